package redisshared_test

import (
	"log"
	"net/http"

	"github.com/failover-go/failover"
	"github.com/failover-go/failover/redisshared"
	"github.com/redis/go-redis/v9"
)

// Every process of the service builds its Transport the same way, with the
// Redis client it already has: an outage one process sees is the whole
// fleet's at once, and one process probes for all.
func ExampleNew() {
	rdb := redis.NewClient(&redis.Options{Addr: "localhost:6379", ContextTimeoutEnabled: true})
	defer rdb.Close()

	t, err := failover.New(failover.Config{
		Upstreams: []failover.Upstream{
			{Name: "openai", BaseURL: "https://api.openai.com/v1"},
			{Name: "deepseek", BaseURL: "https://api.deepseek.com/v1"},
		},
		Shared: redisshared.New(rdb, redisshared.Options{Prefix: "chat-api"}),
	})
	if err != nil {
		log.Fatal(err)
	}
	defer t.Close() // stops the goroutines that talk to Redis

	client := &http.Client{Transport: t}
	_ = client // give it to the SDK
}
