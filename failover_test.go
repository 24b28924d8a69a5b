package failover

import (
	"context"
	"go/ast"
	"go/build"
	"go/parser"
	"go/token"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"testing/synctest"
	"time"
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

// A retryCase is a primary whose first attempt fails as first says and
// whose next answers 200 "a", maybe behind a backup that answers 200 "b".
type retryCase struct {
	name     string
	first    func(*http.Request) (*http.Response, error)
	backup   *Upstream     // nil: the primary alone
	cfg      Config        // Retry, AttemptTimeout, Breaker
	deadline time.Duration // the caller's; 0 for none
	want     string        // the body the caller gets
	retried  bool          // the primary got the request twice
	wait     [2]time.Duration
}

// Costs and models of the primary and its backups, for a request for
// gpt-4o-mini (chatBody).
var (
	primaryCost  = Cost{Input: 1, Output: 2}
	asGood       = Upstream{Cost: primaryCost}
	mapsModel    = Upstream{Cost: primaryCost, Models: map[string]string{"gpt-4o-mini": "claude-3-5-haiku"}}
	dearer       = Upstream{Cost: Cost{Input: 3, Output: 6}}
	transientWin = [2]time.Duration{250 * time.Millisecond, 500 * time.Millisecond} // RetryWaitMin/2 to RetryWaitMin
)

func failWith(code int, kv ...string) func(*http.Request) (*http.Response, error) {
	return func(*http.Request) (*http.Response, error) { return respond(code, "oops", kv...), nil }
}

// runRetry runs c in a synctest bubble, so that the waits are exact. The
// upstreams live in memory (fakeNet): in a bubble a real connection's
// I/O does not block durably, and time would not advance.
func runRetry(t *testing.T, c retryCase) {
	t.Helper()
	synctest.Test(t, func(t *testing.T) {
		n := newFakeNet()
		var calls atomic.Int32
		var failed, again time.Time
		n.handle("a.test", func(r *http.Request) (*http.Response, error) {
			if calls.Add(1) == 1 {
				defer func() { failed = time.Now() }()
				return c.first(r)
			}
			again = time.Now()
			return respond(200, "a"), nil
		})
		n.status("b.test", 200, "b")
		cfg := c.cfg
		cfg.Base = n
		cfg.Upstreams = []Upstream{{Name: "a", BaseURL: "http://a.test", Cost: primaryCost}}
		if c.backup != nil {
			b := *c.backup
			b.Name, b.BaseURL = "b", "http://b.test"
			cfg.Upstreams = append(cfg.Upstreams, b)
		}
		tr := newTestTransport(t, cfg)
		ctx := t.Context()
		if c.deadline > 0 {
			var cancel context.CancelFunc
			ctx, cancel = context.WithTimeout(ctx, c.deadline)
			defer cancel()
		}
		resp, err := tr.RoundTrip(httptestRequest("POST", "http://a.test/v1/chat/completions", chatBody).WithContext(ctx))
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if got := readBody(t, resp); got != c.want {
			t.Errorf("%s: got %d %q, want %q", c.name, resp.StatusCode, got, c.want)
		}
		wantA, wantB := 1, 0
		if c.retried {
			wantA = 2
		}
		if c.want == "b" {
			wantB = 1
		}
		if got := n.count("a.test"); got != wantA {
			t.Errorf("%s: the primary got %d requests, want %d", c.name, got, wantA)
		}
		if got := n.count("b.test"); got != wantB {
			t.Errorf("%s: the backup got %d requests, want %d", c.name, got, wantB)
		}
		if got, want := metricValue(t, tr, `failover_retries_total{upstream="a"}`), float64(wantA-1); got != want {
			t.Errorf("%s: failover_retries_total = %v, want %v", c.name, got, want)
		}
		if c.retried {
			if w := again.Sub(failed); w < c.wait[0] || w > c.wait[1] {
				t.Errorf("%s: the retry came %v after the failure, want %v to %v", c.name, w, c.wait[0], c.wait[1])
			}
		}
	})
}

// A request goes again to the upstream that just failed it, once, after a
// short wait, when the next would serve another model or cost more, or
// when there is no other; it moves on at once when the next is as good,
// when the wait is long or would not fit the caller's deadline, after a
// timeout, and when the failure opened the circuit.
func TestRetrySameUpstream(t *testing.T) {
	reset := func(*http.Request) (*http.Response, error) {
		return nil, &net.OpError{Op: "read", Net: "tcp", Err: os.NewSyscallError("read", syscall.ECONNRESET)}
	}
	hang := func(r *http.Request) (*http.Response, error) {
		<-r.Context().Done()
		return nil, r.Context().Err()
	}
	for _, c := range []retryCase{
		{name: "500, the backup serves another model", first: failWith(500), backup: &mapsModel, want: "a", retried: true, wait: transientWin},
		{name: "500, the backup is as good", first: failWith(500), backup: &asGood, want: "b"},
		{name: "500, the backup costs more", first: failWith(500), backup: &dearer, want: "a", retried: true, wait: transientWin},
		{name: "529, the backup serves another model", first: failWith(529), backup: &mapsModel, want: "a", retried: true, wait: transientWin},
		{name: "reset, the backup serves another model", first: reset, backup: &mapsModel, want: "a", retried: true, wait: transientWin},
		{name: "429 Retry-After 2, the backup serves another model", first: failWith(429, "Retry-After", "2"), backup: &mapsModel, want: "a", retried: true, wait: [2]time.Duration{2 * time.Second, 2200 * time.Millisecond}},
		{name: "503 Retry-After 2, the backup serves another model", first: failWith(503, "Retry-After", "2"), backup: &mapsModel, want: "a", retried: true, wait: [2]time.Duration{2 * time.Second, 2200 * time.Millisecond}},
		{name: "429 Retry-After 30, the backup serves another model", first: failWith(429, "Retry-After", "30"), backup: &mapsModel, want: "b"},
		{name: "429 Retry-After 2, the caller's deadline in 2s", first: failWith(429, "Retry-After", "2"), backup: &mapsModel, deadline: 2 * time.Second, want: "b"},
		{name: "500, the caller's deadline in 600ms", first: failWith(500), backup: &mapsModel, deadline: 600 * time.Millisecond, want: "b"},
		{name: "attempt timeout, the backup serves another model", first: hang, backup: &mapsModel, cfg: Config{AttemptTimeout: time.Second}, want: "b"},
		{name: "500 opens the circuit", first: failWith(500), backup: &mapsModel, cfg: Config{Breaker: BreakerConfig{FailureThreshold: 1}}, want: "b"},
		{name: "500, Off", first: failWith(500), backup: &mapsModel, cfg: Config{Retry: RetryConfig{Off: true}}, want: "b"},
		{name: "500, MaxRetryAfter 1s, 429 Retry-After 2", first: failWith(429, "Retry-After", "2"), backup: &dearer, cfg: Config{Retry: RetryConfig{MaxRetryAfter: time.Second}}, want: "b"},
		{name: "500 alone", first: failWith(500), want: "a", retried: true, wait: transientWin},
		{name: "501 alone", first: failWith(501), want: "oops"},
	} {
		t.Run(c.name, func(t *testing.T) { runRetry(t, c) })
	}
}

// A connection the primary resets, over real loopback TCP, is retried
// there when the backup would serve another model: the reset reaches the
// Transport as net/http reports it.
func TestRetryResetLoopback(t *testing.T) {
	var calls atomic.Int32
	primary := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		if calls.Add(1) > 1 {
			io.WriteString(w, "a")
			return
		}
		c, _, err := http.NewResponseController(w).Hijack()
		if err != nil {
			t.Error(err)
			return
		}
		c.(*net.TCPConn).SetLinger(0) // close with a reset
		c.Close()
	})
	backup := newUpstreamServer(t, 200, "b")
	tr := newTestTransport(t, Config{RetryWaitMin: time.Millisecond, Upstreams: []Upstream{
		{Name: "a", BaseURL: primary.URL},
		{Name: "b", BaseURL: backup.URL, Models: map[string]string{"gpt-4o-mini": "claude-3-5-haiku"}},
	}})
	if got := readBody(t, mustPost(t, tr, primary.URL+"/v1/chat/completions", chatBody)); got != "a" {
		t.Errorf("got %q, want the primary's answer to the retry", got)
	}
	if got := backup.count(); got != 0 {
		t.Errorf("the backup got %d requests, want none", got)
	}
}

// A request that names no model, addressed to an upstream without
// {deployment}, has nothing to fill a deployment with: it never waits
// for a {deployment} upstream to come back (its circuit or its cooldown
// ending first), nor takes it as its last resort, though its circuit
// opened first.
func TestNoModelSkipsDeploymentWhenAllRefuse(t *testing.T) {
	for _, c := range []struct {
		name string
		b    func(n *fakeNet) // how b.test first fails a request with a model
	}{
		{"circuit open", func(n *fakeNet) { n.status("b.test", 503, "down") }},
		{"cooling down", func(n *fakeNet) { n.status("b.test", 429, "slow down", "Retry-After", "20") }},
	} {
		t.Run(c.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				n := newFakeNet()
				tr := newTestTransport(t, Config{
					Base: n,
					Upstreams: []Upstream{
						{Name: "b", BaseURL: "http://b.test/openai/deployments/{deployment}"},
						{Name: "a", BaseURL: "http://a.test/v1"},
					},
					Breaker:   BreakerConfig{FailureThreshold: 1, Cooldown: 30 * time.Second, MaxCooldown: 30 * time.Second},
					RateLimit: RateLimitConfig{MaxWait: 25 * time.Second},
					Retry:     RetryConfig{Off: true},
				})
				chat := func() {
					t.Helper()
					resp, err := tr.RoundTrip(httptestRequest("POST", "http://a.test/v1/chat/completions", `{"model":"m"}`))
					if err != nil {
						t.Fatal(err)
					}
					resp.Body.Close()
				}
				// b refuses first (its circuit opens, or it cools down),
				// then a's circuit opens, 10s later: b comes back first.
				c.b(n)
				n.status("a.test", 200, "ok")
				chat()
				time.Sleep(10 * time.Second)
				n.status("a.test", 503, "down")
				chat()
				if h := tr.Health(); h[1].State != "open" {
					t.Fatalf("a is %s, want open", h[1].State)
				}

				start := time.Now()
				resp, err := tr.RoundTrip(httptestRequest("GET", "http://a.test/v1/models", ""))
				if err != nil {
					t.Fatal(err)
				}
				resp.Body.Close()
				if waited := time.Since(start); waited != 0 {
					t.Errorf("the request waited %v, want no wait: only a can take it, beyond MaxWait", waited)
				}
				if s, _ := ServedBy(resp); s.Upstream != "a" {
					t.Errorf("answered by %q, want a, the last resort", s.Upstream)
				}
				if got := n.count("b.test"); got != 1 {
					t.Errorf("b got %d requests, want only the first", got)
				}
			})
		})
	}
}

// A circuit whose open time ends while the round passes over the other
// upstreams takes the request in another round at once. Before, the
// request saw no upstream to wait for and none for the last resort (the
// circuit was no longer open) and failed, with the primary able to
// answer.
func TestRoundAgainWhenACircuitCloses(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := newFakeNet()
		n.status("a.test", 500, "down")
		n.status("b.test", 200, "ok")
		tr := newTestTransport(t, Config{Base: n, Retry: RetryConfig{Off: true}, Breaker: BreakerConfig{FailureThreshold: 1, Cooldown: time.Second},
			Upstreams: []Upstream{{Name: "a", BaseURL: "http://a.test"}, {Name: "b", BaseURL: "http://b.test", Models: map[string]string{"m": "m"}}}})
		body := `{"model":"other"}`
		resp, err := tr.RoundTrip(httptestRequest("POST", "http://a.test/v1/chat/completions", body))
		if err != nil || resp.StatusCode != 500 {
			t.Fatalf("first request: %v %v, want a's 500", resp, err)
		}
		resp.Body.Close()
		// The round passes over a (open) and, while it looks at b, a's
		// open time ends.
		slow := &Trace{Skipped: func(s TraceSkip) {
			if s.Upstream == "a" {
				time.Sleep(2 * time.Second)
			}
		}}
		req := httptestRequest("POST", "http://a.test/v1/chat/completions", body)
		resp, err = tr.RoundTrip(req.WithContext(WithTrace(req.Context(), slow)))
		if err != nil {
			t.Fatalf("a's circuit half-open after the round: %v, want a's answer", err)
		}
		resp.Body.Close()
		if resp.StatusCode != 500 || n.count("a.test") != 2 {
			t.Errorf("%d, a got %d requests: want its 500 to the second request too", resp.StatusCode, n.count("a.test"))
		}
	})
}
