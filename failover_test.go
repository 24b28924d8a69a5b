package failover

import (
	"go/ast"
	"go/parser"
	"go/scanner"
	"go/token"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The package's layout, as its design card gives it: the card's files are
// at the module's root, the failover loop (which upstream next, and why) is
// read from failover.go alone, and no file of the package holds more than
// maxCodeLines lines of code, so that a reader guesses the file from the
// concern.
func TestLayout(t *testing.T) {
	for _, name := range []string{"go.mod", "go.sum", "transport.go", "classify.go", "failover.go", "ratelimit.go", "transport_test.go", "examples", "README.md"} {
		if _, err := os.Stat(name); err != nil {
			t.Errorf("the card's %s: %v", name, err)
		}
	}

	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, "failover.go", nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	declared := map[string]bool{}
	for _, d := range f.Decls {
		if fd, ok := d.(*ast.FuncDecl); ok {
			declared[funcName(fd)] = true
		}
	}
	// The loop: the rounds, the order of a round, the attempt at each
	// upstream, why one is passed over, the wait between rounds and the
	// last resort.
	for _, name := range []string{"call.run", "call.round", "call.roundInOrder", "call.try", "call.skip", "call.lastResort", "call.backoff", "Transport.order"} {
		if !declared[name] {
			t.Errorf("%s is not in failover.go", name)
		}
	}

	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		src, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		if n := codeLines(t, name, src); n > maxCodeLines {
			t.Errorf("%s has %d lines of code, more than %d: split it by concern", name, n, maxCodeLines)
		}
	}
}

// maxCodeLines is the most lines of code (lines with a token on them,
// comments and blank lines aside) a file of the package holds.
const maxCodeLines = 700

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

// codeLines counts the lines of src that carry a token other than a
// comment.
func codeLines(t *testing.T, name string, src []byte) int {
	t.Helper()
	fset := token.NewFileSet()
	file := fset.AddFile(name, fset.Base(), len(src))
	var s scanner.Scanner
	s.Init(file, src, func(pos token.Position, msg string) { t.Errorf("%s: %s", pos, msg) }, 0)
	lines := map[int]bool{}
	for {
		pos, tok, lit := s.Scan()
		if tok == token.EOF {
			break
		}
		if tok == token.SEMICOLON && lit == "\n" {
			continue // inserted at a line's end: that line has its token already
		}
		lines[file.Line(pos)] = true
	}
	return len(lines)
}
