package failover

import (
	"net/http"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/failover-go/failover/internal/mono"
)

// A demoted upstream is tried after the others, and its attempt says why,
// in the Trace and in failover_demoted_total: a key that answered 401
// three times (Auth's Threshold) is tried last, and reached when the
// backup fails.
func TestPlanDemotedAttemptSaysWhy(t *testing.T) {
	n := newFakeNet()
	n.status("a.test", http.StatusUnauthorized, "bad key")
	n.status("b.test", 200, "b")
	tr := newTestTransport(t, twoUpstreams(n, Config{}))
	for range 3 { // each tries a, gets its 401, fails over to b
		readBody(t, mustGet(t, tr, "http://a.test/v1/models"))
	}
	if got := n.count("a.test"); got != 3 {
		t.Fatalf("a got %d requests, want 3", got)
	}
	n.status("b.test", 500, "down")
	var started []TraceAttempt
	ctx := WithTrace(t.Context(), &Trace{AttemptStart: func(a TraceAttempt) { started = append(started, a) }})
	resp, err := tr.RoundTrip(httptestRequest("GET", "http://a.test/v1/models", "").WithContext(ctx))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	want := []TraceAttempt{
		{Upstream: "b", Attempt: 1},
		{Upstream: "a", Attempt: 2, Demoted: ReasonAuthFailing},
	}
	if !slices.Equal(started, want) {
		t.Errorf("attempts %+v, want %+v", started, want)
	}
	if got := metricValue(t, tr, `failover_demoted_total{upstream="a",reason="auth_failing"}`); got != 1 {
		t.Errorf("failover_demoted_total for a = %v, want 1", got)
	}
	if got := metricValue(t, tr, `failover_demoted_total{upstream="b",reason="auth_failing"}`); got != 0 {
		t.Errorf("failover_demoted_total for b = %v, want 0", got)
	}
}

// A plan's order: the configured one, demoted upstreams after the others
// (only the first maxDemotable can be: past it an upstream keeps its
// place), without those that answered Unservable or that a race took.
func TestPlanOrder(t *testing.T) {
	const n = maxDemotable + 2
	ups := make([]Upstream, n)
	for i := range ups {
		ups[i] = Upstream{Name: strconv.Itoa(i), BaseURL: "http://u" + strconv.Itoa(i) + ".test"}
	}
	tr := newTestTransport(t, Config{Base: newFakeNet(), Upstreams: ups})
	now := time.Now()
	revoke := func(i int) { // as three 401s in a row leave it (AuthConfig)
		u := tr.upstreams[i]
		u.auth.fails.Store(int32(tr.auth.Threshold))
		u.auth.until.Store(int64(mono.Of(now.Add(time.Hour))))
	}
	revoke(0)
	revoke(n - 1) // past maxDemotable: keeps its place
	revoke(3)
	c := &call{request: request{t: tr}, tally: tally{}}
	c.refused = []*upstream{tr.upstreams[1]}
	var p plan
	c.plan(&p, now)
	p.taken = []*upstream{tr.upstreams[2]}
	var got []string
	var why []Reason
	for {
		u, demoted := p.upcoming(now)
		if u == nil {
			break
		}
		got = append(got, u.name)
		why = append(why, demoted)
	}
	var want []string
	for i := 4; i < n; i++ {
		want = append(want, strconv.Itoa(i))
	}
	want = append(want, "0", "3")
	if !slices.Equal(got, want) {
		t.Errorf("order %v, want %v", got, want)
	}
	if w := why[len(why)-2:]; w[0] != ReasonAuthFailing || w[1] != ReasonAuthFailing {
		t.Errorf("the demoted came up with %v, want auth_failing", w)
	}
	if why[len(why)-3] != "" {
		t.Errorf("upstream %d, past maxDemotable, came up demoted: %q", n-1, why[len(why)-3])
	}
}

// switching looks at the upstream the plan would send the request to
// next, passing over those admit refuses, and leaves the plan where it
// was: moving on costs something when that one serves another model or
// costs more, nothing when it is as good, and there is nothing to move
// on to when none takes the request.
func TestPlanSwitching(t *testing.T) {
	const model = "gpt-4o-mini"
	for _, c := range []struct {
		name string
		next Upstream // after the primary and a backup cooling down
		want switchCost
	}{
		{"as good", Upstream{Cost: primaryCost}, switchFree},
		{"cheaper", Upstream{Cost: Cost{Input: 1}}, switchFree},
		{"another model", Upstream{Cost: primaryCost, Models: map[string]string{model: "claude-3-5-haiku"}}, switchCostly},
		{"the same model by a map", Upstream{Cost: primaryCost, Models: map[string]string{"*": "*"}}, switchFree},
		{"costs more", Upstream{Cost: Cost{Input: 1, Output: 3}}, switchCostly},
		{"does not serve the model", Upstream{Models: map[string]string{"o3": "o3"}}, switchNone},
	} {
		next := c.next
		next.Name, next.BaseURL = "c", "http://c.test"
		tr := newTestTransport(t, Config{Base: newFakeNet(), Upstreams: []Upstream{
			{Name: "a", BaseURL: "http://a.test", Cost: primaryCost},
			{Name: "b", BaseURL: "http://b.test", Cost: primaryCost},
			next,
		}})
		now := time.Now()
		tr.upstreams[1].cd.extend(now, time.Minute, CooldownRateLimited)
		call := &call{request: request{t: tr, model: model}}
		var p plan
		call.plan(&p, now)
		a, _ := p.upcoming(now)
		if got := p.switching(a, now); got != c.want {
			t.Errorf("%s: switching = %v, want %v", c.name, got, c.want)
		}
		if u, _ := p.upcoming(now); u != tr.upstreams[1] {
			t.Errorf("%s: after switching, the plan's next is %v, want b", c.name, u.name)
		}
	}
}
