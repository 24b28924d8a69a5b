package failover

import (
	"cmp"
	"context"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/VictoriaMetrics/metrics"

	"github.com/failover-go/failover/internal/circuit"
)

// PinConfig configures pinning: a request that references state a
// provider holds (an OpenAI Responses previous_response_id or
// conversation, a file, batch, vector store, assistant or thread ID,
// encrypted reasoning items, a Gemini cachedContent) works only against
// the organisation and key that created that state. Sent anywhere else it
// gets a 400 or 404 that looks like an outage, or carries the reference
// to another provider. So such a request goes only to the upstream that
// holds its state, and when that upstream cannot take it, it fails at
// once with a [*PinnedError] and a Retry-After rather than failing over.
//
// The Transport learns where state lives from the answers that create it
// (the IDs of the responses, files, batches and the like that a success
// returns) and from [WithPinned]. A reference it has not learned is taken
// to live at the upstream the request was addressed to, where the caller
// sent it. With [Config.Shared], what one member learns the fleet knows.
// Pinning is on by default: it is a correctness rule.
type PinConfig struct {
	// Off turns pinning off: requests that reference state fail over
	// like any other.
	Off bool

	// TTL is how long a learned reference is remembered after its last
	// use. Zero means 24 hours; at most 30 days, as long as providers
	// keep stored responses.
	TTL time.Duration

	// MaxRefs bounds how many references are remembered; past it, the
	// oldest are forgotten first (their requests then go to the upstream
	// they are addressed to). Zero means 100,000.
	MaxRefs int
}

// Defaults and bounds of PinConfig.
const (
	defaultPinTTL  = 24 * time.Hour
	maxPinTTL      = 30 * 24 * time.Hour
	defaultMaxRefs = 100_000
)

func (c PinConfig) validate() error {
	switch {
	case c.TTL < 0:
		return configError("Pinning.TTL", "must not be negative")
	case c.TTL > maxPinTTL:
		return configError("Pinning.TTL", "must be at most 720h (30 days)")
	case c.MaxRefs < 0:
		return configError("Pinning.MaxRefs", "must not be negative")
	case c.MaxRefs > maxBindings:
		return configError("Pinning.MaxRefs", "must be at most "+strconv.Itoa(maxBindings))
	}
	return nil
}

// pins is a Transport's pinning in effect: where each learned reference
// lives.
type pins struct {
	refs    *bindings
	learned atomic.Bool // some reference was ever learned: requests read their bodies for references

	// Requests that referenced state: sent to their pin, or refused
	// there; and references learned.
	followed, refused, learnedN *metrics.Counter
}

// newPins returns the pinning of cfg, nil when it is off.
func newPins(cfg PinConfig) *pins {
	if cfg.Off {
		return nil
	}
	return &pins{refs: newBindings(cmp.Or(cfg.MaxRefs, defaultMaxRefs), cmp.Or(cfg.TTL, defaultPinTTL))}
}

// learn records that ref lives at u, with its key named key ("" for
// none), from now, for d (the TTL when 0).
func (p *pins) learn(ref string, u *upstream, key string, now time.Time, d time.Duration) {
	p.refs.bind(hashName(ref), u, key, now, d)
	p.learned.Store(true)
	p.learnedN.Inc()
}

// WithPinned returns a copy of ctx with which a request goes only to the
// named upstream (Upstream.Name), which holds state the request relies
// on, as a reference the Transport learned would pin it (see
// [PinConfig]): when that upstream cannot take it, the request fails at
// once with a [*PinnedError]. A name no upstream has fails the request
// with an [*UnknownUpstreamError]. It applies even when pinning is off.
func WithPinned(ctx context.Context, upstream string) context.Context {
	return withOptions(ctx, func(o *requestOptions) { o.pinned = upstream })
}

// ErrPinned is matched by the error of a request that references state
// held at one upstream, which could not take it: the request was not
// failed over (see [PinnedError]).
var ErrPinned = errors.New("failover: pinned to the upstream that holds the request's state")

// PinnedError is the cause, in an [*Error]'s [AttemptError], of a request
// pinned to the upstream that holds its state (see [PinConfig]) when that
// upstream could not take it. It names the upstream and the reference,
// never a credential.
type PinnedError struct {
	// Upstream is the Name of the upstream that holds the state.
	Upstream string
	// Ref is the reference the request made ("resp_abc123",
	// "file-xyz", "cachedContents/c1"), "encrypted reasoning" for
	// reasoning items only their organisation can read, "resumable
	// upload session" for a Google upload's (its upload_id is a
	// credential), or empty when the request was pinned by WithPinned.
	Ref string
	// Err is why the upstream did not take the request: ErrCircuitOpen,
	// ErrRateLimited, ErrModelNotServed, an attempt's error, or
	// ErrLeftOut when WithUpstreams leaves the upstream out.
	Err error

	retry time.Duration
	msg   string // Err's message with every known secret scrubbed, as an AttemptError's
}

// Error says which state the request references, where it lives, and why
// it was not sent there, with every configured credential and every
// credential of the request scrubbed from why.
func (e *PinnedError) Error() string {
	s := "failover: request"
	if e.Ref != "" {
		s += " references " + strconv.Quote(e.Ref) + ","
	} else {
		s += " pinned by WithPinned to"
	}
	return s + " held at upstream " + strconv.Quote(e.Upstream) + ", not failed over: " + cmp.Or(e.msg, e.Err.Error())
}

// Unwrap returns ErrPinned and the cause.
func (e *PinnedError) Unwrap() []error { return []error{ErrPinned, e.Err} }

// RetryAfter returns how long until the upstream takes requests again,
// or 0 when unknown.
func (e *PinnedError) RetryAfter() time.Duration { return e.retry }

// ErrLeftOut is a [PinnedError]'s cause when the request's WithUpstreams
// list leaves out the upstream that holds its state.
var ErrLeftOut = errors.New("failover: WithUpstreams leaves out the upstream")

// opaqueRef is the Ref of a request whose state has no reference:
// encrypted reasoning items.
const opaqueRef = "encrypted reasoning"

// uploadRef is the Ref of a request to a Google resumable upload's
// session: the upload_id of its URL, which is never learned, lets anyone
// upload, so it is not said.
const uploadRef = "resumable upload session"

// pinTo pins the request to u, which holds ref ("" for WithPinned).
func (c *call) pinTo(u *upstream, ref string) {
	c.pin, c.pinRef = u, ref
}

// readPins finds what state the request references in its method, path,
// query and body (nil when unread), and pins it to the upstream that holds the
// first reference learned, else, for a reference not learned, to the
// upstream it was addressed to (the first of its WithUpstreams list, when
// it has one). It also finds whether a success creates state to learn,
// for a request pinned by WithPinned too.
func (c *call) readPins(body []byte) {
	c.pinsRead = true
	p := c.t.pins
	if p == nil {
		return
	}
	c.creates = createsState(c.req.Method, c.rest, body) // by WithPinned too
	if c.pin != nil {
		return
	}
	refs, opaque := stateRefs(nil, c.req.Method, c.rest, body)
	upload := len(queryRef(nil, 0, c.req.URL.RawQuery)) > 0 // (c.rest has no query)
	if len(refs) == 0 && !opaque && !upload {
		return
	}
	now := time.Now()
	for _, ref := range refs {
		if b, ok := p.refs.lookup(hashName(ref), now); ok {
			c.pinTo(b.u, ref)
			c.pinKey = b.key
			return
		}
	}
	ref := opaqueRef
	switch {
	case len(refs) > 0:
		ref = refs[0]
	case upload:
		ref = uploadRef
	}
	if c.ups != nil {
		c.pinTo(c.ups[0], ref) // the caller said where the request goes
		return
	}
	c.pinTo(c.addressed, ref)
}

// readsEarly reports whether the request's body is read for the state it
// references before its first attempt: when it is in memory already, when
// some reference was learned, or when its path may create or name state.
// Otherwise it is read only if the request is about to go elsewhere than
// where it was addressed (see pinLate), which most requests never are.
func (c *call) readsEarly() bool {
	p := c.t.pins
	return p != nil && (c.body.buffered != nil || p.learned.Load() || c.t.hedge != nil || c.t.fleet != nil || statePath(c.req.Method, c.rest))
}

// pinLate reads the request's body for the state it references when the
// plan is about to send it, in s, elsewhere than where it was addressed,
// if it was not read before. It reports whether that pinned the request
// elsewhere than s.u: then s's permit is handed back and p is the new
// plan, over at once when the pin had its turn in the round.
func (c *call) pinLate(p *plan, s *step, now time.Time) bool {
	if !c.pinnedFor(s.u) || c.pin == s.u {
		return false
	}
	came := p.came(c.pin)
	s.u.circuit.Done(s.p, circuit.Neutral, now)
	c.plan(p, now)
	if came {
		p.i = len(p.order) // the pin had its turn in the round
	}
	return true
}

// pinnedFor reports whether the request is pinned (see readPins), once
// its body was read for the state it references when it is about to go
// to u elsewhere than where it was addressed, if it was not read before.
// The plan's steps (pinLate) and the last resort ask it.
func (c *call) pinnedFor(u *upstream) bool {
	if !c.pinsRead && u != c.addressed && c.t.pins != nil {
		data := c.body.data(c.t.readLimit())
		c.body.keep(data)
		c.readPins(data)
	}
	return c.pin != nil
}

// learning has a success's body tell the ID of the state the request
// created (see createsState), so that later requests that reference it
// go to u, and with Config.Shared to u in the whole fleet.
func (c *call) learning(resp *http.Response, u *upstream, k *key) {
	p := c.t.pins
	if p == nil || !c.creates || resp.StatusCode/100 != 2 || resp.Body == nil || resp.Body == http.NoBody {
		return
	}
	f := c.t.fleet
	stream := isEventStream(resp.Header.Get("Content-Type"))
	name := k.nameOf()
	resp.Body = newRefScanner(resp.Body, stream, func(id string) {
		p.learn(id, u, name, time.Now(), 0)
		if f != nil {
			f.publish(SharedEvent{Upstream: u.name, Kind: SharedPin, Ref: id, Key: name, For: p.refs.ttl})
		}
	})
}

// pinned ends the request's use of pinning: it counts what came of a
// pinned request, and learns what its answer created.
func (c *call) pinned(resp *http.Response, u *upstream, k *key) {
	p := c.t.pins
	if p == nil && c.pin == nil {
		return
	}
	if c.pin != nil && p != nil {
		if resp != nil {
			p.followed.Inc()
		} else {
			p.refused.Inc()
		}
	}
	if resp != nil && u != nil {
		c.learning(resp, u, k)
	}
}

// byOption pins the request to the upstream its WithPinned names. A name
// no upstream has fails it, as the caller's own fault.
func (c *call) byOption(name string) error {
	for _, u := range c.t.upstreams {
		if u.name == name {
			c.pinTo(u, "")
			return nil
		}
	}
	return c.unknown([]string{name})
}

// pinnedError is the AttemptError of rec, a record of the upstream the
// request is pinned to, for its Error: the cause as a PinnedError.
func (c *call) pinnedError(rec attemptRec) *AttemptError {
	a := rec.attemptError()
	pe := &PinnedError{Upstream: c.pin.name, Ref: c.pinRef, Err: a.Err, retry: a.RetryAfter(), msg: a.msg}
	if a.msg != "" {
		a.msg = pe.Error()
	}
	a.Err = pe
	return a
}

// statePath reports whether a request's method and path, under its
// upstream's base, name state or create it (see stateRefs, createsState).
func statePath(method, path string) bool {
	var a [4]string
	refs := len(pathRefs(a[:0], 0, path))
	if refs > 0 || method != "POST" {
		return refs > 0
	}
	if i := strings.IndexAny(path, "?#"); i >= 0 {
		path = path[:i]
	}
	return createsAt(path, 0, nil)
}
