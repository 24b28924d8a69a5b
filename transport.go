// Package failover makes any http.Client survive the way LLM providers fail.
//
//	t, err := failover.New(failover.Config{Upstreams: []failover.Upstream{
//		{Name: "primary", BaseURL: "https://api.example.com/v1", Header: http.Header{"Authorization": {"Bearer " + k1}}},
//		{Name: "backup", BaseURL: "https://api.openai.com/v1", Header: http.Header{"Authorization": {"Bearer " + k2}}},
//	}})
//	client := &http.Client{Transport: t} // hand it to any SDK
//
// A [Transport] is an http.RoundTripper. The rule: a request is routed when
// its URL lies under an upstream's BaseURL (the same scheme, host and port,
// and a path under the base path). A routed request goes to the first
// upstream, in the configured order, whose circuit is closed and which is
// not cooling down after a 429; when that attempt fails, the next one is
// tried with the same body. The request is rewritten for each upstream
// (scheme, host, base path, and the upstream's own headers); the caller's
// credentials reach only the upstream the caller addressed.
//
// So aim the SDK at an upstream's BaseURL, spelled the same way. An SDK
// aimed at "http://localhost:8080/v1" while the upstream says
// "http://127.0.0.1:8080/v1" addresses no upstream: by default RoundTrip
// refuses such a request with an [*UnroutedError] that lists the
// BaseURLs, and [Config.Unrouted] can pass it through or send it to the
// first upstream instead. Each unrouted host is logged once and listed by
// [Transport.UnroutedHosts].
//
// Each attempt is classified ([Classifier], [DefaultClassifier]):
//
//   - 2xx, 3xx and the caller's own 4xx end the request and count as healthy;
//   - 401 and 403 try the next upstream and never count against a circuit;
//   - 429 cools the upstream down for its Retry-After ([RateLimitConfig]),
//     and tries the next at once;
//   - 408, 5xx, 529 and transport errors count toward the upstream's circuit
//     breaker ([BreakerConfig]) and try the next;
//   - the caller's cancellation stops everything and blames no one.
//
// When an upstream answered, the caller gets that answer, even a 503: SDKs
// then show the provider's own error. An error means no upstream answered
// ([Error], [ErrCircuitOpen], [ErrRateLimited]).
//
// Beyond ordered failover, all opt-in: [Config.Router] picks the order per
// request ([Priority], [Weighted], [LeastLatency], or [Score], which ranks by
// 0.4·max(0, 1 − p50/2s) + 0.4·success rate + 0.2·(1 − cost/highest cost),
// an open circuit scoring −1); [Config.Degraded] and [Config.Hang] try slow
// and silent upstreams last; [Config.Probe] probes upstreams in the
// background; [Upstream.Models] renames the model per upstream;
// [Config.StreamGuard] fails over a stream that starts with an error;
// [Config.Hedge] sends a slow request to the next upstream too and takes
// the first answer; [Upstream.Breaker] and [Upstream.AttemptTimeout] give
// one upstream a breaker and a timeout of its own; [Config.Shared] shares
// open circuits, cooldowns and the half-open probe across a fleet of
// processes (package redisshared keeps them in Redis); [Config.OnUsage],
// [Config.MeterUsage] or any [Upstream.Cost] read the token usage each
// answer reports as its body is read, and price it ([Usage]). Per request,
// through its context: [WithUpstreams] restricts and orders the upstreams,
// [WithoutFailover] sends it at most once, [WithAttemptTimeout] sets its
// attempts' timeout.
//
// The layers work on their own too: [Breaker] is one circuit in front of any
// RoundTripper and [RateLimiter] the cooldown layer. [Transport.Health] and
// the Prometheus metrics in [Config.Metrics] show what each upstream is doing.
package failover

import (
	"cmp"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/VictoriaMetrics/metrics"

	"github.com/failover-go/failover/internal/circuit"
)

// Upstream is one provider endpoint that requests may go to.
type Upstream struct {
	// Name names the upstream in Health, metrics, logs and errors. Empty
	// means the BaseURL's host. Names are unique within a Transport.
	Name string

	// BaseURL is the absolute http or https URL that the upstream's API
	// lives under, such as "https://api.openai.com/v1". A request is
	// addressed to the upstream when its URL has this scheme, host and
	// path prefix; it is rewritten to this scheme, host and prefix when
	// sent here. It carries no user info, query or fragment: credentials
	// go in Header.
	BaseURL string

	// Header is set on every request sent to this upstream, replacing the
	// caller's values of those names: the upstream's own credentials
	// (Authorization, x-api-key, api-key, ...) and anything else it needs.
	// Its values never appear in logs, errors, Health or metrics (but
	// for a value, or a part of one, shorter than 8 bytes: one that
	// short would hide innocent text, a version number, and no
	// provider's key is that short).
	Header http.Header

	// Weight is the upstream's share of traffic under the Weighted
	// router. Zero means 1.
	Weight float64

	// Cost is the upstream's price, for the Score router and for the
	// cost of its answers: with a Cost on any upstream, the usage of
	// every answer is metered (see [Usage], Config.MeterUsage).
	Cost Cost

	// Models maps the model a request asks for (the top-level "model" of
	// its JSON body) to this upstream's id for it, so that a request for
	// "gpt-4o" can fall back to "gemini-2.5-flash" on another provider.
	// The key "*" matches any other model; the value "*" keeps the
	// caller's model. A request whose model this map does not serve skips
	// the upstream ([ErrModelNotServed]). Nil means every model is served
	// as it is. Only the "model" value is rewritten; the rest of the body
	// goes byte for byte, with Content-Length and GetBody to match. A
	// body that cannot be replayed is never read for its model, nor one
	// larger than MaxBodyBuffer (8 MiB when it is negative).
	Models map[string]string

	// Breaker, when set, is this upstream's circuit breaker in place of
	// Config.Breaker: a primary that should trip sooner, or stay open
	// longer, than its backups. Its zero fields inherit Config.Breaker's,
	// and what both leave zero is BreakerConfig's default; so
	// &BreakerConfig{FailureThreshold: 3, Cooldown: 15 * time.Second}
	// changes those two and nothing else. (An upstream cannot turn off a
	// FailureRate that Config.Breaker sets: leave it out there and set it
	// on the upstreams that want it.) Nil means Config.Breaker. See
	// [UpstreamHealth.Breaker] for what is in effect, and [Shared] for
	// a fleet whose members disagree.
	Breaker *BreakerConfig

	// AttemptTimeout bounds the wait for one attempt's response headers
	// at this upstream, in place of Config.AttemptTimeout: a provider
	// that is slow to its first byte by nature gets longer than the
	// others. Zero means Config.AttemptTimeout.
	AttemptTimeout time.Duration
}

// Config configures a [Transport]. A zero field means its documented
// default.
type Config struct {
	// Upstreams are tried in this order. At least one is required.
	Upstreams []Upstream

	// Unrouted says what happens to a request whose URL lies under no
	// Upstream.BaseURL, such as one to "http://localhost:8080/v1" when
	// the upstream says "http://127.0.0.1:8080/v1". The zero value,
	// UnroutedRefuse, fails it with an error naming the BaseURLs;
	// UnroutedPass sends it on untouched, without failover;
	// UnroutedFirst sends it to the first upstream. See [UnroutedPolicy].
	Unrouted UnroutedPolicy

	// Base sends every attempt. Nil means a clone of
	// http.DefaultTransport. A recording, tracing or authenticating
	// RoundTripper fits here.
	Base http.RoundTripper

	// Classify judges each attempt. Nil means DefaultClassifier.
	Classify Classifier

	// Router orders the upstreams for each request: Priority (the
	// configured order), Weighted, LeastLatency, Score, or your own.
	// Nil means Priority, at no cost. Whatever the order, open, probing
	// and cooling upstreams are skipped, and degraded or suspect ones go
	// after the others.
	Router Router

	// Breaker configures each upstream's circuit breaker, unless its
	// Upstream.Breaker says otherwise.
	Breaker BreakerConfig

	// RateLimit configures cooldowns after 429s and waiting when every
	// upstream is unavailable.
	RateLimit RateLimitConfig

	// Retries is how many more rounds over the upstreams a request gets
	// after every upstream failed in a round, at most 100. Zero means
	// none: SDKs retry on their own. Rounds wait as go-retryablehttp's DefaultBackoff says,
	// from RetryWaitMin doubling up to RetryWaitMax, longer when every
	// upstream is still open or cooling down, and never past the
	// request's deadline.
	Retries int

	// RetryWaitMin and RetryWaitMax bound the wait between rounds. Zero
	// means 500ms and 5s.
	RetryWaitMin, RetryWaitMax time.Duration

	// Hang configures hang detection: an upstream with requests in
	// flight that stopped answering is tried after the others, before its
	// attempts time out. On by default.
	Hang HangConfig

	// Degraded configures when a slow or often failing upstream is tried
	// after the others without opening its circuit. Off by default.
	Degraded DegradedConfig

	// Auth configures when an upstream whose key answers 401 or 403 to
	// every request is tried after the others. On by default.
	Auth AuthConfig

	// Probe configures active health probes, run by a background loop
	// that New starts only when Probe.Interval is set and Close stops.
	Probe ProbeConfig

	// StreamGuard, when set, watches the start of every text/event-stream
	// response before handing it to the caller: a stream whose first
	// event does not come within FirstByteTimeout, or that begins with an
	// error event before any content, counts as a failure and the request
	// goes to the next upstream. Once content reaches the caller, the
	// stream is never switched. Nil means streams pass through at once.
	StreamGuard *StreamGuard

	// AttemptTimeout bounds the wait for one attempt's response headers.
	// It never cuts a body that is being read. Zero means no bound but the
	// request's own deadline. An Upstream.AttemptTimeout replaces it for
	// its upstream.
	AttemptTimeout time.Duration

	// Shared, when set, shares open circuits, cooldowns and the
	// half-open probe with the other processes of a fleet (see [Shared]).
	// New starts two goroutines for it, which Close stops. Nil means each
	// Transport learns on its own.
	Shared Shared

	// SharedSync is how often the Transport reads the shared state in
	// full, besides following its messages, and the bound on each call
	// to it (never under 1s: a store that answers late on a loaded
	// machine is not down); at least 10ms and at most an hour. Zero means
	// 1s.
	SharedSync time.Duration

	// LastResort sets what a request does when every upstream it may use
	// refuses it for its circuit: by default it goes to the upstream most
	// likely to answer, past its circuit (see [LastResortConfig]).
	LastResort LastResortConfig

	// Hedge, when set, sends a request that has not been answered within
	// a delay to the next upstream too, and takes the first answer; see
	// [HedgeConfig] for the cost. Nil means no hedging.
	Hedge *HedgeConfig

	// MaxBodyBuffer is the largest request body that is buffered to be
	// sent again, for requests without GetBody (SDKs set GetBody, and
	// their bodies are never buffered). A larger body gets one attempt.
	// Zero means 8 MiB; negative means never buffer.
	MaxBodyBuffer int64

	// Metrics receives the Transport's Prometheus metrics. Nil means a
	// new Set, which [Transport.WritePrometheus] writes out. Give each
	// Transport its own Set, or upstream names that differ.
	Metrics *metrics.Set

	// Logger receives state changes, auth failures and cooldowns. Nil
	// means nothing is logged.
	Logger *slog.Logger

	// CredentialHeaders names request headers that carry the caller's
	// credentials, besides those the Transport knows: Authorization,
	// Proxy-Authorization, Api-Key, X-Api-Key, X-Goog-Api-Key, Cookie,
	// Openai-Organization, Openai-Project, every name an Upstream.Header
	// sets, and every name that contains, in any case, auth, key, token,
	// secret, passw, credential, signature, session, cookie, bearer, jwt,
	// csrf or xsrf, or has sig, pw, pwd, sid or otp as a word ("X-Sig",
	// not "X-Signal"), except Idempotency-Key. The caller's credentials
	// reach only the upstream the caller addressed, on failover and on
	// redirect hops alike, and never appear in errors, Health or logs.
	// Names match in any case; each must be a valid header name.
	CredentialHeaders []string

	// CredentialParams names query parameters that carry the caller's
	// credentials although ForwardParams's list of the names LLM APIs
	// define has them (a gateway of yours that takes its key as model=).
	// Every name not on that list is a credential already. Names match
	// in any case, unescaped; none may be empty.
	CredentialParams []string

	// ForwardParams names query parameters that carry no credentials,
	// besides those LLM APIs define: api-version, alt, $alt,
	// enum-encoding, beta, model, deployment, intent, stream,
	// starting_after, include, include[], limit, after, before, order,
	// after_id, before_id, pageSize, purpose and filter. An upstream the
	// caller did not address (a failover, a hedge, a last resort, a
	// redirect hop's) gets only the query pairs with one of these names:
	// any other name may carry a secret (Azure Functions' code=, a SAS
	// token's sv, sp and se), and its values never appear in errors,
	// Health or logs. The upstream the caller addressed gets the query as
	// the caller wrote it. A name here passes even when it looks like a
	// secret's (pageToken). Names match in any case, unescaped; none may
	// be empty, be in CredentialParams, or be key, api_key, api-key,
	// apikey, access_token, sig or code.
	ForwardParams []string

	// OnStateChange, when set, is called after each change of an
	// upstream's circuit, outside every lock, on the goroutine of the
	// request that caused it (or of Reset). It must not block. Changes
	// made at nearly the same moment by different goroutines may arrive
	// out of order: order them by At.
	OnStateChange func(StateChange)

	// MeterUsage reads the token usage that each answer reports as its
	// caller reads the body (see [Usage]), and counts it per upstream and
	// model in the metrics (failover_tokens_total, failover_cost_total),
	// in UpstreamHealth.Usage and in what Score ranks by. It is on as
	// well when OnUsage is set or any Upstream has a Cost. Off, only the
	// requests whose Trace has a Usage hook are metered, and answers pay
	// nothing for it.
	MeterUsage bool

	// OnUsage, when set, is called with the usage and cost of each
	// answer that reports its usage, once the answer's body has been read
	// to its end or closed: on the goroutine that read or closed it,
	// usually after RoundTrip has returned, and never more than once per
	// answer. It must not block: the reader waits on it.
	OnUsage func(Usage)
}

// StateChange is a change of an upstream's circuit, as
// [Config.OnStateChange] receives it.
type StateChange struct {
	Upstream string // the upstream's Name
	From, To State
	At       time.Time
}

// Defaults and bounds of Config.
const (
	defaultMaxBodyBuffer = 8 << 20
	defaultRetryWaitMin  = 500 * time.Millisecond
	defaultRetryWaitMax  = 5 * time.Second
	maxRetries           = 100
	minSharedSync        = 10 * time.Millisecond
	maxSharedSync        = time.Hour
)

// Transport is an http.RoundTripper that sends each request to the first
// healthy upstream and fails over to the next when an attempt fails. See the
// package documentation for what it does with each response.
//
// RoundTrip follows the http.RoundTripper contract:
//
//   - The caller's request is never modified: each attempt is a clone.
//     The request body is read once per attempt (from GetBody after the
//     first) and closed, even on errors.
//   - RoundTrip returns an error only when no upstream produced a
//     response; the error is an [*Error], or the context's error when the
//     caller's context ended (net/http's own when the caller closed the
//     deprecated Request.Cancel, as http.Client's Timeout does), or for a request addressed to no upstream an
//     [*UnroutedError] or the Base RoundTripper's error, or for a request
//     that [WithUpstreams] restricted to a name no upstream has an
//     [*UnknownUpstreamError], or the caller's own error as it is when
//     its request cannot be sent (its body fails to read, an invalid
//     header), which counts against no upstream. When any upstream
//     answered, the latest answer is returned with a nil error, whatever
//     its status.
//   - The caller must close the returned response's body, as with any
//     RoundTripper. Its Request is the attempt that got it (the URL it
//     went to) with the caller's own headers, never an upstream's. Responses of discarded attempts are drained (up to
//     64 KiB) and closed by the Transport.
//   - A request addressed to no upstream is refused with an
//     [*UnroutedError], or goes to Base untouched, or to the first
//     upstream, as [Config.Unrouted] says. A redirect hop (Request.Response
//     set) addressed to no upstream goes to Base, and without the caller's
//     credentials when it follows a request addressed to an upstream.
//
// A Transport is safe for concurrent use by multiple goroutines. It starts
// goroutines of its own only for opt-in features: the probe loops of
// [ProbeConfig] and the two of [Config.Shared], which [Transport.Close]
// stops, and with [HedgeConfig], once a hedge's delay has passed, one that
// runs the rest of the round and one per hedge, which end with the round
// and when Base returns.
type Transport struct {
	upstreams   []*upstream
	hosts       map[string][]*upstream // by hostKey: the upstreams on each host (route)
	spelled     []spelling             // the first few hosts as the BaseURLs spell them, looked at before hosts
	authorities map[string]bool        // by authorityKey: the host and port each upstream is reached at (reachesUpstream)
	idnUpstream bool                   // some upstream's host is beyond ASCII (maybeIDN)
	base        http.RoundTripper
	classify    Classifier
	router      Router       // nil: the configured order
	picker      picker       // router, when it is one of this package's
	routes      routeCache   // for Score and Weighted (router.go)
	stream      *StreamGuard // nil: no stream guard
	hedge       *hedger      // nil: no hedging
	fleet       *fleet       // nil: no Config.Shared
	models      bool         // some upstream has Models
	rate        RateLimitConfig
	retries     int
	waitMin     time.Duration
	waitMax     time.Duration
	hang        HangConfig
	auth        AuthConfig
	degraded    DegradedConfig
	maxBody     int64
	metrics     *metrics.Set
	logger      *slog.Logger

	onStateChange func(StateChange)
	probes        *prober // nil without probes
	ownBase       bool    // base is the http.Transport New made: Close closes its idle connections

	lastResortCfg      LastResortConfig
	lastResortInFlight atomic.Int64

	// creds tells which headers and query parameters carry credentials,
	// which reach only the upstream the caller addressed, and holds the
	// upstreams' own, scrubbed from every error message.
	creds *credentials

	reqs requestMetrics

	usage usageConfig // what is done with the answers' usage

	unroutedPolicy UnroutedPolicy
	unroutedHosts  unroutedHosts
	unrouted       *metrics.Counter
}

// New returns a Transport for cfg, or an error naming the field of cfg that
// can never work (an interface field holding a nil pointer or func, such
// as a nil *http.Transport for Base, is one). A New that fails registers
// nothing in cfg.Metrics.
func New(cfg Config) (*Transport, error) {
	if len(cfg.Upstreams) == 0 {
		return nil, configError("Upstreams", "is empty: at least one upstream is required")
	}
	if err := cfg.Breaker.validate(); err != nil {
		return nil, err
	}
	if err := cfg.RateLimit.validate(); err != nil {
		return nil, err
	}
	if err := cfg.Hang.validate(); err != nil {
		return nil, err
	}
	if err := cfg.Auth.validate(); err != nil {
		return nil, err
	}
	if err := cfg.Degraded.validate(); err != nil {
		return nil, err
	}
	if err := cfg.Probe.validate(); err != nil {
		return nil, err
	}
	if err := cfg.LastResort.validate(); err != nil {
		return nil, err
	}
	if g := cfg.StreamGuard; g != nil {
		if err := g.validate(); err != nil {
			return nil, err
		}
	}
	if h := cfg.Hedge; h != nil {
		if err := h.validate(); err != nil {
			return nil, err
		}
	}
	switch {
	case cfg.Retries < 0:
		return nil, configError("Retries", "must not be negative")
	case cfg.Retries > maxRetries:
		return nil, configError("Retries", "must be at most 100")
	case cfg.RetryWaitMin < 0:
		return nil, configError("RetryWaitMin", "must not be negative")
	case cfg.RetryWaitMax < 0:
		return nil, configError("RetryWaitMax", "must not be negative")
	case cfg.AttemptTimeout < 0:
		return nil, configError("AttemptTimeout", "must not be negative")
	case cfg.SharedSync < 0:
		return nil, configError("SharedSync", "must not be negative")
	case cfg.SharedSync > 0 && cfg.SharedSync < minSharedSync:
		return nil, configError("SharedSync", "must be at least 10ms")
	case cfg.SharedSync > maxSharedSync:
		// 3×SharedSync, a member's rate's lifetime in the store, wrapped
		// to a negative one past a third of the largest Duration; a
		// period of hours is also a store call bounded by hours.
		return nil, configError("SharedSync", "must be at most 1h")
	case cfg.Unrouted < UnroutedRefuse || cfg.Unrouted > UnroutedFirst:
		return nil, configError("Unrouted", "must be UnroutedRefuse, UnroutedPass or UnroutedFirst")
	case nilValue(cfg.Base):
		return nil, configError("Base", fmt.Sprintf("is a nil %T: leave it nil for a clone of http.DefaultTransport", cfg.Base))
	case nilValue(cfg.Router):
		return nil, configError("Router", fmt.Sprintf("is a nil %T: leave it nil for the configured order", cfg.Router))
	case nilValue(cfg.Shared):
		return nil, configError("Shared", fmt.Sprintf("is a nil %T: leave it nil for no shared state", cfg.Shared))
	}
	t := &Transport{
		base:     cfg.Base,
		classify: cfg.Classify,
		router:   cfg.Router,
		picker:   pickerOf(cfg.Router),
		stream:   cfg.StreamGuard,
		rate:     cfg.RateLimit.withDefaults(),
		retries:  cfg.Retries,
		waitMin:  cmp.Or(cfg.RetryWaitMin, defaultRetryWaitMin),
		waitMax:  cmp.Or(cfg.RetryWaitMax, defaultRetryWaitMax),
		hang:     cfg.Hang.withDefaults(),
		degraded: cfg.Degraded.withDefaults(),
		auth:     cfg.Auth.withDefaults(),
		maxBody:  cmp.Or(cfg.MaxBodyBuffer, defaultMaxBodyBuffer),
		metrics:  cfg.Metrics,
		logger:   cfg.Logger,

		onStateChange:  cfg.OnStateChange,
		lastResortCfg:  cfg.LastResort,
		unroutedPolicy: cfg.Unrouted,
		usage:          newUsageConfig(cfg),
	}
	t.lastResortCfg.MaxInFlight = cmp.Or(t.lastResortCfg.MaxInFlight, defaultLastResortInFlight)
	if t.waitMin > t.waitMax {
		return nil, configError("RetryWaitMin", "must not exceed RetryWaitMax")
	}
	if t.base == nil {
		t.base = http.DefaultTransport.(*http.Transport).Clone()
		t.ownBase = true
	}
	t.classify = checkedClassifier(t.classify)
	if t.metrics == nil {
		t.metrics = metrics.NewSet()
	}
	names := map[string]int{}
	for i, uc := range cfg.Upstreams {
		u, err := newUpstream(i, uc)
		if err != nil {
			return nil, err
		}
		if j, dup := names[u.name]; dup {
			return nil, configError(fmt.Sprintf("Upstreams[%d].Name", i), fmt.Sprintf("%q is also the name of Upstreams[%d]", u.name, j))
		}
		names[u.name] = i
		u.breaker, u.timeout = uc.policy(cfg)
		t.upstreams = append(t.upstreams, u)
		t.models = t.models || len(u.models) > 0
	}
	t.hosts = hostMap(t.upstreams)
	t.spelled = spellings(t.upstreams, t.hosts)
	t.authorities = authorityMap(t.upstreams)
	t.idnUpstream = idnUpstream(t.upstreams)
	creds, err := newCredentials(cfg, t.upstreams)
	if err != nil {
		return nil, err
	}
	t.creds = creds
	// Nothing is registered in Metrics before the last check that can
	// refuse the Config: a New that fails leaves the caller's Set as it
	// was.
	if cfg.Hedge != nil {
		t.hedge = newHedger(*cfg.Hedge, t.metrics)
	}
	if cfg.Shared != nil {
		t.fleet = newFleet(t, cfg.Shared, cmp.Or(cfg.SharedSync, defaultSharedSync))
	}
	for _, u := range t.upstreams {
		var lease func(time.Time, bool) bool
		if f := t.fleet; f != nil {
			lease = func(now time.Time, ask bool) bool { return f.mayProbe(u, now, ask) }
		}
		u.circuit = newCircuit(u.breaker, lease, func(c circuit.Change) { t.changed(u, c) })
		t.newRecent(u)
	}
	t.initMetrics()
	t.startProbes(cfg.Probe)
	if t.fleet != nil {
		t.fleet.start()
	}
	return t, nil
}

// RoundTrip implements http.RoundTripper; see [Transport] for its contract.
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.URL == nil {
		closeBody(req)
		return nil, errors.New("failover: nil Request.URL")
	}
	// The call is built where it stays, on this stack: its request is
	// not copied in.
	var c call
	r := &c.request
	if req.Response != nil {
		r.addressed, r.rest, r.rawRest, r.spelled = t.route(req.URL)
		r.hop = t.redirected(req)
	} else {
		r.addressed, r.rest, r.rawRest, r.spelled = t.address(req.URL)
	}
	r.t, r.req = t, req
	if optioning.Load() { // nothing to look up until a With function was called
		r.opts = contextOptions(req.Context())
	}
	if r.addressed == nil {
		return t.roundTripUnrouted(*r)
	}
	c.trace = requestTrace(req.Context())
	resp, err := c.run()
	c.ended(resp, err)
	return resp, err
}

// newRecent gives u the caches of its recent figures, one per distinct
// window among Degraded's, Hang's and Hedge's.
func (t *Transport) newRecent(u *upstream) {
	u.recent = &recent{span: t.degraded.Window}
	u.hangRecent = u.recent
	if t.hang.Window != u.recent.span {
		u.hangRecent = &recent{span: t.hang.Window}
	}
	u.hedgeRecent = u.recent
	if t.hedge != nil {
		switch t.hedge.Window {
		case u.recent.span:
		case u.hangRecent.span:
			u.hedgeRecent = u.hangRecent
		default:
			u.hedgeRecent = &recent{span: t.hedge.Window}
		}
	}
}

// Reset closes the named upstream's circuit and ends its cooldown, for an
// operator who knows it is back.
//
// With [Config.Shared], the circuit closes in the whole fleet.
func (t *Transport) Reset(name string) error {
	for _, u := range t.upstreams {
		if u.name == name {
			u.circuit.Reset(time.Now())
			u.cd.clear()
			if t.fleet != nil {
				t.fleet.publish(SharedEvent{Upstream: u.name, Kind: SharedReset, For: u.circuit.Cooldown()})
			}
			return nil
		}
	}
	return fmt.Errorf("failover: no upstream named %q", name)
}

// Close stops the probe loops and the fleet's goroutines and waits for them
// to end, and closes the idle connections of the http.Transport that New
// made when Config.Base was nil (a Base of the caller's is left alone). It
// is safe to call more than once, and on a Transport without either.
// Requests in flight at Close go on to their end (a hedged request's
// attempts end with it), and net/http closes their connections as they
// come back rather than keep them idle. Requests still work after Close:
// a connection one of them opens stays idle until CloseIdleConnections,
// or Close again.
//
// With Config.Shared, Close waits for a call to the store in flight to
// end, which it does at its context's deadline at the latest (SharedSync,
// at least 1s, from its start) if the store honours it; Close waits one
// second more, and no longer: it returns within SharedSync (at least 1s)
// and a second, whatever the store does. A call that outlives that (a
// store that ignores its context) is left to end on its own, and the
// goroutine that made it ends when it returns, adopting nothing of what it
// returned; Close logs it. Package redisshared honours the deadline
// whatever the Redis client's options, except as its New says.
func (t *Transport) Close() error {
	if p := t.probes; p != nil {
		p.cancel()
		p.wg.Wait()
	}
	if f := t.fleet; f != nil {
		f.stopOnce.Do(f.stop)
	}
	if t.ownBase {
		t.CloseIdleConnections()
	}
	return nil
}

// CloseIdleConnections closes the idle connections of Base, when Base has
// such a method. http.Client.CloseIdleConnections calls it.
func (t *Transport) CloseIdleConnections() {
	if c, ok := t.base.(interface{ CloseIdleConnections() }); ok {
		c.CloseIdleConnections()
	}
}

func closeBody(req *http.Request) {
	if req.Body != nil {
		req.Body.Close()
	}
}
