package failover

import (
	"cmp"
	"context"
	"fmt"
	"hash/maphash"
	"net/http"
	"time"

	"github.com/VictoriaMetrics/metrics"
	"github.com/tidwall/gjson"
)

// AffinityConfig keeps a conversation on one upstream while it is
// healthy, so that the provider's prompt cache, which discounts the
// cached part of a prompt (by up to 90 %) only when a conversation's
// requests reach the deployment that cached it, keeps hitting. It applies
// when the Router balances between upstreams ([Weighted], [LeastLatency],
// [Score]); under [Priority] and a request's own list ([WithUpstreams]) it
// changes nothing, and a Router of your own is left to decide.
//
// A request's session is, in this order: its context's ([WithSession]),
// the value of Header, the body's "prompt_cache_key" (OpenAI's), or by
// default a hash of the body's stable prefix: the model, the system
// prompt or instructions, and the messages up to the first user message.
// Each turn of an agent loop under an unmodified SDK starts the same way,
// so it finds its session's upstream. The session goes to the upstream
// that answered its last request, when that one takes requests and is not
// demoted; otherwise the Router chooses and the upstream that answers
// holds the session from then on: a session never waits for its
// upstream.
type AffinityConfig struct {
	// Off turns affinity off.
	Off bool

	// TTL is how long a session stays with its upstream after its last
	// request, about the providers' cache lifetimes (5 minutes to an
	// hour). Zero means 5 minutes; at most 24 hours.
	TTL time.Duration

	// Header names a request header whose value is the session, such as
	// "X-Session-Id". Empty means none.
	Header string

	// MaxSessions bounds how many sessions are remembered; past it, the
	// oldest are forgotten first. Zero means 100,000.
	MaxSessions int
}

// Defaults and bounds of AffinityConfig.
const (
	defaultAffinityTTL = 5 * time.Minute
	maxAffinityTTL     = 24 * time.Hour
	defaultMaxSessions = 100_000
	maxBindings        = 1 << 24
)

func (c AffinityConfig) validate() error {
	switch {
	case c.TTL < 0:
		return configError("Affinity.TTL", "must not be negative")
	case c.TTL > maxAffinityTTL:
		return configError("Affinity.TTL", "must be at most 24h")
	case c.MaxSessions < 0:
		return configError("Affinity.MaxSessions", "must not be negative")
	case c.MaxSessions > maxBindings:
		return configError("Affinity.MaxSessions", fmt.Sprintf("must be at most %d", maxBindings))
	case c.Header != "" && !validHeaderName(c.Header):
		return configError("Affinity.Header", fmt.Sprintf("%q is not a valid header name", c.Header))
	}
	return nil
}

// balancing reports whether r is one of this package's Routers that
// spread requests over upstreams, where affinity applies.
func balancing(r Router) bool {
	switch r.(type) {
	case *Weighted, LeastLatency, *LeastLatency, Score, *Score:
		return true
	}
	return false
}

// affinity is a Transport's AffinityConfig in effect: the sessions and
// where each went.
type affinity struct {
	header   string // canonical; "": none
	sessions *bindings

	// Sessions answered: new, at the upstream of their last request, or
	// moved to another.
	started, kept, moved *metrics.Counter
}

// newAffinity returns the affinity of cfg, nil when it does not apply.
func newAffinity(cfg Config) *affinity {
	a := cfg.Affinity
	if a.Off || !balancing(cfg.Router) || len(cfg.Upstreams) < 2 {
		return nil
	}
	af := &affinity{sessions: newBindings(cmp.Or(a.MaxSessions, defaultMaxSessions), cmp.Or(a.TTL, defaultAffinityTTL))}
	if a.Header != "" {
		af.header = http.CanonicalHeaderKey(a.Header)
	}
	return af
}

// WithSession returns a copy of ctx with which a request belongs to the
// session key, which keeps it on the upstream that answered the session
// before (see [AffinityConfig]). An empty key leaves the session to the
// Transport. A later call replaces key.
func WithSession(ctx context.Context, key string) context.Context {
	return withOptions(ctx, func(o *requestOptions) { o.session = key })
}

// session returns the hash of the request's session, 0 when it has none
// (a request without a JSON body that says how its conversation begins).
func (c *call) session(body []byte) uint64 {
	var h maphash.Hash
	h.SetSeed(bindingSeed)
	switch {
	case c.opts != nil && c.opts.session != "":
		h.WriteString("s\x00")
		h.WriteString(c.opts.session)
	case c.t.affinity.header != "" && c.req.Header.Get(c.t.affinity.header) != "":
		h.WriteString("h\x00")
		h.WriteString(c.req.Header.Get(c.t.affinity.header))
	case len(body) == 0:
		return 0
	default:
		if k := gjson.GetBytes(body, "prompt_cache_key"); k.Type == gjson.String && k.Str != "" {
			h.WriteString("p\x00")
			h.WriteString(k.Str)
			break
		}
		if !conversationPrefix(&h, body) {
			return 0
		}
	}
	return h.Sum64()
}

// conversationPrefix writes to h what a conversation's requests all begin
// with, in the dialects of OpenAI (chat completions, responses),
// Anthropic and Gemini: the model, the system prompt or instructions, and
// the messages up to the first of the user's. It reports false when the
// body holds no conversation.
func conversationPrefix(h *maphash.Hash, body []byte) bool {
	found := false
	for _, r := range gjson.GetManyBytes(body, "model", "system", "instructions", "systemInstruction", "system_instruction") {
		if r.Exists() {
			h.WriteString(r.Raw)
			h.WriteByte(0)
		}
	}
	for _, list := range gjson.GetManyBytes(body, "messages", "input", "contents") {
		if list.IsArray() {
			list.ForEach(func(_, m gjson.Result) bool {
				h.WriteString(m.Raw)
				h.WriteByte(0)
				found = true
				role := m.Get("role")
				// Gemini's contents may leave the user's role unsaid.
				return !(role.Str == "user" || !role.Exists() && m.Get("parts").Exists())
			})
		}
	}
	return found
}

// read takes what the request's body says, data (nil when it cannot be
// read): its model, for Upstream.Models, and its session and the
// session's upstream, for affinity.
func (c *call) read(data []byte) {
	if c.t.models {
		if m, ok := requestModel(data); ok {
			c.model, c.modelBody = m, data
		}
	}
	if af := c.t.affinity; af != nil && c.ups == nil {
		if c.sessionKey = c.session(data); c.sessionKey != 0 {
			if b, ok := af.sessions.lookup(c.sessionKey, time.Now()); ok {
				c.affine, c.affineKey = b.u, b.key
			}
		}
	}
}

// affineWell reports whether the request's session has an upstream that
// takes a request for model at now and is not demoted: the request then
// goes there first. A session never waits for its upstream.
func (c *call) affineWell(model string, now time.Time) bool {
	u := c.affine
	return u != nil && c.t.admit(u, model, now, nil).reason == "" && c.t.demotion(u, now) == ""
}

// affined records that the request's session is with the upstream that
// answered it (with its key k, nil for none), when that answer is a
// success: the next request of the session goes there first.
func (c *call) affined(resp *http.Response, u *upstream, k *key) {
	af := c.t.affinity
	if af == nil || c.sessionKey == 0 || resp == nil || u == nil || resp.StatusCode/100 != 2 {
		return
	}
	switch c.affine {
	case nil:
		af.started.Inc()
	case u:
		af.kept.Inc()
	default:
		af.moved.Inc()
	}
	af.sessions.bind(c.sessionKey, u, k.nameOf(), time.Now(), 0)
}
