package failover

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/tidwall/gjson"
)

// piecesBody returns data in reads of the sizes sizes gives in turn (0: a
// read of nothing), then end.
type piecesBody struct {
	data  []byte
	sizes []byte
	end   error
}

func (b *piecesBody) Read(p []byte) (int, error) {
	if len(b.data) == 0 {
		return 0, b.end
	}
	n := len(b.data)
	if len(b.sizes) > 0 {
		n, b.sizes = min(n, int(b.sizes[0])), b.sizes[1:]
	}
	n = copy(p, b.data[:n])
	b.data = b.data[n:]
	return n, nil
}

func (b *piecesBody) Close() error { return nil }

func FuzzSplice(f *testing.F) {
	chat := chatRole("p1") + chatChunk("p1", "one ", "") + chatChunk("p1", "two ", "")
	chatCont := chatRole("b1") + chatChunk("b1", "three", "") + chatChunk("b1", "", "stop") + chatUsage("b1", 3, 1) + "data: [DONE]\n\n"
	msg := msgStart("msg_p", 5, 1) + msgBlockStart(0) + msgText(0, "one ")
	msgCont := msgStart("msg_b", 7, 1) + msgBlockStart(0) + msgText(0, " two") + msgBlockStop(0) + strings.Join(msgEnd(2), "")
	f.Add([]byte(chat), []byte(chatCont), []byte{7, 0, 200}, byte(1))
	f.Add([]byte(chat+"data: [DONE]\n\n"), []byte(chatCont), []byte{}, byte(0))
	f.Add([]byte(strings.TrimSuffix(chat, "\n")), []byte(chatCont), []byte{3}, byte(1))
	f.Add([]byte(strings.ReplaceAll(chat, "\n", "\r\n")), []byte(chatCont), []byte{5, 1, 1}, byte(1))
	f.Add([]byte(strings.ReplaceAll(chat, "\n", "\r")), []byte(strings.ReplaceAll(chatCont, "\n", "\r")), []byte{9, 9}, byte(0))
	f.Add([]byte(chat+": keep-alive\n\n"), []byte(`data: {"error":{"message":"no"}}`+"\n\n"), []byte{}, byte(1))
	f.Add([]byte(msg), []byte(msgCont), []byte{11, 2}, byte(3))
	f.Add([]byte(msg+msgEvent("error", `{"type":"error","error":{"type":"overloaded_error"}}`)), []byte(msgCont), []byte{}, byte(2))
	f.Add([]byte(msg+msgBlockStop(0)), []byte(msgStart("msg_b", 7, 1)+`event: content_block_start`+"\n"+`data: {"type":"content_block_start","index":0,"content_block":{"type":"tool_use","id":"t","name":"f","input":{}}}`+"\n\n"+strings.Join(msgEnd(2), "")), []byte{}, byte(3))
	f.Fuzz(checkSplice)
}

// checkSplice splices first, a primary's stream, and cont, a backup's, as
// FuzzSplice says.
func checkSplice(t *testing.T, first, cont, sizes []byte, mode byte) {
	if len(first) > 16*maxSpliceEvent || len(cont) > 1<<16 {
		return
	}
	path, body := "/v1/chat/completions", contBody
	if mode&2 != 0 {
		path, body = "/v1/messages", msgBody
	}
	end := io.EOF
	if mode&1 != 0 {
		end = io.ErrUnexpectedEOF // a cut
	}
	var mu sync.Mutex
	var continued bool
	answered := first
	base := roundTripFunc(func(r *http.Request) (*http.Response, error) {
		resp := &http.Response{StatusCode: 200, Header: http.Header{"Content-Type": {"text/event-stream"}}, Request: r}
		if r.URL.Host == "primary.test" {
			resp.Body = &piecesBody{data: bytes.Clone(first), sizes: sizes, end: end}
			return resp, nil
		}
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		if gjson.GetBytes(b, "messages.#").Int() > 1 {
			continued = true
		} else {
			answered = cont // the primary's answer failed over before its content
		}
		mu.Unlock()
		resp.Body = &piecesBody{data: bytes.Clone(cont), sizes: sizes, end: io.EOF}
		return resp, nil
	})
	tr, err := New(Config{
		Base:     base,
		Continue: ContinueConfig{On: true},
		Retry:    RetryConfig{Off: true}, // no waits between attempts
		Upstreams: []Upstream{
			{Name: "primary", BaseURL: "http://primary.test/v1"},
			{Name: "backup", BaseURL: "http://backup.test/v1", Prefill: Prefill{Chat: ChatTrailingAssistant, Messages: true}},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	req := httptestRequest("POST", "http://primary.test"+path, body)
	resp, err := tr.RoundTrip(req)
	if err != nil {
		return // no answer at all: nothing spliced
	}
	out, _ := io.ReadAll(io.LimitReader(resp.Body, int64(2*len(first)+8*len(cont)+4096)))
	resp.Body.Close()
	if extra, _ := io.Copy(io.Discard, resp.Body); extra > 0 || len(out) > len(first)+8*len(cont)+4096 {
		t.Fatalf("read %d bytes (and %d more) from %d and %d", len(out), extra, len(first), len(cont))
	}
	mu.Lock()
	defer mu.Unlock()
	if !continued {
		if !bytes.HasPrefix(answered, out) {
			t.Fatalf("not continued, and not the answer as it came:\n%q\n%q", out, answered)
		}
		return
	}
	// Continued: each event the caller reads is one of the first's,
	// or one the splice wrote, which an SDK reads.
	own := map[string]bool{}
	for _, ev := range append(sseEvents(string(first)), sseEvents(string(first)+"\n\n")...) {
		own[ev] = true
	}
	ids := map[string]bool{}
	for _, ev := range sseEvents(string(first)) {
		if j := gjson.Parse(ev); json.Valid([]byte(ev)) && j.Get("id").Exists() {
			ids[j.Get("id").Raw] = true
		}
	}
	for _, ev := range sseEvents(string(out)) {
		if own[ev] {
			continue
		}
		if ev != "[DONE]" && !json.Valid([]byte(ev)) {
			t.Fatalf("an event no SDK reads: %q\nin %q", ev, out)
		}
		if id := gjson.Get(ev, "id"); mode&2 == 0 && len(ids) == 1 && id.Exists() && !ids[id.Raw] {
			t.Fatalf("an event of id %s after the first's %v: %q", id.Raw, ids, out)
		}
	}
}

// TestSpliceLargeEventsLinear splices events of almost maxSpliceEvent
// that come in many small reads in about the time the stream takes to
// pass with continuation off: each byte is looked at for an event's end
// once, not once a read.
func TestSpliceLargeEventsLinear(t *testing.T) {
	var first strings.Builder
	first.WriteString(chatRole("p1"))
	for range 2 {
		first.WriteString(chatChunk("p1", strings.Repeat("x", maxSpliceEvent-1<<10), ""))
	}
	first.WriteString("data: [DONE]\n\n")
	sizes := bytes.Repeat([]byte{255}, first.Len()/255+1)
	tr, err := New(Config{
		Base: roundTripFunc(func(r *http.Request) (*http.Response, error) {
			body := &piecesBody{data: []byte(first.String()), sizes: sizes, end: io.EOF}
			return &http.Response{StatusCode: 200, Header: http.Header{"Content-Type": {"text/event-stream"}}, Body: body, Request: r}, nil
		}),
		Continue: ContinueConfig{On: true},
		Upstreams: []Upstream{
			{Name: "primary", BaseURL: "http://primary.test/v1"},
			{Name: "backup", BaseURL: "http://backup.test/v1", Prefill: Prefill{Chat: ChatTrailingAssistant}},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	resp, err := tr.RoundTrip(httptestRequest("POST", "http://primary.test/v1/chat/completions", contBody))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if n, err := io.Copy(io.Discard, resp.Body); err != nil || n != int64(first.Len()) {
		t.Fatalf("read %d bytes, %v", n, err)
	}
	// Counted, not timed: a scan that began again at each read looked at
	// about size²/510 bytes here, some 8 GB.
	if s := resp.Body.(*splice); s.scanned > 2*int64(first.Len()) {
		t.Errorf("scanned %d bytes for a stream of %d", s.scanned, first.Len())
	}
}

func TestEventScanResumes(t *testing.T) {
	for _, b := range []string{
		"data: x\n\n", "data: x\r\n\r\n", "data: x\r\rdata: y\r\r", "event: e\ndata: x\ndata: y\n\n",
		": comment\n\ndata: x\n\n", "data: x\n\r\n", "data: x\n\r", "data: x\r\n\n", "\n", "\r\n", "data: x",
		"data: " + strings.Repeat("x", 100) + "\r\n" + "data: y\r\n\r\n",
	} {
		for _, end := range []bool{false, true} {
			want := eventEnd([]byte(b), end)
			for k := 0; k <= len(b); k++ {
				n, resume := eventScan([]byte(b[:k]), 0, end && k == len(b))
				if n >= 0 {
					continue // an event whole in the first part
				}
				if got, _ := eventScan([]byte(b), resume, end); got != want {
					t.Errorf("%q, end %v: scanned again from %d after %d bytes: %d, want %d", b, end, resume, k, got, want)
				}
			}
		}
	}
}
