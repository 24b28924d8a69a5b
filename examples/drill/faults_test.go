package main

import (
	"context"
	"strings"
	"testing"
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
