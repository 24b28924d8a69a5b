package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"sync"
	"sync/atomic"
	"time"

	"github.com/failover-go/failover"
)

// options configure one drill; the flags of main fill them in.
type options struct {
	Duration  time.Duration // length of the drill; both runs play at once
	RPS       float64       // requests per second, per run
	Timescale float64       // factor on every provider-scale time
	JSON      bool          // write JSON instead of the table
	Plot      string        // .png or .svg file to draw, or ""
	Listen    string        // address for /metrics and /health, or ""
	Model     string        // model named in the request bodies
	Router    string        // routing policy of the failover run: priority, weighted, leastlatency, score
	Upstreams []realUpstream

	// Status receives the live status; nil means none. StatusTTY redraws
	// it in place.
	Status    io.Writer
	StatusTTY bool
}

// realUpstream is a provider given with -upstream name=URL,KEY_ENV, its
// key read from the environment.
type realUpstream struct {
	Name, BaseURL, Key string
}

// scaled returns the provider-scale duration d at the drill's timescale.
func (o options) scaled(d time.Duration) time.Duration {
	return time.Duration(float64(d) * o.Timescale)
}

// Timing of both runs, at provider scale before -timescale.
const (
	callerTimeout   = 30 * time.Second // the caller's http.Client.Timeout, in both runs
	breakerCooldown = 30 * time.Second // failover.BreakerConfig.Cooldown (its default)
	defaultCooldown = 1 * time.Second  // failover.RateLimitConfig.DefaultCooldown (its default)
	maxCooldown     = 60 * time.Second // failover.RateLimitConfig.MaxCooldown (its default)
	attemptTimeouts = 3                // AttemptTimeout is this many times the slowest p99
)

// record is one request of the caller.
type record struct {
	start   time.Duration // when it was due, since the drill began
	end     time.Duration // when the caller had its answer
	latency time.Duration // end-to-end, the body read to its end
	ok      bool          // a 200 with the whole body (a stream to [DONE])
}

// attempt is one request that reached an upstream (or was sent to it).
type attempt struct {
	at       time.Duration
	upstream int
}

// run is one of the two runs: a caller with an http.Client, and what it saw.
type run struct {
	name    string
	client  *http.Client
	base    *http.Transport
	url     string   // where the caller sends each request
	names   []string // upstreams, primary first
	hosts   map[string]int
	servers []*fakeUpstream
	ft      *failover.Transport // nil in the plain run
	events  *eventLog           // nil in the plain run
	start   time.Time

	inflight atomic.Int64 // requests the caller still waits for

	mu       sync.Mutex
	records  []record
	attempts []attempt
}

// counter counts the attempts that a run's Base RoundTripper sends to each
// upstream.
type counter struct {
	next http.RoundTripper
	r    *run
}

func (c *counter) RoundTrip(req *http.Request) (*http.Response, error) {
	if i, ok := c.r.hosts[req.URL.Host]; ok {
		at := time.Since(c.r.start)
		c.r.mu.Lock()
		c.r.attempts = append(c.r.attempts, attempt{at: at, upstream: i})
		c.r.mu.Unlock()
	}
	return c.next.RoundTrip(req)
}

// newBase returns the http.Transport under both runs' clients: the
// default one, with room for the connections that hung requests hold.
func newBase() *http.Transport {
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.MaxIdleConns = 1024
	t.MaxIdleConnsPerHost = 512
	return t
}

// fire sends one request and records what the caller saw.
func (r *run) fire(ctx context.Context, due time.Duration, body []byte, stream bool) {
	r.inflight.Add(1)
	begin := time.Now()
	ok := r.do(ctx, body, stream)
	end := time.Now()
	r.inflight.Add(-1)
	r.mu.Lock()
	r.records = append(r.records, record{start: due, end: end.Sub(r.start), latency: end.Sub(begin), ok: ok})
	r.mu.Unlock()
}

func (r *run) do(ctx context.Context, body []byte, stream bool) bool {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, r.url, bytes.NewReader(body))
	if err != nil {
		return false
	}
	req.Header.Set("Content-Type", "application/json")
	if stream {
		req.Header.Set("Accept", "text/event-stream")
	}
	resp, err := r.client.Do(req)
	if err != nil {
		return false
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil || resp.StatusCode != http.StatusOK {
		return false
	}
	if stream {
		return bytes.Contains(data, []byte("data: [DONE]"))
	}
	return true
}

// warmConns is how many connections to each local server are opened before
// the drill starts, so that the first second does not measure dials.
const warmConns = 16

// warm opens connections to the run's local servers, around the counter and
// the failover Transport, so that nothing of it is measured.
func (r *run) warm(ctx context.Context, body []byte) {
	c := &http.Client{Transport: r.base, Timeout: 5 * time.Second}
	var wg sync.WaitGroup
	for _, s := range r.servers {
		for range warmConns {
			wg.Go(func() {
				req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.baseURL()+"/chat/completions", bytes.NewReader(body))
				if err != nil {
					return
				}
				if resp, err := c.Do(req); err == nil {
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				}
			})
		}
	}
	wg.Wait()
}

// snapshot returns copies of what the run saw so far.
func (r *run) snapshot() ([]record, []attempt) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]record(nil), r.records...), append([]attempt(nil), r.attempts...)
}

// close ends the run's connections and servers. Every request must have
// ended.
func (r *run) close() {
	if r.client != nil {
		r.client.CloseIdleConnections()
	}
	r.base.CloseIdleConnections()
	for _, s := range r.servers {
		s.close()
	}
}

// event is a change of a circuit's state, as Config.OnStateChange reports it.
type event struct {
	at       time.Duration
	upstream string
	msg      string // "circuit open", "circuit half-open", "circuit closed"
	from     string // the state before
}

// eventLog keeps the Transport's state changes with their exact times,
// without polling Health.
type eventLog struct {
	start time.Time
	mu    sync.Mutex
	evs   []event
}

// record is the Transport's Config.OnStateChange.
func (l *eventLog) record(c failover.StateChange) {
	e := event{at: c.At.Sub(l.start), upstream: c.Upstream, msg: "circuit " + c.To.String(), from: c.From.String()}
	l.mu.Lock()
	l.evs = append(l.evs, e)
	l.mu.Unlock()
}

func (l *eventLog) events() []event {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]event(nil), l.evs...)
}

// drill runs the outage drill as o says and writes the table (or JSON) to
// out. It returns when every request, server and goroutine it started has
// ended.
func drill(ctx context.Context, o options, out io.Writer) error {
	switch {
	case o.Duration <= 0:
		return errors.New("-duration must be positive")
	case o.RPS <= 0:
		return errors.New("-rps must be positive")
	case o.Timescale <= 0:
		return errors.New("-timescale must be positive")
	case o.Plot != "" && plotFormat(o.Plot) == "":
		return fmt.Errorf("-plot %s: want a .png or .svg file", o.Plot)
	}
	if o.Model == "" {
		o.Model = "gpt-4o-mini"
	}
	phases := script(o.Duration)

	plain := &run{name: "plain", base: newBase(), hosts: map[string]int{}}
	fo := &run{name: "failover", base: newBase(), hosts: map[string]int{}, events: &eventLog{}}
	runs := []*run{plain, fo}
	defer func() {
		for _, r := range runs {
			r.close()
		}
	}()

	// The plain run: one primary, the caller aimed at it.
	p := newFakeUpstream(profiles[0], o.Timescale, phases)
	plain.servers = []*fakeUpstream{p}
	plain.names = []string{profiles[0].name}
	plain.hosts[p.srv.Listener.Addr().String()] = 0
	plain.url = p.baseURL() + "/chat/completions"
	plain.client = &http.Client{Transport: &counter{next: plain.base, r: plain}, Timeout: o.scaled(callerTimeout)}

	// The failover run: its own primary with the same script, then the
	// backups, local or real.
	fp := newFakeUpstream(profiles[0], o.Timescale, phases)
	fo.servers = []*fakeUpstream{fp}
	ups := []failover.Upstream{{Name: profiles[0].name, BaseURL: fp.baseURL()}}
	if len(o.Upstreams) == 0 {
		for _, prof := range profiles[1:] {
			s := newFakeUpstream(prof, o.Timescale, nil)
			fo.servers = append(fo.servers, s)
			ups = append(ups, failover.Upstream{Name: prof.name, BaseURL: s.baseURL()})
		}
	} else {
		for _, ru := range o.Upstreams {
			u := failover.Upstream{Name: ru.Name, BaseURL: ru.BaseURL}
			if ru.Key != "" {
				u.Header = http.Header{"Authorization": {"Bearer " + ru.Key}}
			}
			ups = append(ups, u)
		}
	}
	for i, u := range ups {
		pu, err := url.Parse(u.BaseURL)
		if err != nil {
			return fmt.Errorf("upstream %s: %v", u.Name, err)
		}
		fo.names = append(fo.names, u.Name)
		fo.hosts[pu.Host] = i
	}
	fo.url = fp.baseURL() + "/chat/completions"
	router, err := newRouter(o.Router)
	if err != nil {
		return err
	}
	ft, err := failover.New(failover.Config{
		Upstreams:      ups,
		Base:           &counter{next: fo.base, r: fo},
		Breaker:        failover.BreakerConfig{Cooldown: o.scaled(breakerCooldown)},
		RateLimit:      failover.RateLimitConfig{DefaultCooldown: o.scaled(defaultCooldown), MaxCooldown: o.scaled(maxCooldown)},
		AttemptTimeout: o.attemptTimeout(),
		OnStateChange:  fo.events.record,
		Router:         router,
	})
	if err != nil {
		return err
	}
	fo.ft = ft
	fo.client = &http.Client{Transport: ft, Timeout: o.scaled(callerTimeout)}

	stopListen := func() {}
	if o.Listen != "" {
		stop, err := serveMetrics(o.Listen, ft)
		if err != nil {
			return err
		}
		stopListen = stop
	}
	defer stopListen()

	bodies := [2][]byte{requestBody(o.Model, false), requestBody(o.Model, true)}
	for _, r := range runs {
		r.warm(ctx, bodies[0])
	}

	start := time.Now()
	for _, r := range runs {
		r.start = start
		for _, s := range r.servers {
			s.begin(start)
		}
	}
	fo.events.start = start

	var bg sync.WaitGroup // the status loop
	statusDone := make(chan struct{})
	if o.Status != nil {
		st := &status{w: o.Status, tty: o.StatusTTY, runs: runs, phases: phases, start: start, total: o.Duration}
		bg.Go(func() { st.loop(statusDone) })
	}

	// Open-loop load: request i of each run is due at start + i/rps,
	// whatever happened to the ones before.
	var reqs sync.WaitGroup
	n := int(o.Duration.Seconds() * o.RPS)
	interval := time.Duration(float64(time.Second) / o.RPS)
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
schedule:
	for i := range n {
		due := time.Duration(i) * interval
		if d := time.Until(start.Add(due)); d > 0 {
			timer.Reset(d)
			select {
			case <-ctx.Done():
				break schedule
			case <-timer.C:
			}
		}
		stream := i%2 == 1
		for _, r := range runs {
			reqs.Go(func() { r.fire(ctx, due, bodies[b2i(stream)], stream) })
		}
	}
	reqs.Wait()
	close(statusDone)
	bg.Wait()
	if err := ctx.Err(); err != nil {
		return err
	}

	rep := buildReport(o, phases, runs)
	if o.Plot != "" {
		if err := writePlot(o.Plot, o, phases, runs, rep); err != nil {
			return err
		}
	}
	if o.JSON {
		enc := json.NewEncoder(out)
		enc.SetIndent("", "  ")
		return enc.Encode(rep)
	}
	return writeTable(out, rep)
}

// attemptTimeout is a few times the slowest upstream's p99, scaled.
func (o options) attemptTimeout() time.Duration {
	var worst time.Duration
	for _, p := range profiles {
		worst = max(worst, p.p99)
	}
	return o.scaled(attemptTimeouts * worst)
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// requestBody is a small chat completion request.
func requestBody(model string, stream bool) []byte {
	b, _ := json.Marshal(map[string]any{
		"model":      model,
		"messages":   []map[string]string{{"role": "user", "content": "Say hello."}},
		"max_tokens": 8,
		"stream":     stream,
	})
	return b
}

// serveMetrics serves /metrics and /health for t on addr until the
// returned function is called.
func serveMetrics(addr string, t *failover.Transport) (stop func(), err error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("-listen: %v", err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /metrics", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; version=0.0.4")
		t.WritePrometheus(w)
	})
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		enc.Encode(t.Health())
	})
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	served := make(chan struct{})
	go func() {
		defer close(served)
		srv.Serve(ln)
	}()
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		if srv.Shutdown(ctx) != nil {
			srv.Close()
		}
		<-served
	}, nil
}

// newRouter returns the routing policy named by -router.
func newRouter(name string) (failover.Router, error) {
	switch name {
	case "", "priority":
		return nil, nil // the default: the configured order
	case "weighted":
		return &failover.Weighted{}, nil
	case "leastlatency":
		return failover.LeastLatency{}, nil
	case "score":
		return failover.Score{}, nil
	}
	return nil, fmt.Errorf("-router %q: want priority, weighted, leastlatency or score", name)
}
