package failover

import (
	"bytes"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tidwall/gjson"
)

// Timeouts is how long an attempt may wait on its upstream, by what it
// waits for. A provider sends a stream's headers as soon as it takes the
// request, then may think for minutes before the first content, then
// sends content without long pauses; an answer that is not streamed comes
// whole, headers and all, when the generation ends. So a silent upstream
// is told from a thinking one by the headers of a stream, and the bounds
// on thinking are long.
//
// Until anything reached the caller, an attempt out of time fails over to
// the next upstream with [ErrAttemptTimeout] or [ErrFirstContentTimeout];
// once a stream's content reached the caller, a silence past Idle ends it
// with a [*StallError]. Each counts against the upstream's circuit. So
// does an attempt the caller's deadline ended before any answer, when the
// upstream had answered nothing sent since it began and had been silent
// longer than its normal time to answer ([HangConfig]); while that is not
// yet known, a stream's after Headers, and one not streamed never.
//
// A zero field means its default; a negative one means no bound.
type Timeouts struct {
	// Headers bounds the wait for the response headers of a streamed
	// request: a JSON body whose "stream" is true, an Accept of
	// text/event-stream, or a streaming method's path (Gemini's
	// :streamGenerateContent, Bedrock's converse-stream). Zero means 30s.
	Headers time.Duration

	// FirstContent bounds the wait, from a stream's headers, for its first
	// content event (see [StreamGuard]), the time a reasoning model may
	// think. Zero means 10m.
	FirstContent time.Duration

	// Idle bounds each silence of a stream once its answer has begun:
	// the time a read of its body waits for bytes. A caller slow to read
	// is not timed. A stream that begins with the model's reasoning, or
	// is handed on before any content, keeps FirstContent's bound (if
	// longer) instead. Zero means 20s.
	Idle time.Duration

	// Attempt bounds the wait for the answer to a request that is not
	// streamed: its headers come with the whole generation. Zero means
	// 10m.
	Attempt time.Duration
}

// Defaults of Timeouts.
const (
	defaultHeadersTimeout      = 30 * time.Second
	defaultFirstContentTimeout = 10 * time.Minute
	defaultIdleTimeout         = 20 * time.Second
	defaultAttemptTimeout      = 10 * time.Minute
)

// over returns c with each zero field taken from inherited.
func (c Timeouts) over(inherited Timeouts) Timeouts {
	if c.Headers == 0 {
		c.Headers = inherited.Headers
	}
	if c.FirstContent == 0 {
		c.FirstContent = inherited.FirstContent
	}
	if c.Idle == 0 {
		c.Idle = inherited.Idle
	}
	if c.Attempt == 0 {
		c.Attempt = inherited.Attempt
	}
	return c
}

// resolved returns c with its defaults, and 0 for each field with no
// bound.
func (c Timeouts) resolved() Timeouts {
	pick := func(d, def time.Duration) time.Duration {
		switch {
		case d < 0:
			return 0
		case d == 0:
			return def
		}
		return d
	}
	return Timeouts{
		Headers:      pick(c.Headers, defaultHeadersTimeout),
		FirstContent: pick(c.FirstContent, defaultFirstContentTimeout),
		Idle:         pick(c.Idle, defaultIdleTimeout),
		Attempt:      pick(c.Attempt, defaultAttemptTimeout),
	}
}

// longest is the longest an attempt bounded by c may take before its
// answer is the caller's: a stream's headers and first content, or an
// unstreamed answer; 0 when one of them has no bound.
func (c Timeouts) longest() time.Duration {
	if c.Headers == 0 || c.FirstContent == 0 || c.Attempt == 0 {
		return 0
	}
	return max(c.Attempt, c.Headers+c.FirstContent)
}

// timeoutsOf returns the Timeouts in effect at an upstream configured as
// uc under cfg: uc.Timeouts's fields over cfg.Timeouts's, the deprecated
// AttemptTimeouts standing in for Headers and Attempt where those are
// zero, then the defaults.
func timeoutsOf(uc Upstream, cfg Config) Timeouts {
	c := cfg.Timeouts
	if d := cfg.AttemptTimeout; d > 0 {
		c = c.over(Timeouts{Headers: d, Attempt: d})
	}
	u := uc.Timeouts
	if d := uc.AttemptTimeout; d > 0 {
		u = u.over(Timeouts{Headers: d, Attempt: d})
	}
	return u.over(c).resolved()
}

// headersWatch bounds an attempt's wait for its response headers: Headers
// for a streamed request, Attempt for one that is not. The timer first
// fires at the shorter bound; only then is the request looked at, so that
// a request answered in time is never read for its kind. The timer and
// its func come from a pool, as a hedge's do (see hedgeFire): a watch
// that never fired allocates nothing.
type headersWatch struct {
	mu      sync.Mutex
	timer   *time.Timer
	f       *watchFire
	bubbled bool // armed in a synctest bubble: the timer is the bubble's
	e       ender
	out     *http.Request
	sent    time.Time
	bound   time.Duration // the bound of a streamed request; 0: none
	answer  time.Duration // the bound of one that is not; 0: none
	max     int64         // the largest body read for its kind
	kind    bool          // look at the kind even when both bounds are one
	known   bool          // the kind was looked at
	done    bool
	fired   time.Duration // the bound that ended the attempt; 0: none did
	stream  bool          // the request is streamed, when fired says so
}

// watchFire is a headersWatch's timer func, pooled with the timer when
// that was made outside any synctest bubble.
type watchFire struct {
	w     atomic.Pointer[headersWatch]
	fn    func()
	timer *time.Timer
}

var watchFires = sync.Pool{New: func() any {
	f := new(watchFire)
	f.fn = f.run
	return f
}}

func (f *watchFire) run() {
	if w := f.w.Load(); w != nil {
		w.fire()
	}
}

// start arms w, of an attempt sent now, unless neither bound is set; w
// nil means a new one. It returns the armed watch, or nil. kind says to
// learn the request's kind when the watch fires even if both bounds are
// one.
func (w *headersWatch) start(e ender, out *http.Request, now time.Time, stream, answer time.Duration, max int64, kind bool) *headersWatch {
	if stream <= 0 && answer <= 0 {
		return nil
	}
	if w == nil {
		w = new(headersWatch)
	}
	w.e, w.out, w.sent, w.bound, w.answer, w.max, w.kind = e, out, now, stream, answer, max, kind
	w.known, w.done, w.fired, w.stream = false, false, 0, false
	first := stream
	if first <= 0 || (answer > 0 && answer < first) {
		first = answer
	}
	w.mu.Lock() // a fire at once finds the timer set
	defer w.mu.Unlock()
	w.f = watchFires.Get().(*watchFire)
	w.f.w.Store(w)
	if w.bubbled = inBubble(now); !w.bubbled && w.f.timer != nil {
		w.timer = w.f.timer
		w.timer.Reset(first)
	} else {
		w.timer = time.AfterFunc(first, w.f.fn)
	}
	return w
}

func (w *headersWatch) fire() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.done {
		return
	}
	if !w.known && (w.bound != w.answer || w.kind) {
		w.known, w.stream = true, streamed(w.out, w.max)
	}
	bound := w.answer
	if w.stream {
		bound = w.bound
	}
	if bound <= 0 {
		return // no bound for its kind
	}
	if left := bound - time.Since(w.sent); left > 0 {
		w.timer.Reset(left)
		return
	}
	w.fired = bound
	w.e.stop(ErrAttemptTimeout)
}

// end stops the watch once Base has returned, and reports the bound that
// ended the attempt, if one did, and whether the request is streamed. A
// timer that never fired goes back to the pool with its func.
func (w *headersWatch) end() (fired time.Duration, stream bool) {
	w.mu.Lock()
	w.done = true
	stopped := w.timer.Stop()
	fired, stream = w.fired, w.stream
	w.mu.Unlock()
	if stopped {
		// Its func is not on its way, and cannot be.
		w.f.w.Store(nil)
		if !w.bubbled {
			w.f.timer = w.timer
		}
		watchFires.Put(w.f)
	}
	w.f, w.timer, w.out = nil, nil, nil
	return fired, stream
}

// streamed reports whether req asks for a streamed answer: an Accept of
// text/event-stream, Gemini's alt=sse or a streaming method's path, or a
// JSON body (read from GetBody, at most max bytes) whose top-level
// "stream" is true.
func streamed(req *http.Request, max int64) bool {
	for _, a := range req.Header["Accept"] {
		if strings.Contains(strings.ToLower(a), "text/event-stream") {
			return true
		}
	}
	p := req.URL.Path
	if strings.Contains(p, ":streamGenerateContent") || strings.HasSuffix(p, "/converse-stream") ||
		strings.HasSuffix(p, "/invoke-with-response-stream") || req.URL.Query().Get("alt") == "sse" {
		return true
	}
	if req.GetBody == nil {
		return false
	}
	rc, err := req.GetBody()
	if err != nil || rc == nil {
		return false
	}
	defer rc.Close()
	data, err := io.ReadAll(io.LimitReader(rc, oneMore(max)))
	if err != nil || int64(len(data)) > max {
		return false
	}
	data = bytes.TrimSpace(data)
	if len(data) == 0 || data[0] != '{' || !nestsShallow(data) {
		return false
	}
	return gjson.GetBytes(data, "stream").Type == gjson.True
}

// minDeadlineShare is the shortest bound a caller's deadline cuts a
// stream's Headers bound to (deadlineBound).
const minDeadlineShare = 5 * time.Second

// deadlineBound returns the bound on a stream's headers for an attempt
// with left until the caller's deadline: half of what is left when that
// is shorter than bound and another upstream could take the request, so
// that a silent upstream leaves the next one time to answer; never under
// minDeadlineShare. The first time a deadline leaves no room for
// failover, the Logger hears of it.
func (t *Transport) deadlineBound(u *upstream, bound, left time.Duration) time.Duration {
	if bound <= 0 || left >= 2*bound {
		return bound
	}
	if left < bound && t.shortDeadline.CompareAndSwap(false, true) {
		t.logf(slog.LevelWarn, "a request's deadline (http.Client.Timeout or its context) is shorter than Timeouts.Headers, which cannot take effect: a silent upstream holds it up to half its time",
			slog.String("upstream", u.name), slog.Duration("left", left), slog.Duration("headers", bound))
	}
	if len(t.upstreams) < 2 {
		return bound
	}
	return min(bound, max(left/2, minDeadlineShare))
}

// warnings returns what New tells the Logger of cfg: settings that can
// never take effect as written.
func warnings(cfg Config, ups []*upstream) []string {
	var w []string
	if g := cfg.StreamGuard; g != nil && g.FirstByteTimeout > 0 && cfg.Timeouts.FirstContent != 0 {
		w = append(w, "StreamGuard.FirstByteTimeout is set: it replaces Timeouts.FirstContent, which has no effect")
	}
	if h := cfg.Hedge; h != nil && h.Delay > 0 {
		never := true
		for _, u := range ups {
			if u.timeouts.Headers == 0 || h.Delay < u.timeouts.Headers || u.timeouts.Attempt == 0 || h.Delay < u.timeouts.Attempt {
				never = false
			}
		}
		if never {
			w = append(w, fmt.Sprintf("Hedge.Delay %v is not shorter than any upstream's Timeouts: no hedge is ever sent", h.Delay))
		}
	}
	if cfg.Retries > 0 && cfg.RetryWaitMin > 0 && cfg.RateLimit.MaxCooldown > 0 && cfg.RetryWaitMin > cfg.RateLimit.MaxCooldown {
		w = append(w, "RetryWaitMin exceeds RateLimit.MaxCooldown, which caps it")
	}
	return w
}
