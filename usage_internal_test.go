package failover

import (
	"bytes"
	"errors"
	"io"
	"math"
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

// A Cost prices cached reads and cache writes apart from the rest of the
// input when it has prices for them, and as input when it has not.
func TestCostOf(t *testing.T) {
	// Anthropic's message: 13 input tokens, 200 written to the cache,
	// 1000 read from it (Input counts all three), 35 output.
	tk := Tokens{Input: 1213, Cached: 1000, CacheWrite: 200, Output: 35}
	cases := []struct {
		name string
		cost Cost
		want float64 // per million
	}{
		{"no cache prices", Cost{Input: 3, Output: 15}, 1213*3 + 35*15},
		{"claude sonnet", Cost{Input: 3, Output: 15, CachedInput: 0.3, CacheWrite: 3.75}, 13*3 + 1000*0.3 + 200*3.75 + 35*15},
		{"cached reads only", Cost{Input: 3, Output: 15, CachedInput: 0.3}, 213*3 + 1000*0.3 + 35*15},
		{"free input, priced cache", Cost{Output: 15, CachedInput: 0.3}, 1000*0.3 + 35*15},
		{"none", Cost{}, 0},
	}
	for _, tc := range cases {
		if got, want := tc.cost.of(tk), tc.want/1e6; math.Abs(got-want) > 1e-12 {
			t.Errorf("%s: %v, want %v", tc.name, got, want)
		}
	}
}

// An upstream's token totals stop at the largest int64 rather than wrap
// to a negative count: each report is bounded (maxTokens), their sum is
// not, and Health showed an upstream that reported 2^23 of the largest
// counts as having used fewer tokens than none.
func TestUsageTotalsSaturate(t *testing.T) {
	tr, err := New(Config{Upstreams: []Upstream{{BaseURL: "http://a.test"}}})
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	u := tr.upstreams[0]
	s := &u.usage
	s.totals.Tokens = Tokens{Input: math.MaxInt64 - maxTokens, Output: math.MaxInt64 - 1, Cached: 1, CacheWrite: math.MaxInt64}
	s.totals.Answers = 1
	s.add(tr, u, Usage{Tokens: Tokens{Input: maxTokens, Output: maxTokens, Cached: maxTokens, CacheWrite: maxTokens}})
	want := Tokens{Input: math.MaxInt64, Output: math.MaxInt64, Cached: 1 + maxTokens, CacheWrite: math.MaxInt64}
	if got := s.snapshot().Tokens; got != want {
		t.Errorf("totals %+v, want %+v", got, want)
	}
}

// The stream guard and the meter read a stream with one reader, and so
// see the same events however the stream is cut into reads: here, every
// cut into one to three reads of streams that begin with a byte order
// mark and an event that is both an error (which the guard names) and a
// usage report (which the meter counts). Before internal/sse, the meter
// lost that event when the mark was cut.
func TestGuardAndMeterSeeTheSameEvents(t *testing.T) {
	const (
		first  = `{"model":"m-1","error":{"code":"e1","message":"first"},"usage":{"prompt_tokens":125,"completion_tokens":0}}`
		second = `{"error":{"code":"e2"},"usage":{"completion_tokens":7}}`
	)
	for _, stream := range []string{
		"\xEF\xBB\xBFdata: " + first + "\n\ndata: " + second + "\n\n",
		"\xEF\xBB\xBFdata: " + first + "\r\n\r\ndata: " + second + "\r\n\r\n",
		"\xEF\xBB\xBFdata: " + first + "\r\rdata: " + second + "\r\r",
		"\xEF\xBB\xBF: hi\nevent: error\ndata: " + first + "\n\ndata: " + second,
		"\xEF\xBB\xBFdata: " + first[:15] + "\r\ndata: " + first[15:] + "\r\n\r\ndata: " + second + "\n\n", // {"model":"m-1", and the rest
	} {
		everyCut(stream, func(reads ...[]byte) {
			t.Helper()
			_, err := StreamGuard{}.guard(sseResponse(newGuardBody(&chunkReads{chunks: reads})))
			var se *streamError
			if !errors.As(err, &se) || se.code != "e1" {
				t.Fatalf("reads %q: the guard returned %v, want the first event's error e1", reads, err)
			}
			var f sseUsage
			var s usageScanner
			for _, p := range reads {
				f.feed(p, &s)
			}
			f.release(&s)
			tk, _ := s.raw.tokens()
			if want := (Tokens{Input: 125, Output: 7}); tk != want || s.model != "m-1" {
				t.Fatalf("reads %q: the meter read %+v of model %q, want %+v of m-1", reads, tk, s.model, want)
			}
		})
	}
}

// everyCut calls f with every way to cut s into one, two or three reads,
// empty ones among them.
func everyCut(s string, f func(reads ...[]byte)) {
	b := []byte(s)
	f(b)
	for i := 0; i <= len(b); i++ {
		for j := i; j <= len(b); j++ {
			f(b[:i:i], b[i:j:j], b[j:])
		}
	}
}

// chunkReads returns its chunks, one a read (for reads of 4 KiB or
// more), then io.EOF.
type chunkReads struct {
	chunks [][]byte
	i      int
}

func (r *chunkReads) Read(p []byte) (int, error) {
	if r.i == len(r.chunks) {
		return 0, io.EOF
	}
	n := copy(p, r.chunks[r.i])
	r.i++
	return n, nil
}

// Gemini's usageMetadata is the whole tally so far, its zero counts left
// out: the last one read counts whole, and a count it leaves out is 0, not
// an earlier chunk's; an empty one reports zeros.
func TestUsageGeminiTally(t *testing.T) {
	for _, tt := range []struct {
		name   string
		chunks []string
		want   Tokens
	}{
		{"last omits candidates and thoughts", []string{
			`{"usageMetadata":{"promptTokenCount":10,"candidatesTokenCount":30,"thoughtsTokenCount":100,"totalTokenCount":140}}`,
			`{"usageMetadata":{"promptTokenCount":10,"totalTokenCount":10}}`,
		}, Tokens{Input: 10}},
		{"last omits the cache and the tool-use prompt", []string{
			`{"usageMetadata":{"promptTokenCount":1200,"cachedContentTokenCount":1000,"toolUsePromptTokenCount":7,"candidatesTokenCount":3}}`,
			`{"usageMetadata":{"promptTokenCount":1200,"candidatesTokenCount":9}}`,
		}, Tokens{Input: 1200, Output: 9}},
		{"an empty tally last", []string{
			`{"usageMetadata":{"promptTokenCount":10,"candidatesTokenCount":30}}`,
			`{"usageMetadata":{}}`,
		}, Tokens{}},
		{"a chunk without usageMetadata last", []string{
			`{"usageMetadata":{"promptTokenCount":10,"candidatesTokenCount":30,"thoughtsTokenCount":5}}`,
			`{"candidates":[]}`,
		}, Tokens{Input: 10, Output: 35}},
	} {
		var s usageScanner
		for _, c := range tt.chunks {
			s.scan([]byte(c))
			s.endValue()
		}
		if got, ok := s.raw.tokens(); !ok || got != tt.want {
			t.Errorf("%s: %+v, %v; want %+v, true", tt.name, got, ok, tt.want)
		}
	}
}

// The entries of an iterations array are summed and dropped as each ends:
// the bytes held stay within maxUsageCapture however many there are, and
// an entry past that bound drops its usage object whole, as any usage
// object past it is.
func TestUsageIterationsBounded(t *testing.T) {
	entry := []byte(`{"type":"message","input_tokens":3,"cache_read_input_tokens":2,"output_tokens":1},`)
	var s usageScanner
	s.scan([]byte(`{"usage":{"input_tokens":1,"output_tokens":1,"iterations":[`))
	for range 10000 {
		s.scan(entry)
		if cap(s.buf) > maxUsageCapture {
			t.Fatalf("%d bytes held", cap(s.buf))
		}
	}
	s.scan([]byte(`{"type":"message","input_tokens":3,"output_tokens":1}]}}`))
	s.endValue()
	if got, ok := s.raw.tokens(); !ok || got != (Tokens{Input: 10001*3 + 10000*2, Output: 10001, Cached: 10000 * 2}) {
		t.Errorf("read %+v, %v", got, ok)
	}

	var big usageScanner
	big.scan([]byte(`{"usage":{"input_tokens":1,"output_tokens":1,"iterations":[{"type":"message","input_tokens":3,"output_tokens":1,"pad":"` +
		strings.Repeat("x", maxUsageCapture) + `"}]}}`))
	big.endValue()
	if got, ok := big.raw.tokens(); ok {
		t.Errorf("an entry past the bound: read %+v", got)
	}
}
