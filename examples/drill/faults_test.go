package main

import (
	"context"
	"strings"
	"testing"
	"time"
)

// The catalogue's faults that take seconds, with the default Config under
// openai-go: each ends as its right conduct says. (The silent, stalled and
// sparse ones take a minute or more of real time: the root package's
// tests hold them in synctest.)
func TestFaultCatalogue(t *testing.T) {
	want := map[string]struct {
		got             string
		primary, backup int64
		counted         uint
		gotPrefix       bool
	}{
		"cut after content":                                {got: "error: unexpected EOF", primary: 1, backup: 0},
		"one 500, backup on another model":                 {got: `"primary"`, primary: 2, backup: 0, counted: 1},
		"429 Retry-After 2s once, backup on another model": {got: `"primary"`, primary: 2, backup: 0},
		"one 500, backup the same":                         {got: `"backup"`, primary: 1, backup: 1, counted: 1},
		"content-policy 400":                               {got: "error 400", primary: 1, backup: 0},
		"both upstreams 503":                               {got: "error 503", primary: 1, backup: 1, counted: 1},
	}
	for _, c := range faultCatalogue() {
		w, ok := want[c.name]
		if !ok {
			continue
		}
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			r := runFault(context.Background(), c)
			if !strings.HasPrefix(r.got, w.got) || r.primary != w.primary || r.backup != w.backup || r.primaryFailures != w.counted {
				t.Errorf("got %s with %d, %d attempts (counted %d); want %s with %d, %d (counted %d)",
					r.got, r.primary, r.backup, r.primaryFailures, w.got, w.primary, w.backup, w.counted)
			}
		})
	}
}

// TestWriteFaults checks that the catalogue's report names every fault
// with what the caller got, its attempts and its right conduct, in lines
// of at most lineWidth columns.
func TestWriteFaults(t *testing.T) {
	var results []faultResult
	for i, c := range faultCatalogue() {
		r := faultResult{name: c.name, want: c.want, got: `error: POST "http://127.0.0.1:40000/v1/chat/completions": context deadline exceeded`,
			took: 61 * time.Second, primary: 1, backup: 2, primaryFailures: 3, recovered: -1}
		if i == 0 {
			r.requests, r.failed, r.recovered = 16, 4, 1200*time.Millisecond
		}
		results = append(results, r)
	}
	var b strings.Builder
	if err := writeFaults(&b, results); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	checkWidth(t, out)
	for _, r := range results {
		if !strings.Contains(out, "\n"+r.name+"\n") {
			t.Errorf("no paragraph for %q:\n%s", r.name, out)
		}
		if !strings.Contains(strings.Join(strings.Fields(out), " "), r.want) {
			t.Errorf("%q: the right conduct %q is missing:\n%s", r.name, r.want, out)
		}
	}
	for _, want := range []string{"attempts: primary 1, backup 2 (counted 3)", "after 1m1s", "4 of 16 failed; primary back 1.2s after its recovery"} {
		if !strings.Contains(strings.Join(strings.Fields(out), " "), want) {
			t.Errorf("no %q:\n%s", want, out)
		}
	}
	if testing.Verbose() {
		t.Log(out)
	}
}
