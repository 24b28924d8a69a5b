package failover

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
	"testing/synctest"
	"time"
)

// These tests run in synctest bubbles over fakeNet: the bounds are tens of
// seconds to minutes, which only a fake clock makes exact, and a bubble
// allows no real network I/O.

const (
	streamBody   = `{"model":"m","stream":true,"messages":[]}`
	unstreamBody = `{"model":"m","messages":[]}`
)

// silent is an upstream that takes the request and never answers, until
// the attempt's context ends.
func silent(r *http.Request) (*http.Response, error) {
	<-r.Context().Done()
	return nil, r.Context().Err()
}

// sseAnswer is a 200 stream whose body is what w writes to a pipe; w gets
// the request's context, and the pipe is closed when w returns.
func sseAnswer(r *http.Request, w func(ctx context.Context, pw *io.PipeWriter)) *http.Response {
	pr, pw := io.Pipe()
	go func() {
		w(r.Context(), pw)
		pw.Close()
	}()
	resp := respond(200, "", "Content-Type", "text/event-stream")
	resp.Body, resp.ContentLength = pr, -1
	return resp
}

// waitOr sleeps d unless ctx ends first; it reports whether d passed.
func waitOr(ctx context.Context, d time.Duration) bool {
	select {
	case <-time.After(d):
		return true
	case <-ctx.Done():
		return false
	}
}

// A silent upstream (it takes the connection and never answers) fails a
// streamed request over once Timeouts.Headers passes, with the default
// Config, and the timeout counts against it.
func TestSilentUpstreamFailsStreamOver(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := newFakeNet()
		n.handle("a.test", silent)
		n.handle("b.test", func(r *http.Request) (*http.Response, error) {
			return sseAnswer(r, func(_ context.Context, pw *io.PipeWriter) { io.WriteString(pw, contentEvent+"data: [DONE]\n\n") }), nil
		})
		tr := newTestTransport(t, twoUpstreams(n, Config{}))
		start := time.Now()
		resp, err := tr.RoundTrip(httptestRequest("POST", "http://a.test/v1/chat/completions", streamBody))
		if err != nil {
			t.Fatal(err)
		}
		if took := time.Since(start); took != defaultHeadersTimeout {
			t.Errorf("answered after %v, want %v", took, defaultHeadersTimeout)
		}
		if got := readBody(t, resp); !strings.HasPrefix(got, contentEvent) {
			t.Errorf("body %q, want the backup's stream", got)
		}
		if h := tr.Health()[0]; h.BreakerFailures != 1 || h.Requests.Failed != 1 {
			t.Errorf("primary: %d breaker failures, %d failed; want 1 and 1", h.BreakerFailures, h.Requests.Failed)
		}
	})
}

// The kinds of streamed request are told apart from unstreamed ones only
// once Headers passes: by the body's "stream", an Accept of
// text/event-stream, or a streaming method's path.
func TestStreamedRequestKinds(t *testing.T) {
	for _, c := range []struct {
		name, url, body, accept string
		want                    bool
	}{
		{"stream true", "http://x.test/v1/chat/completions", ` { "messages":[{"stream":false}], "stream" : true }`, "", true},
		{"stream false", "http://x.test/v1/chat/completions", `{"stream":false}`, "", false},
		{"nested stream", "http://x.test/v1/chat/completions", `{"tools":[{"stream":true}]}`, "", false},
		{"no body", "http://x.test/v1/models", "", "", false},
		{"not JSON", "http://x.test/v1/chat/completions", `stream=true`, "", false},
		{"accept", "http://x.test/v1/chat/completions", `{}`, "application/json, Text/Event-Stream", true},
		{"gemini", "http://x.test/v1beta/models/gemini-2.5-flash:streamGenerateContent", `{}`, "", true},
		{"gemini sse", "http://x.test/v1beta/models/gemini-2.5-flash:generateContent?alt=sse", `{}`, "", true},
		{"bedrock converse", "http://x.test/model/m/converse-stream", `{}`, "", true},
		{"bedrock invoke", "http://x.test/model/m/invoke-with-response-stream", `{}`, "", true},
	} {
		req := httptestRequest("POST", c.url, c.body)
		if c.accept != "" {
			req.Header.Set("Accept", c.accept)
		}
		if got := streamed(req, defaultMaxBodyBuffer); got != c.want {
			t.Errorf("%s: streamed %v, want %v", c.name, got, c.want)
		}
	}
	// A body larger than the bound is not read for its kind.
	req := httptestRequest("POST", "http://x.test/v1/chat/completions", `{"stream":true,"pad":"`+strings.Repeat("x", 100)+`"}`)
	if streamed(req, 50) {
		t.Error("a body over the bound read as streamed")
	}
}

// A request that is not streamed gets its headers only with the whole
// answer: a silent upstream fails it over after Timeouts.Attempt, not
// Headers, and a healthy answer after 5 minutes of thinking is not cut.
func TestUnstreamedRequestWaitsForItsAnswer(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := newFakeNet()
		n.handle("a.test", silent)
		n.status("b.test", 200, `{"ok":true}`)
		tr := newTestTransport(t, twoUpstreams(n, Config{}))
		start := time.Now()
		resp, err := tr.RoundTrip(httptestRequest("POST", "http://a.test/v1/chat/completions", unstreamBody))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if took := time.Since(start); took != defaultAttemptTimeout {
			t.Errorf("failed over after %v, want %v", took, defaultAttemptTimeout)
		}

		n.handle("a.test", func(r *http.Request) (*http.Response, error) {
			if !waitOr(r.Context(), 5*time.Minute) {
				return nil, r.Context().Err()
			}
			return respond(200, `{"thought":"long"}`), nil
		})
		tr = newTestTransport(t, twoUpstreams(n, Config{}))
		resp, err = tr.RoundTrip(httptestRequest("POST", "http://a.test/v1/chat/completions", unstreamBody))
		if err != nil {
			t.Fatal(err)
		}
		if got := readBody(t, resp); got != `{"thought":"long"}` {
			t.Errorf("got %q, want the primary's slow answer", got)
		}
	})
}

// A stream whose headers come at once and whose content comes after
// minutes of thinking (OpenAI's chat completions send nothing meanwhile)
// is not cut; one with no content within FirstContent fails over.
func TestThinkingStreamIsNotCut(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		think := 8 * time.Minute
		n := newFakeNet()
		n.handle("a.test", func(r *http.Request) (*http.Response, error) {
			return sseAnswer(r, func(ctx context.Context, pw *io.PipeWriter) {
				io.WriteString(pw, "data: {\"choices\":[{\"delta\":{\"role\":\"assistant\"}}]}\n\n")
				if waitOr(ctx, think) {
					io.WriteString(pw, contentEvent+"data: [DONE]\n\n")
				}
			}), nil
		})
		n.handle("b.test", func(r *http.Request) (*http.Response, error) {
			return sseAnswer(r, func(_ context.Context, pw *io.PipeWriter) { io.WriteString(pw, "data: backup\n\n") }), nil
		})
		tr := newTestTransport(t, twoUpstreams(n, Config{}))
		resp, err := tr.RoundTrip(httptestRequest("POST", "http://a.test/v1/chat/completions", streamBody))
		if err != nil {
			t.Fatal(err)
		}
		if got := readBody(t, resp); !strings.Contains(got, contentEvent) {
			t.Fatalf("got %q, want the thinking primary's content", got)
		}

		think = 11 * time.Minute // past FirstContent
		tr = newTestTransport(t, twoUpstreams(n, Config{}))
		start := time.Now()
		resp, err = tr.RoundTrip(httptestRequest("POST", "http://a.test/v1/chat/completions", streamBody))
		if err != nil {
			t.Fatal(err)
		}
		if got := readBody(t, resp); got != "data: backup\n\n" {
			t.Errorf("got %q, want the backup's stream", got)
		}
		if took := time.Since(start); took != defaultFirstContentTimeout {
			t.Errorf("failed over after %v, want %v", took, defaultFirstContentTimeout)
		}
		if h := tr.Health()[0]; h.BreakerFailures != 1 {
			t.Errorf("primary: %d breaker failures, want 1", h.BreakerFailures)
		}
	})
}

// A stream that goes silent after its content began ends for the caller
// with a *StallError naming the upstream and the silence, once a read has
// waited Timeouts.Idle, and counts against the upstream. A caller slow to
// read is not taken for a silent upstream.
func TestStreamStallAfterContent(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := newFakeNet()
		n.handle("a.test", func(r *http.Request) (*http.Response, error) {
			return sseAnswer(r, func(ctx context.Context, pw *io.PipeWriter) {
				io.WriteString(pw, contentEvent)
				if waitOr(ctx, 30*time.Second) { // the stall
					io.WriteString(pw, contentEvent+"data: [DONE]\n\n")
				}
			}), nil
		})
		n.status("b.test", 200, "backup")
		tr := newTestTransport(t, twoUpstreams(n, Config{}))
		resp, err := tr.RoundTrip(httptestRequest("POST", "http://a.test/v1/chat/completions", streamBody))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		buf := make([]byte, 4096)
		if k, err := resp.Body.Read(buf); err != nil || string(buf[:k]) != contentEvent {
			t.Fatalf("first read %q, %v", buf[:k], err)
		}
		start := time.Now()
		_, err = io.ReadAll(resp.Body)
		var stall *StallError
		if !errors.As(err, &stall) || !errors.Is(err, ErrStreamStalled) || stall.Upstream != "a" || stall.Silence != defaultIdleTimeout {
			t.Fatalf("read error %v, want a *StallError of a after %v", err, defaultIdleTimeout)
		}
		if took := time.Since(start); took != defaultIdleTimeout {
			t.Errorf("stall reported after %v, want %v", took, defaultIdleTimeout)
		}
		if msg := err.Error(); !strings.Contains(msg, `"a"`) || !strings.Contains(msg, "20s") {
			t.Errorf("error %q names neither the upstream nor the silence", msg)
		}
		if h := tr.Health()[0]; h.BreakerFailures != 1 || !strings.Contains(h.LastError, "stalled") {
			t.Errorf("primary: %d breaker failures, last error %q; want 1 and the stall", h.BreakerFailures, h.LastError)
		}
		if got := metricValue(t, tr, `failover_stream_stalls_total{upstream="a"}`); got != 1 {
			t.Errorf("stalls metric %v, want 1", got)
		}

		// The caller takes a minute between reads; the upstream never
		// stalls: no error.
		n.handle("a.test", func(r *http.Request) (*http.Response, error) {
			return sseAnswer(r, func(ctx context.Context, pw *io.PipeWriter) {
				for range 3 {
					io.WriteString(pw, contentEvent)
				}
				io.WriteString(pw, "data: [DONE]\n\n")
			}), nil
		})
		resp, err = tr.RoundTrip(httptestRequest("POST", "http://a.test/v1/chat/completions", streamBody))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		small := make([]byte, 16)
		for {
			_, err := resp.Body.Read(small)
			if err == io.EOF {
				break
			}
			if err != nil {
				t.Fatalf("a slow reader got %v", err)
			}
			time.Sleep(time.Minute)
		}
	})
}

// An attempt that the caller's deadline ends before any answer counts
// against its upstream when that upstream answered nothing sent since
// the attempt began and had been silent past its normal time (the hang
// limit from its recent p99): the callers who waited out a primary gone
// silent open its circuit. One at an upstream that answered others
// meanwhile counts for nothing. (With no history, only a stream's is
// judged, by Headers: TestDeadlineNeverBlamesALongUnstreamedAnswer.)
func TestDeadlineEndedSilentAttemptCounts(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := newFakeNet()
		n.handle("a.test", func(r *http.Request) (*http.Response, error) {
			time.Sleep(100 * time.Millisecond)
			return respond(200, "ok"), nil
		})
		n.status("b.test", 200, "backup")
		tr := newTestTransport(t, twoUpstreams(n, Config{}))
		for range defaultMinSamples { // its normal time: 100ms
			if code, err := get(t, tr, "http://a.test/v1/models"); code != 200 {
				t.Fatalf("warm-up: %d, %v", code, err)
			}
		}
		n.handle("a.test", silent)
		send := func(d time.Duration) error {
			ctx, cancel := context.WithTimeout(context.Background(), d)
			defer cancel()
			req := httptestRequest("POST", "http://a.test/v1/chat/completions", unstreamBody).WithContext(ctx)
			resp, err := tr.RoundTrip(req)
			if err == nil {
				resp.Body.Close()
			}
			return err
		}
		if err := send(50 * time.Millisecond); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("got %v, want the deadline", err)
		}
		if h := tr.Health()[0]; h.BreakerFailures != 0 {
			t.Fatalf("an attempt silent for less than its upstream's normal time counted: %d failures", h.BreakerFailures)
		}
		// Five callers at once, each with a 10s deadline.
		errs := make(chan error, 5)
		for range 5 {
			go func() { errs <- send(10 * time.Second) }()
		}
		for range 5 {
			if err := <-errs; !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("got %v, want the deadline", err)
			}
		}
		if h := tr.Health()[0]; h.State != Open.String() {
			t.Fatalf("after five callers waited out the silent primary: %s, %d failures; want open", h.State, h.BreakerFailures)
		}
		if err := send(time.Minute); err != nil {
			t.Fatalf("with the primary open: %v, want the backup's answer", err)
		}

		// An upstream that answers what was sent after: a long call, not
		// a silent upstream.
		n = newFakeNet()
		slow := make(chan struct{})
		n.handle("a.test", func(r *http.Request) (*http.Response, error) {
			if strings.Contains(r.URL.Path, "slow") {
				select {
				case <-slow:
				case <-r.Context().Done():
					return nil, r.Context().Err()
				}
			}
			return respond(200, "ok"), nil
		})
		n.status("b.test", 200, "backup")
		tr = newTestTransport(t, twoUpstreams(n, Config{Timeouts: Timeouts{Attempt: -1}}))
		done := make(chan error)
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			_, err := tr.RoundTrip(httptestRequest("POST", "http://a.test/v1/slow", unstreamBody).WithContext(ctx))
			done <- err
		}()
		time.Sleep(40 * time.Second)
		if code, err := get(t, tr, "http://a.test/v1/models"); code != 200 {
			t.Fatalf("quick request: %d, %v", code, err)
		}
		if err := <-done; !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("got %v, want the deadline", err)
		}
		close(slow)
		if h := tr.Health()[0]; h.BreakerFailures != 0 {
			t.Errorf("a long call at an upstream that answered meanwhile counted: %d failures", h.BreakerFailures)
		}
	})
}

// A deadline shorter than Timeouts.Headers (an http.Client.Timeout) leaves
// the next upstream half of it: the silent primary's stream fails over
// instead of taking the whole deadline; the Logger hears of it once.
func TestShortDeadlineLeavesRoomToFailOver(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := newFakeNet()
		n.handle("a.test", silent)
		n.handle("b.test", func(r *http.Request) (*http.Response, error) {
			return sseAnswer(r, func(_ context.Context, pw *io.PipeWriter) { io.WriteString(pw, contentEvent) }), nil
		})
		var logs logBuffer
		tr := newTestTransport(t, twoUpstreams(n, Config{Logger: newLogger(&logs)}))
		client := &http.Client{Transport: tr, Timeout: 24 * time.Second}
		for range 2 {
			start := time.Now()
			resp, err := client.Post("http://a.test/v1/chat/completions", "application/json", strings.NewReader(streamBody))
			if err != nil {
				t.Fatalf("with a 24s client timeout: %v, want the backup's stream", err)
			}
			readBody(t, resp)
			if took := time.Since(start); took != 12*time.Second {
				t.Errorf("failed over after %v, want 12s", took)
			}
		}
		if got := strings.Count(logs.String(), "shorter than Timeouts.Headers"); got != 1 {
			t.Errorf("the Logger heard of the short deadline %d times, want once:\n%s", got, logs.String())
		}
	})
}

// New tells the Logger of settings that can never take effect.
func TestNewWarnsOfSettingsWithoutEffect(t *testing.T) {
	var logs logBuffer
	newTestTransport(t, twoUpstreams(newFakeNet(), Config{
		Logger:      newLogger(&logs),
		Hedge:       &HedgeConfig{Delay: time.Hour},
		StreamGuard: &StreamGuard{FirstByteTimeout: time.Second},
		Timeouts:    Timeouts{FirstContent: time.Minute},
	}))
	for _, want := range []string{"Hedge.Delay 1h0m0s", "FirstContent, which has no effect"} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("New's log lacks %q:\n%s", want, logs.String())
		}
	}
	logs = logBuffer{}
	newTestTransport(t, twoUpstreams(newFakeNet(), Config{Logger: newLogger(&logs), Hedge: &HedgeConfig{Delay: time.Second}}))
	if s := logs.String(); s != "" {
		t.Errorf("New warned of a sound config:\n%s", s)
	}
}

// The deprecated AttemptTimeout still bounds the headers of either kind,
// and WithAttemptTimeout bounds one request's.
func TestDeprecatedAttemptTimeoutBoundsBothKinds(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := newFakeNet()
		n.handle("a.test", silent)
		n.status("b.test", 200, "backup")
		for _, c := range []struct {
			cfg  Config
			ctx  context.Context
			want time.Duration
		}{
			{Config{AttemptTimeout: 3 * time.Second}, context.Background(), 3 * time.Second},
			{Config{Upstreams: []Upstream{{AttemptTimeout: 2 * time.Second}}}, context.Background(), 2 * time.Second},
			{Config{}, WithAttemptTimeout(context.Background(), time.Second), time.Second},
		} {
			cfg := twoUpstreams(n, c.cfg)
			if len(c.cfg.Upstreams) > 0 {
				cfg.Upstreams[0].AttemptTimeout = c.cfg.Upstreams[0].AttemptTimeout
			}
			tr := newTestTransport(t, cfg)
			for _, body := range []string{streamBody, unstreamBody} {
				start := time.Now()
				resp, err := tr.RoundTrip(httptestRequest("POST", "http://a.test/v1/chat/completions", body).WithContext(c.ctx))
				if err != nil {
					t.Fatal(err)
				}
				resp.Body.Close()
				if took := time.Since(start); took != c.want {
					t.Errorf("%+v, %s: failed over after %v, want %v", c.cfg, body, took, c.want)
				}
			}
		}
	})
}

// A stream's Headers bound cut to the caller's deadline's share (a 12s
// http.Client.Timeout, an upstream whose headers take 8s) fails over but
// counts nothing against the upstream: the bound was the caller's.
func TestDeadlineShareNeverBlamesTheUpstream(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := newFakeNet()
		n.handle("a.test", func(r *http.Request) (*http.Response, error) {
			if !waitOr(r.Context(), 8*time.Second) { // well within Headers (30s)
				return nil, r.Context().Err()
			}
			return sseAnswer(r, func(_ context.Context, pw *io.PipeWriter) { io.WriteString(pw, contentEvent) }), nil
		})
		n.handle("b.test", func(r *http.Request) (*http.Response, error) {
			return sseAnswer(r, func(_ context.Context, pw *io.PipeWriter) { io.WriteString(pw, contentEvent) }), nil
		})
		tr := newTestTransport(t, twoUpstreams(n, Config{}))
		client := &http.Client{Transport: tr, Timeout: 12 * time.Second}
		for range 5 {
			resp, err := client.Post("http://a.test/v1/chat/completions", "application/json", strings.NewReader(streamBody))
			if err != nil {
				t.Fatal(err)
			}
			readBody(t, resp)
		}
		if h := tr.Health()[0]; h.BreakerFailures != 0 || h.State != Closed.String() {
			t.Errorf("upstream answering headers in 8s (Headers 30s) under 12s client timeouts: %s, %d breaker failures; want closed, 0", h.State, h.BreakerFailures)
		}
	})
}
