package failover

import (
	"go/ast"
	"go/build"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The package's layout, as its design card gives it: a reader guesses the
// file from the concern. Each name below is declared in the file the card
// gives its concern, and the card's other files are at the module's root.
func TestLayout(t *testing.T) {
	for _, name := range []string{"go.mod", "go.sum", "transport_test.go", "example_test.go", "examples", "README.md"} {
		if _, err := os.Stat(name); err != nil {
			t.Errorf("the card's %s: %v", name, err)
		}
	}
	where := map[string][]string{
		// The entry: Config, New, RoundTrip and its contract.
		"transport.go": {"Config", "Transport", "New", "Transport.RoundTrip", "Transport.Close"},
		// Where a request may go, and why not: one decision.
		"plan.go": {"Reason", "Transport.admit", "Transport.demotion", "Transport.earliest", "Transport.lastResort", "plan", "plan.next", "call.plan"},
		// The loop that walks the plan: rounds, sends, waits.
		"failover.go": {"call.run", "call.round", "call.send", "call.backoff", "call.lastResort"},
		// What an attempt's answer does to the request.
		"call.go": {"call", "request", "request.launch", "call.settle", "tally.skip"},
		// Hedging is a way of sending; its race is its own file.
		"hedge.go":     {"HedgeConfig", "call.sendHedged", "hedgeWait"},
		"race.go":      {"race", "race.run", "call.race"},
		"router.go":    {"Router", "Candidate", "picker", "Transport.routed"},
		"policies.go":  {"Priority", "Weighted", "LeastLatency", "Score"},
		"classify.go":  {"Outcome", "DefaultClassifier"},
		"ratelimit.go": {"RateLimitConfig", "RetryAfter"},
		"breaker.go":   {"Breaker"},
		"health.go":    {"Transport.Health", "UpstreamHealth"},
		"metrics.go":   {"Transport.WritePrometheus", "families"},
	}
	for file, names := range where {
		declared := declarations(t, file)
		for _, name := range names {
			if !declared[name] {
				t.Errorf("%s is not declared in %s", name, file)
			}
		}
	}
}

// declarations returns the names file declares at its top level: types,
// functions, variables and constants, a method as "Type.Method".
func declarations(t *testing.T, file string) map[string]bool {
	t.Helper()
	f, err := parser.ParseFile(token.NewFileSet(), file, nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	declared := map[string]bool{}
	for _, d := range f.Decls {
		switch d := d.(type) {
		case *ast.FuncDecl:
			declared[funcName(d)] = true
		case *ast.GenDecl:
			for _, s := range d.Specs {
				switch s := s.(type) {
				case *ast.TypeSpec:
					declared[s.Name.Name] = true
				case *ast.ValueSpec:
					for _, n := range s.Names {
						declared[n.Name] = true
					}
				}
			}
		}
	}
	return declared
}

// funcName is a function's name, with its receiver's type for a method:
// "call.run", "Transport.order".
func funcName(fd *ast.FuncDecl) string {
	if fd.Recv == nil || len(fd.Recv.List) == 0 {
		return fd.Name.Name
	}
	typ := fd.Recv.List[0].Type
	if star, ok := typ.(*ast.StarExpr); ok {
		typ = star.X
	}
	if id, ok := typ.(*ast.Ident); ok {
		return id.Name + "." + fd.Name.Name
	}
	return fd.Name.Name
}

// The packages under internal/ (the circuit, the parsers, the clock) are
// parts the root package uses, never the other way round: none imports
// the root package, directly or through another of the module's.
func TestInternalImportsNoRoot(t *testing.T) {
	const root = "github.com/failover-go/failover"
	dirs, err := filepath.Glob("internal/*")
	if err != nil {
		t.Fatal(err)
	}
	if len(dirs) == 0 {
		t.Fatal("no package under internal/")
	}
	seen := map[string]bool{}
	var visit func(path, dir string, chain []string)
	visit = func(path, dir string, chain []string) {
		if seen[path] {
			return
		}
		seen[path] = true
		pkg, err := build.ImportDir(dir, 0)
		if err != nil {
			t.Errorf("%s: %v", dir, err)
			return
		}
		for _, imp := range pkg.Imports {
			switch {
			case imp == root:
				t.Errorf("%s imports the root package", strings.Join(append(chain, path), " -> "))
			case strings.HasPrefix(imp, root+"/"):
				visit(imp, strings.TrimPrefix(imp, root+"/"), append(chain, path))
			}
		}
	}
	for _, dir := range dirs {
		if fi, err := os.Stat(dir); err == nil && fi.IsDir() {
			visit(root+"/"+filepath.ToSlash(dir), dir, nil)
		}
	}
}
