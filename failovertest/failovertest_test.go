package failovertest_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/failover-go/failover"
	"github.com/failover-go/failover/failovertest"
	"go.uber.org/goleak"
)

// TestMain fails the run when a test leaves a goroutine behind: a Server
// must be gone when its test ends.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// newClient returns a client whose idle connections are closed when the
// test ends.
func newClient(t *testing.T) *http.Client {
	t.Helper()
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr}
}

// answer is what a client saw of one response.
type answer struct {
	status int
	body   string
}

// get sends a GET to url and returns the answer.
func get(t *testing.T, c *http.Client, url string) answer {
	t.Helper()
	resp, err := c.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("GET %s: reading the body: %v", url, err)
	}
	return answer{resp.StatusCode, string(body)}
}

func TestScript(t *testing.T) {
	tests := []struct {
		name  string
		steps []failovertest.Step
		want  []answer // one per request, in order
	}{
		{
			name: "no steps",
			want: []answer{{200, ""}, {200, ""}},
		},
		{
			name:  "zero status is 200",
			steps: []failovertest.Step{{Body: "ok"}},
			want:  []answer{{200, "ok"}},
		},
		{
			name:  "one step repeats",
			steps: []failovertest.Step{{Status: 503, Body: "down"}},
			want:  []answer{{503, "down"}, {503, "down"}, {503, "down"}},
		},
		{
			name: "steps in order, then the last again",
			steps: []failovertest.Step{
				{Status: 503, Body: "down"},
				{Status: 429, Body: "slow down"},
				{Status: 200, Body: "ok"},
			},
			want: []answer{{503, "down"}, {429, "slow down"}, {200, "ok"}, {200, "ok"}, {200, "ok"}},
		},
		{
			name:  "529",
			steps: []failovertest.Step{{Status: 529, Body: "overloaded"}, {}},
			want:  []answer{{529, "overloaded"}, {200, ""}},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := failovertest.NewServer(t, tc.steps...)
			c := newClient(t)
			var got []answer
			for range tc.want {
				got = append(got, get(t, c, s.URL+"/v1/models"))
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("got %v, want %v", got, tc.want)
			}
			if got, want := s.Calls(), len(tc.want); got != want {
				t.Errorf("got %d calls, want %d", got, want)
			}
		})
	}
}

// TestNewServerCopiesSteps: changing the steps after NewServer changes
// nothing.
func TestNewServerCopiesSteps(t *testing.T) {
	steps := []failovertest.Step{{Status: 503, Header: http.Header{"Retry-After": {"1"}}, Chunks: []string{"a"}}}
	s := failovertest.NewServer(t, steps...)
	steps[0].Status = 200
	steps[0].Header.Set("Retry-After", "2")
	steps[0].Chunks[0] = "b"

	resp, err := newClient(t).Get(s.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 503 || resp.Header.Get("Retry-After") != "1" || string(body) != "a" {
		t.Errorf("got %d, Retry-After %q, body %q; want 503, %q, %q", resp.StatusCode, resp.Header.Get("Retry-After"), body, "1", "a")
	}
}

func TestNewServerPanicsOnBadStatus(t *testing.T) {
	for _, status := range []int{-1, 1, 100, 199, 1000} {
		t.Run(fmt.Sprint(status), func(t *testing.T) {
			defer func() {
				if recover() == nil {
					t.Errorf("NewServer with Status %d did not panic", status)
				}
			}()
			failovertest.NewServer(t, failovertest.Step{}, failovertest.Step{Status: status})
		})
	}
}

func TestHeadersAndBody(t *testing.T) {
	tests := []struct {
		name            string
		step            failovertest.Step
		wantContentType string
		wantBody        string
		wantHeader      http.Header // must be among the response's headers
	}{
		{
			name:            "JSON body",
			step:            failovertest.Step{Body: `{"id":"chatcmpl-1"}`},
			wantContentType: "application/json",
			wantBody:        `{"id":"chatcmpl-1"}`,
		},
		{
			name:            "text body",
			step:            failovertest.Step{Body: "upstream connect error"},
			wantContentType: "text/plain; charset=utf-8", // sniffed by net/http
			wantBody:        "upstream connect error",
		},
		{
			name:            "no body",
			step:            failovertest.Step{Status: 503},
			wantContentType: "",
		},
		{
			name: "headers as given",
			step: failovertest.Step{
				Status: 429,
				Header: http.Header{
					"Content-Type":   {"application/problem+json"},
					"Retry-After":    {"30"},
					"Retry-After-Ms": {"30000"},
					"X-Multi":        {"a", "b"},
				},
				Body: `{"error":{"type":"rate_limit_exceeded"}}`,
			},
			wantContentType: "application/problem+json",
			wantBody:        `{"error":{"type":"rate_limit_exceeded"}}`,
			wantHeader:      http.Header{"Retry-After": {"30"}, "Retry-After-Ms": {"30000"}, "X-Multi": {"a", "b"}},
		},
		{
			name:            "chunks",
			step:            failovertest.Step{Body: ": comment\n\n", Chunks: []string{"data: 1\n\n", "data: 2\n\n", "data: [DONE]\n\n"}},
			wantContentType: "text/event-stream",
			wantBody:        ": comment\n\ndata: 1\n\ndata: 2\n\ndata: [DONE]\n\n",
		},
		{
			name:            "empty chunks",
			step:            failovertest.Step{Chunks: []string{}},
			wantContentType: "text/event-stream",
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := failovertest.NewServer(t, tc.step)
			resp, err := newClient(t).Get(s.URL)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			body, err := io.ReadAll(resp.Body)
			if err != nil {
				t.Fatalf("reading the body: %v", err)
			}
			if want := max(tc.step.Status, 200); resp.StatusCode != want {
				t.Errorf("got status %d, want %d", resp.StatusCode, want)
			}
			if got := resp.Header.Get("Content-Type"); got != tc.wantContentType {
				t.Errorf("got Content-Type %q, want %q", got, tc.wantContentType)
			}
			if string(body) != tc.wantBody {
				t.Errorf("got body %q, want %q", body, tc.wantBody)
			}
			for k, want := range tc.wantHeader {
				if got := resp.Header.Values(k); !slices.Equal(got, want) {
					t.Errorf("got %s %q, want %q", k, got, want)
				}
			}
		})
	}
}

// TestChunksAreFlushed: a step with Chunks streams its body as it writes it,
// chunk by chunk, with no Content-Length.
func TestChunksAreFlushed(t *testing.T) {
	chunks := []string{"data: {\"n\":1}\n\n", "data: {\"n\":2}\n\n", "data: [DONE]\n\n"}
	s := failovertest.NewServer(t, failovertest.Step{Chunks: chunks})
	resp, err := newClient(t).Get(s.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.ContentLength != -1 || !slices.Equal(resp.TransferEncoding, []string{"chunked"}) {
		t.Errorf("got Content-Length %d and Transfer-Encoding %q, want a chunked stream", resp.ContentLength, resp.TransferEncoding)
	}
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := string(body), strings.Join(chunks, ""); got != want {
		t.Errorf("got %q, want %q", got, want)
	}
}

func TestRecordsRequests(t *testing.T) {
	s := failovertest.NewServer(t)
	c := newClient(t)

	req, err := http.NewRequest(http.MethodPost, s.URL+"/openai/v1/chat/completions?api-version=2024-10-21&b=2&a=1&a=3", strings.NewReader(`{"model":"m"}`))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer sk-test")
	req.Header.Set("Content-Type", "application/json")
	req.Header["X-Multi"] = []string{"a", "b"}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	get(t, c, s.URL+"/v1/models")

	if got := s.Calls(); got != 2 {
		t.Fatalf("got %d calls, want 2", got)
	}
	reqs := s.Requests()
	if len(reqs) != 2 {
		t.Fatalf("got %d requests, want 2", len(reqs))
	}
	post, gotGet := reqs[0], reqs[1]
	if post.Method != http.MethodPost || post.Path != "/openai/v1/chat/completions" {
		t.Errorf("got %s %s, want POST /openai/v1/chat/completions", post.Method, post.Path)
	}
	if want := "api-version=2024-10-21&b=2&a=1&a=3"; post.RawQuery != want {
		t.Errorf("got RawQuery %q, want %q", post.RawQuery, want)
	}
	if got := post.Query["a"]; post.Query.Get("api-version") != "2024-10-21" || !slices.Equal(got, []string{"1", "3"}) {
		t.Errorf("got Query %v, want api-version=2024-10-21 and a=[1 3]", post.Query)
	}
	if got := post.Header.Get("Authorization"); got != "Bearer sk-test" {
		t.Errorf("got Authorization %q, want %q", got, "Bearer sk-test")
	}
	if got := post.Header.Values("X-Multi"); !slices.Equal(got, []string{"a", "b"}) {
		t.Errorf("got X-Multi %q, want %q", got, []string{"a", "b"})
	}
	if string(post.Body) != `{"model":"m"}` {
		t.Errorf("got body %q, want %q", post.Body, `{"model":"m"}`)
	}
	if gotGet.Method != http.MethodGet || gotGet.Path != "/v1/models" || gotGet.RawQuery != "" || len(gotGet.Body) != 0 {
		t.Errorf("got %s %s?%s with body %q, want GET /v1/models, no query, no body", gotGet.Method, gotGet.Path, gotGet.RawQuery, gotGet.Body)
	}

	// Requests returns copies.
	reqs[0].Header.Set("Authorization", "changed")
	reqs[0].Query.Set("a", "changed")
	reqs[0].Body[0] = 'X'
	again := s.Requests()[0]
	if again.Header.Get("Authorization") != "Bearer sk-test" || again.Query.Get("a") != "1" || string(again.Body) != `{"model":"m"}` {
		t.Errorf("changing what Requests returned changed the server's record: %+v", again)
	}
}

// TestConcurrentRequests: concurrent requests each get a step of their own,
// and every one is recorded.
func TestConcurrentRequests(t *testing.T) {
	const n = 16
	var steps []failovertest.Step
	for i := range n {
		steps = append(steps, failovertest.Step{Body: fmt.Sprint(i)})
	}
	s := failovertest.NewServer(t, steps...)
	c := newClient(t)
	bodies := make([]string, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			resp, err := c.Get(fmt.Sprintf("%s/r%d", s.URL, i))
			if err != nil {
				t.Error(err)
				return
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			bodies[i] = string(b)
		})
	}
	wg.Wait()
	seen := map[string]bool{}
	for _, b := range bodies {
		seen[b] = true
	}
	if len(seen) != n {
		t.Errorf("got bodies %q, want each of the %d steps once", bodies, n)
	}
	if got := s.Calls(); got != n {
		t.Errorf("got %d calls, want %d", got, n)
	}
	paths := map[string]bool{}
	for _, r := range s.Requests() {
		paths[r.Path] = true
	}
	if len(paths) != n {
		t.Errorf("got %d distinct paths recorded, want %d", len(paths), n)
	}
}

func TestReceived(t *testing.T) {
	s := failovertest.NewServer(t)
	c := newClient(t)
	select {
	case <-s.Received(0):
	default:
		t.Error("Received(0) is not closed at once")
	}
	two := s.Received(2)
	get(t, c, s.URL)
	select {
	case <-two:
		t.Fatal("Received(2) is closed after one request")
	case <-s.Received(1):
	}
	get(t, c, s.URL)
	<-two // closed by the second request; a bug hangs here until the test times out
	select {
	case <-s.Received(2):
	default:
		t.Error("Received(2) is not closed at once after two requests")
	}
}

// TestDelay: the headers come no earlier than Delay.
func TestDelay(t *testing.T) {
	const delay = 50 * time.Millisecond
	s := failovertest.NewServer(t, failovertest.Step{Delay: delay, Body: "late"})
	start := time.Now()
	got := get(t, newClient(t), s.URL)
	if elapsed := time.Since(start); elapsed < delay {
		t.Errorf("got the answer after %v, want no earlier than %v", elapsed, delay)
	}
	if want := (answer{200, "late"}); got != want {
		t.Errorf("got %v, want %v", got, want)
	}
}

// TestDelayEndsWhenClientGivesUp: an upstream that hangs lets go of a
// request whose client gave up, and the server shuts down at once.
func TestDelayEndsWhenClientGivesUp(t *testing.T) {
	s := failovertest.NewServer(t, failovertest.Step{Delay: time.Hour})
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, s.URL, nil)
	if err != nil {
		t.Fatal(err)
	}
	c := newClient(t)
	errc := make(chan error, 1)
	go func() {
		resp, err := c.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		errc <- err
	}()
	<-s.Received(1)
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Errorf("got %v, want context.Canceled", err)
	}
	// The test's cleanup closes the server; a handler still waiting for
	// the hour would hold it (and goleak would see it).
}

// TestDelayEndsWhenServerCloses: an upstream that hangs gives no answer at
// all when its test ends: the connection is dropped, no 200 is made up.
func TestDelayEndsWhenServerCloses(t *testing.T) {
	c := newClient(t)
	type result struct {
		status int
		err    error
	}
	done := make(chan result, 1)
	t.Run("hang", func(t *testing.T) {
		s := failovertest.NewServer(t, failovertest.Step{Delay: time.Hour, Body: "never"})
		go func() {
			resp, err := c.Get(s.URL)
			if err != nil {
				done <- result{err: err}
				return
			}
			resp.Body.Close()
			done <- result{status: resp.StatusCode}
		}()
		<-s.Received(1)
		// The subtest ends with the request in flight: its cleanup shuts
		// the server down.
	})
	r := <-done
	if r.err == nil {
		t.Errorf("got status %d, want an error: no answer at all", r.status)
	}
}

// TestCleanupClosesServer: the server is gone when its test ends.
func TestCleanupClosesServer(t *testing.T) {
	var url string
	t.Run("server", func(t *testing.T) {
		url = failovertest.NewServer(t).URL
	})
	resp, err := newClient(t).Get(url)
	if err == nil {
		resp.Body.Close()
		t.Fatalf("got status %d from a server whose test ended, want an error", resp.StatusCode)
	}
}

// TestWithFailover: the primary fails once and then recovers; the backup
// serves while the primary fails, each with its own key.
func TestWithFailover(t *testing.T) {
	primary := failovertest.NewServer(t,
		failovertest.Step{Status: http.StatusServiceUnavailable, Body: `{"error":{"message":"overloaded","type":"server_error"}}`},
		failovertest.Step{Body: `{"choices":[{"message":{"content":"from primary"}}]}`},
	)
	backup := failovertest.NewServer(t, failovertest.Step{Body: `{"choices":[{"message":{"content":"from backup"}}]}`})
	tr, err := failover.New(failover.Config{Upstreams: []failover.Upstream{
		{Name: "primary", BaseURL: primary.URL + "/v1", Header: http.Header{"Authorization": {"Bearer sk-primary-0123456789"}}},
		{Name: "backup", BaseURL: backup.URL + "/openai/v1", Header: http.Header{"Authorization": {"Bearer sk-backup-0123456789"}}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(tr.CloseIdleConnections)
	client := &http.Client{Transport: tr}

	const reqBody = `{"model":"gpt-test","messages":[{"role":"user","content":"hi"}]}`
	want := []answer{
		{200, `{"choices":[{"message":{"content":"from backup"}}]}`},
		{200, `{"choices":[{"message":{"content":"from primary"}}]}`},
	}
	for i, w := range want {
		req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, primary.URL+"/v1/chat/completions", strings.NewReader(reqBody))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer sk-caller-0123456789")
		resp, err := client.Do(req)
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			t.Fatalf("request %d: reading the body: %v", i, err)
		}
		if got := (answer{resp.StatusCode, string(body)}); got != w {
			t.Errorf("request %d: got %v, want %v", i, got, w)
		}
	}

	if got, want := primary.Calls(), 2; got != want {
		t.Errorf("primary got %d calls, want %d", got, want)
	}
	if got, want := backup.Calls(), 1; got != want {
		t.Errorf("backup got %d calls, want %d", got, want)
	}
	for _, r := range primary.Requests() {
		if got := r.Header.Get("Authorization"); got != "Bearer sk-primary-0123456789" {
			t.Errorf("primary got Authorization %q, want its own key", got)
		}
		if r.Path != "/v1/chat/completions" || string(r.Body) != reqBody {
			t.Errorf("primary got %s with body %q, want /v1/chat/completions with %q", r.Path, r.Body, reqBody)
		}
	}
	for _, r := range backup.Requests() {
		if got := r.Header.Values("Authorization"); !slices.Equal(got, []string{"Bearer sk-backup-0123456789"}) {
			t.Errorf("backup got Authorization %q, want only its own key", got)
		}
		if r.Path != "/openai/v1/chat/completions" || string(r.Body) != reqBody {
			t.Errorf("backup got %s with body %q, want /openai/v1/chat/completions with %q", r.Path, r.Body, reqBody)
		}
	}
	h := tr.Health()
	if h[0].Requests.Failed != 1 || h[0].Requests.Success != 1 || h[1].Requests.Success != 1 {
		t.Errorf("got primary %+v and backup %+v, want one failure and one success at the primary, one success at the backup", h[0].Requests, h[1].Requests)
	}
}

// ClosedURL refuses connections for as long as the test runs.
func TestClosedURL(t *testing.T) {
	u := failovertest.ClosedURL(t)
	resp, err := http.Get(u)
	if err == nil {
		resp.Body.Close()
		t.Fatalf("GET %s answered %d, want a refused connection", u, resp.StatusCode)
	}
	if !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("GET %s: %v, want ECONNREFUSED", u, err)
	}
}
