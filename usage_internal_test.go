package failover

import (
	"bytes"
	"io"
	"strings"
	"testing"
	"unicode/utf8"
)

// The model the caller asked for reaches failover_tokens_total's and
// failover_cost_total's model label clipped, as an answer's own model
// does: valid UTF-8 and bounded, whatever the request body says, when the
// answer names no model of its own (found by review: it went unclipped).
func TestUsageModelLabelFromRequestClipped(t *testing.T) {
	n := newFakeNet()
	n.status("b.test", 200, `{"usage":{"prompt_tokens":3,"completion_tokens":4}}`, "Content-Type", "application/json")
	cfg := Config{Base: n, MeterUsage: true, Upstreams: []Upstream{
		{Name: "a", BaseURL: "http://a.test", Models: map[string]string{"x": "y"}}, // some upstream has Models: the request's model is read
		{Name: "b", BaseURL: "http://b.test"},
	}}
	var got []Usage
	cfg.OnUsage = func(u Usage) { got = append(got, u) }
	tr := newTestTransport(t, cfg)
	model := strings.Repeat("m", 30<<10) + "\xff"
	body := `{"model":"` + model + `","messages":[]}`
	resp, err := tr.RoundTrip(httptestRequest("POST", "http://b.test/v1/chat/completions", body))
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if len(got) != 1 {
		t.Fatalf("OnUsage called %d times", len(got))
	}
	var buf bytes.Buffer
	tr.WritePrometheus(&buf)
	for _, line := range strings.Split(buf.String(), "\n") {
		if !strings.HasPrefix(line, "failover_tokens_total") && !strings.HasPrefix(line, "failover_cost_total") {
			continue
		}
		if !utf8.ValidString(line) {
			t.Errorf("exposition line is not valid UTF-8: %.80q...", line)
			break
		}
		if len(line) > 8<<10 {
			t.Errorf("exposition line of %d bytes: the caller's model is the label, unclipped", len(line))
			break
		}
	}
	t.Logf("model %d bytes, labels %d bytes", len(got[0].Model), buf.Len())
	if m := got[0].Model; !utf8.ValidString(m) || len(m) > 4<<10 {
		t.Errorf("Usage.Model is %d bytes, valid UTF-8 %v: the caller's raw model (the answer's own is clipped)", len(m), utf8.ValidString(m))
	}
}
