package failover

import (
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"sync"
)

// Misconfigurations that only the whole config, or the traffic, shows:
// an upstream with no credentials of its own that a request fails over
// to, one BaseURL under two names, a model that no backup's Models maps.
// Each is said once to the Logger (at Warn), kept in its upstreams'
// UpstreamHealth.Problems, and, where it fails a request, named in the
// Error or the answer's Served.Problems.

// Bounds of what misconfigurations keep.
const (
	maxProblemModels = 64 // distinct models reported as served by no backup
	maxModelInNote   = 64 // bytes of a model's name quoted in a note
)

// problems is a Transport's record of misconfigurations.
type problems struct {
	noCreds []bool   // by upstream index: its Upstream.Header sets no credential
	extra   []string // Config.CredentialHeaders

	// mu guards the fields below.
	mu     sync.Mutex
	by     [][]string      // by upstream index, for Health
	said   map[string]bool // the keys of the problems reported
	models int             // distinct models reported
}

// newProblems records what New can see of cfg's misconfigurations, and
// returns the warnings to log.
func newProblems(cfg Config, ups []*upstream) (*problems, []string) {
	p := &problems{noCreds: make([]bool, len(ups)), extra: cfg.CredentialHeaders, by: make([][]string, len(ups)), said: map[string]bool{}}
	for i, u := range ups {
		own := false
		for k := range u.header {
			own = own || p.credential(k)
		}
		p.noCreds[i] = !own
	}
	var warn []string
	for j, v := range ups {
		for i, u := range ups[:j] {
			if !sameBaseURL(u, v) || !p.noCreds[j] {
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

// of returns the problems of the upstream of index i.
func (p *problems) of(i int) []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.by[i]...)
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
// the request carries some.
func (r *request) heldBack(u *upstream) bool {
	if u == r.owner() || !r.t.problems.noCreds[u.index] {
		return false
	}
	for k := range r.req.Header {
		if r.t.problems.credential(k) {
			return true
		}
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

// reportModel reports msg, that no backup serves model, once per model,
// in the Health of each upstream of unserved; past maxProblemModels
// models, it is left to the requests' errors.
func (t *Transport) reportModel(model string, unserved []*upstream, msg string) {
	p := t.problems
	key := "model " + model
	p.mu.Lock()
	if p.said[key] || p.models >= maxProblemModels {
		p.mu.Unlock()
		return
	}
	p.said[key] = true
	p.models++
	for _, u := range unserved {
		p.by[u.index] = append(p.by[u.index], msg)
	}
	p.mu.Unlock()
	t.logf(slog.LevelWarn, msg)
}
