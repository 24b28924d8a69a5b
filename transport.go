// Package failover makes any http.Client survive the way LLM providers fail.
// Put a [Transport] under an SDK's http.Client, here openai-go's:
//
//	t, err := failover.New(failover.Config{Upstreams: []failover.Upstream{
//		{Name: "openai", BaseURL: "https://api.openai.com/v1",
//			Header: http.Header{"Authorization": {"Bearer " + os.Getenv("OPENAI_API_KEY")}}},
//		{Name: "openrouter", BaseURL: "https://openrouter.ai/api/v1",
//			Header: http.Header{"Authorization": {"Bearer " + os.Getenv("OPENROUTER_API_KEY")}},
//			Models: map[string]string{"gpt-4o": "openai/gpt-4o", "gpt-4o-mini": "openai/gpt-4o-mini"}},
//	}})
//	if err != nil {
//		log.Fatal(err) // a *failover.ConfigError naming the field
//	}
//	defer t.Close()
//
//	client := openai.NewClient(
//		option.WithBaseURL("https://api.openai.com/v1"), // the first upstream's BaseURL
//		option.WithHTTPClient(&http.Client{Transport: t}),
//	)
//
// A [Transport] is an http.RoundTripper. A request whose URL lies under an
// upstream's BaseURL goes to the first upstream whose circuit is closed and
// which is not cooling down after a 429; when that attempt fails, the next
// is tried with the same body, rewritten for its upstream. The caller's
// credentials reach only the upstream the caller addressed. Aim the SDK at
// an upstream's BaseURL, spelled the same way: by default a request
// addressed to no upstream is refused ([Config.Unrouted]).
//
// Each attempt is classified ([DefaultClassifier]): 2xx, 3xx and the
// caller's own 4xx end the request; 401 and 403 try the next upstream; 429
// cools the upstream down ([RateLimitConfig]); 408, 5xx and transport errors
// count toward its circuit breaker ([BreakerConfig]) and try the next; the
// caller's cancellation stops everything. When an upstream answered, the
// caller gets that answer, even a 503; an error means none did ([Error]).
// An SDK that retries on its own (openai-go, anthropic-sdk-go) is told
// not to retry what the Transport already failed over ([Config.SDKRetries]).
//
// By default, each attempt is bounded by what it waits for ([Timeouts]): a
// silent upstream fails a stream over within 30s, a thinking model is
// never cut, and a stream that stalls after its content ends in a
// [*StallError]. A stream is held until its first content
// ([StreamGuard]). A transient failure is retried once at the same
// upstream when the next would change the model or the price
// ([RetryConfig]), and a tripped circuit stays open longer the longer its
// upstream keeps failing ([BreakerConfig]).
//
// A request that references state a provider holds (a previous response,
// a file, a cached content) goes only to the upstream that holds it
// ([PinConfig]); under a balancing [Router], a conversation stays on the
// upstream whose prompt cache holds it ([AffinityConfig]). An upstream may
// hold several keys ([Key]) and set its credentials as each attempt is
// sent ([Authorizer]); [WithSheddable] marks a request that yields when
// capacity runs short.
//
// The rest is opt-in, each on its field of [Config]: routing ([Router]),
// hedging, probes, model mapping, usage metering and state shared by a
// fleet ([Shared]); per request, [WithUpstreams],
// [WithoutFailover], [WithAttemptTimeout] and [WithTrace]. [Breaker] and
// [RateLimiter] work alone in front of any RoundTripper. [Transport.Health]
// and [Transport.WritePrometheus] show what each upstream is doing, and
// [Transport.HealthHandler] and [Transport.MetricsHandler] serve them;
// [ServedBy] says which upstream answered a response; [Config.Logger]
// hears of each failover.
package failover

import (
	"cmp"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"runtime"
	"sync/atomic"
	"time"
	"weak"

	"github.com/VictoriaMetrics/metrics"

	"github.com/failover-go/failover/internal/circuit"
)

// Upstream is one provider endpoint that requests may go to.
type Upstream struct {
	// Name names the upstream in Health, metrics, logs and errors. Empty
	// means the BaseURL's host. Names are unique within a Transport.
	Name string

	// BaseURL is the absolute http or https URL the upstream's API lives
	// under, such as "https://api.openai.com/v1". A request is addressed
	// to the upstream when its URL has this scheme, host and path prefix,
	// and is rewritten to them when sent here. It carries no user info,
	// query or fragment: parameters go in Query, credentials in Header.
	//
	// One whole path segment may be {deployment}, as in Azure OpenAI's
	// "https://res.openai.azure.com/openai/deployments/{deployment}": a
	// request addressed to the upstream has any single segment there,
	// and one sent here from another upstream has the request's model,
	// after Models, path-escaped. A request that names no model skips
	// the upstream ([ErrModelNotServed]) unless it was addressed to it.
	// New refuses a {deployment} right under another upstream's BaseURL
	// on the same host, where a request could be addressed to either.
	BaseURL string

	// Header is set on every request sent to this upstream, replacing the
	// caller's values of those names: the upstream's own credentials
	// (Authorization, x-api-key, ...) and anything else it needs. Its
	// values of 8 bytes or more never appear in logs, errors, Health or
	// metrics.
	Header http.Header

	// Keys are several keys of this upstream's provider, each with its
	// own 429 cooldown, rate-limit headroom and revocation ([Key]): a
	// request is sent with one of them, its Header set over Header. A
	// key answered 429 (or 401, 403) sends the request at once to the
	// next key; the upstream takes no request only when every key cools
	// down. Empty means Header alone, as one key.
	Keys []Key

	// Query holds query parameters that are not credentials, such as
	// Azure OpenAI's api-version, which every request sent to this
	// upstream carries, replacing the caller's parameters of those
	// names in any case. A name in it is this upstream's own: a caller's
	// parameter of that name goes to no other upstream. New refuses a
	// name the credential rule calls a credential's (Config.CredentialParams,
	// or one like subscription-key or token), and one name in two cases:
	// credentials go in Header. Its values of 8 bytes or more never
	// appear in logs, errors, Health or metrics.
	Query url.Values

	// Authorizer, when set, sets the credentials of each request sent to
	// this upstream, after Header, Query and Models: a token that rotates
	// (package failover/oauth2), a signature over the final body
	// (failover/sigv4). They go to this upstream only. When it fails,
	// nothing is sent here and the request goes on to the next upstream,
	// blaming none ([ErrAuthorize]). Nil means none.
	Authorizer Authorizer

	// Prefill says how this upstream takes the answer so far of a stream
	// another upstream broke off, to continue it (see [ContinueConfig]).
	// The zero value takes none: it continues no stream.
	Prefill Prefill

	// Weight is the upstream's share of traffic under the Weighted
	// router. Zero means 1.
	Weight float64

	// Cost is the upstream's price, for the Score router and the cost of
	// its answers. A Cost on any upstream turns on usage metering (see
	// [Usage]).
	Cost Cost

	// Models maps the model a request asks for (the top-level "model" of
	// its JSON body) to this upstream's id for it, so that "gpt-4o" can
	// fall back to "gemini-2.5-flash" on another provider. The key "*"
	// matches any other model; the value "*" keeps the caller's. A
	// request whose model the map does not serve skips the upstream
	// ([ErrModelNotServed]). Nil serves every model as it is. Only the
	// "model" value is rewritten, and a BaseURL's {deployment} filled. A body that cannot be replayed, or is
	// larger than MaxBodyBuffer (8 MiB when negative), is not read for it.
	Models map[string]string

	// Breaker, when set, replaces Config.Breaker for this upstream, such
	// as a primary that should trip sooner than its backups. Its zero
	// fields inherit Config.Breaker's, then BreakerConfig's defaults, so
	// it cannot turn off a FailureRate that Config.Breaker sets. Nil
	// means Config.Breaker. [UpstreamHealth.Breaker] shows what is in
	// effect.
	Breaker *BreakerConfig

	// Timeouts, when a field is set, replaces Config.Timeouts's for this
	// upstream, such as a provider slow to its first byte by nature.
	Timeouts Timeouts

	// AttemptTimeout sets Timeouts.Headers and Timeouts.Attempt for this
	// upstream where those are zero.
	//
	// Deprecated: set Timeouts.
	AttemptTimeout time.Duration
}

// Config configures a [Transport]. A zero field means its documented
// default.
type Config struct {
	// Upstreams are tried in this order. At least one is required.
	Upstreams []Upstream

	// Unrouted says what happens to a request whose URL lies under no
	// Upstream.BaseURL. The zero value, UnroutedRefuse, fails it with an
	// error naming the BaseURLs. See [UnroutedPolicy].
	Unrouted UnroutedPolicy

	// Base sends every attempt. Nil means a clone of
	// http.DefaultTransport. A recording, tracing or authenticating
	// RoundTripper fits here.
	Base http.RoundTripper

	// Classify judges each attempt. Nil means DefaultClassifier.
	Classify Classifier

	// Router orders the upstreams for each request: [Priority],
	// [Weighted], [LeastLatency], [Score], or your own. Nil means
	// Priority. Whatever the order, unavailable upstreams are skipped
	// and demoted ones go after the others.
	Router Router

	// Breaker configures each upstream's circuit breaker, unless its
	// Upstream.Breaker says otherwise.
	Breaker BreakerConfig

	// RateLimit configures cooldowns after 429s and waiting when every
	// upstream is unavailable.
	RateLimit RateLimitConfig

	// Retries is how many more rounds over the upstreams a request gets
	// after every upstream failed in a round, at most 100. Zero means
	// none: an SDK's own retries then repeat only a request that got one
	// attempt (see SDKRetries). The wait between rounds is the last
	// 429's or 5xx's Retry-After (529 "overloaded" included), else doubles
	// from RetryWaitMin up to RetryWaitMax (go-retryablehttp's
	// DefaultBackoff); longer while every upstream is open or cooling
	// down, never more than RateLimit.MaxCooldown, and never past the
	// request's deadline. Each extra round takes a place in Retry's
	// budget; without one, the request ends.
	Retries int

	// RetryWaitMin and RetryWaitMax bound the wait between rounds. Zero
	// means 500ms and 5s.
	RetryWaitMin, RetryWaitMax time.Duration

	// Retry says when a request that failed at an upstream goes there
	// once more rather than on to a backup that serves another model or
	// costs more, and bounds these retries and the rounds of Retries
	// with a budget (see [RetryConfig]). On by default.
	Retry RetryConfig

	// Hang configures hang detection: an upstream that stopped answering
	// is tried after the others before its attempts time out. On by
	// default.
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

	// StreamGuard configures how each text/event-stream response is held
	// until its first content event: a stream that begins with an error
	// event, or sends no content within Timeouts.FirstContent, fails over.
	// Once content reaches the caller, the stream is never switched. Nil
	// means the zero StreamGuard; HoldEvents -1 passes streams through at
	// once.
	StreamGuard *StreamGuard

	// Timeouts bounds each attempt by what it waits for: a stream's
	// headers, its first content and its silences, and an answer that is
	// not streamed. The zero value fails a silent upstream over within
	// 30s for a stream, and never cuts a healthy reasoning model; see
	// [Timeouts].
	Timeouts Timeouts

	// AttemptTimeout sets Timeouts.Headers and Timeouts.Attempt where
	// those are zero.
	//
	// Deprecated: set Timeouts. A zero AttemptTimeout no longer means no
	// bound: set Timeouts fields to -1 for that.
	AttemptTimeout time.Duration

	// Shared, when set, shares open circuits, cooldowns and the
	// half-open probe with the other processes of a fleet (see [Shared]).
	// What it says keeps an upstream out for at most RateLimit.MaxCooldown
	// (an open circuit: or its Breaker.MaxCooldown, if longer) from when this
	// Transport first adopted it. New starts two goroutines for it, which
	// Close stops; from Close on, nothing it says is adopted. Nil means
	// each Transport learns on its own.
	Shared Shared

	// SharedSync is how often the Transport reads the shared state in
	// full, besides following its messages, from 10ms to 1h; each call to
	// the store is bounded by it, but never under 1s. Zero means 1s.
	SharedSync time.Duration

	// Affinity keeps a conversation on the upstream that answered it
	// before, for the provider's prompt cache, whenever the Router
	// balances between upstreams (see [AffinityConfig]). On by default.
	Affinity AffinityConfig

	// Pinning sends a request that references state a provider holds
	// (a previous response, a conversation, a file, a cached content)
	// only to the upstream that holds it, and fails it at once when that
	// upstream cannot take it (see [PinConfig]). On by default.
	Pinning PinConfig

	// LastResort sets what a request does when every circuit refuses it:
	// by default it goes past the circuit of the upstream most likely to
	// answer (see [LastResortConfig]).
	LastResort LastResortConfig

	// Shed says when a sheddable request ([WithSheddable]) is refused
	// at once, for the interactive ones to keep an upstream's last
	// rate-limit headroom. The zero value keeps the last 10% of every
	// window (see [ShedConfig]).
	Shed ShedConfig

	// Continue, when On, continues a streamed answer that breaks after its
	// content began on the next upstream whose Prefill takes the answer
	// so far, and splices the two streams into one for the caller (see
	// [ContinueConfig]). Off by default: the continuation is another
	// generation.
	Continue ContinueConfig

	// Hedge, when set, sends a request that has not been answered within
	// a delay to the next upstream too, and takes the first answer; see
	// [HedgeConfig] for the cost. Nil means no hedging.
	Hedge *HedgeConfig

	// MaxBodyBuffer is the largest body of a request without GetBody that
	// is buffered to be sent again; a larger one gets one attempt. Zero
	// means 8 MiB; negative means never buffer.
	MaxBodyBuffer int64

	// Metrics receives the Transport's Prometheus metrics. Nil means a
	// new Set, which [Transport.WritePrometheus] writes out. Give each
	// Transport its own Set, or upstream names that differ.
	Metrics *metrics.Set

	// Logger receives state changes, auth failures, cooldowns and, once
	// each, misconfigurations (see [UpstreamHealth.Problems]); each
	// failover at Info (from, to, attempt, and why: the failed attempt's
	// outcome and status, or its error's class), and each upstream a
	// request passes over at Debug (upstream, reason, round,
	// retry_after). Those two are logged with the request's context, so
	// that a Handler may add its trace IDs; no record holds a URL query,
	// a header or a key. Nil means nothing is logged.
	Logger *slog.Logger

	// CredentialHeaders names request headers that carry the caller's
	// credentials, besides those the Transport knows: Authorization,
	// Proxy-Authorization, Api-Key, X-Api-Key, X-Goog-Api-Key, Cookie,
	// Openai-Organization, Openai-Project, the names Upstream.Header
	// sets, and any name but Idempotency-Key that contains auth, key,
	// token, secret, passw, credential, signature, session, cookie,
	// bearer, jwt, csrf or xsrf, or has sig, pw, pwd, sid or otp as a
	// word. Credentials reach only the upstream the caller addressed and
	// never appear in errors, Health or logs. Names match in any case.
	CredentialHeaders []string

	// CredentialParams names query parameters on ForwardParams's default
	// list that carry credentials for you (a gateway that takes its key
	// as model=); every name off that list counts as one already. Names
	// match in any case, unescaped; none may be empty.
	CredentialParams []string

	// ForwardParams names query parameters that carry no credentials,
	// besides those LLM APIs define: api-version, alt, $alt,
	// enum-encoding, beta, model, deployment, intent, stream,
	// starting_after, include, include[], limit, after, before, order,
	// after_id, before_id, pageSize, purpose and filter. An upstream the
	// caller did not address gets only the query pairs with these names,
	// and the values of the others never appear in errors, Health or
	// logs; the one it addressed gets the query as written. Names match
	// in any case, unescaped; none may be empty, be in CredentialParams,
	// or be key, api_key, api-key, apikey, access_token, sig or code.
	ForwardParams []string

	// OnStateChange, when set, is called after each change of an
	// upstream's circuit, outside every lock, on the goroutine that caused
	// it. It must not block. Concurrent changes may arrive out of order:
	// order them by At.
	OnStateChange func(StateChange)

	// MeterUsage reads the token usage each answer reports as the caller
	// reads its body (see [Usage]), for the metrics, UpstreamHealth.Usage
	// and Score. It is on as well when OnUsage is set or any Upstream has
	// a Cost; off, only requests whose Trace has a Usage hook are metered.
	MeterUsage bool

	// OnUsage, when set, is called at most once per answer that reports
	// its usage, when its body has been read to its end or closed, on the
	// goroutine that did so. It must not block: the reader waits on it.
	OnUsage func(Usage)

	// FailoverContentPolicy sends a request that a provider's content
	// policy refused (see [DefaultClassifier]) on to the next upstream,
	// as [Unservable], for a fleet whose providers filter differently by
	// design. Off, the refusal is the caller's answer: another provider
	// saying yes would overrule the first one's verdict on the content.
	FailoverContentPolicy bool

	// SDKRetries leaves answers and errors as they are, for an SDK to
	// retry them on its own. Off, an SDK's retry never multiplies the
	// Transport's attempts: an answer that follows more than one attempt,
	// or an upstream skipped, carries "X-Should-Retry: false" when its
	// status is one the Stainless SDKs (openai-go, anthropic-sdk-go)
	// retry, and a request from such an SDK gets, instead of an [*Error]
	// or [*UnroutedError], an answer that says the same ([AnswerError]).
	SDKRetries bool

	// ServedHeader, when set, names a header that each answer RoundTrip
	// returns from an upstream carries, holding that upstream's Name
	// (see [ServedBy]), for a proxy to pass on, such as
	// "Failover-Upstream". It must be a valid header name and no
	// credential's (see CredentialHeaders). Empty means none.
	ServedHeader string
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
// available upstream and fails over to the next when an attempt fails.
//
// RoundTrip follows the http.RoundTripper contract:
//
//   - The caller's request is never modified: each attempt is a clone. The
//     body is read once per attempt (from GetBody after the first) and
//     closed, even on errors.
//   - When any upstream answered, the latest answer is returned with a nil
//     error, whatever its status. Otherwise the error is an [*Error]; the
//     context's error when the caller's context ended (net/http's when its
//     Request.Cancel closed); an [*UnroutedError] or Base's error for a
//     request addressed to no upstream; an [*UnknownUpstreamError] for a
//     bad [WithUpstreams] list; or the caller's own error when its request
//     cannot be sent (a body that fails to read, an invalid header), which
//     blames no upstream.
//   - Unless [Config.SDKRetries]: an answer after more than one attempt
//     or a skipped upstream carries "X-Should-Retry: false" when its
//     status is one SDKs retry; and a request with the Stainless SDKs'
//     headers (X-Stainless-Lang) gets, instead of an [*Error] or an
//     [*UnroutedError], a 502, 503, 504 or 421 answer made by the
//     Transport that says so, whose Request is the caller's and whose
//     error [AnswerError] gives back.
//   - The caller closes the returned body. Its Request is the attempt that
//     got it, with the caller's headers, never an upstream's, from which
//     [ServedBy] reads which upstream answered. Discarded
//     responses are drained (up to 64 KiB) and closed by the Transport.
//   - A redirect hop addressed to no upstream goes to Base, without the
//     caller's credentials when the request before it was routed.
//
// A Transport is safe for concurrent use by multiple goroutines. It starts
// goroutines only for opt-in features: probes and [Config.Shared], which
// [Transport.Close] stops, or the garbage collector once the Transport is
// unreachable, and hedges, which end with their request.
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
	shed        ShedConfig
	cont        ContinueConfig // with its defaults (continue.go)
	retries     int
	waitMin     time.Duration
	waitMax     time.Duration
	retry       retryPolicy
	hang        HangConfig
	auth        AuthConfig
	degraded    DegradedConfig
	maxBody     int64
	metrics     *metrics.Set
	logger      *slog.Logger

	onStateChange func(StateChange)
	shortDeadline atomic.Bool // the Logger heard of a deadline shorter than twice a Headers bound (deadlineBound)
	bg            *background // what Close stops

	lastResortCfg      LastResortConfig
	lastResortInFlight atomic.Int64

	// creds tells which headers and query parameters carry credentials,
	// and holds the upstreams' own, scrubbed from every error message.
	creds *credentials

	reqs requestMetrics

	usage usageConfig // what is done with the answers' usage

	unroutedPolicy UnroutedPolicy
	unroutedHosts  unroutedHosts
	unrouted       *metrics.Counter

	sdkRetries bool // Config.SDKRetries: answers and errors as they are (sdk.go)

	servedHeader string    // Config.ServedHeader, canonical; "": none (served.go)
	problems     *problems // misconfigurations (misconfig.go)

	affinity *affinity // nil: no affinity (affinity.go)
	pins     *pins     // nil: no pinning (pin.go)
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
	if err := cfg.Retry.validate(); err != nil {
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
	if err := cfg.Affinity.validate(); err != nil {
		return nil, err
	}
	if err := cfg.Pinning.validate(); err != nil {
		return nil, err
	}
	if err := cfg.Shed.validate(); err != nil {
		return nil, err
	}
	if err := cfg.Continue.validate(); err != nil {
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
		// A member's rate lives 3×SharedSync in the store, which must
		// not overflow; and a store call bounded by hours is unbounded.
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
		stream:   cmp.Or(cfg.StreamGuard, &StreamGuard{}),
		rate:     cfg.RateLimit.withDefaults(),
		shed:     cfg.Shed.withDefaults(),
		cont:     cfg.Continue.withDefaults(),
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
		sdkRetries:     cfg.SDKRetries,
		affinity:       newAffinity(cfg),
		pins:           newPins(cfg.Pinning),
	}
	t.lastResortCfg.MaxInFlight = cmp.Or(t.lastResortCfg.MaxInFlight, defaultLastResortInFlight)
	if t.waitMin > t.waitMax {
		return nil, configError("RetryWaitMin", "must not exceed RetryWaitMax")
	}
	t.retry.init(cfg.Retry)
	var ownBase *http.Transport // Close closes its idle connections
	if t.base == nil {
		ownBase = http.DefaultTransport.(*http.Transport).Clone()
		t.base = ownBase
	}
	t.classify = checkedClassifier(t.classify)
	if cfg.FailoverContentPolicy {
		t.classify = failingOverContentPolicy(t.classify)
	}
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
		u.breaker, u.timeouts = uc.policy(cfg)
		u.timeout = u.timeouts.Headers
		t.upstreams = append(t.upstreams, u)
		t.models = t.models || len(u.models) > 0 || u.deployed
	}
	// A request that two upstreams may be addressed by would carry the
	// caller's credentials to the one it was not meant for.
	if err := checkDeployments(t.upstreams); err != nil {
		return nil, err
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
	if h := cfg.ServedHeader; h != "" {
		if !validHeaderName(h) {
			return nil, configError("ServedHeader", fmt.Sprintf("%q is not a valid header name", h))
		}
		if creds.header(h) {
			return nil, configError("ServedHeader", fmt.Sprintf("%q names a credential header", h))
		}
		t.servedHeader = http.CanonicalHeaderKey(h)
	}
	var problemWarnings []string
	t.problems, problemWarnings = newProblems(cfg, t.upstreams)
	// Nothing is registered in Metrics before the last check that can
	// fail: a New that fails leaves the caller's Set as it was.
	if cfg.Hedge != nil {
		t.hedge = newHedger(*cfg.Hedge, t.metrics)
	}
	if cfg.Shared != nil {
		t.fleet = newFleet(t, cfg.Shared, cmp.Or(cfg.SharedSync, defaultSharedSync))
	}
	// The probes and the fleet hold the upstreams, and with them their
	// circuits' hooks: these hold t weakly, so that a t dropped without
	// Close is collected and its cleanup stops them.
	wt := weak.Make(t)
	for _, u := range t.upstreams {
		var lease func(time.Time, bool) bool
		if f := t.fleet; f != nil {
			lease = func(now time.Time, ask bool) bool { return f.mayProbe(u, now, ask) }
		}
		u.circuit = newCircuit(u.breaker, u.timeouts.longest(), lease, func(c circuit.Change) {
			if t := wt.Value(); t != nil {
				t.changed(u, c)
			}
		})
		t.newRecent(u)
	}
	t.initMetrics()
	for _, w := range append(warnings(cfg, t.upstreams), problemWarnings...) {
		t.logf(slog.LevelWarn, w)
	}
	t.bg = &background{probes: t.startProbes(cfg.Probe), fleet: t.fleet, upstreams: t.upstreams, base: ownBase, logger: t.logger}
	if t.fleet != nil {
		t.fleet.start()
	}
	if t.bg.hasGoroutines() {
		runtime.AddCleanup(t, (*background).dropped, t.bg)
	}
	return t, nil
}

// RoundTrip implements http.RoundTripper; see [Transport] for its contract.
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.URL == nil {
		closeBody(req)
		return nil, errors.New("failover: nil Request.URL")
	}
	resp, _, err := t.roundTrip(req, nil)
	return resp, err
}

// roundTrip is RoundTrip, which also returns the upstream whose answer
// resp is; k, when not nil, makes the request the continuation of a
// stream that broke (continue.go).
func (t *Transport) roundTrip(req *http.Request, k *continuation) (*http.Response, *upstream, error) {
	// Built in place, so that its request is not copied.
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
	if k != nil {
		o := &requestOptions{cont: k}
		if r.opts != nil {
			*o = *r.opts
			o.cont = k
		}
		r.opts = o
		c.sent = k.sent // its attempts are numbered after those before
	}
	if r.addressed == nil {
		resp, err := t.roundTripUnrouted(*r)
		resp, err = t.forSDK(req, resp, err, false)
		return resp, nil, err
	}
	c.trace = requestTrace(req.Context())
	resp, err := c.run()
	if resp != nil {
		c.affined(resp, c.answer.u, c.answer.k)
		c.pinned(resp, c.answer.u, c.answer.k)
	} else if c.pin != nil {
		c.pinned(nil, nil, nil)
	}
	c.ended(resp, err)
	notes := c.notes(resp)
	if e, ok := err.(*Error); ok && len(notes) > 0 {
		e.Problems = notes
	}
	var u *upstream
	if resp != nil {
		u = c.answer.u
	}
	resp, err = t.forSDK(req, resp, err, c.sent > 1 || c.passed > 0)
	if resp != nil {
		resp = t.served(&c, resp, u, notes)
		if t.cont.On && u != nil {
			resp = c.continuable(resp)
		}
	}
	return resp, u, err
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

// Reset closes the named upstream's circuit and ends its cooldown (and
// its keys'), for an operator who knows it is back; with [Config.Shared],
// in the whole fleet (its keys' in this process only).
func (t *Transport) Reset(name string) error {
	for _, u := range t.upstreams {
		if u.name == name {
			u.circuit.Reset(time.Now())
			u.cd.clear()
			for _, k := range u.keys {
				k.cd.clear()
			}
			if t.fleet != nil {
				t.fleet.publish(SharedEvent{Upstream: u.name, Kind: SharedReset, For: u.circuit.ProbeLife()})
			}
			return nil
		}
	}
	return fmt.Errorf("failover: no upstream named %q", name)
}

// Close stops the probe loops and the fleet's goroutines and waits for them,
// and closes the idle connections of the http.Transport that New made when
// Config.Base was nil (a Base of the caller's is left alone). It is safe to
// call more than once. Requests in flight go on to their end, and requests
// still work after Close.
//
// Close returns within a second, or with Config.Shared within SharedSync
// (at least 1s) and a second, whatever user code does. A probe still in
// user code then (a Base that ignores its context, a Probe.Request or
// Classify that blocks), or a call to the store that ignores its
// deadline, is left to end on its own, Close logs which (a Logger that
// blocks is left likewise), and what it returns is dropped: nothing
// changes routing after Close.
//
// A Transport dropped without Close stops its probes and the fleet's
// goroutines likewise once the garbage collector finds it unreachable.
func (t *Transport) Close() error {
	if t.bg != nil { // nil for a Transport not made by New
		t.bg.stop()
	}
	return nil
}

// closeGrace is how long Close waits for background work (a probe, a call
// to the shared state) to return once told to stop, past the bound of the
// call in flight: user code that honours its context unwinds within it.
// Its last closeLogWait is the Logger's, told what is left.
const closeGrace = time.Second

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
