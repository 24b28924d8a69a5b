package failover

import (
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

func sseServer(t *testing.T, events ...string) *server {
	t.Helper()
	return newServer(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(200)
		w.(http.Flusher).Flush() // headers first, as providers do
		for _, e := range events {
			if e == "STALL" {
				<-r.Context().Done()
				return
			}
			io.WriteString(w, e)
			w.(http.Flusher).Flush()
		}
	})
}

const (
	overloadedEvent = "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"Overloaded\"}}\n\n"
	roleEvent       = "data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\"}}]}\n\n"
	contentEvent    = "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hello\"}}]}\n\n"
	doneEvent       = "data: [DONE]\n\n"
)

// With a StreamGuard, a stream that begins with an error event, or says
// nothing within FirstByteTimeout, fails over before the caller sees a
// byte; once content flows, an error passes through to the caller.
func TestStreamGuardFailsOver(t *testing.T) {
	backup := sseServer(t, roleEvent, contentEvent, doneEvent)
	for _, tt := range []struct {
		name     string
		primary  []string
		failover bool
		cause    error
	}{
		{"error event first", []string{roleEvent, overloadedEvent}, true, ErrStreamError},
		{"stalls before the first event", []string{"STALL"}, true, ErrFirstByteTimeout},
		{"content first", []string{roleEvent, contentEvent, overloadedEvent}, false, nil},
	} {
		t.Run(tt.name, func(t *testing.T) {
			primary := sseServer(t, tt.primary...)
			tr := newTestTransport(t, Config{
				StreamGuard: &StreamGuard{FirstByteTimeout: 200 * time.Millisecond},
				Upstreams:   []Upstream{{Name: "primary", BaseURL: primary.URL}, {Name: "backup", BaseURL: backup.URL}},
			})
			resp := mustPost(t, tr, primary.URL+"/v1/chat/completions", `{"stream":true}`)
			body := readBody(t, resp)
			want := strings.Join(tt.primary, "")
			if tt.failover {
				want = roleEvent + contentEvent + doneEvent
			}
			if body != want {
				t.Fatalf("caller read %q, want %q", body, want)
			}
			h := tr.Health()[0]
			if tt.failover && (h.Requests.Failed != 1 || !strings.Contains(h.LastError, tt.cause.Error()[len("failover: "):])) {
				t.Fatalf("primary %+v, last error %q; want one failure: %v", h.Requests, h.LastError, tt.cause)
			}
			if !tt.failover && h.Requests.Success != 1 {
				t.Fatalf("primary %+v", h.Requests)
			}
		})
	}
}

// Alone, the caller gets the guard's error.
func TestStreamGuardAlone(t *testing.T) {
	primary := sseServer(t, overloadedEvent)
	tr := newTestTransport(t, Config{
		StreamGuard: &StreamGuard{},
		Upstreams:   []Upstream{{BaseURL: primary.URL}},
	})
	_, err := tr.RoundTrip(httptestRequest("POST", primary.URL+"/v1/messages", `{"stream":true}`))
	if !errors.Is(err, ErrStreamError) || !strings.Contains(err.Error(), "overloaded_error") {
		t.Fatalf("err = %v, want ErrStreamError naming overloaded_error", err)
	}
	if _, err := New(Config{Upstreams: []Upstream{{BaseURL: "http://a.test"}}, StreamGuard: &StreamGuard{FirstByteTimeout: -1}}); err == nil {
		t.Fatal("New accepted a negative FirstByteTimeout")
	}
}
