package integration_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"testing"

	"github.com/failover-go/failover"
	"github.com/openai/openai-go/v3"
)

// TestOpenAIAffinity: under the Weighted router, 10 conversations of 4
// turns each, sent through openai-go with their growing message history
// and nothing else to tell them apart, keep each to the upstream that
// answered its first turn, while the conversations spread over both
// upstreams. With affinity off, the round robin moves them.
//
// The conversations take turns in an order that shifts by one each
// round, so that the round robin alone, alternating between the two
// upstreams, would send every conversation's next turn to the other one.
func TestOpenAIAffinity(t *testing.T) {
	const conversations, turns = 10, 4
	for _, off := range []bool{false, true} {
		t.Run(fmt.Sprintf("Affinity.Off=%v", off), func(t *testing.T) {
			var log requestLog
			a := fakeUpstream(t, &log, "a", completion("from a"))
			b := fakeUpstream(t, &log, "b", completion("from b"))
			tr, err := failover.New(failover.Config{
				Router:   &failover.Weighted{},
				Affinity: failover.AffinityConfig{Off: off},
				Upstreams: []failover.Upstream{
					{Name: "a", BaseURL: a.URL + "/v1", Header: http.Header{"Authorization": {"Bearer " + primaryKey}}},
					{Name: "b", BaseURL: b.URL + "/v1", Header: http.Header{"Authorization": {"Bearer " + backupKey}}},
				},
			})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { tr.Close() })
			client := newOpenAIClient(t, tr, a.URL+"/v1")
			ctx := testContext(t)

			history := make([][]openai.ChatCompletionMessageParamUnion, conversations)
			for c := range history {
				history[c] = []openai.ChatCompletionMessageParamUnion{
					openai.SystemMessage(fmt.Sprintf("You are agent %d.", c)),
					openai.UserMessage(fmt.Sprintf("Start task %d.", c)),
				}
			}
			for turn := range turns {
				for i := range conversations {
					c := (i + turn) % conversations
					res, err := client.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: "gpt-test", Messages: history[c]})
					if err != nil {
						t.Fatalf("conversation %d, turn %d: %v", c, turn, err)
					}
					history[c] = append(history[c],
						openai.AssistantMessage(res.Choices[0].Message.Content),
						openai.UserMessage(fmt.Sprintf("Go on with step %d.", turn+1)))
				}
			}

			// Where each conversation's turns landed, by its system prompt
			// and the length of its history.
			where := make([][]string, conversations)
			for _, r := range log.all() {
				var body struct {
					Messages []struct {
						Content string `json:"content"`
					} `json:"messages"`
				}
				var c int
				if err := json.Unmarshal(r.body, &body); err != nil || len(body.Messages) == 0 {
					t.Fatalf("%s got body %q", r.upstream, r.body)
				}
				if _, err := fmt.Sscanf(body.Messages[0].Content, "You are agent %d.", &c); err != nil || c < 0 || c >= conversations {
					t.Fatalf("%s got system prompt %q", r.upstream, body.Messages[0].Content)
				}
				if turn := len(where[c]); len(body.Messages) != 2+2*turn {
					t.Fatalf("conversation %d, turn %d: %s got %d messages, want %d", c, turn, r.upstream, len(body.Messages), 2+2*turn)
				}
				where[c] = append(where[c], r.upstream)
			}
			used := map[string]int{}
			moved := 0
			for c, ups := range where {
				if len(ups) != turns {
					t.Fatalf("conversation %d: %d requests reached the upstreams (%q), want %d", c, len(ups), ups, turns)
				}
				used[ups[0]]++
				for _, u := range ups[1:] {
					if u != ups[0] {
						moved++
						if !off {
							t.Errorf("conversation %d moved: its turns went to %q", c, ups)
						}
						break
					}
				}
			}
			if used["a"] == 0 || used["b"] == 0 {
				t.Errorf("conversations started at a: %d, b: %d; want both upstreams used", used["a"], used["b"])
			}
			if off && moved == 0 {
				t.Errorf("with affinity off, no conversation moved: the test cannot tell affinity from the round robin")
			}
		})
	}
}
