package main

import (
	"strings"
	"testing"
	"unicode/utf8"
)

// TestWrap checks that wrap breaks lines at spaces within the width,
// indents the continuations, keeps every word, keeps a figure with its
// unit, and leaves a line that fits alone.
func TestWrap(t *testing.T) {
	text := "Scheduling lag (how late a 2.0 ms sleep woke, 11647 times): p50 0.5 ms, p99 2.4 ms, worst 236 ms; 20 stalls later than 35 ms.\nshort line"
	var b strings.Builder
	wrap(&b, text, 40)
	got := b.String()
	lines := strings.Split(strings.TrimSuffix(got, "\n"), "\n")
	for i, l := range lines {
		if n := utf8.RuneCountInString(l); n > 40 {
			t.Errorf("line %d is %d wide: %q", i, n, l)
		}
		if i > 0 && i < len(lines)-1 && !strings.HasPrefix(l, "  ") {
			t.Errorf("continuation %d not indented: %q", i, l)
		}
		for _, unit := range []string{" ms", " %", " times"} {
			if strings.HasPrefix(strings.TrimSpace(l), strings.TrimSpace(unit)) {
				t.Errorf("line %d begins with a unit parted from its figure: %q", i, l)
			}
		}
	}
	if lines[len(lines)-1] != "short line" {
		t.Errorf("last line %q, want the short line as it was", lines[len(lines)-1])
	}
	if strings.Join(strings.Fields(got), " ") != strings.Join(strings.Fields(text), " ") {
		t.Errorf("words changed:\n%s", got)
	}
}

// TestGridBlocks checks that a grid too wide for the width is written in
// blocks, each with the names and the plain column and as many of the
// other columns as fit, every cell once, and none wider than the width.
func TestGridBlocks(t *testing.T) {
	g := grid{
		{"", "plain client", "failover (priority)", "failover (score)", "failover (weighted)"},
		{"throughput retention", "49.88 % (2993 of 6000)", "98.60 %", "97.00 %", "96.00 %"},
	}
	var b strings.Builder
	g.write(&b, 90)
	out := b.String()
	blocks := strings.Split(strings.TrimSuffix(out, "\n"), "\n\n")
	if len(blocks) != 2 {
		t.Fatalf("got %d blocks, want 2 (two columns, then one):\n%s", len(blocks), out)
	}
	for _, blk := range blocks {
		if !strings.Contains(blk, "plain client") || !strings.Contains(blk, "throughput retention") {
			t.Errorf("block without the names or the plain column:\n%s", blk)
		}
	}
	for _, name := range g[0][2:] {
		if strings.Count(out, name) != 1 {
			t.Errorf("column %q appears %d times, want once:\n%s", name, strings.Count(out, name), out)
		}
	}
	for _, l := range strings.Split(out, "\n") {
		if utf8.RuneCountInString(l) > 90 || strings.HasSuffix(l, " ") {
			t.Errorf("line %q is wider than 90 or ends in a space", l)
		}
	}
	b.Reset()
	g.write(&b, 200)
	if strings.Contains(b.String(), "\n\n") {
		t.Errorf("a grid that fits was split:\n%s", b.String())
	}
}
