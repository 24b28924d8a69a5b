package failover

import (
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
)

// Misconfigurations that only the whole config, or the traffic, shows:
// an upstream with no credentials of its own that a request fails over
// to, one BaseURL under two names, a model that no backup's Models maps.
// Each is said once to the Logger (at Warn; a model, see reportModel),
// kept in its upstreams' UpstreamHealth.Problems, and, where it fails a
// request, named in the Error or the answer's Served.Problems.
//
// An upstream has no credentials of its own when its Upstream.Header
// sets none, it has no Upstream.Authorizer, and the Transport knows what
// Base adds: Base is nil (the
// Transport's own) or a plain *http.Transport. Any other Base may sign
// or authenticate (oauth2, SigV4), so under it no upstream is said to
// lack credentials, and its 401 or 403 counts as any upstream's. A
// BaseURL listed twice is reported whatever the Base: the second never
// gets the caller's credentials.

// Bounds of what misconfigurations keep.
const (
	maxProblemModels = 64 // models counted as served by no backup
	maxShownModels   = 8  // of those, the most skipped, in Health
	maxModelInNote   = 64 // bytes of a model's name quoted in a note
)

// problems is a Transport's record of misconfigurations.
type problems struct {
	noCreds []bool   // by upstream index: neither its Header nor an Authorizer sets a credential, under a known Base
	extra   []string // Config.CredentialHeaders

	// mu guards the fields below.
	mu     sync.Mutex
	by     [][]string      // by upstream index, for Health
	said   map[string]bool // the keys of the problems reported
	models []modelCount    // models served by no backup, at most maxProblemModels
}

// modelCount is a model that no backup served, counted by the
// Space-Saving rule: a model new to a full table takes the place of the
// least counted one, inheriting its count as err, so that count
// overestimates by at most err and a model skipped often enough is never
// crowded out by many skipped rarely (callers' typos).
type modelCount struct {
	model    string
	msg      string // the latest note for it
	unserved []int  // indexes of the upstreams whose Models do not map it
	count    int
	err      int  // count inherited on entering a full table
	logged   bool // said to the Logger since it entered
}

// hits is the number of requests skipped for m since it entered the
// table: a lower bound of all, and all of them when err is 0.
func (m *modelCount) hits() int { return m.count - m.err }

// above reports whether m ranks above n in Health: more hits, then a
// larger count.
func (m *modelCount) above(n *modelCount) bool {
	return m.hits() > n.hits() || m.hits() == n.hits() && m.count > n.count
}

// newProblems records what New can see of cfg's misconfigurations, and
// returns the warnings to log.
func newProblems(cfg Config, ups []*upstream) (*problems, []string) {
	p := &problems{noCreds: make([]bool, len(ups)), extra: cfg.CredentialHeaders, by: make([][]string, len(ups)), said: map[string]bool{}}
	// Only a Base the Transport knows adds none: any other may sign or
	// authenticate (oauth2, SigV4).
	_, plain := cfg.Base.(*http.Transport)
	knownBase := cfg.Base == nil || plain
	headerless := make([]bool, len(ups)) // neither its Header nor an Authorizer sets a credential
	for i, u := range ups {
		own := u.cfg.Authorizer != nil // it sets credentials of its own
		for k := range u.header {
			own = own || p.credential(k)
		}
		for _, k := range u.keyNames {
			own = own || p.credential(k) // (Keys: credentials of its own)
		}
		headerless[i] = !own
		p.noCreds[i] = !own && knownBase
	}
	var warn []string
	for j, v := range ups {
		for i, u := range ups[:j] {
			if !sameBaseURL(u, v) || !headerless[j] {
				continue
			}
			msg := fmt.Sprintf("Upstreams[%d] has the BaseURL of Upstreams[%d]: a request is addressed to Upstreams[%d], so Upstreams[%d] never gets the caller's credentials: give it a Header", j, i, i, j)
			if p.add("baseurl "+v.name, j, msg) {
				warn = append(warn, msg)
			}
			break
		}
	}
	return p, warn
}

// credential reports whether the header named k carries credentials by
// the Transport's rule, leaving out the names an Upstream.Header sets,
// which count as credentials only to keep the caller's from the others.
func (p *problems) credential(k string) bool {
	if strings.EqualFold(k, "Idempotency-Key") {
		return false
	}
	if looksSecret(k) || slices.ContainsFunc(credentialHeaders, func(n string) bool { return strings.EqualFold(k, n) }) {
		return true
	}
	return slices.ContainsFunc(p.extra, func(n string) bool { return strings.EqualFold(k, n) })
}

// sameBaseURL reports whether u and v are reached at the same BaseURL,
// {deployment} and what follows it included.
func sameBaseURL(u, v *upstream) bool {
	return strings.EqualFold(u.scheme, v.scheme) && strings.EqualFold(u.host, v.host) && u.path == v.path &&
		u.deployed == v.deployed && u.suffix == v.suffix
}

// add records msg as a problem of the upstream of index i under key,
// unless it was already; it reports whether it was new.
func (p *problems) add(key string, i int, msg string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.said[key] {
		return false
	}
	p.said[key] = true
	p.by[i] = append(p.by[i], msg)
	return true
}

// of returns the problems of the upstream of index i: those said once,
// then the models it skipped most (at most maxShownModels), each with
// how many requests it skipped.
func (p *problems) of(i int) []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := append([]string(nil), p.by[i]...)
	var top []*modelCount
	for j := range p.models {
		if m := &p.models[j]; slices.Contains(m.unserved, i) {
			top = append(top, m)
		}
	}
	slices.SortStableFunc(top, func(m, n *modelCount) int {
		switch {
		case m.above(n):
			return -1
		case n.above(m):
			return 1
		}
		return 0
	})
	for _, m := range top[:min(len(top), maxShownModels)] {
		out = append(out, m.msg+" ("+skippedText(m)+")")
	}
	return out
}

// skippedText says how many requests m counts.
func skippedText(m *modelCount) string {
	n, s := m.hits(), "s"
	if n == 1 {
		s = ""
	}
	if m.err > 0 {
		return "skipped at least " + thousands(n) + " request" + s
	}
	return "skipped " + thousands(n) + " request" + s
}

// thousands formats n, not negative, with a comma between thousands.
func thousands(n int) string {
	d := strconv.Itoa(n)
	var b strings.Builder
	for i := range len(d) {
		if i > 0 && (len(d)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteByte(d[i])
	}
	return b.String()
}

// report records msg as a problem of u under key, and logs it the first
// time.
func (t *Transport) report(key string, u *upstream, msg string) {
	if t.problems.add(key, u.index, msg) {
		t.log(slog.LevelWarn, msg, u)
	}
}

// heldBack reports whether the caller's credentials were held back from
// u, which sets none of its own: u is not the upstream they are for, and
// the request carries some, by the rule the rewrite holds them back by:
// a credential header or trailer, a query pair the rewrite drops, or the
// URL's user info.
func (r *request) heldBack(u *upstream) bool {
	if u == r.owner() || !r.t.problems.noCreds[u.index] {
		return false
	}
	for _, h := range []http.Header{r.req.Header, r.req.Trailer} {
		for k := range h {
			if r.t.problems.credential(k) {
				return true
			}
		}
	}
	if ru := r.req.URL; ru != nil {
		return ru.User != nil || ru.RawQuery != "" && r.t.creds.stripQuery(ru.RawQuery) != ru.RawQuery
	}
	return false
}

// uncredentialed judges a, whose upstream refused the request (401, 403)
// while it had no credentials: none of its own, the caller's held back
// (heldBack). The refusal says nothing of its key, which it has none of,
// nor of the request: the answer is discarded, so that an earlier
// failure stays the caller's answer, and the upstream is Unservable for
// the request, with an error that says why.
func (t *Transport) uncredentialed(a *attempt) (Outcome, error) {
	status := a.resp.StatusCode
	discard(a.resp)
	a.resp = nil
	msg := noCredentialsNote(a.u)
	t.report("nocreds "+a.u.name, a.u, msg)
	return Unservable, fmt.Errorf("%w: %s; it answered %s", ErrNoCredentials, msg, statusText(status))
}

// noCredentialsNote says what is wrong with u, which refused a request
// without credentials.
func noCredentialsNote(u *upstream) string {
	return fmt.Sprintf("Upstreams[%d] has no credentials of its own (Upstream.Header) and the caller's were held back", u.index)
}

// notes returns the misconfigurations behind a request that did not
// succeed, from what happened at each upstream, reporting each once: an
// upstream without credentials that refused it, and a model that admit
// found no other upstream serves (ReasonModelNotServed). Nil for a
// request that succeeded or met none.
func (c *call) notes(resp *http.Response) []string {
	if len(c.errs) == 0 || resp != nil && resp.StatusCode < 400 {
		return nil
	}
	var out []string
	var unserved []*upstream // skipped for the model, each once
	for _, rec := range c.errs {
		switch {
		case rec.err == ErrModelNotServed:
			if !slices.Contains(unserved, rec.u) {
				unserved = append(unserved, rec.u)
			}
		case rec.err != nil && errors.Is(rec.err, ErrNoCredentials):
			if n := noCredentialsNote(rec.u); !slices.Contains(out, n) {
				out = append(out, n)
			}
		}
	}
	ups := c.usable()
	if len(unserved) == 0 || len(unserved) < len(ups)-1 || c.model == "" {
		return out
	}
	var serving []string
	for _, u := range ups {
		if !slices.Contains(unserved, u) {
			serving = append(serving, fmt.Sprintf("Upstreams[%d]", u.index))
		}
	}
	fields := make([]string, len(unserved))
	for i, u := range unserved {
		fields[i] = fmt.Sprintf("Upstreams[%d].Models", u.index)
	}
	model := c.model
	if len(model) > maxModelInNote {
		model = model[:maxModelInNote] + "..."
	}
	var msg string
	if len(serving) == 0 {
		msg = fmt.Sprintf("no upstream serves model %q: %s do not map it", model, strings.Join(fields, ", "))
	} else {
		msg = fmt.Sprintf("no upstream but %s serves model %q: %s do not map it", strings.Join(serving, ", "), model, strings.Join(fields, ", "))
	}
	out = append(out, msg)
	c.t.reportModel(model, unserved, msg)
	return out
}

// reportModel counts a request skipped by the upstreams of unserved,
// whose Models do not map model, with msg the note saying so. A model is
// said to the Logger once when it enters the table while there is room,
// or, once the table is full, when it first ranks among the shown with
// two requests or more since it entered: a flood of one-off models from
// callers is not logged each, while a model the config forgot, skipped
// again and again, is.
func (t *Transport) reportModel(model string, unserved []*upstream, msg string) {
	p := t.problems
	idx := make([]int, len(unserved))
	for i, u := range unserved {
		idx[i] = u.index
	}
	p.mu.Lock()
	j := slices.IndexFunc(p.models, func(m modelCount) bool { return m.model == model })
	switch {
	case j >= 0:
		p.models[j].count++
	case len(p.models) < maxProblemModels:
		p.models = append(p.models, modelCount{model: model, count: 1})
		j = len(p.models) - 1
	default:
		j = 0
		for k := range p.models {
			if p.models[k].count < p.models[j].count {
				j = k
			}
		}
		least := p.models[j].count
		p.models[j] = modelCount{model: model, count: least + 1, err: least}
	}
	m := &p.models[j]
	m.msg, m.unserved = msg, idx
	say := false
	if !m.logged && (m.err == 0 || m.hits() >= 2 && p.shown(m)) {
		m.logged, say = true, true
	}
	p.mu.Unlock()
	if say {
		t.logf(slog.LevelWarn, msg)
	}
}

// shown reports whether m ranks among the maxShownModels most skipped.
// It requires that p.mu is held.
func (p *problems) shown(m *modelCount) bool {
	n := 0
	for k := range p.models {
		if o := &p.models[k]; o != m && o.above(m) {
			n++
		}
	}
	return n < maxShownModels
}
