package failover

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
)

// probes counts the probe requests (GET .../models) that reached host.
func probes(n *fakeNet, host string) int {
	c := 0
	for _, s := range n.requests(host) {
		if s.Method == "GET" && strings.HasSuffix(s.Path, "/models") {
			c++
		}
	}
	return c
}

// Probes find a dead upstream with no user traffic at all, and carry the
// upstream's own headers.
func TestProbesOpenADeadUpstream(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := newFakeNet()
		n.status("a.test", 503, "down")
		n.status("b.test", 200, "b")
		cfg := twoUpstreams(n, Config{
			Breaker: BreakerConfig{FailureThreshold: 3},
			Probe:   ProbeConfig{Interval: time.Second},
		})
		cfg.Upstreams[0].BaseURL = "http://a.test/v1"
		cfg.Upstreams[0].Header = http.Header{"Authorization": {"Bearer key-a"}}
		tr := newTestTransport(t, cfg)
		defer tr.Close()
		time.Sleep(3500 * time.Millisecond) // three probes, each 0.9-1.1s apart
		if h := tr.Health()[0]; h.State != "open" || h.Requests.Total() != 0 {
			t.Fatalf("after 3 failed probes: %+v; want open, and no request counted", h)
		}
		got := n.requests("a.test")
		if len(got) != 3 || got[0].Path != "/v1/models" || got[0].Header.Get("Authorization") != "Bearer key-a" {
			t.Fatalf("a got %d probes, first %+v", len(got), got[0])
		}
		var m strings.Builder
		tr.WritePrometheus(&m)
		if !strings.Contains(m.String(), `failover_probes_total{upstream="a",outcome="failed"} 3`) {
			t.Error("probes are not counted in the metrics")
		}
		tr.Close()
		tr.Close() // twice is fine
		time.Sleep(time.Minute)
		if len(n.requests("a.test")) != 3 {
			t.Fatal("probes went on after Close")
		}
	})
}

// A succeeding probe moves an open circuit to half-open long before its
// Cooldown, so the next request tries the upstream again.
func TestProbeReopensEarly(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := newFakeNet()
		var healthy atomic.Bool
		n.handle("a.test", func(*http.Request) (*http.Response, error) {
			if healthy.Load() {
				return respond(200, "a"), nil
			}
			return respond(503, "down"), nil
		})
		n.status("b.test", 200, "b")
		tr := newTestTransport(t, twoUpstreams(n, Config{
			Breaker: BreakerConfig{FailureThreshold: 1, Cooldown: time.Hour},
			Probe:   ProbeConfig{Interval: 10 * time.Second},
		}))
		defer tr.Close()
		get(t, tr, "http://a.test/x")
		if s := tr.Health()[0].State; s != "open" {
			t.Fatalf("state %s", s)
		}
		healthy.Store(true)
		time.Sleep(12 * time.Second)
		if s := tr.Health()[0].State; s != "half-open" {
			t.Fatalf("after a successful probe: %s, want half-open (an hour before the cooldown ends)", s)
		}
		resp, err := tr.RoundTrip(httptestRequest("GET", "http://a.test/x", ""))
		if err != nil || readBody(t, resp) != "a" {
			t.Fatalf("next request: %v, want a's answer", err)
		}
		if s := tr.Health()[0].State; s != "closed" {
			t.Fatalf("after the request succeeded: %s", s)
		}
	})
}

// No probe goes out while a half-open probe request is in flight.
func TestNoProbeDuringARealProbe(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := newFakeNet()
		release := make(chan struct{})
		var phase atomic.Int32
		n.handle("a.test", func(r *http.Request) (*http.Response, error) {
			if phase.Load() == 1 && r.Method == "POST" {
				<-release
				return respond(200, "a"), nil
			}
			if phase.Load() == 0 {
				return respond(503, "down"), nil
			}
			return respond(200, "ok"), nil
		})
		n.status("b.test", 200, "b")
		tr := newTestTransport(t, twoUpstreams(n, Config{
			Breaker: BreakerConfig{FailureThreshold: 1, Cooldown: time.Second},
			Probe:   ProbeConfig{Interval: time.Hour}, // only the real probe here
		}))
		defer tr.Close()
		get(t, tr, "http://a.test/x")
		time.Sleep(time.Second)
		phase.Store(1)
		done := make(chan struct{})
		go func() {
			defer close(done)
			resp, err := tr.RoundTrip(httptestRequest("POST", "http://a.test/x", "{}"))
			if err == nil {
				resp.Body.Close()
			}
		}()
		synctest.Wait()
		before := probes(n, "a.test")
		tr.bg.probes.probe(tr.upstreams[0]) // what the loop would do now
		if got := probes(n, "a.test"); got != before {
			t.Fatal("an active probe went out while a request was probing")
		}
		close(release)
		<-done
	})
}

func TestProbeConfigErrors(t *testing.T) {
	_, err := New(Config{Upstreams: []Upstream{{BaseURL: "http://a.test"}}, Probe: ProbeConfig{Interval: -1}})
	var cerr *ConfigError
	if !errors.As(err, &cerr) || cerr.Field != "Probe.Interval" {
		t.Fatalf("err = %v", err)
	}
}

// The log line of a probe request that cannot be built shows no secret,
// whatever the user's Request puts in its error.
func TestProbeRequestErrorRedacted(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var logs logBuffer
		const key = "sk-probe-secret-0123456789"
		tr := newTestTransport(t, Config{Base: newFakeNet(), Logger: newLogger(&logs),
			Upstreams: []Upstream{{Name: "a", BaseURL: "http://a.test", Header: http.Header{"Authorization": {"Bearer " + key}}}},
			Probe: ProbeConfig{Interval: time.Second, Request: func(_ context.Context, u Upstream) (*http.Request, error) {
				return nil, fmt.Errorf("cannot build a probe with %s", u.Header.Get("Authorization"))
			}}})
		time.Sleep(2 * time.Second)
		tr.Close()
		if !strings.Contains(logs.String(), "cannot build a probe") || strings.Contains(logs.String(), key) {
			t.Fatalf("the probe's error is not logged, or shows the key:\n%s", logs.String())
		}
	})
}

// A Request that returns no request and no error, to probe only some
// upstreams, sends no probe for that upstream and logs why: the probe
// loop's goroutine does not panic (which would end the process), and the
// other upstreams are still probed.
func TestProbeRequestNilRequest(t *testing.T) {
	var probed atomic.Int64
	srv := newServer(t, func(http.ResponseWriter, *http.Request) { probed.Add(1) })
	var logs logBuffer
	tr := newTestTransport(t, Config{Logger: newLogger(&logs),
		Upstreams: []Upstream{{Name: "a", BaseURL: srv.URL + "/a"}, {Name: "b", BaseURL: srv.URL + "/b"}},
		Probe: ProbeConfig{Interval: minProbeInterval, Request: func(ctx context.Context, u Upstream) (*http.Request, error) {
			if u.Name == "a" {
				return nil, nil
			}
			return http.NewRequestWithContext(ctx, http.MethodGet, u.BaseURL+"/models", nil)
		}}})
	defer tr.Close()
	for deadline := time.Now().Add(5 * time.Second); probed.Load() < 2; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("b got %d probes in 5s, want 2", probed.Load())
		}
	}
	tr.Close()
	if n := len(srv.requests()); n != int(probed.Load()) {
		t.Fatalf("%d probes reached the server, %d of them b's", n, probed.Load())
	}
	if !strings.Contains(logs.String(), "probe request") || !strings.Contains(logs.String(), "upstream=a") {
		t.Errorf("the nil probe request of a is not logged:\n%s", logs.String())
	}
}

// A ProbeConfig.Request that panics (here for a, on every probe) is
// reported to the Logger, and the probe loops go on: on the probe loop's
// goroutine, the panic ended the process.
func TestProbeRequestPanics(t *testing.T) {
	var probed atomic.Int64
	srv := newServer(t, func(http.ResponseWriter, *http.Request) { probed.Add(1) })
	var logs logBuffer
	var panicked atomic.Int64
	tr := newTestTransport(t, Config{Logger: newLogger(&logs),
		Upstreams: []Upstream{{Name: "a", BaseURL: srv.URL + "/a", Header: http.Header{"Authorization": {"Bearer sk-probe-key-0123456789"}}}, {Name: "b", BaseURL: srv.URL + "/b"}},
		Probe: ProbeConfig{Interval: minProbeInterval, Request: func(ctx context.Context, u Upstream) (*http.Request, error) {
			if u.Name == "a" {
				panicked.Add(1)
				panic("a's probe request: " + u.Header.Get("Authorization"))
			}
			return http.NewRequestWithContext(ctx, http.MethodGet, u.BaseURL+"/models", nil)
		}}})
	defer tr.Close()
	for deadline := time.Now().Add(5 * time.Second); probed.Load() < 2 || panicked.Load() < 2; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("in 5s, b got %d probes and a's Request panicked %d times; want 2 of each", probed.Load(), panicked.Load())
		}
	}
	tr.Close()
	out := logs.String()
	if !strings.Contains(out, "panic in the probe of a") {
		t.Errorf("a's panic is not logged:\n%s", out)
	}
	if strings.Contains(out, "sk-probe-key-0123456789") {
		t.Errorf("the log shows a's key:\n%s", out)
	}
	if h := tr.Health()[0]; h.State != "closed" {
		t.Errorf("a is %s after its probe's panics, want closed: they count for nothing", h.State)
	}
}

// A probe request built without the ctx Request is given (http.NewRequest)
// is still bounded by Probe.Timeout and ended by Close: against an
// upstream that never answers, the probe fails at its Timeout and Close
// returns, rather than waiting on the probe loop for ever.
func TestProbeRequestWithoutContext(t *testing.T) {
	release := make(chan struct{})
	unblock := sync.OnceFunc(func() { close(release) })
	var probed atomic.Int64
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		probed.Add(1)
		select {
		case <-r.Context().Done():
		case <-release:
		}
	})
	defer unblock() // before srv.Close, which waits for its handlers
	tr, err := New(Config{Upstreams: []Upstream{{Name: "a", BaseURL: srv.URL}},
		Probe: ProbeConfig{Interval: minProbeInterval, Timeout: 50 * time.Millisecond, Request: func(_ context.Context, u Upstream) (*http.Request, error) {
			return http.NewRequest(http.MethodGet, u.BaseURL+"/models", nil)
		}}})
	if err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(5 * time.Second); probed.Load() < 2; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			unblock()
			tr.Close()
			t.Fatalf("%d probes in 5s: the first is not bounded by Probe.Timeout", probed.Load())
		}
	}
	closed := make(chan struct{})
	go func() {
		tr.Close()
		close(closed)
	}()
	select {
	case <-closed:
	case <-time.After(5 * time.Second):
		t.Fatal("Close waits on a probe in flight") // release then ends it
	}
	var m strings.Builder
	tr.WritePrometheus(&m)
	if !strings.Contains(m.String(), `failover_probes_total{upstream="a",outcome="failed"}`) {
		t.Errorf("a probe past its Timeout is not counted as failed:\n%s", m.String())
	}
}

// The jitter of a Probe.Interval near the largest Duration saturates
// rather than wrapping to a negative wait, which fired the probe timer at
// once: an Interval of 1<<63-1 sent a probe at New half the time, and
// again after each such probe.
func TestProbeJitterHugeInterval(t *testing.T) {
	const d = time.Duration(1<<63 - 1)
	for range 1000 {
		if j := jitter(d); j < d/10*9 {
			t.Fatalf("jitter(%v) = %v, want within 10 %% of it", d, j)
		}
	}
	for range 1000 {
		if j := jitter(time.Second); j < 900*time.Millisecond || j > 1100*time.Millisecond {
			t.Fatalf("jitter(1s) = %v, want within 10 %% of it", j)
		}
	}
}

// Close returns within its second whatever user code a probe is in: a Base
// that ignores its context, a Probe.Request or a Classify that blocks. It
// logs which probes it left, and what each says when it comes back is
// dropped: no request is sent, nothing is counted, no circuit moves.
func TestCloseLeavesStuckProbesBehind(t *testing.T) {
	for _, stuck := range []string{"Base", "Probe.Request", "Classify"} {
		t.Run(stuck, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				release := make(chan struct{})
				var sent atomic.Int64
				inUserCode := make(chan struct{}, 1)
				block := func(where, host string) {
					if where == stuck && host == "a.test" {
						select {
						case inUserCode <- struct{}{}:
						default:
						}
						<-release // ignores every context
					}
				}
				base := roundTripFunc(func(r *http.Request) (*http.Response, error) {
					sent.Add(1)
					block("Base", r.URL.Host)
					resp := respond(503, "down")
					resp.Request = r
					return resp, nil
				})
				var logs logBuffer
				tr, err := New(Config{
					Base:      base,
					Logger:    newLogger(&logs),
					Breaker:   BreakerConfig{FailureThreshold: 1},
					Upstreams: []Upstream{{Name: "a", BaseURL: "http://a.test/v1", Header: http.Header{"Authorization": {"Bearer sk-stuck-0123456789"}}}, {Name: "b", BaseURL: "http://b.test/v1"}},
					Classify: func(resp *http.Response, err error) Outcome {
						block("Classify", resp.Request.URL.Host)
						return DefaultClassifier(resp, err)
					},
					Probe: ProbeConfig{Interval: time.Second, Request: func(ctx context.Context, u Upstream) (*http.Request, error) {
						block("Probe.Request", strings.TrimPrefix(strings.TrimSuffix(u.BaseURL, "/v1"), "http://"))
						return http.NewRequestWithContext(ctx, http.MethodGet, u.BaseURL+"/models", nil)
					}},
				})
				if err != nil {
					t.Fatal(err)
				}
				<-inUserCode // a's first probe is stuck
				synctest.Wait()
				before := sent.Load()
				start := time.Now()
				tr.Close()
				if took := time.Since(start); took > closeGrace {
					t.Errorf("Close took %v, want at most %v", took, closeGrace)
				}
				if out := logs.String(); !strings.Contains(out, "a in "+stuck) && !(stuck == "Classify" && strings.Contains(out, "a judging its answer")) {
					t.Errorf("the log does not say what Close left:\n%s", out)
				} else if strings.Contains(out, "sk-stuck") {
					t.Errorf("the log shows a's key:\n%s", out)
				}
				close(release)
				synctest.Wait()
				time.Sleep(time.Minute)
				if n := sent.Load(); n != before {
					t.Errorf("%d probes sent after Close", n-before)
				}
				if h := tr.Health()[0]; h.State != "closed" || h.Requests.Total() != 0 {
					t.Errorf("a after its stuck probe came back: %+v; want closed, nothing counted", h)
				}
				var m strings.Builder
				tr.WritePrometheus(&m)
				if regexp.MustCompile(`failover_probes_total\{upstream="a",[^}]*\} [1-9]`).MatchString(m.String()) {
					t.Errorf("a probe that came back after Close is counted:\n%s", m.String())
				}
			})
		})
	}
}

// blockingHandler is a slog.Handler that, once block is set, holds every
// record until release is closed, ignoring every context, as a handler
// writing to a pipe nobody reads does.
type blockingHandler struct {
	block   *atomic.Bool
	release chan struct{}
	held    chan struct{} // told of the first record held
}

func (h blockingHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h blockingHandler) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h blockingHandler) WithGroup(string) slog.Handler            { return h }

func (h blockingHandler) Handle(context.Context, slog.Record) error {
	if h.block.Load() {
		select {
		case h.held <- struct{}{}:
		default:
		}
		<-h.release
	}
	return nil
}

// Close keeps its bound when the Logger it tells what it leaves behind
// blocks too: a probe stuck logging its circuit's change, or a call to the
// shared state past its bound, leaves Close waiting on the Logger no
// longer than on the rest of user code.
func TestCloseBoundedWhenLoggerBlocks(t *testing.T) {
	for _, stuck := range []string{"probe", "shared"} {
		t.Run(stuck, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				h := blockingHandler{block: new(atomic.Bool), release: make(chan struct{}), held: make(chan struct{}, 1)}
				cfg := Config{Logger: slog.New(h), Breaker: BreakerConfig{FailureThreshold: 1}}
				bound := closeGrace
				var s *deafShared
				if stuck == "probe" {
					h.block.Store(true)
					cfg.Base = roundTripFunc(func(*http.Request) (*http.Response, error) { return nil, errors.New("refused") })
					cfg.Upstreams = []Upstream{{Name: "a", BaseURL: "http://a.test/v1"}}
					cfg.Probe = ProbeConfig{Interval: time.Second}
				} else {
					n := newFakeNet()
					n.status("a.test", 200, "a")
					n.status("b.test", 200, "b")
					s = &deafShared{memShared: newMemShared(), loading: make(chan struct{}), release: make(chan struct{})}
					cfg = twoUpstreams(n, Config{Shared: s, SharedSync: 100 * time.Millisecond, Logger: cfg.Logger})
					bound = minCallBound + closeGrace
				}
				tr, err := New(cfg)
				if err != nil {
					t.Fatal(err)
				}
				if stuck == "probe" {
					<-h.held // the probe's failure opened a's circuit, which it logs
				} else {
					synctest.Wait()
					s.deaf.Store(true)
					<-s.loading // the next reconcile's Load, which ignores its context
					h.block.Store(true)
				}
				synctest.Wait()
				start := time.Now()
				closed := make(chan struct{})
				go func() {
					tr.Close()
					close(closed)
				}()
				select {
				case <-closed:
					if took := time.Since(start); took > bound {
						t.Errorf("Close took %v, want at most %v", took, bound)
					}
				case <-time.After(time.Hour):
					t.Errorf("Close has not returned within an hour")
				}
				close(h.release)
				if s != nil {
					close(s.release)
				}
				<-closed
				synctest.Wait()
			})
		})
	}
}

// The default probe of an upstream with {deployment} in its BaseURL asks
// for the models list its resource has (Azure OpenAI's classic
// /openai/models), and every probe carries the upstream's Query.
func TestProbeDeploymentAndQuery(t *testing.T) {
	for _, c := range []struct {
		name, base string
		query      map[string][]string
		request    func(ctx context.Context, u Upstream) (*http.Request, error)
		path, raw  string
	}{
		{name: "azure classic", base: "/openai/deployments/{deployment}", query: map[string][]string{"api-version": {"2024-10-21"}},
			path: "/openai/models", raw: "api-version=2024-10-21"},
		{name: "deployment then suffix", base: "/gw/{deployment}/v1", path: "/gw/models"},
		{name: "plain", base: "/v1/", query: map[string][]string{"a": {"1"}}, path: "/v1/models", raw: "a=1"},
		{name: "custom request", base: "/v1", query: map[string][]string{"a": {"1"}},
			request: func(ctx context.Context, u Upstream) (*http.Request, error) {
				return http.NewRequestWithContext(ctx, http.MethodGet, u.BaseURL+"/health?a=0&x=2", nil)
			},
			path: "/v1/health", raw: "x=2&a=1"},
	} {
		t.Run(c.name, func(t *testing.T) {
			got := make(chan *http.Request, 1)
			srv := newServer(t, func(w http.ResponseWriter, r *http.Request) {
				select {
				case got <- r:
				default:
				}
			})
			tr := newTestTransport(t, Config{
				Upstreams: []Upstream{{Name: "a", BaseURL: srv.URL + c.base, Query: c.query}},
				Probe:     ProbeConfig{Interval: minProbeInterval, Request: c.request},
			})
			defer tr.Close()
			select {
			case r := <-got:
				if r.URL.Path != c.path || r.URL.RawQuery != c.raw {
					t.Errorf("probe of %s: GET %s?%s, want %s?%s", c.base, r.URL.Path, r.URL.RawQuery, c.path, c.raw)
				}
			case <-time.After(time.Minute):
				t.Fatal("no probe came")
			}
		})
	}
}
