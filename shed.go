package failover

import (
	"math"
	"net/http"
	"time"

	"github.com/failover-go/failover/internal/mono"
)

// Shedding by criticality: a request marked [WithSheddable] (a batch job,
// background work) leaves an upstream's last rate-limit headroom to the
// interactive requests, and is refused at once, with a Retry-After, where
// an interactive one would wait or go past a circuit. plan.next asks
// shedding before admit; run ends the request when its round admitted
// nothing.

// ShedConfig says when a sheddable request ([WithSheddable]) is refused.
// Whatever Headroom, a sheddable request is refused at once, never
// waiting within RateLimit.MaxWait nor going to the last resort, when no
// upstream it may use takes it now (each cooling down, open or, by
// Headroom, short of headroom), and it passes over an upstream with a
// rate-limit window at 0 (ReasonOutOfHeadroom).
type ShedConfig struct {
	// Headroom is the share of a rate-limit window's limit below which
	// an upstream takes no sheddable request, read from the limits and
	// remaining counts its successes report (x-ratelimit-limit-requests
	// and friends), from 0 to 1. Zero means 0.1: the last 10% of every
	// window are kept for interactive requests. -1 sheds only when no
	// upstream can take the request.
	Headroom float64
}

// defaultShedHeadroom is ShedConfig.Headroom's zero value's meaning.
const defaultShedHeadroom = 0.1

func (c ShedConfig) validate() error {
	switch h := c.Headroom; {
	case math.IsNaN(h):
		return configError("Shed.Headroom", "is NaN: want -1, or a share from 0 to 1")
	case h > 1:
		return configError("Shed.Headroom", "must be at most 1 (the whole window)")
	case h < 0 && h != -1:
		return configError("Shed.Headroom", "must be -1 (shed only when no upstream can take the request) or from 0 to 1")
	}
	return nil
}

func (c ShedConfig) withDefaults() ShedConfig {
	if c.Headroom == 0 {
		c.Headroom = defaultShedHeadroom
	}
	return c
}

// shedding is whether u takes no sheddable request at now, and if so, for
// how long: it reported a rate-limit window at 0 that has not reset
// (ReasonOutOfHeadroom), or, unless Shed.Headroom is -1, a window with less
// than Shed.Headroom of its limit left at its last full report, which
// holds until that window resets. An upstream with Keys is short only
// when every key is, for the shortest wait. plan.next asks it for a
// sheddable request before admit.
func (t *Transport) shedding(u *upstream, now time.Time) availability {
	m := mono.Of(now)
	if len(u.keys) == 0 {
		return t.short(&u.headroom, m)
	}
	a := availability{reason: ReasonShed, known: true}
	for i, k := range u.keys {
		ka := t.short(&k.headroom, m)
		if ka.reason == "" {
			return ka
		}
		if i == 0 || ka.wait < a.wait {
			a.wait = ka.wait
		}
	}
	return a
}

// short is shedding for one headroom: an upstream's, or one of its keys'.
func (t *Transport) short(h *headroomState, m mono.Time) availability {
	if until := mono.Time(h.until.Load()); until != 0 && m < until {
		return availability{reason: ReasonShed, wait: until.Sub(m), known: true}
	}
	if t.shed.Headroom < 0 {
		return availability{known: true}
	}
	if share, until, ok := h.last.Load().shareAt(m); ok && share < t.shed.Headroom {
		return availability{reason: ReasonShed, wait: until.Sub(m), known: true}
	}
	return availability{known: true}
}

// shed reports whether the request is sheddable (WithSheddable).
func (r *request) shed() bool { return r.opts != nil && r.opts.shed }

// refuse ends a sheddable request that its round sent nowhere at once:
// with the answer held, if an upstream said it cannot serve the request,
// or else an Error that matches ErrShed and says when to come back: the
// shortest wait its skipped upstreams announced, or next, how long until
// the first upstream takes requests again, when known.
func (c *call) refuse(next time.Duration, known bool) (*http.Response, error) {
	resp, err := c.finish()
	if e, ok := err.(*Error); ok {
		e.shed = true
		if e.retry == 0 && known && next > 0 {
			e.retry = next
		}
	}
	return resp, err
}
