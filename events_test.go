package failover

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
)

func TestOnStateChange(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := newFakeNet()
		var healthy atomic.Bool
		n.handle("a.test", func(*http.Request) (*http.Response, error) {
			if healthy.Load() {
				return respond(200, "a"), nil
			}
			return respond(503, "down"), nil
		})
		n.status("b.test", 200, "b")
		var changes []StateChange
		var tr *Transport
		tr = newTestTransport(t, twoUpstreams(n, Config{
			Breaker: BreakerConfig{FailureThreshold: 2, Cooldown: 10 * time.Second},
			OnStateChange: func(c StateChange) {
				tr.Health() // called outside every lock: this must not deadlock
				changes = append(changes, c)
			},
		}))
		start := time.Now()
		get(t, tr, "http://a.test/")
		get(t, tr, "http://a.test/")
		if since := tr.Health()[0].StateSince; !since.Equal(start) {
			t.Fatalf("StateSince %v, want %v", since, start)
		}
		time.Sleep(10 * time.Second)
		healthy.Store(true)
		get(t, tr, "http://a.test/")
		tr.Reset("a") // already closed: no change
		want := []StateChange{
			{"a", Closed, Open, start},
			{"a", Open, HalfOpen, start.Add(10 * time.Second)},
			{"a", HalfOpen, Closed, start.Add(10 * time.Second)},
		}
		if !reflect.DeepEqual(changes, want) {
			t.Fatalf("changes:\n%v\nwant\n%v", changes, want)
		}
	})
}

// recordHandler keeps the records a Logger writes, each with the value of
// the request context's logKey, as a handler that adds trace IDs reads
// them.
type recordHandler struct {
	level slog.Level
	mu    sync.Mutex
	recs  []logRecord
}

type logRecord struct {
	level slog.Level
	msg   string
	attrs map[string]string
	ctxID any
}

type logKey struct{}

func (h *recordHandler) Enabled(_ context.Context, l slog.Level) bool { return l >= h.level }
func (h *recordHandler) WithAttrs([]slog.Attr) slog.Handler           { return h }
func (h *recordHandler) WithGroup(string) slog.Handler                { return h }
func (h *recordHandler) Handle(ctx context.Context, r slog.Record) error {
	rec := logRecord{level: r.Level, msg: r.Message, attrs: map[string]string{}, ctxID: ctx.Value(logKey{})}
	r.Attrs(func(a slog.Attr) bool {
		rec.attrs[a.Key] = a.Value.String()
		return true
	})
	h.mu.Lock()
	h.recs = append(h.recs, rec)
	h.mu.Unlock()
	return nil
}

func (h *recordHandler) records(msg string) []logRecord {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []logRecord
	for _, r := range h.recs {
		if r.msg == msg {
			out = append(out, r)
		}
	}
	return out
}

// refusingURL returns the URL of a loopback port nothing listens on.
func refusingURL(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return "http://" + addr
}

// Each failover is logged at Info with the request's context: from, to,
// the attempt's number, and why (the failed attempt's outcome and status,
// or its error's class); never the query, a header or a key.
func TestLogFailover(t *testing.T) {
	a := newUpstreamServer(t, 503, "overloaded")
	c := newUpstreamServer(t, 200, `{"ok":true}`)
	h := &recordHandler{level: slog.LevelInfo}
	tr := newTestTransport(t, Config{Logger: slog.New(h), Upstreams: []Upstream{
		{Name: "a", BaseURL: a.URL + "/v1", Header: http.Header{"Authorization": {"Bearer up-secret-a"}}},
		{Name: "b", BaseURL: refusingURL(t) + "/v1"},
		{Name: "c", BaseURL: c.URL + "/v1"},
	}})
	ctx := context.WithValue(context.Background(), logKey{}, "req-42")
	req := httptestRequest("POST", a.URL+"/v1/chat/completions?api-key=query-secret", chatBody).WithContext(ctx)
	req.Header.Set("Authorization", "Bearer caller-secret")
	resp, err := tr.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	got := h.records("failover: failed over")
	want := []map[string]string{
		{"from": "a", "to": "b", "attempt": "2", "outcome": "failed", "status": "503"},
		{"from": "b", "to": "c", "attempt": "3", "error": "connection_refused"},
	}
	if len(got) != len(want) {
		t.Fatalf("%d failover records %v, want %d", len(got), got, len(want))
	}
	for i, r := range got {
		if r.level != slog.LevelInfo || r.ctxID != "req-42" || !reflect.DeepEqual(r.attrs, want[i]) {
			t.Errorf("record %d: %v %v, context %v; want INFO %v, context req-42", i, r.level, r.attrs, r.ctxID, want[i])
		}
	}
	dump := fmt.Sprint(h.recs)
	for _, s := range []string{"secret", "api-key", "Authorization", "127.0.0.1"} {
		if strings.Contains(dump, s) {
			t.Errorf("a record holds %q: %s", s, dump)
		}
	}
}

// Each upstream a request passes over is logged at Debug with the
// request's context, its reason and when it takes requests again; a
// Logger at Info gets no such record, and the healthy request none at all.
func TestLogSkip(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := newFakeNet()
		n.status("a.test", 503, "down")
		n.status("b.test", 200, "b")
		debug, info := &recordHandler{level: slog.LevelDebug}, &recordHandler{level: slog.LevelInfo}
		for _, h := range []*recordHandler{debug, info} {
			tr := newTestTransport(t, twoUpstreams(n, Config{Logger: slog.New(h), Breaker: BreakerConfig{FailureThreshold: 1, Cooldown: 10 * time.Second}}))
			get(t, tr, "http://a.test/") // opens a's circuit
			time.Sleep(time.Second)
			ctx := context.WithValue(context.Background(), logKey{}, "req-7")
			resp, err := tr.RoundTrip(httptestRequest("GET", "http://a.test/", "").WithContext(ctx))
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
		}
		got := debug.records("failover: upstream skipped")
		want := map[string]string{"upstream": "a", "reason": "circuit_open", "round": "0", "retry_after": "9s"}
		if len(got) != 1 || got[0].level != slog.LevelDebug || got[0].ctxID != "req-7" || !reflect.DeepEqual(got[0].attrs, want) {
			t.Errorf("skip records %v, want one DEBUG %v with context req-7", got, want)
		}
		if got := info.records("failover: upstream skipped"); len(got) != 0 {
			t.Errorf("a Logger at Info got %v", got)
		}
		if got := len(info.records("failover: failed over")); got != 1 {
			t.Errorf("a Logger at Info got %d failover records, want 1", got)
		}
	})
}

// An Authorizer's failure has its own class in the failover log, even when
// it ran out of the attempt's time.
func TestErrorClassAuthorize(t *testing.T) {
	for _, err := range []error{fmt.Errorf("%w: token endpoint: 500", ErrAuthorize), errors.Join(ErrAuthorize, ErrAttemptTimeout)} {
		if got := errorClass(err); got != "authorize" {
			t.Errorf("errorClass(%v) = %q, want authorize", err, got)
		}
	}
}
