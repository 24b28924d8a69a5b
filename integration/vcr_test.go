package integration_test

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/failover-go/failover"
	"github.com/failover-go/failover/failovertest"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"gopkg.in/dnaeon/go-vcr.v4/pkg/cassette"
	"gopkg.in/dnaeon/go-vcr.v4/pkg/recorder"
)

// These tests show that code tested with recorded provider responses keeps
// working with the failover Transport on top: Config.Base is a go-vcr
// recorder that replays a cassette committed under testdata/vcr, so the
// tests need no network, no keys and no servers.
//
// The cassette was recorded once with
//
//	go test -run TestVCR ./integration -args -vcr.record
//
// against local scripted upstreams (failovertest) that a dialer put behind
// the fixed hosts primary.test and backup.test, so that replaying does not
// depend on random ports.

var vcrRecord = flag.Bool("vcr.record", false, "record the cassettes of the VCR tests again, against local scripted upstreams")

const (
	vcrPrimary = "http://primary.test/v1"
	vcrBackup  = "http://backup.test/v1"
)

// vcrIgnoredHeaders are the request headers that the cassette's matcher
// ignores; it compares everything else that go-vcr's default matcher
// compares (method, URL, body, the other headers, ...).
var vcrIgnoredHeaders = []string{
	// They change from one attempt to the next for the same request:
	// openai-go counts its own retries in X-Stainless-Retry-Count ("0",
	// "1", ...), and the Transport replaces Authorization with the key of
	// each upstream it tries. Authorization is also never written to a
	// cassette.
	"X-Stainless-Retry-Count",
	"Authorization",
	// They change with the machine and the SDK's version, not with the
	// request.
	"User-Agent",
	"X-Stainless-Os",
	"X-Stainless-Arch",
	"X-Stainless-Runtime-Version",
	"X-Stainless-Package-Version",
}

// vcrMatcher matches requests to recorded ones; see vcrIgnoredHeaders.
var vcrMatcher = cassette.NewDefaultMatcher(cassette.WithIgnoreHeaders(vcrIgnoredHeaders...))

// vcrAttempt is one request that the Transport sent to Base.
type vcrAttempt struct {
	host          string
	authorization string
	err           error
}

// vcrLog is a RoundTripper between the Transport and the recorder that
// notes every attempt: which upstream it went to and with which key.
type vcrLog struct {
	next http.RoundTripper

	mu       sync.Mutex
	attempts []vcrAttempt
}

func (l *vcrLog) RoundTrip(req *http.Request) (*http.Response, error) {
	a := vcrAttempt{host: req.URL.Host, authorization: req.Header.Get("Authorization")}
	resp, err := l.next.RoundTrip(req)
	a.err = err
	l.mu.Lock()
	l.attempts = append(l.attempts, a)
	l.mu.Unlock()
	return resp, err
}

// take returns the attempts since the last call.
func (l *vcrLog) take() []vcrAttempt {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := l.attempts
	l.attempts = nil
	return out
}

// vcrHosts returns the host of each attempt.
func vcrHosts(as []vcrAttempt) []string {
	var out []string
	for _, a := range as {
		out = append(out, a.host)
	}
	return out
}

// newVCRRecorder returns a recorder that replays the cassette name (a path
// without .yaml), or, with -vcr.record, records it again through the
// transport that upstreams returns.
func newVCRRecorder(t *testing.T, name string, upstreams func() http.RoundTripper) *recorder.Recorder {
	t.Helper()
	opts := []recorder.Option{
		recorder.WithMatcher(vcrMatcher),
		recorder.WithSkipRequestLatency(true),
		recorder.WithMode(recorder.ModeReplayOnly),
		recorder.WithRealTransport(vcrNoNetwork{t}),
	}
	if *vcrRecord {
		opts = append(opts,
			recorder.WithMode(recorder.ModeRecordOnly),
			recorder.WithRealTransport(upstreams()),
			recorder.WithHook(func(i *cassette.Interaction) error {
				// Keep keys and machine details out of the fixture, and
				// what changes with each recording.
				for _, k := range vcrIgnoredHeaders {
					delete(i.Request.Headers, k)
				}
				delete(i.Response.Headers, "Date")
				i.Response.Duration = 0
				return nil
			}, recorder.AfterCaptureHook),
		)
	}
	rec, err := recorder.New(name, opts...)
	if err != nil {
		t.Fatalf("recorder.New(%q): %v", name, err)
	}
	if *vcrRecord {
		t.Cleanup(func() {
			if err := rec.Stop(); err != nil {
				t.Errorf("saving the cassette: %v", err)
			}
		})
	}
	return rec
}

// vcrNoNetwork is the recorder's real transport in replay: a request that
// reaches it fails the test.
type vcrNoNetwork struct{ t *testing.T }

func (n vcrNoNetwork) RoundTrip(r *http.Request) (*http.Response, error) {
	n.t.Errorf("the replay reached the network: %s %s", r.Method, r.URL)
	return nil, errors.New("no network in replay")
}

// vcrDialHosts returns a transport that connects to servers[host] for each of
// the hosts, whatever they resolve to, and to nothing else.
func vcrDialHosts(t *testing.T, servers map[string]*failovertest.Server) http.RoundTripper {
	t.Helper()
	addrs := map[string]string{}
	for host, s := range servers {
		u, err := url.Parse(s.URL)
		if err != nil {
			t.Fatal(err)
		}
		addrs[host+":80"] = u.Host
	}
	var d net.Dialer
	tr := &http.Transport{DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
		a, ok := addrs[addr]
		if !ok {
			return nil, fmt.Errorf("no local upstream for %s", addr)
		}
		return d.DialContext(ctx, network, a)
	}}
	t.Cleanup(tr.CloseIdleConnections)
	return tr
}

// TestVCRReplayFailover replays testdata/vcr/primary-503-429-backup.yaml:
// the primary answers a 503, then a 429 with Retry-After: 30; the backup
// answers each chat completion. Through openai-go, the caller sees three
// completions from the backup; the primary cools down after the 429 and the
// third request goes straight to the backup.
func TestVCRReplayFailover(t *testing.T) {
	const name = "testdata/vcr/primary-503-429-backup"
	completion := func(n int) string {
		return fmt.Sprintf(`{"id":"chatcmpl-vcr-%d","object":"chat.completion","created":1700000000,"model":"gpt-test",`+
			`"choices":[{"index":0,"message":{"role":"assistant","content":"backup answer %d","refusal":null},"logprobs":null,"finish_reason":"stop"}],`+
			`"usage":{"prompt_tokens":9,"completion_tokens":3,"total_tokens":12}}`, n, n)
	}
	rec := newVCRRecorder(t, name, func() http.RoundTripper {
		return vcrDialHosts(t, map[string]*failovertest.Server{
			"primary.test": failovertest.NewServer(t,
				failovertest.Step{Status: http.StatusServiceUnavailable, Body: `{"error":{"message":"The server is overloaded or not ready yet.","type":"server_error","param":null,"code":null}}`},
				failovertest.Step{
					Status: http.StatusTooManyRequests,
					Header: http.Header{"Retry-After": {"30"}},
					Body:   `{"error":{"message":"Rate limit reached for gpt-test on requests per min (RPM): Limit 3, Used 3, Requested 1.","type":"requests","param":null,"code":"rate_limit_exceeded"}}`,
				},
			),
			"backup.test": failovertest.NewServer(t,
				failovertest.Step{Body: completion(1)},
				failovertest.Step{Body: completion(2)},
				failovertest.Step{Body: completion(3)},
			),
		})
	})
	log := &vcrLog{next: rec}
	tr := newFailover(t, vcrPrimary, vcrBackup, failover.Config{Base: log})
	// No SDK retries: what the caller sees comes from the Transport alone.
	client := newOpenAIClient(t, tr, vcrPrimary, option.WithMaxRetries(0))

	tests := []struct {
		name     string
		prompt   string
		attempts []string // the hosts the Transport tried, in order
		body     string   // what the caller gets, byte for byte
	}{
		{"primary 503", "request 1", []string{"primary.test", "backup.test"}, completion(1)},
		{"primary 429", "request 2", []string{"primary.test", "backup.test"}, completion(2)},
		{"primary cooling down", "request 3", []string{"backup.test"}, completion(3)},
	}
	for i, tc := range tests {
		params := openai.ChatCompletionNewParams{
			Model:    "gpt-test",
			Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage(tc.prompt)},
		}
		var resp *http.Response
		res, err := client.Chat.Completions.New(testContext(t), params, option.WithResponseInto(&resp))
		if err != nil {
			t.Fatalf("%s: Chat.Completions.New: %v", tc.name, err)
		}
		if resp.StatusCode != http.StatusOK || res.RawJSON() != tc.body {
			t.Errorf("%s: the caller got %d %s, want 200 %s", tc.name, resp.StatusCode, res.RawJSON(), tc.body)
		}
		if got, want := res.Choices[0].Message.Content, fmt.Sprintf("backup answer %d", i+1); got != want {
			t.Errorf("%s: got content %q, want %q", tc.name, got, want)
		}
		attempts := log.take()
		if got := vcrHosts(attempts); !slices.Equal(got, tc.attempts) {
			t.Errorf("%s: the Transport tried %q, want %q", tc.name, got, tc.attempts)
		}
		for _, a := range attempts {
			want := map[string]string{"primary.test": "Bearer " + primaryKey, "backup.test": "Bearer " + backupKey}[a.host]
			if a.authorization != want {
				t.Errorf("%s: %s got Authorization %q, want its own key", tc.name, a.host, a.authorization)
			}
			if a.err != nil {
				t.Errorf("%s: %s: no recorded answer: %v", tc.name, a.host, a.err)
			}
		}

		primary, backup := tr.Health()[0], tr.Health()[1]
		switch i {
		case 0:
			if primary.Cooldown != 0 || primary.Requests.Failed != 1 {
				t.Errorf("%s: primary cools down for %v with %+v, want no cooldown and one failure", tc.name, primary.Cooldown, primary.Requests)
			}
		default:
			// Retry-After: 30 was read: the cooldown is longer than the
			// 1s default, and no longer than asked.
			if primary.Cooldown <= time.Second || primary.Cooldown > 30*time.Second ||
				primary.CooldownReason != failover.CooldownRateLimited || primary.Available || primary.State != "closed" {
				t.Errorf("%s: primary is %s, available %v, cooling down for %v (%q); want closed, unavailable, cooling down for more than the 1s default and up to the 30s of Retry-After (%q)",
					tc.name, primary.State, primary.Available, primary.Cooldown, primary.CooldownReason, failover.CooldownRateLimited)
			}
			if primary.Requests.Failed != 1 || primary.Requests.RateLimited != 1 || primary.Requests.Total() != 2 {
				t.Errorf("%s: primary has %+v, want one failure, one 429 and nothing else", tc.name, primary.Requests)
			}
		}
		if backup.Requests.Success != uint64(i+1) || backup.Requests.Total() != uint64(i+1) {
			t.Errorf("%s: backup has %+v, want %d successes and nothing else", tc.name, backup.Requests, i+1)
		}
	}

	// Every recorded interaction was played, each once.
	if !*vcrRecord {
		c, err := cassette.Load(name)
		if err != nil {
			t.Fatal(err)
		}
		if got, want := len(c.Interactions), 5; got != want {
			t.Errorf("the cassette has %d interactions, want the %d attempts made", got, want)
		}
	}
}
