package integration_test

import (
	"errors"
	"net/http"
	"slices"
	"testing"

	"github.com/failover-go/failover"
	"github.com/openai/openai-go/v3"
)

// TestOpenAISheddable sends batch requests (failover.WithSheddable) through
// the real openai-go client, with its default retries, to upstreams that
// report how much of their request window is left: a sheddable request
// passes over the primary, short of headroom, for the backup, and once
// both are short it gets a 503 with a Retry-After that the SDK does not
// retry, while an interactive request still goes to the primary.
func TestOpenAISheddable(t *testing.T) {
	var log requestLog
	low := func(content string) http.HandlerFunc { // 5 of 100 left: under Shed.Headroom's 10%
		return func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("X-Ratelimit-Limit-Requests", "100")
			w.Header().Set("X-Ratelimit-Remaining-Requests", "5")
			w.Header().Set("X-Ratelimit-Reset-Requests", "20s")
			completion(content)(w, r)
		}
	}
	primary := fakeUpstream(t, &log, "primary", low("from primary"))
	backup := fakeUpstream(t, &log, "backup", low("from backup"))
	tr := newFailover(t, primary.URL+"/v1", backup.URL+"/v1", failover.Config{})
	client := newOpenAIClient(t, tr, primary.URL+"/v1")
	ctx := testContext(t)
	batch := failover.WithSheddable(ctx)

	for i, tc := range []struct {
		sheddable bool
		want      string // the answer's content; "" for the 503
	}{
		{false, "from primary"},
		{true, "from backup"},
		{true, ""},
		{false, "from primary"},
	} {
		c := ctx
		if tc.sheddable {
			c = batch
		}
		res, err := client.Chat.Completions.New(c, chatParams())
		if tc.want == "" {
			var apiErr *openai.Error
			if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusServiceUnavailable || apiErr.Response.Header.Get("Retry-After") == "" {
				t.Fatalf("request %d: %v; want a 503 with a Retry-After", i, err)
			}
			continue
		}
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		if got := res.Choices[0].Message.Content; got != tc.want {
			t.Errorf("request %d: got %q, want %q", i, got, tc.want)
		}
	}
	if got, want := log.order(), []string{"primary#0", "backup#0", "primary#0"}; !slices.Equal(got, want) {
		t.Errorf("got requests %q, want %q: the shed request must reach no upstream, nor be retried by the SDK", got, want)
	}
}
