package failover

import (
	"fmt"
	"maps"
	"math"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/failover-go/failover/internal/circuit"
)

// upstream is the configuration and live state of one upstream.
type upstream struct {
	cfg     Upstream // as configured, for probes
	index   int
	name    string
	baseURL string // redacted: scheme, host and path only
	scheme  string
	host    string // as configured, for the rewritten URL and Host header
	path    string // decoded base path, no trailing slash
	rawPath string // escaped base path, no trailing slash
	header  http.Header
	headers []headerField // header's fields in a slice, sorted by key: what each request reads (rewrite)
	lens    uint64        // bit n set: a key of headers is n bytes long (n < 64), or, bit 63, 63 or more (sets)
	models  modelMap      // Upstream.Models

	// The policy in effect (policy.go): Upstream.Breaker over
	// Config.Breaker with the defaults filled in, and Upstream's
	// AttemptTimeout, else Config's (0: none).
	breaker BreakerConfig
	timeout time.Duration

	circuit  *circuit.Circuit
	timedOut atomic.Int64 // mono.Time of its last attempt that timed out (AttemptTimeout)
	cd       cooldown
	window   window
	live     liveness
	latency  peakEWMA // for LeastLatency
	headroom headroomState
	fleet    fleetState // with Config.Shared
	auth     authState
	m        upstreamMetrics
	usage    usageState

	// The recent figures of each feature's window: Degraded's (which the
	// routers read too), Hang's and Hedge's. Features with the same
	// window share one.
	recent, hangRecent, hedgeRecent *recent
}

// newUpstream checks and parses the i-th upstream's config.
func newUpstream(i int, uc Upstream) (*upstream, error) {
	field := func(f string) string { return fmt.Sprintf("Upstreams[%d].%s", i, f) }
	base, err := url.Parse(uc.BaseURL)
	switch {
	case uc.BaseURL == "":
		return nil, configError(field("BaseURL"), "is empty")
	case err != nil:
		return nil, configError(field("BaseURL"), "is not a URL") // err may quote the URL
	case base.Scheme != "http" && base.Scheme != "https":
		return nil, configError(field("BaseURL"), "must be an absolute http or https URL")
	case base.Host == "" || base.Hostname() == "":
		return nil, configError(field("BaseURL"), "has no host")
	case !validPort(base.Port()):
		return nil, configError(field("BaseURL"), "has a port outside 1-65535")
	case base.User != nil:
		return nil, configError(field("BaseURL"), "must not carry user info: put credentials in Header")
	case base.RawQuery != "" || base.ForceQuery:
		return nil, configError(field("BaseURL"), "must not carry a query: put credentials in Header")
	case base.Fragment != "":
		return nil, configError(field("BaseURL"), "must not carry a fragment")
	case hasDotSegment(base.Path):
		return nil, configError(field("BaseURL"), "must not contain . or .. path segments")
	}
	name := uc.Name
	if name == "" {
		name = base.Host
	}
	if strings.ContainsFunc(name, func(r rune) bool { return r < ' ' || r == 0x7f }) {
		return nil, configError(field("Name"), "must not contain control characters")
	}
	switch {
	case uc.Weight < 0 || uc.Weight != uc.Weight:
		return nil, configError(field("Weight"), "must not be negative")
	case !price(uc.Cost.Input) || !price(uc.Cost.Output) || !price(uc.Cost.CachedInput) || !price(uc.Cost.CacheWrite):
		return nil, configError(field("Cost"), "prices must be finite, not negative and at most 1e100")
	}
	if err := uc.validatePolicy(i); err != nil {
		return nil, err
	}
	for k, vs := range uc.Header {
		if !validHeaderName(k) {
			return nil, configError(field("Header"), fmt.Sprintf("has an invalid header name %q", k))
		}
		for _, v := range vs {
			if strings.ContainsFunc(v, headerControl) {
				// Never quote the value: it is likely a key.
				return nil, configError(field("Header"), fmt.Sprintf("has an invalid value for %q", k))
			}
		}
	}
	u := &upstream{
		cfg:     uc,
		index:   i,
		name:    name,
		baseURL: base.Scheme + "://" + base.Host + base.EscapedPath(),
		scheme:  base.Scheme,
		host:    base.Host,
		path:    base.Path,
		rawPath: base.EscapedPath(),
		header:  http.Header{},
	}
	if strings.HasSuffix(u.rawPath, "/") { // a literal slash, not %2F
		u.rawPath = u.rawPath[:len(u.rawPath)-1]
		u.path = strings.TrimSuffix(u.path, "/")
	}
	for k, vs := range uc.Header {
		u.header[http.CanonicalHeaderKey(k)] = append([]string(nil), vs...)
	}
	for _, k := range slices.Sorted(maps.Keys(u.header)) {
		u.headers = append(u.headers, headerField{k, u.header[k]})
		u.lens |= lenBit(len(k))
	}
	if len(uc.Models) > 0 {
		if err := modelMap(uc.Models).validate(field("Models")); err != nil {
			return nil, err
		}
		u.models = maps.Clone(uc.Models)
	}
	return u, nil
}

// validPort reports whether p, a URL's port, is empty (the scheme's) or
// one a connection can have.
func validPort(p string) bool {
	n, err := strconv.ParseUint(p, 10, 16)
	return p == "" || err == nil && n > 0
}

// headerControl reports whether r is a control character that net/http
// refuses in a header value: any but HT.
func headerControl(r rune) bool { return r < ' ' && r != '\t' || r == 0x7f }

// finite reports whether x is neither NaN nor infinite.
func finite(x float64) bool { return !math.IsNaN(x) && !math.IsInf(x, 0) }

// maxPrice is the largest price New takes: an answer's cost at it (at
// most maxTokens of each figure) and the sum of any number of answers'
// stay finite, where a price near the largest float64 made them +Inf,
// which UpstreamHealth's JSON cannot encode and Score took for free.
const maxPrice = 1e100

// price reports whether x is a valid price: finite, not negative and at
// most maxPrice.
func price(x float64) bool { return finite(x) && x >= 0 && x <= maxPrice }

// headerField is a header's key, canonical, and its values.
type headerField struct {
	key    string
	values []string
}

// sets reports whether u's Header sets the caller's header k, in any
// spelling: net/http would send a non-canonical key as a second header.
func (u *upstream) sets(k string) bool {
	if u.lens&lenBit(len(k)) == 0 {
		return false // no key of its is as long: most of the caller's headers
	}
	for i := range u.headers {
		if h := u.headers[i].key; len(h) == len(k) && (h == k || equalFoldASCII(h, k)) {
			return true
		}
	}
	return false
}

// lenBit is the bit of upstream.lens for a key n bytes long.
func lenBit(n int) uint64 { return 1 << min(n, 63) }

// serves reports whether u serves model ("" serves everywhere).
func (u *upstream) serves(model string) bool {
	if model == "" || len(u.models) == 0 {
		return true
	}
	_, ok := u.models.lookup(model)
	return ok
}

// Reason says why an upstream takes no request now (see
// [UpstreamHealth.Unavailable] and [Candidate.Unavailable]), or why it is
// tried after the others (see [UpstreamHealth.Demoted] and
// [Candidate.Demoted]). The empty Reason means neither. Reasons name the
// failover_skipped_total series too.
type Reason string

// Why an upstream takes no request, in the order they are decided.
const (
	// ReasonRateLimited: it cools down after a 429 (ErrRateLimited).
	ReasonRateLimited Reason = "rate_limited"
	// ReasonModelNotServed: its Upstream.Models does not serve the
	// request's model (ErrModelNotServed). Only a request has a model:
	// Health never reports it.
	ReasonModelNotServed Reason = "model_not_served"
	// ReasonCircuitOpen: its circuit is open (ErrCircuitOpen).
	ReasonCircuitOpen Reason = "circuit_open"
	// ReasonProbing: its circuit is half-open and its one probe is in
	// flight (ErrCircuitOpen).
	ReasonProbing Reason = "probe_in_flight"
	// ReasonProbeElsewhere: its circuit is half-open and another process
	// of the fleet holds the probe ([Config.Shared]; ErrCircuitOpen).
	ReasonProbeElsewhere Reason = "probe_elsewhere"
)

// Why an upstream is tried after the others, in the order they are
// decided.
const (
	// ReasonFailing: its latest requests failed in a row (two, or one
	// when FailureThreshold is 2), and with the requests in flight there
	// it has as many as would open its circuit if they failed too
	// ([BreakerConfig]). Until one of them ends, a new request tries it
	// after the others: a failing upstream gets FailureThreshold
	// requests before its circuit opens, however many were in flight
	// when its fault began (or one more than were sent before its first
	// failure came back, when that is more).
	ReasonFailing Reason = "failing"
	// ReasonAuthFailing: its last answers were all 401 or 403: its key
	// looks revoked ([AuthConfig]).
	ReasonAuthFailing Reason = "auth_failing"
	// ReasonOutOfHeadroom: a success said a rate-limit window is
	// exhausted, and that window has not reset yet (for at most
	// RateLimit.MaxCooldown; a later success that reports the same
	// window above 0 lifts it).
	ReasonOutOfHeadroom Reason = "out_of_headroom"
	// ReasonDegraded: its recent latency or success rate is bad
	// ([DegradedConfig]).
	ReasonDegraded Reason = "degraded"
	// ReasonSuspect: it looks hung ([HangConfig]).
	ReasonSuspect Reason = "suspect"
)

// skipReasons are the Reasons a request skips an upstream for, as the
// skipped metrics count them.
var skipReasons = [...]Reason{ReasonRateLimited, ReasonModelNotServed, ReasonCircuitOpen, ReasonProbing, ReasonProbeElsewhere}

// availability is the admission decision about one upstream at one
// instant.
type availability struct {
	reason Reason        // "" when the upstream takes the request
	wait   time.Duration // how long until it may, when known
	known  bool          // whether wait is known: a probe may end at any moment, a model is never served
}

// err is the error a request records for an upstream it skipped.
func (a availability) err() error {
	switch a.reason {
	case ReasonRateLimited:
		return ErrRateLimited
	case ReasonModelNotServed:
		return ErrModelNotServed
	}
	return ErrCircuitOpen
}

// admit is the one decision whether u takes a request for model ("" for
// any) at now, and if not, why and when it may again. With p set, it also
// takes the circuit's permit into *p; otherwise it only reads. Ordering,
// the Router's candidates, earliest, Health and the skipped metrics all
// ask it. A request's own list (WithUpstreams) is no input here: it
// chooses which upstreams are asked at all (see options.go).
func (t *Transport) admit(u *upstream, model string, now time.Time, p *circuit.Permit) availability {
	if left := u.cd.remaining(now); left > 0 {
		a := availability{reason: ReasonRateLimited, wait: left, known: true}
		if v := u.circuit.Check(now); v.Refusal == circuit.Opened {
			a.wait = max(a.wait, v.Wait)
		}
		return a
	}
	if !u.serves(model) {
		return availability{reason: ReasonModelNotServed}
	}
	var v circuit.Verdict
	if p != nil {
		*p, v = u.circuit.Allow(now)
	} else {
		v = u.circuit.Check(now)
	}
	switch v.Refusal {
	case circuit.Opened:
		return availability{reason: ReasonCircuitOpen, wait: v.Wait, known: true}
	case circuit.Probing:
		return availability{reason: ReasonProbing}
	case circuit.Elsewhere:
		return availability{reason: ReasonProbeElsewhere}
	}
	return availability{known: true}
}

// demotion is the one decision whether u is tried after the others at
// now, and why: its circuit is about to open, its key looks revoked,
// its rate-limit headroom is exhausted, its recent figures are degraded,
// or it looks hung. Ordering, the Router's candidates and Health ask it.
func (t *Transport) demotion(u *upstream, now time.Time) Reason {
	switch {
	case u.failing():
		return ReasonFailing
	case t.authFailing(u, now):
		return ReasonAuthFailing
	case u.outOfHeadroom(now):
		return ReasonOutOfHeadroom
	case t.isDegraded(u, now):
		return ReasonDegraded
	case t.suspect(u, now):
		return ReasonSuspect
	}
	return ""
}

// routed asks the router for the order. With after set (firstRouted's
// pick, already tried) it returns the others, in the order that the
// router, one of this package's, gives them after its first pick: then,
// when firstRouted names one, first among them.
func (t *Transport) routed(buf []*upstream, model string, now time.Time, after, then *upstream) []*upstream {
	// The Router is an interface, so what it is given escapes: the
	// buffers come from a pool rather than from each request's heap.
	rb := routerBuffers.Get().(*routerBuffer)
	cands := rb.cands[:0]
	for i, u := range t.upstreams {
		cands = append(cands, t.candidate(i, u, model, now))
	}
	out := buf[:0]
	if cap(out) < len(cands) {
		out = make([]*upstream, 0, len(cands)) // past the caller's room: once, not by doubling
	}
	var order []int
	if after == nil {
		order = t.router.Order(rb.order[:0], cands)
		switch t.router.(type) {
		case Priority, *Weighted, LeastLatency, Score:
		default:
			order = validOrder(order, len(cands))
		}
	} else {
		next := -1
		if then != nil {
			next = then.index
		}
		order = t.orderRest(rb.order[:0], cands, after.index, next)
	}
	for _, i := range order {
		out = append(out, t.upstreams[i])
	}
	if cap(cands) <= maxPooledCandidates {
		clear(cands) // no Name or reason kept alive by the pool
		rb.cands, rb.order = cands[:0], order[:0]
		routerBuffers.Put(rb)
	}
	return out
}

// validOrder returns order, a Router's of your own for n upstreams, with
// every Index out of range or given before left out and every Index it
// lacks appended, ascending (see [Router]). A valid order is returned as
// it is; any other is copied, never written: the Router may keep its
// slice.
func validOrder(order []int, n int) []int {
	var small [1]uint64
	seen := small[:]
	if n > 64 {
		seen = make([]uint64, (n+63)/64)
	}
	valid := len(order) == n
	for _, i := range order {
		if i < 0 || i >= n || seen[i/64]&(1<<(i%64)) != 0 {
			valid = false
			break
		}
		seen[i/64] |= 1 << (i % 64)
	}
	if valid {
		return order
	}
	clear(seen)
	out := make([]int, 0, n)
	for _, i := range order {
		if i >= 0 && i < n && seen[i/64]&(1<<(i%64)) == 0 {
			seen[i/64] |= 1 << (i % 64)
			out = append(out, i)
		}
	}
	for i := range n {
		if seen[i/64]&(1<<(i%64)) == 0 {
			out = append(out, i)
		}
	}
	return out
}

// routerBuffer is what routed gives a Router: room for the candidates and
// for the order it returns.
type routerBuffer struct {
	cands []Candidate
	order []int
}

// maxPooledCandidates bounds the buffers routerBuffers keeps.
const maxPooledCandidates = 1024

var routerBuffers = sync.Pool{New: func() any { return &routerBuffer{cands: make([]Candidate, 0, 8), order: make([]int, 0, 8)} }}

// candidate is what a Router knows of u at now, for a request for model.
// An upstream the Transport would skip reads as Open, with the reason.
func (t *Transport) candidate(i int, u *upstream, model string, now time.Time) Candidate {
	f := u.recent.get(&u.window, now) // the router reads the recent figures
	c := Candidate{
		Index:       i,
		Name:        u.name,
		Weight:      u.cfg.Weight,
		Cost:        u.cfg.Cost,
		InFlight:    int(u.live.inflight.Load()),
		Latency:     u.latency.value(now),
		P50:         f.p50,
		SuccessRate: f.rate,
		State:       State(u.circuit.Status(now)),
		Recovering:  u.circuit.Recovering(now),
		Unavailable: t.admit(u, model, now, nil).reason,
		Demoted:     t.demotion(u, now),
	}
	c.RequestCost, c.InputTokens, c.OutputTokens = u.usage.averages()
	if c.Unavailable != "" {
		c.State, c.Recovering = Open, false
	}
	return c
}

// earliest returns how long until the first of ups (the upstreams a
// request may use) can take a request for model, 0 when one can now, and
// whether that is known (a probe in flight may end at any moment).
func (t *Transport) earliest(ups []*upstream, model string, now time.Time) (time.Duration, bool) {
	best, known := time.Duration(0), false
	for _, u := range ups {
		a := t.admit(u, model, now, nil)
		if a.reason == "" {
			return 0, true
		}
		if a.known && (!known || a.wait < best) {
			best, known = a.wait, true
		}
	}
	return best, known
}
