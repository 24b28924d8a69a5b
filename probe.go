package failover

import (
	"context"
	"errors"
	"fmt"
	"log"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"runtime/debug"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/failover-go/failover/internal/circuit"
	"github.com/failover-go/failover/internal/redact"
)

// ProbeConfig configures active health probes: a background loop that sends
// each upstream a cheap request every Interval, so that a provider that went
// down is known before users hit it, and one that came back is tried before
// its circuit's open time ends. A failing probe counts like a failed request;
// a succeeding one moves an open circuit to half-open, so that the next
// request probes it. Probes carry the upstream's Header and are counted in
// failover_probes_total, not in Health's request counts.
type ProbeConfig struct {
	// Interval between two probes of one upstream, each jittered by up
	// to ±10 % so that a fleet does not probe in lockstep; at least
	// 100ms. Zero means no probes (and no background goroutine).
	Interval time.Duration

	// Timeout bounds one probe. Zero means Interval, at most 10s.
	Timeout time.Duration

	// Request builds the probe of an upstream; the Transport then sets
	// the upstream's Header and Query on it. Nil means GET
	// {BaseURL}/models; for a BaseURL with {deployment}, which a probe
	// has no model to fill, the path before that segment, less a last
	// "deployments" segment, and /models (Azure OpenAI's classic
	// /openai/deployments/{deployment} lists its models at
	// /openai/models). A chat completion with max_tokens 1 suits
	// providers without a models list. An error
	// or a nil request skips that probe and is logged. The probe ends at
	// Timeout and at Close, whatever its request's context. A panic
	// during a probe is logged and the probe counts for nothing.
	Request func(ctx context.Context, u Upstream) (*http.Request, error)
}

// errNoProbeRequest is a ProbeConfig.Request that returned neither a
// request nor an error.
var errNoProbeRequest = errors.New("ProbeConfig.Request returned neither a request nor an error")

func (c ProbeConfig) validate() error {
	switch {
	case c.Interval < 0:
		return configError("Probe.Interval", "must not be negative")
	case c.Interval > 0 && c.Interval < minProbeInterval:
		return configError("Probe.Interval", "must be at least 100ms")
	case c.Timeout < 0:
		return configError("Probe.Timeout", "must not be negative")
	}
	return nil
}

// minProbeInterval is the shortest Probe.Interval: a shorter one would
// spin.
const minProbeInterval = 100 * time.Millisecond

// prober runs the probe loops of a Transport. It holds what a probe needs,
// not the Transport, so that its loops leave a Transport dropped without
// Close unreachable (see background).
type prober struct {
	cfg      ProbeConfig
	base     http.RoundTripper
	classify Classifier
	logger   *slog.Logger
	secrets  []string        // the upstreams' own, scrubbed from what is logged
	creds    *credentials    // the credential rule, for what an Authorizer set
	ctx      context.Context // canceled by Close
	cancel   context.CancelFunc
	wg       sync.WaitGroup
	stages   []atomic.Int32 // by upstream index: where its probe is, for Close's log
}

// Where a probe is: what Close names when it leaves a probe behind.
const (
	probeIdle     = iota
	probeBuilding // in Probe.Request
	probeSending  // in Base
	probeJudging  // reading the answer: Classify, the circuit's hooks
)

var probeStages = [...]string{probeBuilding: "in Probe.Request", probeSending: "in Base", probeJudging: "judging its answer"}

// stop ends the probe loops and waits for them until deadline. It returns
// what the probes left running are doing, by upstream ("a in Base"), in
// the order of the upstreams: user code (a Base that ignores its
// context, a Probe.Request that blocks) ends on its own, and what it
// returns then is dropped.
func (p *prober) stop(ups []*upstream, deadline time.Time) []string {
	p.cancel()
	done := make(chan struct{})
	go func() {
		p.wg.Wait()
		close(done)
	}()
	select {
	case <-done:
		return nil
	default:
	}
	wait := time.NewTimer(time.Until(deadline))
	defer wait.Stop()
	select {
	case <-done:
		return nil
	case <-wait.C:
	}
	var left []string
	for _, u := range ups {
		if st := p.stages[u.index].Load(); st != probeIdle {
			left = append(left, u.name+" "+probeStages[st])
		}
	}
	return left
}

// startProbes starts one loop per upstream, when probes are configured,
// and returns their prober; nil without probes.
func (t *Transport) startProbes(cfg ProbeConfig) *prober {
	if cfg.Interval == 0 {
		return nil
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = min(cfg.Interval, 10*time.Second)
	}
	ctx, cancel := context.WithCancel(context.Background())
	p := &prober{cfg: cfg, base: t.base, classify: t.classify, logger: t.logger, secrets: t.creds.upstreamSecrets, creds: t.creds,
		ctx: ctx, cancel: cancel, stages: make([]atomic.Int32, len(t.upstreams))}
	for _, u := range t.upstreams {
		p.wg.Add(1)
		go p.loop(u)
	}
	return p
}

// modelsRequest is the probe of u when Probe.Request is nil: a GET of
// its models list (see ProbeConfig.Request).
func modelsRequest(ctx context.Context, u *upstream) (*http.Request, error) {
	path := u.rawPath
	if u.deployed {
		path = strings.TrimSuffix(path, "/deployments")
	}
	return http.NewRequestWithContext(ctx, http.MethodGet, u.scheme+"://"+u.host+path+"/models", nil)
}

func (p *prober) loop(u *upstream) {
	defer p.wg.Done()
	timer := time.NewTimer(jitter(p.cfg.Interval))
	defer timer.Stop()
	for {
		select {
		case <-p.ctx.Done():
			return
		case <-timer.C:
		}
		p.probe(u)
		timer.Reset(jitter(p.cfg.Interval))
	}
}

// jitter returns d give or take 10 %, saturating at the largest Duration.
func jitter(d time.Duration) time.Duration {
	j := time.Duration((rand.Float64() - 0.5) * 0.2 * float64(d))
	if j > maxDuration-d {
		return maxDuration
	}
	return d + j
}

// probe sends u one probe and records what it says. A panic is reported
// and the probe counts for nothing: on the probe loop's goroutine it would
// end the process. A probe that returns after Close (from user code that
// ignored its context) sends and records nothing more.
func (p *prober) probe(u *upstream) {
	if u.circuit.Check(time.Now()).Refusal == circuit.Probing {
		return // a real request is probing it
	}
	stage := &p.stages[u.index]
	defer func() {
		stage.Store(probeIdle)
		if v := recover(); v != nil {
			msg := fmt.Sprintf("failover: panic in the probe of %s: %v\n%s", u.name, v, debug.Stack())
			p.reportPanic(redact.String(msg, p.secrets))
		}
	}()
	ctx, cancel := context.WithTimeout(p.ctx, p.cfg.Timeout)
	defer cancel()
	stage.Store(probeBuilding)
	var req *http.Request
	var err error
	if p.cfg.Request != nil {
		req, err = p.cfg.Request(ctx, u.cfg)
	} else {
		req, err = modelsRequest(ctx, u)
	}
	if p.ctx.Err() != nil {
		return // closed while Request built it
	}
	if err == nil && req == nil {
		err = errNoProbeRequest
	}
	if err != nil {
		p.log(slog.LevelError, "probe request: "+redact.String(err.Error(), p.secrets), u)
		return
	}
	if rctx := req.Context(); rctx != ctx {
		// Built with a context of its own (http.NewRequest): the
		// probe's Timeout and Close still end it.
		bounded, stop := context.WithCancel(rctx)
		defer stop()
		defer context.AfterFunc(ctx, stop)()
		req = req.WithContext(bounded)
	}
	if req.Header == nil {
		req.Header = make(http.Header)
	}
	for k, v := range u.header {
		req.Header[k] = v
	}
	if k := u.probeKey(time.Now()); k != nil {
		k.setKey(req.Header)
	}
	if len(u.queryNames) > 0 && req.URL != nil {
		q := *req.URL // the URL may be shared with what built it
		q.RawQuery = u.withQuery(q.RawQuery)
		req.URL = &q
	}
	if !p.authorizeProbe(u, req) {
		return
	}
	stage.Store(probeSending)
	resp, err := p.base.RoundTrip(req)
	if p.ctx.Err() != nil {
		// Closed while Base had it: what it says is dropped, a
		// failure of Close's own making above all.
		if resp != nil {
			discard(resp)
		}
		return
	}
	stage.Store(probeJudging)
	o := p.classify(resp, err) // the probe's timeout is the upstream's failure
	if resp != nil {
		discard(resp)
	}
	if p.ctx.Err() != nil {
		return
	}
	u.m.probes[o].Inc()
	u.circuit.Probed(circuitResult(o, err), time.Now())
}

// log writes one record about u, as Transport.log does.
func (p *prober) log(level slog.Level, msg string, u *upstream) {
	if p.logger != nil && p.logger.Enabled(context.Background(), level) {
		p.logger.LogAttrs(context.Background(), level, "failover: "+msg, slog.String("upstream", u.name))
	}
}

// reportPanic reports a panic recovered in a probe, as
// Transport.reportPanic does.
func (p *prober) reportPanic(msg string) {
	if p.logger != nil {
		p.logger.Error(msg)
		return
	}
	log.Print(msg)
}
