package main

import (
	"context"
	"strings"
	"testing"
)

// The offline demo, as `go run ./examples/openai` runs it: both calls are
// served by the backup while the primary is overloaded, and Health shows the
// primary's circuit open.
func TestOfflineDemo(t *testing.T) {
	for _, overload := range []int{503, 529} {
		cfg, shutdown := offline(overload)
		cfg.model = "gpt-4o-mini"
		var out strings.Builder
		err := run(context.Background(), &out, cfg)
		shutdown()
		if err != nil {
			t.Fatalf("%d: %v", overload, err)
		}
		got := out.String()
		if n := strings.Count(got, "served by backup"); n != 2 {
			t.Errorf("%d: %d calls served by the backup, want 2:\n%s", overload, n, got)
		}
		if !strings.Contains(got, "Hello from the backup upstream!") {
			t.Errorf("%d: the completion's text is missing:\n%s", overload, got)
		}
		var primary string
		for _, line := range strings.Split(got, "\n") {
			if strings.HasPrefix(strings.TrimSpace(line), "primary ") {
				primary = line
			}
		}
		if !strings.Contains(primary, "open") {
			t.Errorf("%d: the primary's health line %q does not show its circuit open", overload, primary)
		}
	}
}
