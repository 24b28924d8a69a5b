package failovertest_test

import (
	"fmt"
	"io"
	"log"
	"net/http"
	"strings"

	"github.com/failover-go/failover"
	"github.com/failover-go/failover/failovertest"
)

// cleanups stands in for the *testing.T of a test, which is what a test
// passes to NewServer: it runs the servers' shutdown at the end.
type cleanups []func()

func (c *cleanups) Cleanup(f func()) { *c = append(*c, f) }

func (c *cleanups) run() {
	for i := len(*c) - 1; i >= 0; i-- {
		(*c)[i]()
	}
}

// The primary fails once and then recovers; the backup serves the request
// that the primary failed, with its own key.
func Example() {
	var t cleanups // in a test: t *testing.T
	defer t.run()

	primary := failovertest.NewServer(&t,
		failovertest.Step{Status: http.StatusServiceUnavailable, Body: `{"error":{"message":"overloaded"}}`},
		failovertest.Step{Body: `{"choices":[{"message":{"content":"from primary"}}]}`},
	)
	backup := failovertest.NewServer(&t, failovertest.Step{Body: `{"choices":[{"message":{"content":"from backup"}}]}`})

	tr, err := failover.New(failover.Config{Upstreams: []failover.Upstream{
		{Name: "primary", BaseURL: primary.URL + "/v1"},
		{Name: "backup", BaseURL: backup.URL + "/v1", Header: http.Header{"Authorization": {"Bearer BACKUP_KEY"}}},
	}})
	if err != nil {
		log.Fatal(err)
	}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr}

	for range 2 {
		resp, err := client.Post(primary.URL+"/v1/chat/completions", "application/json", strings.NewReader(`{"model":"m"}`))
		if err != nil {
			log.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		fmt.Println(resp.StatusCode, string(body))
	}
	fmt.Println("calls:", primary.Calls(), backup.Calls())
	r := backup.Requests()[0]
	fmt.Println("backup got", r.Method, r.Path, r.Header.Get("Authorization"), string(r.Body))
	// Output:
	// 200 {"choices":[{"message":{"content":"from backup"}}]}
	// 200 {"choices":[{"message":{"content":"from primary"}}]}
	// calls: 2 1
	// backup got POST /v1/chat/completions Bearer BACKUP_KEY {"model":"m"}
}
