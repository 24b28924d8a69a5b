package main

import (
	"context"
	"strings"
	"testing"

	"go.uber.org/goleak"
)

// TestContinueDrill runs a small continuation part and checks what it is
// for: with continuation on, every stream that broke after its content
// began is read complete, the backup's continuation spliced after the
// primary's chunks; a refused continuation ends in the primary's own
// error, never the backup's 400; and no stream ends like a success with a
// short answer. Off, none is complete, and a stream that ended early
// reads like a success. The counts come from what each stream read, not
// from timing, so that they hold on a loaded machine.
func TestContinueDrill(t *testing.T) {
	defer goleak.VerifyNone(t)
	o := contOptions{Streams: 20, Parallel: 10, Timescale: 0.05}
	rows, err := contRows(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 8 {
		t.Fatalf("%d rows, want 8: each of 4 faults on and off", len(rows))
	}
	for _, r := range rows {
		if r.Streams != o.Streams || r.FirstAtBackup != 0 {
			t.Errorf("%s: %d streams, %d begun on the backup, want %d, all on the primary", r.Name(), r.Streams, r.FirstAtBackup, o.Streams)
		}
		type counts struct{ complete, original, other, short, continued, not int }
		got := counts{r.Complete, r.Original, r.Other, r.Short, r.Continued, r.NotContinued}
		var want counts
		switch {
		case r.On && r.Fault == contRefused:
			want = counts{original: o.Streams, not: o.Streams}
		case r.On:
			want = counts{complete: o.Streams, continued: o.Streams}
		case r.Fault == contEnd:
			want = counts{short: o.Streams}
		default:
			want = counts{original: o.Streams}
		}
		if !r.On && r.Fault == contStall && r.Other > 0 && r.Original+r.Other == o.Streams {
			// A read that begins just as the stall is found may fail
			// with the closed connection's error instead of the
			// *StallError (stream.go's stallBody): the stall all the
			// same, and no answer that looks whole.
			got.original, got.other = got.original+got.other, 0
		}
		if got != want {
			t.Errorf("%s: got %+v, want %+v (first other error: %q)", r.Name(), got, want, r.OtherErr)
		}
		if r.On && r.Continued > 0 && r.Added99 <= 0 {
			t.Errorf("%s: time added p99 %s, want above 0", r.Name(), r.Added99)
		}
	}
	if r := rows[len(rows)-2]; !strings.Contains(r.NotWhy, "400") {
		t.Errorf("%s: the Trace's reason %q, want the backup's 400", r.Name(), r.NotWhy)
	}
	var b strings.Builder
	if err := writeContinue(&b, o, rows); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	checkWidth(t, out)
	if !strings.Contains(strings.Join(strings.Fields(out), " "), contSummary(rows)) {
		t.Errorf("the table does not end with the summary %q:\n%s", contSummary(rows), out)
	}
	if testing.Verbose() {
		t.Logf("\n%s", out)
	}
}

// TestWords checks that an answer's chunks are its words, each with the
// space before it, and make the answer again.
func TestWords(t *testing.T) {
	for _, text := range []string{"", "a", "one two  three", answerTo("Question 0001")} {
		ws := words(text)
		if got := strings.Join(ws, ""); got != text {
			t.Errorf("words(%q) joined %q, want the text", text, got)
		}
		for i, w := range ws {
			if i > 0 && !strings.HasPrefix(w, " ") || strings.Contains(w[1:], " ") && !strings.HasPrefix(w[1:], " ") {
				t.Errorf("words(%q)[%d] = %q, want a word with the space before it", text, i, w)
			}
		}
	}
}
