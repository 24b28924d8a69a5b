package failover

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
)

var soakLong = flag.Bool("soak.long", false, "run the long soak: 100,000 requests instead of 5,000")

// soakUpstream is a loopback upstream that fails at random, on a seeded
// schedule, and checks every request it receives.
type soakUpstream struct {
	*httptest.Server
	name string

	mu     sync.Mutex
	rng    *rand.Rand
	seen   map[int]int                 // request id: attempts received
	wrong  []string                    // requests whose body is not their own
	active map[net.Conn]http.ConnState // open connections, idle ones too
}

func newSoakUpstream(t *testing.T, name string, seed uint64) *soakUpstream {
	u := &soakUpstream{name: name, rng: rand.New(rand.NewPCG(seed, seed)), seen: map[int]int{}, active: map[net.Conn]http.ConnState{}}
	u.Server = httptest.NewUnstartedServer(http.HandlerFunc(u.serve))
	u.Config.ConnState = func(c net.Conn, s http.ConnState) {
		u.mu.Lock()
		defer u.mu.Unlock()
		if s == http.StateClosed || s == http.StateHijacked {
			delete(u.active, c)
		} else {
			u.active[c] = s
		}
	}
	u.Start()
	t.Cleanup(u.Close)
	return u
}

func (u *soakUpstream) serve(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		return
	}
	id, _ := strconv.Atoi(r.Header.Get("X-Req-Id"))
	u.mu.Lock()
	u.seen[id]++
	if !bytes.Equal(body, soakBody(id)) {
		u.wrong = append(u.wrong, fmt.Sprintf("request %d got body %.40q", id, body))
	}
	p := u.rng.IntN(100)
	u.mu.Unlock()
	switch {
	case p < 2:
		w.WriteHeader(http.StatusServiceUnavailable)
		io.WriteString(w, `{"error":"overloaded"}`)
	case p < 3:
		w.Header().Set("Retry-After-Ms", "20")
		w.WriteHeader(http.StatusTooManyRequests)
	case p < 4: // hangs until the attempt times out
		<-r.Context().Done()
	case p < 5: // resets the connection
		c, _, err := w.(http.Hijacker).Hijack()
		if err == nil {
			c.(*net.TCPConn).SetLinger(0)
			c.Close()
		}
	default:
		fmt.Fprintf(w, `{"id":%d,"upstream":%q}`, id, u.name)
	}
}

func (u *soakUpstream) openConns() int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return len(u.active)
}

func soakBody(id int) []byte {
	return fmt.Appendf(nil, `{"model":"m","id":%d,"messages":[{"role":"user","content":"%s"}]}`, id, strings.Repeat("x", id%200))
}

// attemptCounter counts what reaches Base, to check Health and the metrics
// against.
type attemptCounter struct {
	next http.RoundTripper
	n    atomic.Int64
}

func (c *attemptCounter) RoundTrip(r *http.Request) (*http.Response, error) {
	c.n.Add(1)
	return c.next.RoundTrip(r)
}

// Three upstreams failing at random (a seeded schedule), 50 concurrent
// callers: every request ends in exactly one documented way, no body goes
// to the wrong upstream or twice to one, the counts add up, and goroutines,
// connections and memory return to where they were.
func TestSoak(t *testing.T) {
	requests := 5_000
	if *soakLong {
		requests = 100_000
	}
	if testing.Short() {
		requests = 1_000
	}
	leaks := goleak.IgnoreCurrent()
	var before runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)

	ups := []*soakUpstream{newSoakUpstream(t, "a", 1), newSoakUpstream(t, "b", 2), newSoakUpstream(t, "c", 3)}
	real := http.DefaultTransport.(*http.Transport).Clone()
	real.MaxIdleConnsPerHost = 64
	base := &attemptCounter{next: real}
	tr := newTestTransport(t, Config{
		Base:           base,
		AttemptTimeout: 300 * time.Millisecond,
		Breaker:        BreakerConfig{Cooldown: 200 * time.Millisecond},
		RateLimit:      RateLimitConfig{MaxWait: 100 * time.Millisecond},
		Upstreams: []Upstream{
			{Name: "a", BaseURL: ups[0].URL + "/v1", Header: http.Header{"Authorization": {"Bearer key-a-0123456789"}}},
			{Name: "b", BaseURL: ups[1].URL + "/v1", Header: http.Header{"Authorization": {"Bearer key-b-0123456789"}}},
			{Name: "c", BaseURL: ups[2].URL + "/v1", Header: http.Header{"Authorization": {"Bearer key-c-0123456789"}}},
		},
	})

	const deadline = 2 * time.Second
	var ok, answered, failed, timedOut atomic.Int64
	var next atomic.Int64
	var wg sync.WaitGroup
	for range 50 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				id := int(next.Add(1))
				if id > requests {
					return
				}
				ctx, cancel := context.WithTimeout(context.Background(), deadline)
				req, _ := http.NewRequestWithContext(ctx, "POST", ups[0].URL+"/v1/chat/completions", bytes.NewReader(soakBody(id)))
				req.Header.Set("X-Req-Id", strconv.Itoa(id))
				start := time.Now()
				resp, err := tr.RoundTrip(req)
				var ferr *Error
				switch {
				case err == nil && resp.StatusCode == 200:
					b, rerr := io.ReadAll(resp.Body)
					if rerr != nil || !bytes.HasPrefix(b, fmt.Appendf(nil, `{"id":%d,`, id)) {
						t.Errorf("request %d: got %q, %v", id, b, rerr)
					}
					ok.Add(1)
				case err == nil:
					answered.Add(1) // the provider's own 503 or 429
				case errors.As(err, &ferr):
					failed.Add(1)
				case errors.Is(err, context.DeadlineExceeded):
					timedOut.Add(1)
				default:
					t.Errorf("request %d: undocumented error %T %v", id, err, err)
				}
				if resp != nil {
					resp.Body.Close()
				}
				cancel()
				// A hang would be unbounded; the slack only absorbs a loaded
				// machine stalling the whole process (seen with -race).
				if took := time.Since(start); took > deadline+10*time.Second {
					t.Errorf("request %d took %v, past its %v deadline", id, took, deadline)
				}
			}
		}()
	}
	wg.Wait()
	t.Logf("%d requests: %d ok, %d provider answers, %d *Error, %d deadline", requests, ok.Load(), answered.Load(), failed.Load(), timedOut.Load())

	if sum := ok.Load() + answered.Load() + failed.Load() + timedOut.Load(); sum != int64(requests) {
		t.Fatalf("%d outcomes for %d requests", sum, requests)
	}
	// Three upstreams each failing 5 % leave about 0.01 % to fail, on an
	// idle machine; a loaded one (-race, other jobs) times out more and
	// trips breakers. The invariants above and below are the point; this
	// floor only catches a transport that stopped serving.
	if ok.Load() < int64(requests)/2 {
		t.Errorf("only %d of %d succeeded with three upstreams each failing 5%%", ok.Load(), requests)
	}
	for _, u := range ups {
		u.mu.Lock()
		for _, w := range u.wrong {
			t.Errorf("upstream %s: %s", u.name, w)
		}
		for id, n := range u.seen {
			if n > 1 {
				t.Errorf("upstream %s got request %d %d times", u.name, id, n)
			}
		}
		u.mu.Unlock()
	}

	// Health, the metrics and Base agree on the attempts made.
	var health uint64
	for _, h := range tr.Health() {
		health += h.Requests.Total()
	}
	var m strings.Builder
	tr.WritePrometheus(&m)
	var metered uint64
	sc := bufio.NewScanner(strings.NewReader(m.String()))
	for sc.Scan() {
		if line := sc.Text(); strings.HasPrefix(line, "failover_requests_total{") {
			n, _ := strconv.ParseUint(line[strings.LastIndexByte(line, ' ')+1:], 10, 64)
			metered += n
		}
	}
	if sent := uint64(base.n.Load()); health != sent || metered != sent {
		t.Fatalf("attempts: Health %d, metrics %d, Base %d", health, metered, sent)
	}

	// Connections, goroutines and memory return to where they were.
	real.CloseIdleConnections() // the counter in between does not pass it on
	for _, u := range ups {
		for i := 0; u.openConns() > 0 && i < 100; i++ {
			time.Sleep(10 * time.Millisecond)
		}
		if n := u.openConns(); n != 0 {
			t.Errorf("upstream %s: %d connections still active", u.name, n)
		}
		u.Close()
	}
	goleak.VerifyNone(t, leaks)
	var after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&after)
	if after.HeapInuse > before.HeapInuse+8<<20 {
		t.Errorf("heap in use grew from %d to %d bytes", before.HeapInuse, after.HeapInuse)
	}
}
