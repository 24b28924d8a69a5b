package failover

import (
	"fmt"
	"log/slog"
	"maps"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/VictoriaMetrics/metrics"

	"github.com/failover-go/failover/internal/mono"
)

// Key is one of an upstream's keys ([Upstream.Keys]): credentials of the
// same provider, at the same BaseURL, with a rate limit and a revocation
// of their own. A key answered 429 cools down on its own and the request
// goes at once to the next key; the upstream cools down only when every
// key does.
type Key struct {
	// Name names the key in Health, metrics and logs, which never show
	// its value. It is required, and unique among the upstream's keys.
	Name string

	// Header holds the key's credentials (Authorization, x-api-key,
	// ...), set over Upstream.Header on every request sent with the key:
	// its values replace Upstream.Header's of the same names. It follows
	// Upstream.Header's rules: a caller's value of any of its names
	// reaches no upstream but the one the caller addressed, and its
	// values of 8 bytes or more never appear in logs, errors, Health or
	// metrics.
	Header http.Header
}

// KeyHealth is a snapshot of one key of an upstream, as
// [UpstreamHealth.Keys] holds it. It names the key; it never holds its
// value.
type KeyHealth struct {
	Name string

	// Cooldown is how long the key still cools down after a 429, and
	// CooldownReason why ("rate_limited", "quota_exhausted").
	Cooldown       time.Duration
	CooldownReason CooldownReason

	// AuthFailing says the key looks revoked ([AuthConfig]): it is tried
	// after the upstream's other keys.
	AuthFailing bool

	// Headroom is what the answers to the key last said of its rate
	// limits (nil when they never did), and OutOfHeadroom whether a
	// window they reported at 0 has not reset yet, which puts the key
	// behind the others. HeadroomShare is the lowest share of its limit
	// a window had left, as [UpstreamHealth.HeadroomShare] says of an
	// upstream without Keys: sheddable requests read it per key.
	Headroom      *Headroom
	OutOfHeadroom bool
	HeadroomShare float64
}

// maxKeys bounds an upstream's keys: a request tracks those it tried in
// the bits of a uint64.
const maxKeys = 64

// key is one key of an upstream and its own live state.
type key struct {
	name     string
	bit      uint64        // 1 << its index among the upstream's keys
	headers  []headerField // its Header, canonical, sorted by key: set over the upstream's (rewrite)
	cd       cooldown
	headroom headroomState
	auth     authState

	// Its metrics: attempts sent with it, and cooldowns it started.
	attempts, cooldowns *metrics.Counter
}

// newKeys checks the i-th upstream's Keys and gives u their state. The
// names of the keys' headers join u's own in sets: the caller's values of
// them go to no upstream.
func (u *upstream) newKeys(i int, ks []Key) error {
	field := func(j int, f string) string { return fmt.Sprintf("Upstreams[%d].Keys[%d].%s", i, j, f) }
	if len(ks) > maxKeys {
		return configError(fmt.Sprintf("Upstreams[%d].Keys", i), fmt.Sprintf("has more than %d keys", maxKeys))
	}
	for j, kc := range ks {
		switch {
		case kc.Name == "":
			return configError(field(j, "Name"), "is empty")
		case strings.ContainsFunc(kc.Name, func(r rune) bool { return r < ' ' || r == 0x7f }):
			return configError(field(j, "Name"), "must not contain control characters")
		case slices.ContainsFunc(ks[:j], func(o Key) bool { return o.Name == kc.Name }):
			return configError(field(j, "Name"), fmt.Sprintf("names another key too: %q", kc.Name))
		case len(kc.Header) == 0:
			return configError(field(j, "Header"), "is empty: a key sets its credentials")
		}
		if err := checkHeader(field(j, "Header"), kc.Header); err != nil {
			return err
		}
		k := &key{name: kc.Name, bit: 1 << j}
		h := http.Header{}
		for name, vs := range kc.Header {
			if !slices.ContainsFunc(vs, func(v string) bool { return v != "" }) {
				// It would send the key without its credentials.
				return configError(field(j, "Header"), fmt.Sprintf("has no value for %q: a key sets its credentials", name))
			}
			h[http.CanonicalHeaderKey(name)] = append([]string(nil), vs...)
		}
		for _, name := range slices.Sorted(maps.Keys(h)) {
			k.headers = append(k.headers, headerField{name, h[name]})
			if !slices.Contains(u.keyNames, name) {
				u.keyNames = append(u.keyNames, name)
				u.lens |= lenBit(len(name))
			}
		}
		u.keys = append(u.keys, k)
	}
	return nil
}

// setKey sets k's headers on h, over the upstream's.
func (k *key) setKey(h http.Header) {
	for _, f := range k.headers {
		h[f.key] = f.values
	}
}

// setsKey reports whether a key of u sets the caller's header k, in any
// spelling (see sets).
func (u *upstream) setsKey(k string) bool {
	for _, h := range u.keyNames {
		if len(h) == len(k) && (h == k || equalFoldASCII(h, k)) {
			return true
		}
	}
	return false
}

// cooling returns how long u still cools down at now: its own cooldown
// or, when it has keys, until the first of them stops cooling (0 when one
// is not), whichever is longer.
func (u *upstream) cooling(now time.Time) time.Duration {
	left := u.cd.remaining(now)
	if len(u.keys) == 0 {
		return left
	}
	first := maxDuration
	for _, k := range u.keys {
		first = min(first, k.cd.remaining(now))
	}
	return max(left, first)
}

// coolingReason is why u cools down at now: its own cooldown's reason,
// or that of the key that stops cooling first.
func (u *upstream) coolingReason(now time.Time) CooldownReason {
	var r *CooldownReason
	if len(u.keys) == 0 || u.cd.remaining(now) > 0 {
		r = u.cd.reason.Load()
	} else {
		first := maxDuration
		for _, k := range u.keys {
			if left := k.cd.remaining(now); left < first {
				first, r = left, k.cd.reason.Load()
			}
		}
	}
	if r == nil {
		return ""
	}
	return *r
}

// authOf is the auth state that a's answer speaks of: its key's, or its
// upstream's when it has no keys.
func (a *attempt) authOf() *authState {
	if a.k != nil {
		return &a.k.auth
	}
	return &a.u.auth
}

// headroomOf is the headroom state that a's answer speaks of: its key's,
// or its upstream's when it has no keys.
func (a *attempt) headroomOf() *headroomState {
	if a.k != nil {
		return &a.k.headroom
	}
	return &a.u.headroom
}

// keysHealth is the snapshot of u's keys at now; nil when it has none.
func (t *Transport) keysHealth(u *upstream, now time.Time) []KeyHealth {
	if len(u.keys) == 0 {
		return nil
	}
	out := make([]KeyHealth, len(u.keys))
	for i, k := range u.keys {
		h := KeyHealth{
			Name:          k.name,
			Cooldown:      k.cd.remaining(now),
			AuthFailing:   t.revoked(&k.auth, now),
			OutOfHeadroom: k.headroom.out(now),
			HeadroomShare: -1,
		}
		if r := k.cd.reason.Load(); r != nil && h.Cooldown > 0 {
			h.CooldownReason = *r
		}
		if hr := k.headroom.last.Load(); hr != nil {
			c := hr.Headroom
			h.Headroom = &c
			if share, _, ok := hr.shareAt(mono.Of(now)); ok {
				h.HeadroomShare = share
			}
		}
		out[i] = h
	}
	return out
}

// keyJSON is a KeyHealth as Health's JSON shows it.
type keyJSON struct {
	Name           string         `json:"name"`
	Cooldown       float64        `json:"cooldown_seconds"`
	CooldownReason CooldownReason `json:"cooldown_reason,omitempty"`
	AuthFailing    bool           `json:"auth_failing"`
	Headroom       *headroomJSON  `json:"headroom,omitempty"`
	OutOfHeadroom  bool           `json:"out_of_headroom"`
	HeadroomShare  *float64       `json:"headroom_share,omitempty"`
}

func keysJSON(ks []KeyHealth) []keyJSON {
	if len(ks) == 0 {
		return nil
	}
	out := make([]keyJSON, len(ks))
	for i, k := range ks {
		out[i] = keyJSON{k.Name, k.Cooldown.Seconds(), k.CooldownReason, k.AuthFailing, k.Headroom.json(), k.OutOfHeadroom, nil}
		if k.HeadroomShare >= 0 {
			out[i].HeadroomShare = &ks[i].HeadroomShare
		}
	}
	return out
}

// initKeyMetrics registers the series of u's keys in s.
func initKeyMetrics(s *metrics.Set, u *upstream) {
	for _, k := range u.keys {
		k.attempts = s.GetOrCreateCounter(famKeyAttempts.series(u.name, k.name))
		k.cooldowns = s.GetOrCreateCounter(famKeyCooldowns.series(u.name, k.name))
		cd := &k.cd
		s.GetOrCreateGauge(famKeyCooldown.series(u.name, k.name), func() float64 { return cd.remaining(time.Now()).Seconds() })
	}
}

// keyAttr is the attribute that names k in a log record: none when k is
// nil. It names the key, never its value.
func keyAttr(k *key) []slog.Attr {
	if k == nil {
		return nil
	}
	return []slog.Attr{slog.String("key", k.name)}
}

// key returns u's key named name; nil when there is none.
func (u *upstream) key(name string) *key {
	if name == "" {
		return nil
	}
	for _, k := range u.keys {
		if k.name == name {
			return k
		}
	}
	return nil
}

// probeKey is the key of u an active probe is sent with at now: the
// first that does not cool down and whose last answer was no 401 or 403
// (a revoked key's probe says nothing of the upstream), else the first
// that does not cool down, else the first; nil when u has no Keys.
func (u *upstream) probeKey(now time.Time) *key {
	var best *key
	for _, k := range u.keys {
		switch {
		case k.cd.remaining(now) > 0:
		case k.auth.fails.Load() == 0:
			return k
		case best == nil:
			best = k
		}
	}
	if best == nil && len(u.keys) > 0 {
		return u.keys[0]
	}
	return best
}

// nameOf returns k's name, "" for nil (an upstream without Keys).
func (k *key) nameOf() string {
	if k == nil {
		return ""
	}
	return k.name
}
