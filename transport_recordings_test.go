package failover_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"mime"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/failover-go/failover"
)

// The recordings are real exchanges with LLM providers, kept outside the
// repository (see ../shared/recordings/README.md).
const (
	recordingsDir = "../shared/recordings"
	// minRecordedExchanges is how many exchanges the recordings hold.
	minRecordedExchanges = 77
	// secondKey is the second upstream's own key.
	secondKey = "Bearer second-upstream-key"
	// secondBase is the second upstream's base path, so that the rewrite
	// of recorded paths (escaped ones included) is checked too.
	secondBase = "/second"
)

// recordedExchange is one request and its response from an httprr trace.
type recordedExchange struct {
	name     string // file and index, for subtests
	req      *http.Request
	reqBody  []byte
	resp     *http.Response
	respBody []byte
}

// parseTrace parses an httprr trace: the line "httprr trace v1", then for
// each exchange a line "N M", N bytes of request and M bytes of response in
// HTTP/1.1 wire form.
func parseTrace(name string, data []byte) ([]recordedExchange, error) {
	line, rest, ok := bytes.Cut(data, []byte("\n"))
	if !ok || string(line) != "httprr trace v1" {
		return nil, errors.New("not an httprr trace v1")
	}
	var out []recordedExchange
	for len(rest) > 0 {
		line, rest, ok = bytes.Cut(rest, []byte("\n"))
		ns, ms, ok2 := strings.Cut(string(line), " ")
		n, err1 := strconv.Atoi(ns)
		m, err2 := strconv.Atoi(ms)
		if !ok || !ok2 || err1 != nil || err2 != nil || n < 0 || m < 0 || n+m > len(rest) {
			return nil, fmt.Errorf("exchange %d: bad size line %q", len(out), line)
		}
		ex := recordedExchange{name: fmt.Sprintf("%s/%d", name, len(out))}
		var err error
		ex.req, err = http.ReadRequest(bufio.NewReader(bytes.NewReader(rest[:n])))
		if err != nil {
			return nil, fmt.Errorf("exchange %d: request: %w", len(out), err)
		}
		if ex.reqBody, err = io.ReadAll(ex.req.Body); err != nil {
			return nil, fmt.Errorf("exchange %d: request body: %w", len(out), err)
		}
		ex.resp, err = http.ReadResponse(bufio.NewReader(bytes.NewReader(rest[n:n+m])), ex.req)
		if err != nil {
			return nil, fmt.Errorf("exchange %d: response: %w", len(out), err)
		}
		if ex.respBody, err = io.ReadAll(ex.resp.Body); err != nil {
			return nil, fmt.Errorf("exchange %d: response body: %w", len(out), err)
		}
		out = append(out, ex)
		rest = rest[n+m:]
	}
	return out, nil
}

// loadRecordings parses every trace in recordingsDir, or skips the test
// when the directory is not there.
func loadRecordings(t *testing.T) (exchanges []recordedExchange, files int) {
	t.Helper()
	if _, err := os.Stat(recordingsDir); errors.Is(err, fs.ErrNotExist) {
		t.Skipf("no recordings at %s: they live outside the repository, in the shared directory next to it", recordingsDir)
	}
	paths, err := filepath.Glob(filepath.Join(recordingsDir, "*.httprr"))
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range paths {
		data, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		exs, err := parseTrace(strings.TrimSuffix(filepath.Base(p), ".httprr"), data)
		if err != nil {
			t.Fatalf("%s: %v", p, err)
		}
		exchanges = append(exchanges, exs...)
	}
	if len(exchanges) < minRecordedExchanges {
		t.Fatalf("parsed %d exchanges from %d files in %s, want at least %d", len(exchanges), len(paths), recordingsDir, minRecordedExchanges)
	}
	return exchanges, len(paths)
}

// hopByHop are the headers that belong to one connection; they, and the
// ones net/http computes itself, are not compared.
var hopByHop = []string{
	"Connection", "Keep-Alive", "Proxy-Connection", "Proxy-Authenticate", "Proxy-Authorization",
	"Te", "Trailer", "Transfer-Encoding", "Upgrade",
}

func ignoredHeader(k string) bool {
	k = http.CanonicalHeaderKey(k)
	return slices.Contains(hopByHop, k) || k == "Content-Length" || k == "Date" || k == "Host"
}

// credentialHeaders are the headers that carry a caller's credentials: they
// reach only the upstream the caller addressed ([failover.Transport]).
var credentialHeaders = []string{"Authorization", "Proxy-Authorization", "Api-Key", "X-Api-Key", "X-Goog-Api-Key", "Cookie"}

// credentialParams are the query parameters that carry credentials.
var credentialParams = []string{"key", "api_key", "api-key", "apikey", "access_token"}

// withoutCredentialParams returns the raw query minus its credential
// parameters, every other pair as the caller wrote it, and whether it
// removed any.
func withoutCredentialParams(raw string) (string, bool) {
	var kept []string
	removed := false
	for _, pair := range strings.Split(raw, "&") {
		k, _, _ := strings.Cut(pair, "=")
		if uk, err := url.QueryUnescape(k); err == nil {
			k = uk
		}
		if slices.ContainsFunc(credentialParams, func(p string) bool { return strings.EqualFold(k, p) }) {
			removed = true
			continue
		}
		kept = append(kept, pair)
	}
	return strings.Join(kept, "&"), removed
}

// queryPairs returns the decoded key=value pairs of a raw query, sorted: two
// queries with the same pairs mean the same to a server, whatever their
// order and escaping. Only & separates pairs; a ; is data.
func queryPairs(raw string) []string {
	var out []string
	for _, pair := range strings.Split(raw, "&") {
		if pair == "" {
			continue
		}
		k, v, _ := strings.Cut(pair, "=")
		if uk, err := url.QueryUnescape(k); err == nil {
			k = uk
		}
		if uv, err := url.QueryUnescape(v); err == nil {
			v = uv
		}
		out = append(out, k+"="+v)
	}
	slices.Sort(out)
	return out
}

// unescapedQuery returns raw with every pair's key and value unescaped, as
// a query written by hand looks.
func unescapedQuery(raw string) string {
	var out []string
	for _, pair := range strings.Split(raw, "&") {
		k, v, hasV := strings.Cut(pair, "=")
		if uk, err := url.QueryUnescape(k); err == nil {
			k = uk
		}
		if uv, err := url.QueryUnescape(v); err == nil {
			v = uv
		}
		if hasV {
			k += "=" + v
		}
		out = append(out, k)
	}
	return strings.Join(out, "&")
}

// streamSeparator returns what a streamed body of contentType is flushed
// after, or nil when it is written at once.
func streamSeparator(contentType string) []byte {
	mt, _, _ := mime.ParseMediaType(contentType)
	switch mt {
	case "text/event-stream":
		return []byte("\n\n")
	case "application/x-ndjson":
		return []byte("\n")
	}
	return nil
}

// upstreamRequest is what a recording server received.
type upstreamRequest struct {
	method     string
	requestURI string
	header     http.Header
	body       []byte
}

// recordingServer serves ex's recorded response to every request and
// records what it received.
type recordingServer struct {
	*httptest.Server
	mu   sync.Mutex
	reqs []upstreamRequest
}

func newRecordingServer(t *testing.T, ex *recordedExchange) *recordingServer {
	t.Helper()
	s := &recordingServer{}
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			t.Errorf("reading the request body: %v", err)
		}
		s.mu.Lock()
		s.reqs = append(s.reqs, upstreamRequest{r.Method, r.RequestURI, r.Header.Clone(), body})
		s.mu.Unlock()

		for k, vs := range ex.resp.Header {
			if !slices.Contains(hopByHop, k) && k != "Content-Length" {
				w.Header()[k] = slices.Clone(vs)
			}
		}
		sep := streamSeparator(ex.resp.Header.Get("Content-Type"))
		if sep == nil {
			w.Header().Set("Content-Length", strconv.Itoa(len(ex.respBody)))
		}
		w.WriteHeader(ex.resp.StatusCode)
		if sep == nil {
			w.Write(ex.respBody)
			return
		}
		for _, piece := range bytes.SplitAfter(ex.respBody, sep) {
			if _, err := w.Write(piece); err != nil {
				return
			}
			w.(http.Flusher).Flush()
		}
	}))
	t.Cleanup(s.Close)
	return s
}

func (s *recordingServer) received() []upstreamRequest {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.reqs)
}

// failsOver reports whether a recorded status makes the Transport try the
// next upstream (DefaultClassifier): 401, 403, 408, 429 and 5xx.
func failsOver(status int) bool {
	switch status {
	case http.StatusUnauthorized, http.StatusForbidden, http.StatusRequestTimeout, http.StatusTooManyRequests:
		return true
	}
	return status >= 500
}

// replayMode is how the recorded request is handed to the Transport.
type replayMode struct {
	name           string
	getBody        bool          // the request has GetBody, as SDKs set it
	attemptTimeout time.Duration // Config.AttemptTimeout
	cont           bool          // Config.Continue on, the second upstream taking a prefix: whole streams pass as they are
}

var replayModes = []replayMode{
	{name: "GetBody", getBody: true},
	// Without GetBody the Transport buffers the body to replay it; an
	// attempt timeout wraps the response body.
	{name: "buffered", getBody: false, attemptTimeout: time.Minute},
	{name: "continue", getBody: true, cont: true},
}

// TestRecordingsTransparent replays every recorded exchange through a
// Transport whose first upstream serves the recorded response: the caller
// must get that response unchanged and the upstream the recorded request
// unchanged. A second upstream is asked only when the recorded status fails
// over (the recordings' 403s and 429), and then answers the same.
func TestRecordingsTransparent(t *testing.T) {
	exchanges, files := loadRecordings(t)
	checked, passed, failedOver := 0, 0, map[int]int{}
	for i := range exchanges {
		ex := &exchanges[i]
		checked++
		if failsOver(ex.resp.StatusCode) {
			failedOver[ex.resp.StatusCode]++
		}
		if t.Run(ex.name, func(t *testing.T) {
			for _, mode := range replayModes {
				t.Run(mode.name, func(t *testing.T) { checkReplay(t, ex, mode) })
			}
		}) {
			passed++
		}
	}
	t.Logf("checked %d exchanges from %d files in %s (%d passed), each in %d modes; failed over to the second upstream by status: %v",
		checked, files, recordingsDir, passed, len(replayModes), failedOver)
}

// checkReplay replays ex through a Transport over two recording servers
// and checks what the caller and each upstream got.
func checkReplay(t *testing.T, ex *recordedExchange, mode replayMode) {
	first := newRecordingServer(t, ex)
	second := newRecordingServer(t, ex)
	tr, err := failover.New(failover.Config{
		Upstreams: []failover.Upstream{
			// The first upstream has no Header: the caller's own
			// credentials reach it, as recorded.
			{Name: "first", BaseURL: first.URL},
			{Name: "second", BaseURL: second.URL + secondBase, Header: http.Header{"Authorization": {secondKey}},
				Prefill: failover.Prefill{Chat: failover.ChatTrailingAssistant, Messages: true}},
		},
		Continue:       failover.ContinueConfig{On: mode.cont},
		AttemptTimeout: mode.attemptTimeout,
		Retry:          failover.RetryConfig{Off: true}, // each upstream gets the recording once
	})
	if err != nil {
		t.Fatalf("failover.New: %v", err)
	}
	t.Cleanup(tr.CloseIdleConnections)

	// The recorded request, addressed to the first upstream.
	target := *ex.req.URL
	target.Scheme, target.Host = "http", strings.TrimPrefix(first.URL, "http://")
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	var body io.Reader = bytes.NewReader(ex.reqBody)
	if !mode.getBody {
		body = struct{ io.Reader }{body} // hides the type NewRequest derives GetBody from
	}
	req, err := http.NewRequestWithContext(ctx, ex.req.Method, target.String(), body)
	if err != nil {
		t.Fatal(err)
	}
	req.ContentLength = int64(len(ex.reqBody))
	if (req.GetBody != nil) != mode.getBody {
		t.Fatalf("request has GetBody %v, want %v", req.GetBody != nil, mode.getBody)
	}
	for k, vs := range ex.req.Header {
		if !ignoredHeader(k) {
			req.Header[k] = slices.Clone(vs)
		}
	}

	resp, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		t.Fatalf("Do: %v", err)
	}
	got, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		t.Fatalf("reading the response body: %v", err)
	}

	// What the caller got.
	if resp.StatusCode != ex.resp.StatusCode {
		t.Errorf("got status %d, want %d", resp.StatusCode, ex.resp.StatusCode)
	}
	if !bytes.Equal(got, ex.respBody) {
		t.Errorf("got a body of %d bytes that differs from the recorded %d bytes at byte %d", len(got), len(ex.respBody), firstDifference(got, ex.respBody))
	}
	for k, want := range ex.resp.Header {
		if ignoredHeader(k) {
			continue
		}
		if got := resp.Header.Values(k); !slices.Equal(got, want) {
			t.Errorf("got response header %s %q, want %q", k, got, want)
		}
	}

	// What the upstreams got.
	wantSecond := 0
	if failsOver(ex.resp.StatusCode) {
		wantSecond = 1
	}
	firstReqs, secondReqs := first.received(), second.received()
	if len(firstReqs) != 1 || len(secondReqs) != wantSecond {
		t.Fatalf("got %d requests at the first upstream and %d at the second, want 1 and %d", len(firstReqs), len(secondReqs), wantSecond)
	}
	// The first upstream gets the request target as the caller wrote it;
	// the second gets it below its own base path, without the caller's
	// credential parameters and, when there were any, with the other
	// pairs' meaning kept.
	checkUpstreamRequest(t, "first", firstReqs[0], ex, ex.req.URL.EscapedPath(), ex.req.URL.RawQuery, true, false)
	if wantSecond == 1 {
		q, removed := withoutCredentialParams(ex.req.URL.RawQuery)
		checkUpstreamRequest(t, "second", secondReqs[0], ex, secondBase+ex.req.URL.EscapedPath(), q, !removed, true)
	}
}

// checkUpstreamRequest compares what an upstream received with the recorded
// request: method, escaped path, raw query (byte for byte when exact, else
// as decoded pairs), body and headers. The upstream the caller did not
// address (other) gets its own credentials instead of the caller's.
func checkUpstreamRequest(t *testing.T, name string, got upstreamRequest, ex *recordedExchange, wantPath, wantQuery string, exact, other bool) {
	t.Helper()
	path, query, _ := strings.Cut(got.requestURI, "?")
	if got.method != ex.req.Method || path != wantPath {
		t.Errorf("%s upstream got %s %s, want %s %s", name, got.method, path, ex.req.Method, wantPath)
	}
	if exact && query != wantQuery {
		t.Errorf("%s upstream got query %q, want %q", name, query, wantQuery)
	}
	if g, w := queryPairs(query), queryPairs(wantQuery); !exact && !slices.Equal(g, w) {
		t.Errorf("%s upstream got query %q, meaning %q; want %q", name, query, g, w)
	}
	if !bytes.Equal(got.body, ex.reqBody) {
		t.Errorf("%s upstream got a body of %d bytes that differs from the recorded %d bytes at byte %d", name, len(got.body), len(ex.reqBody), firstDifference(got.body, ex.reqBody))
	}
	for k, want := range ex.req.Header {
		if ignoredHeader(k) {
			continue
		}
		if other && slices.Contains(credentialHeaders, k) {
			continue
		}
		if got := got.header.Values(k); !slices.Equal(got, want) {
			t.Errorf("%s upstream got request header %s %q, want %q", name, k, got, want)
		}
	}
	if !other {
		return
	}
	if got, want := got.header.Values("Authorization"), []string{secondKey}; !slices.Equal(got, want) {
		t.Errorf("%s upstream got Authorization %q, want its own %q", name, got, want)
	}
	for _, k := range credentialHeaders {
		for _, v := range ex.req.Header.Values(k) {
			for hk, hvs := range got.header {
				if slices.Contains(hvs, v) {
					t.Errorf("%s upstream got the caller's %s value in header %s", name, k, hk)
				}
			}
		}
	}
}

// firstDifference returns the index of the first byte where a and b differ.
func firstDifference(a, b []byte) int {
	n := min(len(a), len(b))
	for i := range n {
		if a[i] != b[i] {
			return i
		}
	}
	return n
}

// TestRecordingsCredentialQueryParams replays the recorded requests that
// fail over and carry a query with the caller's key in the query, as
// Gemini's REST API takes it (?key=), once appended to the recorded query
// and once first in front of the recorded query as written by hand
// (unescaped). The key must reach the first upstream only; every other
// parameter must reach both.
func TestRecordingsCredentialQueryParams(t *testing.T) {
	exchanges, _ := loadRecordings(t)
	n := 0
	for i := range exchanges {
		ex := &exchanges[i]
		if !failsOver(ex.resp.StatusCode) || ex.req.URL.RawQuery == "" {
			continue
		}
		raw := ex.req.URL.RawQuery
		for _, v := range []struct{ name, query string }{
			{"key appended", raw + "&key=test-api-key"},
			{"key first, unescaped", "key=test-api-key&" + unescapedQuery(raw)},
		} {
			n++
			t.Run(ex.name+"/"+v.name, func(t *testing.T) {
				variant := *ex
				variant.req = ex.req.Clone(t.Context())
				variant.req.URL.RawQuery = v.query
				checkReplay(t, &variant, replayModes[0])
			})
		}
	}
	if n == 0 {
		t.Fatal("no recorded exchange fails over with a query")
	}
	t.Logf("checked %d variants", n)
}

// headroomHeaders are the rate-limit headers ParseHeadroom reads.
var headroomHeaders = []string{
	"X-Ratelimit-Remaining-Requests", "X-Ratelimit-Reset-Requests",
	"X-Ratelimit-Remaining-Tokens", "X-Ratelimit-Reset-Tokens",
	"Anthropic-Ratelimit-Requests-Remaining", "Anthropic-Ratelimit-Requests-Reset",
	"Anthropic-Ratelimit-Tokens-Remaining", "Anthropic-Ratelimit-Tokens-Reset",
	"Anthropic-Ratelimit-Input-Tokens-Remaining", "Anthropic-Ratelimit-Input-Tokens-Reset",
	"Anthropic-Ratelimit-Output-Tokens-Remaining", "Anthropic-Ratelimit-Output-Tokens-Reset",
	"X-Ratelimit-Remaining", "X-Ratelimit-Reset",
	"Ratelimit-Remaining", "Ratelimit-Reset",
}

// Every recorded response, read at its own Date: the headroom of each one
// that reports it, OpenAI's counts as sent, and the one exhausted window,
// OpenRouter's 429, with the reset it announced.
func TestRecordedHeadroom(t *testing.T) {
	exchanges, _ := loadRecordings(t)
	reporting, exhausted := 0, 0
	for _, ex := range exchanges {
		h := ex.resp.Header
		now, err := http.ParseTime(h.Get("Date"))
		if err != nil {
			t.Errorf("%s: Date %q: %v", ex.name, h.Get("Date"), err)
			continue
		}
		hr, ok := failover.ParseHeadroom(h, now)
		reports := false
		for _, name := range headroomHeaders {
			reports = reports || h.Get(name) != ""
		}
		if ok != reports {
			t.Errorf("%s: ParseHeadroom = %+v, %v; the response has rate-limit headers: %v", ex.name, hr, ok, reports)
		}
		if !ok {
			continue
		}
		reporting++
		for _, c := range []struct {
			name string
			got  int64
		}{
			{"X-Ratelimit-Remaining-Requests", hr.RemainingRequests},
			{"X-Ratelimit-Remaining-Tokens", hr.RemainingTokens},
		} {
			if v := h.Get(c.name); v != "" {
				if want, _ := strconv.ParseInt(v, 10, 64); c.got != want {
					t.Errorf("%s: %s: %s, read as %d", ex.name, c.name, v, c.got)
				}
			}
		}
		if !hr.Reset.IsZero() && !hr.Reset.After(now) {
			t.Errorf("%s: Reset %s is not after the Date %s", ex.name, hr.Reset, now)
		}
		if hr.Exhausted() {
			exhausted++
			want := time.Date(2025, 8, 8, 15, 41, 0, 0, time.UTC) // X-Ratelimit-Reset: 1754667660000
			if ex.resp.StatusCode != http.StatusTooManyRequests || !hr.Reset.Equal(want) {
				t.Errorf("%s: %d, exhausted headroom %+v; want a 429 that resets at %s", ex.name, ex.resp.StatusCode, hr, want)
			}
		}
	}
	if reporting < 20 || exhausted != 1 {
		t.Errorf("%d responses report their headroom, %d of them exhausted; want at least 20 and 1", reporting, exhausted)
	}
}
