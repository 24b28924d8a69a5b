package main

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/VictoriaMetrics/metrics"
	"github.com/redis/go-redis/v9"

	"github.com/failover-go/failover"
	"github.com/failover-go/failover/redisshared"
)

// options configure one drill; the flags of main fill them in.
type options struct {
	Duration  time.Duration // length of the drill; all runs play at once
	RPS       float64       // requests per second, per run
	Timescale float64       // factor on every provider-scale time
	Hedge     time.Duration // hedge delay at provider scale; 0: no hedged run
	JSON      bool          // write JSON instead of the table
	Plot      string        // .png or .svg file to draw, or ""
	Listen    string        // address for /metrics and /health, or ""
	Model     string        // model named in the request bodies
	Router    string        // routing policies, one failover run each: "priority,score", "all"; "" is priority
	Fleet     int           // members of each fleet run; 0: no fleets, one Transport per run
	Redis     string        // Redis of the sharing fleet, host:port or redis:// URL; "": start a redis-server
	Hogs      int           // CPU hogs to run beside the drill, child processes; 0: none

	NoLastResort bool // Config.LastResort.Off in every failover run
	Upstreams    []realUpstream

	// Status receives the live status; nil means none. StatusTTY redraws
	// it in place.
	Status    io.Writer
	StatusTTY bool

	// Warn receives the warning that the machine was too starved for
	// the figures to mean much, with -json (the table has it); nil
	// means none.
	Warn io.Writer

	// Scrape, when not nil, is called with the base URL of -listen's
	// server ("http://127.0.0.1:PORT") when the drill is over, before
	// the server stops: a test reads /metrics after all the traffic.
	Scrape func(base string)
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

// Timing of the runs, at provider scale before -timescale.
const (
	callerTimeout   = 30 * time.Second       // the caller's http.Client.Timeout, in every run
	breakerCooldown = 30 * time.Second       // failover.BreakerConfig.Cooldown, set
	sharedSync      = 1 * time.Second        // failover.Config.SharedSync (its default)
	defaultCooldown = 1 * time.Second        // failover.RateLimitConfig.DefaultCooldown (its default)
	maxCooldown     = 60 * time.Second       // failover.RateLimitConfig.MaxCooldown (its default)
	recentWindow    = 30 * time.Second       // failover.DegradedConfig.Window (its default): "recent" figures
	hangFloor       = 100 * time.Millisecond // failover.HangConfig.Floor (its default)
	attemptTimeouts = 3                      // AttemptTimeout is this many times the slowest p99
)

// hangMultiple is the failover runs' failover.HangConfig.Multiple, its
// default; see options.hangConfig.
const hangMultiple = 1

// breakerThreshold is failover.BreakerConfig.FailureThreshold (its
// default): consecutive failures that open a circuit.
const breakerThreshold = 5

// The primary's own breaker (failover.Upstream.Breaker), at provider scale,
// as in the field's reference setup: it trips after 3 consecutive failures
// and is probed again after 15 s, where the backups keep Config.Breaker
// (breakerThreshold, the default, and breakerCooldown).
const (
	primaryThreshold = 3
	primaryCooldown  = 15 * time.Second
)

// primaryBreaker is the primary's Upstream.Breaker, scaled.
func (o options) primaryBreaker() *failover.BreakerConfig {
	return &failover.BreakerConfig{FailureThreshold: primaryThreshold, Cooldown: o.scaled(primaryCooldown)}
}

// record is one request of the caller.
type record struct {
	start   time.Duration // when it was due, since the drill began
	end     time.Duration // when the caller had its answer
	latency time.Duration // end-to-end, the body read to its end
	ok      bool          // a 200 with the whole body (a stream to [DONE])
}

// attempt is one request that reached an upstream (or was sent to it).
type attempt struct {
	at       time.Duration // when it was sent
	upstream int
	member   int  // which of the run's members sent it
	ok       bool // it was answered with a 2xx
}

// run is one of the drill's runs, the plain one or a failover one: a
// caller with an http.Client, or a fleet of them, and what it saw.
type run struct {
	name    string  // column heading: "plain", "failover", "failover (score)", "fleet, sharing on"
	spec    runSpec // the failover Transports' configuration
	members []*member
	url     string   // where the caller sends each request
	names   []string // upstreams, primary first
	hosts   map[string]int
	servers []*fakeUpstream
	start   time.Time

	inflight atomic.Int64 // requests the caller still waits for

	mu       sync.Mutex
	records  []record
	attempts []attempt
}

// member is one http.Client of a run and what is under it: the run's only
// one, or one process of a fleet run, with a Transport, connections and
// state of its own.
type member struct {
	client  *http.Client
	base    *http.Transport
	ft      *failover.Transport // nil in the plain run
	events  *eventLog           // nil in the plain run
	metrics *metrics.Set        // ft's metrics; nil in the plain run
	rdb     *redis.Client       // its own client of the fleet's Redis; nil with sharing off
}

// transport returns the run's Transport, its first member's in a fleet
// run; nil in the plain run.
func (r *run) transport() *failover.Transport { return r.members[0].ft }

// counter counts the attempts that a member's Base RoundTripper sends to
// each upstream, and which were answered with a 2xx.
type counter struct {
	next   http.RoundTripper
	r      *run
	member int
}

func (c *counter) RoundTrip(req *http.Request) (*http.Response, error) {
	i, ok := c.r.hosts[req.URL.Host]
	if !ok {
		return c.next.RoundTrip(req)
	}
	at := time.Since(c.r.start)
	c.r.mu.Lock()
	n := len(c.r.attempts)
	c.r.attempts = append(c.r.attempts, attempt{at: at, upstream: i, member: c.member})
	c.r.mu.Unlock()
	resp, err := c.next.RoundTrip(req)
	if err == nil && resp.StatusCode/100 == 2 {
		c.r.mu.Lock()
		c.r.attempts[n].ok = true
		c.r.mu.Unlock()
	}
	return resp, err
}

// newBase returns the http.Transport under each run's client: the
// default one, with room for the connections that hung requests hold.
func newBase() *http.Transport {
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.MaxIdleConns = 1024
	t.MaxIdleConnsPerHost = 512
	return t
}

// fire sends one request through m and records what the caller saw.
func (r *run) fire(ctx context.Context, m *member, due time.Duration, body []byte, stream bool) {
	r.inflight.Add(1)
	begin := time.Now()
	ok := r.do(ctx, m.client, body, stream)
	end := time.Now()
	r.inflight.Add(-1)
	r.mu.Lock()
	r.records = append(r.records, record{start: due, end: end.Sub(r.start), latency: end.Sub(begin), ok: ok})
	r.mu.Unlock()
}

func (r *run) do(ctx context.Context, client *http.Client, body []byte, stream bool) bool {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, r.url, bytes.NewReader(body))
	if err != nil {
		return false
	}
	req.Header.Set("Content-Type", "application/json")
	if stream {
		req.Header.Set("Accept", "text/event-stream")
	}
	resp, err := client.Do(req)
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

// warmConns is how many connections to each local server a run opens
// before the drill starts, so that the first second does not measure
// dials; a fleet's members share them out, at least 2 each.
const warmConns = 16

// warm opens connections to the run's local servers, around the counter and
// the failover Transport, so that nothing of it is measured.
func (r *run) warm(ctx context.Context, body []byte) {
	per := max(2, warmConns/len(r.members))
	var wg sync.WaitGroup
	for _, m := range r.members {
		c := &http.Client{Transport: m.base, Timeout: 5 * time.Second}
		for _, s := range r.servers {
			for range per {
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
	}
	wg.Wait()
}

// snapshot returns copies of what the run saw so far.
func (r *run) snapshot() ([]record, []attempt) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]record(nil), r.records...), append([]attempt(nil), r.attempts...)
}

// close ends the run's Transports, connections and servers. Every
// request must have ended.
func (r *run) close() {
	for _, m := range r.members {
		m.close()
	}
	for _, s := range r.servers {
		s.close()
	}
}

// close stops the member's Transport (and with it the goroutines of
// Config.Shared), then closes its Redis client and idle connections.
func (m *member) close() {
	if m.ft != nil {
		m.ft.Close()
	}
	if m.rdb != nil {
		m.rdb.Close()
	}
	if m.client != nil {
		m.client.CloseIdleConnections()
	}
	m.base.CloseIdleConnections()
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

// events returns the changes so far in the order they happened, which
// is not always the order they were reported in.
func (l *eventLog) events() []event {
	l.mu.Lock()
	evs := append([]event(nil), l.evs...)
	l.mu.Unlock()
	slices.SortStableFunc(evs, func(a, b event) int { return cmp.Compare(a.at, b.at) })
	return evs
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
	case o.Hedge < 0:
		return errors.New("-hedge must not be negative")
	case o.Plot != "" && plotFormat(o.Plot) == "":
		return fmt.Errorf("-plot %s: want a .png or .svg file", o.Plot)
	case o.Hogs < 0 || o.Hogs > maxHogs:
		return fmt.Errorf("-hogs %d: want 0 to %d", o.Hogs, maxHogs)
	}
	if o.Model == "" {
		o.Model = "gpt-4o-mini"
	}
	policies, err := parseRouters(o.Router)
	if err != nil {
		return err
	}
	specs := failoverSpecs(policies, o.Hedge > 0)
	if o.Fleet != 0 || o.Redis != "" {
		if err := checkFleet(o, policies); err != nil {
			return err
		}
		rs, err := connectRedis(ctx, o.Redis)
		if err != nil {
			return err
		}
		defer rs.stop()
		sh := &sharing{redis: rs, prefix: newPrefix(), sync: o.sharedSync()}
		specs = []runSpec{{policy: policies[0], fleet: o.Fleet}, {policy: policies[0], fleet: o.Fleet, shared: sh}}
	}
	phases := script(o.Duration)
	if o.Hogs > 0 {
		h, err := startHogs(o.Hogs)
		if err != nil {
			return err
		}
		defer h.stop()
	}

	var runs []*run
	defer func() {
		for _, r := range runs {
			r.close()
		}
	}()
	runs = append(runs, newPlainRun(o, phases))
	for _, sp := range specs {
		r, err := newFailoverRun(o, phases, sp, len(specs) > 1 || sp.policy != "priority")
		if err != nil {
			return err
		}
		runs = append(runs, r)
	}

	stopListen := func() {}
	if o.Listen != "" {
		stop, addr, err := serveMetrics(o.Listen, runs[1:])
		if err != nil {
			return err
		}
		stopListen = func() {
			if o.Scrape != nil {
				o.Scrape("http://" + addr)
			}
			stop()
		}
	}
	defer stopListen()

	bodies := [2][]byte{requestBody(o.Model, false), requestBody(o.Model, true)}
	for _, r := range runs {
		r.warm(ctx, bodies[0])
	}
	for _, r := range runs {
		if err := r.waitShared(ctx); err != nil {
			return err
		}
	}

	start := time.Now()
	for _, r := range runs {
		r.start = start
		for _, s := range r.servers {
			s.begin(start)
		}
		for _, m := range r.members {
			if m.events != nil {
				m.events.start = start
			}
		}
	}

	lag := startLag(start)
	defer lag.stop()

	var bg sync.WaitGroup // the status loop
	statusDone := make(chan struct{})
	if o.Status != nil {
		st := &status{w: o.Status, tty: o.StatusTTY, runs: runs, phases: phases, start: start, total: o.Duration, lag: lag}
		bg.Go(func() { st.loop(statusDone) })
	}

	// Open-loop load: request i of each run is due at start + i/rps,
	// whatever happened to the ones before. In a fleet run, member i mod
	// N sends it: each member sends every N/rps, in turn.
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
			m := r.members[i%len(r.members)]
			reqs.Go(func() { r.fire(ctx, m, due, bodies[b2i(stream)], stream) })
		}
	}
	reqs.Wait()
	lag.stop()
	close(statusDone)
	bg.Wait()
	if err := ctx.Err(); err != nil {
		return err
	}

	rep := buildReport(o, phases, runs)
	rep.Lag = lag.report(o, phases)
	if o.Plot != "" {
		if err := writePlot(o.Plot, o, phases, runs, rep); err != nil {
			return err
		}
		if rep.Plot, err = filepath.Abs(o.Plot); err != nil {
			rep.Plot = o.Plot
		}
	}
	if o.JSON {
		if rep.Lag.Starved && o.Warn != nil {
			var b strings.Builder
			wrap(&b, "drill: warning: "+rep.Lag.Warning, lineWidth)
			io.WriteString(o.Warn, b.String())
		}
		enc := json.NewEncoder(out)
		enc.SetIndent("", "  ")
		return enc.Encode(rep)
	}
	return writeTable(out, rep)
}

// newPlainRun returns the plain run: one primary playing the script, the
// caller's http.Client aimed at it.
func newPlainRun(o options, phases []phase) *run {
	r := &run{name: "plain", hosts: map[string]int{}}
	p := newFakeUpstream(profiles[0], o.Timescale, phases)
	r.servers = []*fakeUpstream{p}
	r.names = []string{profiles[0].name}
	r.hosts[p.srv.Listener.Addr().String()] = 0
	r.url = p.baseURL() + "/chat/completions"
	m := &member{base: newBase()}
	m.client = &http.Client{Transport: &counter{next: m.base, r: r}, Timeout: o.scaled(callerTimeout)}
	r.members = []*member{m}
	return r
}

// runSpec says how one failover run's Transports are configured.
type runSpec struct {
	policy string   // routing policy, as -router names it
	hedge  bool     // Config.Hedge with -hedge's delay
	fleet  int      // members of a fleet run, each a Transport; 0: one Transport
	shared *sharing // a fleet's Config.Shared; nil: sharing off
}

// key names the run in -listen paths: "priority", "score",
// "priority+hedge", and for fleet runs "fleet" and "fleet+shared".
func (sp runSpec) key() string {
	switch {
	case sp.fleet > 0 && sp.shared != nil:
		return "fleet+shared"
	case sp.fleet > 0:
		return "fleet"
	case sp.hedge:
		return sp.policy + "+hedge"
	}
	return sp.policy
}

// name is the run's column heading: "failover", "failover (key)" when
// qualified, and for fleet runs "fleet, sharing off" and "fleet, sharing
// on", "fleet (score), sharing on" with another policy than priority.
func (sp runSpec) name(qualified bool) string {
	switch {
	case sp.fleet > 0:
		n := "fleet"
		if sp.policy != "priority" {
			n += " (" + sp.policy + ")"
		}
		if sp.shared != nil {
			return n + ", sharing on"
		}
		return n + ", sharing off"
	case qualified:
		return "failover (" + sp.key() + ")"
	}
	return "failover"
}

// failoverSpecs returns the failover runs: one per policy, and with
// hedging one more, the first policy hedged.
func failoverSpecs(policies []string, hedge bool) []runSpec {
	var specs []runSpec
	for _, p := range policies {
		specs = append(specs, runSpec{policy: p})
	}
	if hedge {
		specs = append(specs, runSpec{policy: policies[0], hedge: true})
	}
	return specs
}

// newFailoverRun returns a failover run: its own primary playing the
// script, then the backups, local or real, behind a failover.Transport
// configured as sp says, or a fleet of sp.fleet of them, each with its
// own http.Transport and state, as processes have. Its name is as
// sp.name says.
func newFailoverRun(o options, phases []phase, sp runSpec, qualified bool) (*run, error) {
	r := &run{name: sp.name(qualified), spec: sp, hosts: map[string]int{}}
	fp := newFakeUpstream(profiles[0], o.Timescale, phases)
	r.servers = []*fakeUpstream{fp}
	ups := []failover.Upstream{{Name: profiles[0].name, BaseURL: fp.baseURL(), Breaker: o.primaryBreaker(), Cost: profiles[0].cost}}
	if len(o.Upstreams) == 0 {
		for _, prof := range profiles[1:] {
			s := newFakeUpstream(prof, o.Timescale, nil)
			r.servers = append(r.servers, s)
			ups = append(ups, failover.Upstream{Name: prof.name, BaseURL: s.baseURL(), Cost: prof.cost})
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
			r.close()
			return nil, fmt.Errorf("upstream %s: %v", u.Name, err)
		}
		r.names = append(r.names, u.Name)
		r.hosts[pu.Host] = i
	}
	r.url = fp.baseURL() + "/chat/completions"
	for i := range max(sp.fleet, 1) {
		m, err := newMember(o, r, i, ups)
		if err != nil {
			r.close()
			return nil, err
		}
		r.members = append(r.members, m)
	}
	return r, nil
}

// newMember returns member i of r: a failover.Transport over ups, with an
// http.Transport, metrics and, when r shares, a Redis client of its own.
func newMember(o options, r *run, i int, ups []failover.Upstream) (*member, error) {
	sp := r.spec
	router, err := newRouter(sp.policy)
	if err != nil {
		return nil, err
	}
	m := &member{base: newBase(), events: &eventLog{}, metrics: metrics.NewSet()}
	cfg := failover.Config{
		Upstreams:      ups,
		Base:           &counter{next: m.base, r: r, member: i},
		Router:         router,
		Breaker:        failover.BreakerConfig{FailureThreshold: breakerThreshold, Cooldown: o.scaled(breakerCooldown)},
		RateLimit:      failover.RateLimitConfig{DefaultCooldown: o.scaled(defaultCooldown), MaxCooldown: o.scaled(maxCooldown)},
		Hang:           o.hangConfig(),
		Degraded:       failover.DegradedConfig{Window: o.scaled(recentWindow)},
		AttemptTimeout: o.attemptTimeout(),
		LastResort:     failover.LastResortConfig{Off: o.NoLastResort},
		Metrics:        m.metrics,
		OnStateChange:  m.events.record,
	}
	if sp.hedge {
		cfg.Hedge = &failover.HedgeConfig{Delay: o.scaled(o.Hedge)}
	}
	if sh := sp.shared; sh != nil {
		m.rdb = sh.redis.client()
		cfg.Shared = redisshared.New(m.rdb, redisshared.Options{Prefix: sh.prefix})
		cfg.SharedSync = sh.sync
	}
	ft, err := failover.New(cfg)
	if err != nil {
		m.close()
		return nil, err
	}
	m.ft = ft
	m.client = &http.Client{Transport: ft, Timeout: o.scaled(callerTimeout)}
	return m, nil
}

// hangConfig is the failover runs' hang detection: the defaults (an
// upstream is suspect once at least 3 requests wait on it and none sent
// to it for its recent p99 has answered), with the Floor of 100 ms scaled
// like every other time. Unscaled, the Floor would be twice the primary's
// p99 at the default timescale and set the pace alone.
//
// A hung primary takes a request every 5 ms at 200 req/s. The requests
// sent just before the hang go on answering for a few dozen milliseconds;
// their answers say nothing of the requests sent after the hang began,
// and the Transport does not count them as signs of life. One p99 of
// silence after the hang began is then about ten requests, and with the
// primary's own FailureThreshold of 3, the first timeout already leaves
// room for only two more (failover.ReasonFailing).
func (o options) hangConfig() failover.HangConfig {
	return failover.HangConfig{Floor: o.scaled(hangFloor)}
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

// requestBody is a small chat completion request; a streamed one asks
// for the usage in its last chunk, as a caller that bills must.
func requestBody(model string, stream bool) []byte {
	req := map[string]any{
		"model":      model,
		"messages":   []map[string]string{{"role": "user", "content": "Say hello."}},
		"max_tokens": 8,
		"stream":     stream,
	}
	if stream {
		req["stream_options"] = map[string]bool{"include_usage": true}
	}
	b, _ := json.Marshal(req)
	return b
}

// serveMetrics serves metricsMux(runs) on addr until the returned function
// is called, and returns the address it listens on (addr's port may be 0).
func serveMetrics(addr string, runs []*run) (stop func(), listening string, err error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, "", fmt.Errorf("-listen: %v", err)
	}
	mux := metricsMux(runs)
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
	}, ln.Addr().String(), nil
}

// metricsMux serves /metrics (Prometheus text) and /health (Health() as
// JSON) of the first of runs, and /metrics/KEY and /health/KEY of each,
// KEY being runSpec.key: "score", "priority+hedge", "fleet+shared"; in a
// fleet run, those of its first member, and /metrics/KEY/I and
// /health/KEY/I those of member I, from 0.
func metricsMux(runs []*run) *http.ServeMux {
	byKey := map[string]*run{"": runs[0]}
	for _, r := range runs {
		byKey[r.spec.key()] = r
	}
	find := func(w http.ResponseWriter, req *http.Request) *failover.Transport {
		r, ok := byKey[req.PathValue("run")]
		i := 0
		if s := req.PathValue("member"); ok && s != "" {
			n, err := strconv.Atoi(s)
			ok = err == nil && n >= 0 && n < len(r.members) && s == strconv.Itoa(n)
			i = n
		}
		if !ok {
			http.NotFound(w, req)
			return nil
		}
		return r.members[i].ft
	}
	writeMetrics := func(w http.ResponseWriter, req *http.Request) {
		if t := find(w, req); t != nil {
			w.Header().Set("Content-Type", "text/plain; version=0.0.4")
			t.WritePrometheus(w)
		}
	}
	writeHealth := func(w http.ResponseWriter, req *http.Request) {
		if t := find(w, req); t != nil {
			w.Header().Set("Content-Type", "application/json")
			enc := json.NewEncoder(w)
			enc.SetIndent("", "  ")
			enc.Encode(t.Health())
		}
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /metrics", writeMetrics)
	mux.HandleFunc("GET /metrics/{run}", writeMetrics)
	mux.HandleFunc("GET /metrics/{run}/{member}", writeMetrics)
	mux.HandleFunc("GET /health", writeHealth)
	mux.HandleFunc("GET /health/{run}", writeHealth)
	mux.HandleFunc("GET /health/{run}/{member}", writeHealth)
	return mux
}

// policies are the routing policies that -router names, in the order
// "all" runs them.
var policies = []string{"priority", "weighted", "leastlatency", "score"}

// parseRouters reads -router: a comma-separated list of policies, or
// "all" for every one. Empty means priority.
func parseRouters(list string) ([]string, error) {
	if strings.TrimSpace(list) == "" {
		return []string{"priority"}, nil
	}
	var out []string
	for name := range strings.SplitSeq(list, ",") {
		name = strings.ToLower(strings.TrimSpace(name))
		names := []string{name}
		if name == "all" {
			names = policies
		} else if !slices.Contains(policies, name) {
			return nil, fmt.Errorf("-router %q: want a comma-separated list of priority, weighted, leastlatency and score, or all", name)
		}
		for _, n := range names {
			if !slices.Contains(out, n) {
				out = append(out, n)
			}
		}
	}
	return out, nil
}

// newRouter returns the routing policy that -router names.
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
