package failover

// Fuzz targets for hostile and bad input (issue 4): Retry-After parsing, the
// inspection of 429 bodies, routing and rewriting of arbitrary request URLs
// against arbitrary base URLs, and the classifier. Each has a seed corpus in
// testdata/fuzz/<FuzzName>/, which plain `go test` runs; .ci/fuzz.sh runs
// each target for $FUZZTIME.

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// ---------------------------------------------------------------------------
// FuzzRetryAfter

// RetryAfter on arbitrary Retry-After, retry-after-ms and x-ms-retry-after-ms
// values never panics, never says ok with a negative duration, gives a whole
// number N >= 0 of seconds as exactly N s (capped at the largest Duration),
// lets a valid millisecond value win over seconds, and reads nothing but the
// headers and now.
func FuzzRetryAfter(f *testing.F) {
	now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC).Unix()
	for _, s := range [][3]string{
		{"20", "", ""},
		{" 7 ", "", ""},
		{"-5", "", ""},
		{"+5", "", ""},
		{"-0", "", ""},
		{"9223372037", "", ""},
		{"99999999999999999", "", ""},
		{"Sun, 29 Nov 2026 12:00:30 GMT", "", ""},
		{"Sunday, 29-Nov-26 12:00:45 GMT", "", ""},
		{"Sun Nov 29 12:01:00 2026", "", ""},
		{"Sun, 29 Nov 2026 11:00:00 GMT", "", ""},
		{"tomorrow", "", ""},
		{"20", "1500", ""},
		{"3", "soon", "250"},
		{"", "1e300", ""},
		{"", "NaN", "-1"},
	} {
		f.Add(s[0], s[1], s[2], now)
	}
	f.Fuzz(func(t *testing.T, ra, ms, xms string, nowSec int64) {
		now := fuzzNow(nowSec)
		h := http.Header{}
		h.Set("Retry-After", ra)
		h.Set("Retry-After-Ms", ms)
		h.Set("X-Ms-Retry-After-Ms", xms)
		before := h.Clone()
		in := fmt.Sprintf("Retry-After: %q, retry-after-ms: %q, x-ms-retry-after-ms: %q, now %s", ra, ms, xms, now.Format(time.RFC3339))

		got, ok := RetryAfter(h, now)
		if ok && got < 0 {
			t.Fatalf("%s: RetryAfter = %v, true: a negative wait", in, got)
		}
		if !reflect.DeepEqual(h, before) {
			t.Fatalf("%s: RetryAfter changed the header to %q", in, h)
		}
		want, wantOK, from, when := retryAfterOracle(h, now)
		if from != "ambiguous" && (got != want || ok != wantOK) {
			t.Fatalf("%s: RetryAfter = %v, %v; want %v, %v (from the %s)", in, got, ok, want, wantOK, from)
		}

		// Nothing but those headers counts: not other headers, not a
		// spelling net/http never delivers, not a second call.
		h2 := h.Clone()
		h2.Set("Date", "Sun, 06 Nov 1994 08:49:37 GMT")
		h2.Set("X-Ratelimit-Reset", "5")
		h2["retry-after"] = []string{"1"}
		if got2, ok2 := RetryAfter(h2, now); got2 != got || ok2 != ok {
			t.Fatalf("%s: RetryAfter = %v, %v; with unrelated headers %v, %v", in, got, ok, got2, ok2)
		}
		// A number does not depend on now; a date is an instant.
		switch from {
		case "milliseconds", "seconds":
			later := now.Add(1000*time.Hour + 1500*time.Millisecond)
			if got2, ok2 := RetryAfter(h, later); got2 != got || ok2 != ok {
				t.Fatalf("%s: RetryAfter = %v, %v at now, %v, %v later", in, got, ok, got2, ok2)
			}
		case "date":
			if ok && got != maxDuration && !now.Add(got).Equal(when) {
				t.Fatalf("%s: RetryAfter = %v, but now + that is %s, not %s", in, got, now.Add(got), when)
			}
		}
	})
}

// fuzzNow maps any int64 onto a Unix time in years 1 to 9999, the years an
// HTTP-date can name.
func fuzzNow(sec int64) time.Time {
	const lo, hi = -62135596800, 253402300799 // 0001-01-01T00:00:00Z, 9999-12-31T23:59:59Z
	if sec < lo || sec > hi {
		const span = hi - lo + 1
		sec = lo + (sec%span+span)%span
	}
	return time.Unix(sec, 0).UTC()
}

// retryAfterOracle is what RetryAfter documents: the first of the
// millisecond headers holding a finite, non-negative number that fits a
// Duration; else Retry-After as whole seconds (capped) or as an HTTP-date
// after now. from says which form decided ("ambiguous" for a millisecond
// value within a millisecond of the largest Duration, which may go either
// way).
func retryAfterOracle(h http.Header, now time.Time) (d time.Duration, ok bool, from string, when time.Time) {
	for _, name := range []string{"Retry-After-Ms", "X-Ms-Retry-After-Ms"} {
		v := strings.TrimSpace(h.Get(name))
		if v == "" {
			continue
		}
		ms, err := strconv.ParseFloat(v, 64)
		if err != nil || ms != ms || ms < 0 || ms*float64(time.Millisecond) >= float64(maxDuration) {
			continue // not a valid number of milliseconds: the next header decides
		}
		if ms >= float64(maxDuration/time.Millisecond) {
			return 0, false, "ambiguous", when
		}
		return time.Duration(ms * float64(time.Millisecond)), true, "milliseconds", when
	}
	v := strings.TrimSpace(h.Get("Retry-After"))
	if v == "" {
		return 0, false, "absence", when
	}
	if neg, digits, isInt := decimalInteger(v); isInt {
		digits = strings.TrimLeft(digits, "0")
		switch {
		case neg && digits != "":
			return 0, false, "seconds", when // negative: ignored
		case len(digits) > 19:
			return maxDuration, true, "seconds", when
		}
		n, _ := strconv.ParseUint("0"+digits, 10, 64)
		if n > uint64(maxDuration/time.Second) {
			return maxDuration, true, "seconds", when
		}
		return time.Duration(n) * time.Second, true, "seconds", when
	}
	if t, err := http.ParseTime(v); err == nil {
		if t.After(now) {
			return t.Sub(now), true, "date", t
		}
		return 0, false, "date", t // in the past: ignored
	}
	return 0, false, "garbage", when
}

// decimalInteger reports whether s is an optionally signed run of ASCII
// digits, and splits it.
func decimalInteger(s string) (neg bool, digits string, ok bool) {
	if s != "" && (s[0] == '+' || s[0] == '-') {
		neg, s = s[0] == '-', s[1:]
	}
	if s == "" {
		return false, "", false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false, "", false
		}
	}
	return neg, s, true
}

// ---------------------------------------------------------------------------
// FuzzInspect429

// inspect429 on arbitrary bodies, delivered in random small chunks and
// possibly ending in a read error, never panics, reads at most 4 KiB before
// it decides, decides on those bytes alone, hands the body back byte for byte
// (and its error), and closes the original exactly once when the caller
// closes.
func FuzzInspect429(f *testing.F) {
	for _, s := range []struct {
		body  string
		pad   uint16
		sizes string
		fail  int
		read  bool
	}{
		{`{"error":{"message":"You exceeded your current quota","type":"insufficient_quota","code":"insufficient_quota"}}`, 0, "\x05\x01\x00\x3f", -1, true},
		{`{"error":{"code":"insufficient_quota"}}`, quotaPeek - 40, "\x07", -1, true},
		{`insufficient_quota`, quotaPeek - 18, "", -1, true}, // ends at byte 4096: detected
		{`insufficient_quota`, quotaPeek - 17, "", -1, true}, // ends at byte 4097: not read
		{`{"error":{"type":"rate_limit_exceeded"}}`, 0, "\x81", -1, false},
		{`{"details":[{"retryDelay": "22s"}]}`, 100, "\x02\x00\x00\x00\x03", 20, true},
		{`{"quotaId":"GenerateRequestsPerDayPerProjectPerModel"}`, quotaPeek, "\x3f\x3f", quotaPeek + 10, true},
		{"", 0, "", -1, true},
		{"", 0, "", 0, true},
	} {
		f.Add([]byte(s.body), s.pad, []byte(s.sizes), s.fail, s.read)
	}
	f.Fuzz(func(t *testing.T, body []byte, pad uint16, sizes []byte, failAt int, readBack bool) {
		if len(body) > 64<<10 {
			body = body[:64<<10]
		}
		full := append(bytes.Repeat([]byte{'.'}, int(pad)%(2*quotaPeek+1)), body...)
		fail := failAt >= 0
		if fail {
			full = full[:min(failAt, len(full))]
		}
		in := fmt.Sprintf("body of %d bytes %.80q..., chunks %q, read error at the end: %v", len(full), full, sizes, fail)

		orig := &chunkedBody{data: full, fail: fail, sizes: sizes}
		resp := &http.Response{StatusCode: 429, Header: http.Header{}, Body: orig}
		start := time.Now()
		quota, delay, ok := inspect429(resp)
		if time.Since(start) >= drainTimeout*9/10 {
			return // the stall timer may have cut the body: nothing holds then
		}
		if orig.pos > quotaPeek {
			t.Fatalf("%s: read %d bytes before deciding, more than %d", in, orig.pos, quotaPeek)
		}
		peek := full[:min(len(full), quotaPeek)]
		if bytes.Contains(peek, []byte("insufficient_quota")) && !quota {
			t.Fatalf("%s: insufficient_quota within the first 4 KiB, but no quota detected", in)
		}
		if want := containsAny(peek, quotaMarkers); quota != want {
			t.Fatalf("%s: quota = %v, but a marker in the first 4 KiB: %v", in, quota, want)
		}
		if ok && delay < 0 {
			t.Fatalf("%s: a negative retryDelay %v", in, delay)
		}
		// How the bytes arrive does not matter.
		whole := &http.Response{StatusCode: 429, Header: http.Header{}, Body: io.NopCloser(bytes.NewReader(full))}
		if q, d, o := inspect429(whole); q != quota || d != delay || o != ok {
			t.Fatalf("%s: inspect429 = %v, %v, %v in chunks, %v, %v, %v at once", in, quota, delay, ok, q, d, o)
		}

		switch closes := orig.closes.Load(); {
		case closes > 1:
			t.Fatalf("%s: inspect429 closed the body %d times", in, closes)
		case closes == 1 && (fail || orig.pos != len(full)):
			t.Fatalf("%s: inspect429 closed a body it had not read to its end", in)
		}
		if readBack {
			got, err := io.ReadAll(resp.Body)
			if !bytes.Equal(got, full) {
				t.Fatalf("%s: the body handed back is %d bytes %.80q..., not the %d sent", in, len(got), got, len(full))
			}
			if fail && !errors.Is(err, errChunkedBody) {
				t.Fatalf("%s: reading the body handed back: %v, want the original's read error", in, err)
			}
			if !fail && err != nil {
				t.Fatalf("%s: reading the body handed back: %v", in, err)
			}
		}
		if orig.readAfterClose.Load() {
			t.Fatalf("%s: the original body was read after it was closed", in)
		}
		if err := resp.Body.Close(); err != nil {
			t.Fatalf("%s: Close: %v", in, err)
		}
		if closes := orig.closes.Load(); closes != 1 {
			t.Fatalf("%s: the original body was closed %d times once the caller closed, want 1", in, closes)
		}
	})
}

var errChunkedBody = errors.New("fuzz: connection reset")

// chunkedBody delivers data in the sizes that sizes gives in turn (the low
// six bits; 0 returns nothing, at most twice in a row), with io.EOF in the
// same call as the last bytes when the size's top bit is set, and
// errChunkedBody instead of io.EOF when fail is set. It records closes and
// reads after a close.
type chunkedBody struct {
	data  []byte
	pos   int
	fail  bool
	sizes []byte
	i     int
	zeros int

	closes         atomic.Int32
	readAfterClose atomic.Bool
}

func (b *chunkedBody) end() error {
	if b.fail {
		return errChunkedBody
	}
	return io.EOF
}

func (b *chunkedBody) Read(p []byte) (int, error) {
	if b.closes.Load() > 0 {
		b.readAfterClose.Store(true)
	}
	if b.pos >= len(b.data) {
		return 0, b.end()
	}
	if len(p) == 0 {
		return 0, nil
	}
	n, endWithData := len(p), false
	if len(b.sizes) > 0 {
		s := b.sizes[b.i%len(b.sizes)]
		b.i++
		endWithData = s&0x80 != 0
		if s&0x3f == 0 && b.zeros < 2 {
			b.zeros++
			return 0, nil
		}
		b.zeros = 0
		n = min(n, max(int(s&0x3f), 1))
	}
	n = copy(p[:n], b.data[b.pos:])
	b.pos += n
	if b.pos == len(b.data) && endWithData {
		return n, b.end()
	}
	return n, nil
}

func (b *chunkedBody) Close() error {
	b.closes.Add(1)
	return nil
}

func containsAny(b []byte, markers [][]byte) bool {
	for _, m := range markers {
		if bytes.Contains(b, m) {
			return true
		}
	}
	return false
}

// ---------------------------------------------------------------------------
// FuzzRoute and FuzzRewrite

// Values no fuzzed input may contain, so that finding them in what an
// upstream received proves a leak.
const (
	callerMarker   = "zqCALLERSECRETqz"
	upstreamMarker = "zqUPSTREAMKEYqz"
)

// fuzzCredentialHeaders are the header names that the package documents as
// a caller's credentials, and X-Custom-Token, which upstream 1 sets.
var fuzzCredentialHeaders = []string{
	"Authorization", "Proxy-Authorization", "Api-Key", "X-Api-Key", "X-Goog-Api-Key",
	"Cookie", "Openai-Organization", "Openai-Project", "X-Custom-Token",
}

// fuzzCredentialParams are the query parameters that carry credentials.
var fuzzCredentialParams = []string{"key", "api_key", "api-key", "apikey", "access_token"}

func upstreamSecret(i int) string { return fmt.Sprintf("upkey%d-%s", i, upstreamMarker) }

// fuzzUpstreamHeader is the Header of the i-th fuzzed upstream: its keys,
// and X-Fuzz-Upstream, which tells what each upstream received apart
// whatever order the Transport tries them in.
func fuzzUpstreamHeader(i int) http.Header {
	h := http.Header{"X-Fuzz-Upstream": {strconv.Itoa(i)}}
	switch i {
	case 0:
		h["Authorization"] = []string{"Bearer " + upstreamSecret(0)}
	case 1:
		h["X-Api-Key"] = []string{upstreamSecret(1)}
		h["X-Custom-Token"] = []string{upstreamSecret(1) + "-b"}
	}
	return h
}

// fuzzBase is a base URL that New accepted, as the fuzz tests read it.
type fuzzBase struct {
	url           *url.URL
	path, rawPath string // decoded and escaped, without one trailing slash
}

// fuzzTransport builds a Transport, through New, over those of the base
// URLs that New accepts on their own (each is checked to be one that can be
// an upstream), and returns them; nil when it accepts none.
func fuzzTransport(t *testing.T, rt http.RoundTripper, raws ...string) (*Transport, []fuzzBase, []string) {
	var ups []Upstream
	var accepted []string
	for _, r := range raws {
		if r == "" {
			continue
		}
		if _, err := New(Config{Upstreams: []Upstream{{BaseURL: r}}, Base: rt}); err != nil {
			continue
		}
		i := len(ups)
		ups = append(ups, Upstream{Name: "u" + strconv.Itoa(i), BaseURL: r, Header: fuzzUpstreamHeader(i)})
		accepted = append(accepted, r)
	}
	if len(ups) == 0 {
		return nil, nil, nil
	}
	tr, err := New(Config{Upstreams: ups, Base: rt})
	if err != nil {
		t.Fatalf("New refused base URLs %q that it accepts one by one: %v", accepted, err)
	}
	bases := make([]fuzzBase, len(ups))
	for i, up := range ups {
		u, err := url.Parse(up.BaseURL)
		switch {
		case err != nil:
			t.Fatalf("New accepted BaseURL %q, which is not a URL: %v", up.BaseURL, err)
		case u.Scheme != "http" && u.Scheme != "https", u.Host == "", u.Hostname() == "", u.Opaque != "":
			t.Fatalf("New accepted BaseURL %q, not an absolute http or https URL", up.BaseURL)
		case u.User != nil, u.RawQuery != "", u.ForceQuery, u.Fragment != "":
			t.Fatalf("New accepted BaseURL %q, with user info, a query or a fragment", up.BaseURL)
		case dotSegments(u.Path):
			t.Fatalf("New accepted BaseURL %q, whose path %q has dot segments", up.BaseURL, u.Path)
		}
		// A trailing slash is trimmed only when it is a literal one: a
		// base ending in %2F keeps it.
		b := fuzzBase{url: u, path: u.Path, rawPath: u.EscapedPath()}
		if strings.HasSuffix(b.rawPath, "/") {
			b.rawPath, b.path = strings.TrimSuffix(b.rawPath, "/"), strings.TrimSuffix(b.path, "/")
		}
		bases[i] = b
	}
	return tr, bases, accepted
}

// fuzzRequestURL makes the request URL: target alone (mode%4 == 0), or
// target after one of the (accepted) bases, as written, with its host in upper case,
// or with its default port written out; bit 8 of mode writes the scheme in
// upper case.
func fuzzRequestURL(bases []string, target string, mode uint16) string {
	if mode%4 == 0 || len(bases) == 0 {
		return target
	}
	b, err := url.Parse(bases[int(mode/4)%len(bases)])
	if err != nil {
		return target
	}
	scheme, host := b.Scheme, b.Host
	switch mode % 4 {
	case 2:
		host = strings.ToUpper(host)
	case 3:
		if b.Port() == "" {
			if strings.EqualFold(scheme, "https") {
				host += ":443"
			} else {
				host += ":80"
			}
		}
	}
	if mode&0x100 != 0 {
		scheme = strings.ToUpper(scheme)
	}
	return scheme + "://" + host + b.EscapedPath() + target
}

// wantRoute is the upstream a URL is addressed to, as Upstream.BaseURL
// documents it: same scheme, same authority (any case, default port or
// not), decoded and escaped path under the base path, the longest base path
// first; never a path with dot segments. -1 means none.
func wantRoute(u *url.URL, bases []fuzzBase) int {
	if u.Opaque != "" || u.Host == "" {
		return -1
	}
	raw := u.EscapedPath()
	best := -1
	for i, b := range bases {
		if !strings.EqualFold(u.Scheme, b.url.Scheme) ||
			!strings.EqualFold(authority(b.url.Scheme, u.Host), authority(b.url.Scheme, b.url.Host)) ||
			!pathUnder(u.Path, b.path) || !pathUnder(raw, b.rawPath) {
			continue
		}
		if best < 0 || len(b.path) > len(bases[best].path) {
			best = i
		}
	}
	if best >= 0 && dotSegments(u.Path) {
		return -1
	}
	return best
}

// authority is host without the scheme's default port or an empty port.
func authority(scheme, host string) string {
	def := ":80"
	if strings.EqualFold(scheme, "https") {
		def = ":443"
	}
	if h, ok := strings.CutSuffix(host, def); ok {
		return h
	}
	return strings.TrimSuffix(host, ":")
}

// pathUnder reports whether p is base or lies under it.
func pathUnder(p, base string) bool {
	rest, ok := strings.CutPrefix(p, base)
	return ok && (rest == "" || rest[0] == '/')
}

// dotSegments reports whether p has a "." or ".." segment, with '/' or
// '\' between segments (some servers read a backslash as a slash).
func dotSegments(p string) bool {
	for _, seg := range strings.FieldsFunc(p, func(r rune) bool { return r == '/' || r == '\\' }) {
		if seg == "." || seg == ".." {
			return true
		}
	}
	return false
}

func addRouteSeeds(f *testing.F, withHeader bool) {
	bases := []string{
		"https://api.openai.com/v1",
		"http://b.test:8080/openai/v1/",
		"http://[::1]:9/v1",
		"https://gen.test",
		"http://h.test/proxy%2Fopenai/v1",
		"HTTP://Upper.Test:80/V1",
	}
	targets := []string{
		"/chat/completions?model=x&key=abc&alt=json",
		"/../../admin",
		"/%2e%2e/%2E%2E/admin",
		"/..%2fadmin",
		"%2F..%2F..%2Fadmin",
		"/./x",
		"",
		"/",
		"x/../../y",
		"?key=1&&a=2&%6Bey=3&KEY=4&$alt=json;enum-encoding=int",
		"https://evil.test/v1/chat",
		"//evil.test/x",
		"@evil.test/x",
		"/models/gemini:generateContent?key=k&alt=sse",
	}
	for i, target := range targets {
		for mode := range uint16(4) {
			b0, b1, b2 := bases[i%len(bases)], bases[(i+1)%len(bases)], bases[(i+2)%len(bases)]
			mode := mode + 4*uint16(i%3)
			if withHeader {
				f.Add(b0, b1, b2, target, mode, []string{"", "x-goog-api-key", "X-Request-Id", "x-custom-token"}[mode%4])
			} else {
				f.Add(b0, b1, b2, target, mode)
			}
		}
	}
}

// A URL routed to an upstream lies under its base, decoded and escaped, has
// no dot segments, and goes to the upstream with the longest such base; the
// rest of its path is what follows the base, and both forms of it agree.
// Every base New accepts is an absolute http(s) URL without user info,
// query, fragment or dot segments.
func FuzzRoute(f *testing.F) {
	addRouteSeeds(f, false)
	f.Fuzz(func(t *testing.T, b0, b1, b2, target string, mode uint16) {
		tr, bases, accepted := fuzzTransport(t, roundTripFunc(func(*http.Request) (*http.Response, error) {
			return nil, errors.New("unused")
		}), b0, b1, b2)
		if tr == nil {
			return
		}
		raw := fuzzRequestURL(accepted, target, mode)
		u, err := url.Parse(raw)
		if err != nil {
			return
		}
		in := fmt.Sprintf("URL %q against bases %q", raw, accepted)
		up, rest, rawRest := tr.route(u)
		got := -1
		if up != nil {
			got = up.index
		}
		if want := wantRoute(u, bases); got != want {
			t.Fatalf("%s: routed to upstream %d, want %d", in, got, want)
		}
		if up == nil {
			return
		}
		b, esc := bases[got], u.EscapedPath()
		switch {
		case !pathUnder(u.Path, b.path) || !pathUnder(esc, b.rawPath):
			t.Fatalf("%s: routed to %q, but its path %q (%q) is not under %q (%q)", in, b.url, u.Path, esc, b.path, b.rawPath)
		case dotSegments(u.Path):
			t.Fatalf("%s: routed with dot segments in %q", in, u.Path)
		case rest != u.Path[len(b.path):] || rawRest != esc[len(b.rawPath):]:
			t.Fatalf("%s: rest %q (%q), want %q (%q)", in, rest, rawRest, u.Path[len(b.path):], esc[len(b.rawPath):])
		}
		if dec, err := url.PathUnescape(rawRest); err != nil || dec != rest {
			t.Fatalf("%s: the escaped rest %q decodes to %q (%v), not to the rest %q: another upstream gets a different path", in, rawRest, dec, err, rest)
		}
	})
}

// received is a request as an upstream received it.
type received struct {
	Scheme, Host, ReqHost, Path, EscapedPath, RawQuery string
	User                                               *url.Userinfo
	Header                                             http.Header
	Body                                               string
}

// recordingNet is an in-memory Base where every upstream answers 503, so
// that every upstream gets one attempt; it records them all.
type recordingNet struct {
	mu  sync.Mutex
	got []received
}

func (n *recordingNet) RoundTrip(r *http.Request) (*http.Response, error) {
	var body []byte
	if r.Body != nil {
		body, _ = io.ReadAll(r.Body)
		r.Body.Close()
	}
	rec := received{
		Scheme: r.URL.Scheme, Host: r.URL.Host, ReqHost: r.Host,
		Path: r.URL.Path, EscapedPath: r.URL.EscapedPath(), RawQuery: r.URL.RawQuery,
		Header: r.Header.Clone(), Body: string(body),
	}
	if r.URL.User != nil {
		u := *r.URL.User
		rec.User = &u
	}
	n.mu.Lock()
	n.got = append(n.got, rec)
	n.mu.Unlock()
	resp := respond(http.StatusServiceUnavailable, "down")
	resp.Request = r
	return resp, nil
}

const fuzzRequestBody = `{"model":"m","messages":[{"role":"user","content":"hi"}]}`

// Every upstream gets the request rewritten for it, through the real
// Transport: exactly its configured scheme and host; a path under its base
// path with the rest of the caller's path byte for byte and no dot segment;
// every non-credential query pair byte for byte; the caller's headers, but
// its own Header for the names it sets, and none of the caller's
// credentials (header values, key= parameters, user info) unless the caller
// addressed it; never another upstream's key. A request addressed to no
// upstream goes to Base untouched.
func FuzzRewrite(f *testing.F) {
	addRouteSeeds(f, true)
	f.Fuzz(func(t *testing.T, b0, b1, b2, target string, mode uint16, header string) {
		all := strings.ToLower(b0 + b1 + b2 + target + header)
		if strings.Contains(all, strings.ToLower(callerMarker)) || strings.Contains(all, strings.ToLower(upstreamMarker)) {
			return
		}
		n := &recordingNet{}
		tr, bases, accepted := fuzzTransport(t, n, b0, b1, b2)
		if tr == nil {
			return
		}
		raw := fuzzRequestURL(accepted, target, mode)
		req, err := http.NewRequest("POST", raw, strings.NewReader(fuzzRequestBody))
		if err != nil {
			return
		}
		// The caller's credentials, in every form.
		if req.URL.User == nil {
			req.URL.User = url.UserPassword("caller", callerMarker+"-pass")
		}
		creds := "key=" + callerMarker + "-q&API_KEY=" + callerMarker + "-q2&%61ccess_token=" + callerMarker + "-q3"
		if req.URL.RawQuery == "" {
			req.URL.RawQuery = creds
		} else {
			req.URL.RawQuery += "&" + creds
		}
		for _, name := range fuzzCredentialHeaders {
			req.Header.Set(name, "caller "+callerMarker+" "+name)
		}
		req.Header["x-api-key"] = []string{callerMarker + "-lower"} // not canonical
		req.Header.Set("X-Request-Id", "r-1")
		req.Header.Set("Content-Type", "application/json")
		if validToken(header) {
			if isCredentialHeader(header) {
				req.Header[header] = append(req.Header[header], callerMarker+"-fuzzed")
			} else {
				req.Header[header] = append(req.Header[header], "plain")
			}
		}
		want := wantRoute(req.URL, bases)
		in := fmt.Sprintf("request %q (header %q) against bases %q, addressed to %d", req.URL, header, accepted, want)
		callerURL := *req.URL
		callerHeader := req.Header.Clone()

		resp, err := tr.RoundTrip(req)
		if err != nil {
			t.Fatalf("%s: RoundTrip: %v", in, err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusServiceUnavailable {
			t.Fatalf("%s: status %d, want the last upstream's 503", in, resp.StatusCode)
		}
		if callerURL.String() != req.URL.String() || !reflect.DeepEqual(callerHeader, req.Header) {
			t.Fatalf("%s: RoundTrip modified the caller's request", in)
		}
		got := n.got

		if want < 0 {
			if len(got) != 1 {
				t.Fatalf("%s: addressed to no upstream, yet Base got %d requests", in, len(got))
			}
			g := got[0]
			if g.Scheme != req.URL.Scheme || g.Host != req.URL.Host || g.Path != req.URL.Path || g.EscapedPath != req.URL.EscapedPath() ||
				g.RawQuery != req.URL.RawQuery || g.User.String() != req.URL.User.String() || !reflect.DeepEqual(g.Header, req.Header) {
				t.Fatalf("%s: addressed to no upstream, yet Base did not get the request untouched: %+v", in, g)
			}
			return
		}

		byUpstream := make([]received, len(bases))
		for _, g := range got {
			i, err := strconv.Atoi(g.Header.Get("X-Fuzz-Upstream"))
			if err != nil || i < 0 || i >= len(bases) || byUpstream[i].Header != nil {
				t.Fatalf("%s: an attempt that is no upstream's, or a second one: %+v", in, g)
			}
			byUpstream[i] = g
		}
		if len(got) != len(bases) {
			t.Fatalf("%s: %d attempts for %d upstreams each answering 503", in, len(got), len(bases))
		}
		addr := bases[want]
		rest, rawRest := req.URL.Path[len(addr.path):], req.URL.EscapedPath()[len(addr.rawPath):]
		var wantPairs []string
		for _, p := range queryPairs(req.URL.RawQuery) {
			if p != "" && !credentialPair(p) {
				wantPairs = append(wantPairs, p)
			}
		}
		for i, g := range byUpstream {
			b := bases[i]
			in := fmt.Sprintf("%s: upstream %d (%s)", in, i, b.url)
			if g.Scheme != b.url.Scheme || g.Host != b.url.Host || g.ReqHost != b.url.Host {
				t.Fatalf("%s got a request for %s://%s (Host %q), not for its configured %s://%s", in, g.Scheme, g.Host, g.ReqHost, b.url.Scheme, b.url.Host)
			}
			if g.Body != fuzzRequestBody {
				t.Fatalf("%s got body %q", in, g.Body)
			}
			if dump := fmt.Sprintf("%+v %v", g, g.User); i != want && strings.Contains(dump, callerMarker) {
				t.Fatalf("%s, not addressed, got the caller's credentials: %+v, user %v", in, g, g.User)
			}
			for j := range bases {
				if j != i && strings.Contains(fmt.Sprintf("%+v %v", g, g.User), upstreamSecret(j)) {
					t.Fatalf("%s got upstream %d's key: %+v", in, j, g)
				}
			}
			own := fuzzUpstreamHeader(i)
			for k, vs := range own {
				if hv := fuzzHeaderValues(g.Header, k); !slices.Equal(hv, vs) {
					t.Fatalf("%s: %s = %q, want only its own %q", in, k, hv, vs)
				}
			}
			for k, vs := range req.Header {
				switch {
				case len(fuzzHeaderValues(own, k)) > 0:
					// Its own value replaces the caller's: checked above.
				case i != want && isCredentialHeader(k):
					if _, ok := g.Header[k]; ok {
						t.Fatalf("%s, not addressed, got the caller's %s", in, k)
					}
				case !slices.Equal(g.Header[k], vs):
					t.Fatalf("%s: header %s = %q, want the caller's %q", in, k, g.Header[k], vs)
				}
			}
			for k := range g.Header {
				if _, ok := req.Header[k]; !ok && len(fuzzHeaderValues(own, k)) == 0 {
					t.Fatalf("%s got header %s, which neither the caller nor its config set", in, k)
				}
			}

			if i == want {
				if g.Path != req.URL.Path || g.EscapedPath != req.URL.EscapedPath() || g.RawQuery != req.URL.RawQuery || g.User.String() != req.URL.User.String() {
					t.Fatalf("%s, addressed, got path %q (%q), query %q, user %v; want the caller's %q (%q), %q, %v",
						in, g.Path, g.EscapedPath, g.RawQuery, g.User, req.URL.Path, req.URL.EscapedPath(), req.URL.RawQuery, req.URL.User)
				}
				continue
			}
			if g.User != nil {
				t.Fatalf("%s, not addressed, got user info %v", in, g.User)
			}
			if !pathUnder(g.Path, b.path) || !pathUnder(g.EscapedPath, b.rawPath) {
				t.Fatalf("%s got path %q (%q), not under its base path %q (%q)", in, g.Path, g.EscapedPath, b.path, b.rawPath)
			}
			if dotSegments(g.Path) {
				t.Fatalf("%s got path %q (%q), with dot segments once decoded", in, g.Path, g.EscapedPath)
			}
			if g.Path[len(b.path):] != rest || g.EscapedPath[len(b.rawPath):] != rawRest {
				t.Fatalf("%s got path %q (%q): after its base %q (%q) comes %q (%q), not the rest of the caller's path %q (%q)",
					in, g.Path, g.EscapedPath, b.path, b.rawPath, g.Path[len(b.path):], g.EscapedPath[len(b.rawPath):], rest, rawRest)
			}
			var pairs []string
			for _, p := range queryPairs(g.RawQuery) {
				if p != "" {
					pairs = append(pairs, p)
				}
			}
			if !slices.Equal(pairs, wantPairs) {
				t.Fatalf("%s got query %q; want the caller's non-credential pairs %q", in, g.RawQuery, wantPairs)
			}
		}
	})
}

// queryPairs splits a raw query at '&' and ';', as some servers do.
func queryPairs(raw string) []string {
	return strings.FieldsFunc(raw, func(r rune) bool { return r == '&' || r == ';' })
}

// credentialPair reports whether a raw query pair's name is a credential
// parameter.
func credentialPair(pair string) bool {
	name, _, _ := strings.Cut(pair, "=")
	if n, err := url.QueryUnescape(name); err == nil {
		name = n
	}
	for _, c := range fuzzCredentialParams {
		if strings.EqualFold(name, c) {
			return true
		}
	}
	return false
}

// isCredentialHeader reports whether name, in any case, is a credential
// header: a documented one or a name an upstream's Header sets.
func isCredentialHeader(name string) bool {
	for _, c := range fuzzCredentialHeaders {
		if strings.EqualFold(name, c) {
			return true
		}
	}
	for i := range 3 {
		if len(fuzzHeaderValues(fuzzUpstreamHeader(i), name)) > 0 {
			return true
		}
	}
	return false
}

// fuzzHeaderValues returns the values of name in h under any spelling.
func fuzzHeaderValues(h http.Header, name string) []string {
	var out []string
	for k, vs := range h {
		if strings.EqualFold(k, name) {
			out = append(out, vs...)
		}
	}
	return out
}

// validToken reports whether s is a valid header field name (RFC 9110
// token).
func validToken(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0) {
			return false
		}
	}
	return true
}

// ---------------------------------------------------------------------------
// FuzzClassifier

// DefaultClassifier on any status from 0 to 999 and any kind of error never
// panics, returns a valid Outcome and never Canceled; Success iff there is no
// error and the status is below 400; the documented outcome for each status,
// and for errors that the documentation names.
func FuzzClassifier(f *testing.F) {
	for _, code := range []int{0, 99, 200, 204, 301, 399, 400, 401, 403, 404, 408, 429, 499, 500, 501, 503, 529, 599, 600, 999} {
		f.Add(code, 0, "", 0)
	}
	for kind := range numErrKinds {
		f.Add(200, kind, "net/http: invalid header field value", kind%4)
		f.Add(503, kind, "stopped after 10 redirects", kind%3)
	}
	f.Fuzz(func(t *testing.T, status, kind int, msg string, wrap int) {
		code := int(uint(status) % 1000)
		err := fuzzError(kind, msg, wrap)
		var resp *http.Response
		if err == nil || wrap&4 != 0 {
			// A RoundTripper that breaks its contract may give both.
			resp = &http.Response{StatusCode: code, Status: strconv.Itoa(code), Header: http.Header{}, Body: http.NoBody}
		}
		in := fmt.Sprintf("status %d, error %#v (%v)", code, err, err)
		o := DefaultClassifier(resp, err)
		if o < Success || o > Failed || o.String() == "unknown" {
			t.Fatalf("%s: DefaultClassifier = %d (%v), not a valid outcome other than Canceled", in, int(o), o)
		}
		if (o == Success) != (err == nil && code < 400) {
			t.Fatalf("%s: DefaultClassifier = %v", in, o)
		}
		if again := DefaultClassifier(resp, err); again != o {
			t.Fatalf("%s: DefaultClassifier = %v, then %v", in, o, again)
		}
		if err == nil {
			want := Rejected
			switch {
			case code < 400:
				want = Success
			case code == 401 || code == 403:
				want = AuthFailed
			case code == 429:
				want = RateLimited
			case code == 408 || code >= 500:
				want = Failed
			}
			if o != want {
				t.Fatalf("%s: DefaultClassifier = %v, want %v", in, o, want)
			}
			return
		}
		if o != Failed && o != Rejected {
			t.Fatalf("%s: DefaultClassifier = %v for an error, want failed or rejected", in, o)
		}
		if errors.Is(err, ErrAttemptTimeout) && o != Failed {
			t.Fatalf("%s: DefaultClassifier = %v for an attempt timeout, want failed", in, o)
		}
		var cert *tls.CertificateVerificationError
		if errors.As(err, &cert) && o != Failed {
			t.Fatalf("%s: DefaultClassifier = %v for an untrusted certificate, want failed", in, o)
		}
		if kind%numErrKinds >= 1 && kind%numErrKinds <= 7 && wrap&3 != 3 && o != Failed {
			// A timeout, a context error the caller's context did not
			// cause, EOF, refused, reset: the upstream failed.
			t.Fatalf("%s: DefaultClassifier = %v, want failed", in, o)
		}
	})
}

const numErrKinds = 16

// fuzzError makes an error of the given kind (none for kind 0), wrapped
// wrap%4 times: in fmt.Errorf, a *net.OpError, then a *url.Error that
// quotes msg.
func fuzzError(kind int, msg string, wrap int) error {
	var err error
	switch uint(kind) % numErrKinds {
	case 0:
		return nil
	case 1:
		err = ErrAttemptTimeout
	case 2:
		err = fmt.Errorf("net/http: timeout awaiting response headers: %w", context.DeadlineExceeded)
	case 3:
		err = context.Canceled
	case 4:
		err = io.EOF
	case 5:
		err = io.ErrUnexpectedEOF
	case 6:
		err = &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}
	case 7:
		err = &net.OpError{Op: "read", Net: "tcp", Err: syscall.ECONNRESET}
	case 8:
		err = errors.New(msg)
	case 9:
		err = &tls.CertificateVerificationError{Err: x509.UnknownAuthorityError{}}
	case 10:
		err = x509.HostnameError{Certificate: &x509.Certificate{}, Host: msg}
	case 11:
		err = x509.CertificateInvalidError{Cert: &x509.Certificate{}, Reason: x509.Expired, Detail: msg}
	case 12:
		err = x509.UnknownAuthorityError{}
	case 13:
		err = fmt.Errorf("net/http: invalid header field value for %q", msg)
	case 14:
		err = fmt.Errorf("unsupported protocol scheme %q", msg)
	case 15:
		err = errors.Join(errors.New(msg), ErrAttemptTimeout)
	}
	for i := range uint(wrap) % 4 {
		switch i {
		case 0:
			err = fmt.Errorf("attempt: %w", err)
		case 1:
			err = &net.OpError{Op: "read", Net: "tcp", Err: err}
		case 2:
			err = &url.Error{Op: "Post", URL: msg, Err: err}
		}
	}
	return err
}
