package integration_test

import (
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/failover-go/failover"
	"github.com/openai/openai-go/v3/option"
)

// Two keys of one upstream (Upstream.Keys).
const (
	keyOne = "sk-key-one-0123456789"
	keyTwo = "sk-key-two-0123456789"
)

// TestOpenAIKeyPool: under openai-go with its default retries, a
// completion whose first key answers 429 is sent at once with the
// upstream's second key, not to the backup: the SDK makes one call and
// ServedBy names key "two". The next completion skips the cooling key.
func TestOpenAIKeyPool(t *testing.T) {
	var log requestLog
	primary := fakeUpstream(t, &log, "primary", func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") == "Bearer "+keyOne {
			apiError(http.StatusTooManyRequests, "rate_limit_exceeded", "Rate limit reached for requests", "Retry-After", "30")(w, r)
			return
		}
		completion("from primary")(w, r)
	})
	backup := fakeUpstream(t, &log, "backup", completion("from backup"))
	tr, err := failover.New(failover.Config{Upstreams: []failover.Upstream{
		{Name: "primary", BaseURL: primary.URL + "/v1", Keys: []failover.Key{
			{Name: "one", Header: http.Header{"Authorization": {"Bearer " + keyOne}}},
			{Name: "two", Header: http.Header{"Authorization": {"Bearer " + keyTwo}}},
		}},
		{Name: "backup", BaseURL: backup.URL + "/v1", Header: http.Header{"Authorization": {"Bearer " + backupKey}}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tr.Close() })
	sdk := &calls{next: tr}
	client := newOpenAIClient(t, sdk, primary.URL+"/v1")

	for i, wantKeys := range [][]string{{keyOne, keyTwo}, {keyTwo}} {
		before := len(log.all())
		sdk.n.Store(0)
		var raw *http.Response
		res, err := client.Chat.Completions.New(testContext(t), chatParams(), option.WithResponseInto(&raw))
		if err != nil {
			t.Fatalf("call %d: %v", i, err)
		}
		if got := res.Choices[0].Message.Content; got != "from primary" {
			t.Errorf("call %d: got %q, want %q", i, got, "from primary")
		}
		if n := sdk.n.Load(); n != 1 {
			t.Errorf("call %d: the SDK made %d attempts, want 1", i, n)
		}
		s, ok := failover.ServedBy(raw)
		if !ok || s.Upstream != "primary" || s.Key != "two" || s.Attempts != len(wantKeys) {
			t.Errorf("call %d: ServedBy = %+v, %v; want primary's key two after %d attempts", i, s, ok, len(wantKeys))
		}
		var keys []string
		for _, r := range log.all()[before:] {
			if r.upstream != "primary" {
				t.Errorf("call %d: %s got a request", i, r.upstream)
				continue
			}
			keys = append(keys, r.header.Get("Authorization")[len("Bearer "):])
			checkCredentials(t, r, keys[len(keys)-1])
		}
		if !slices.Equal(keys, wantKeys) {
			t.Errorf("call %d: the primary got keys %q, want %q", i, keys, wantKeys)
		}
	}

	h := tr.Health()[0]
	if len(h.Keys) != 2 || h.Keys[0].Cooldown <= 15*time.Second || h.Keys[0].Cooldown > 30*time.Second || h.Keys[1].Cooldown != 0 {
		t.Errorf("Health keys = %+v, want key one cooling down for up to 30s and key two not", h.Keys)
	}
	if !h.Available || h.Cooldown != 0 {
		t.Errorf("the primary is available %v, cooling down %v; want available: one key still takes requests", h.Available, h.Cooldown)
	}
}
