package main

import (
	"context"
	"strings"
	"testing"

	"go.uber.org/goleak"
)

// TestAffinityDrill runs a small affinity part and checks what it is for:
// with affinity, a conversation's turns find their prefix in the prompt
// cache of the upstream that answered the turn before, so that most input
// tokens are cached; without, half of the turns go to the other upstream
// and miss. The shares come from the token counts, not from timing, so
// that they hold on a loaded machine.
func TestAffinityDrill(t *testing.T) {
	defer goleak.VerifyNone(t)
	o := affinityOptions{Conversations: 40, Turns: 5, Parallel: 25, Timescale: 0.05}
	runs, err := affinityRuns(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	on, off := runs[0], runs[1]
	for _, r := range runs {
		if r.Failed != 0 || r.Requests != o.Conversations*o.Turns {
			t.Errorf("%s: %d of %d requests failed, want all %d answered", r.Name, r.Failed, r.Requests, o.Conversations*o.Turns)
		}
		for i, n := range r.PerUpstream {
			if share := ratio(int(n), r.Requests); share < 0.2 {
				t.Errorf("%s: upstream %d answered %d of %d requests, want at least 20 %%", r.Name, i, n, r.Requests)
			}
		}
	}
	if want := int64(o.Conversations * (o.Turns - 1)); on.Kept != want || on.Moved != 0 {
		t.Errorf("with affinity, %d turns kept on their upstream and %d moved, want %d and 0", on.Kept, on.Moved, want)
	}
	if off.Kept+off.Moved != 0 {
		t.Errorf("without affinity, %d turns kept and %d moved, want no affinity metrics", off.Kept, off.Moved)
	}
	if s := on.CachedShare(); s <= 0.8 {
		t.Errorf("cached share with affinity %.3f, want above 0.8", s)
	}
	if s := off.CachedShare(); s >= 0.7 {
		t.Errorf("cached share without affinity %.3f, want below 0.7", s)
	}
	var b strings.Builder
	if err := writeAffinity(&b, o, runs); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	checkWidth(t, out)
	if !strings.Contains(strings.Join(strings.Fields(out), " "), affinitySummary(runs)) {
		t.Errorf("the table does not end with the summary %q:\n%s", affinitySummary(runs), out)
	}
	if testing.Verbose() {
		t.Logf("\n%s", out)
	}
}
