package failover

import (
	"context"
	"net/http"
	"net/http/httptest"
	"runtime"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/VictoriaMetrics/metrics"
)

// TestDroppedTransportStops drops Transports with probes, and with
// Config.Shared, without Close, and checks that once collected they stop
// every goroutine they started and send nothing more.
func TestDroppedTransportStops(t *testing.T) {
	for _, tc := range []struct {
		name          string
		probe, shared bool
		metrics       bool // each in a Set that outlives it
	}{
		{"probes", true, false, false},
		{"shared", false, true, false},
		{"both", true, true, false},
		{"metrics", true, true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var sent atomic.Int64 // probes received and calls to the store
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				sent.Add(1)
				w.Write([]byte(`{"data":[]}`))
			}))
			defer srv.Close()
			cfg := Config{Upstreams: []Upstream{{Name: "a", BaseURL: srv.URL + "/a"}, {Name: "b", BaseURL: srv.URL + "/b"}}}
			if tc.probe {
				cfg.Probe = ProbeConfig{Interval: minProbeInterval}
			}
			if tc.shared {
				cfg.Shared = &countingShared{Shared: newMemShared(), calls: &sent}
				cfg.SharedSync = minProbeInterval
			}
			const transports = 20
			label := "dropped-" + tc.name
			// The Transports' goroutines, and those their Base starts,
			// carry the label of the goroutine that called New.
			var live []*Transport
			var sets []*metrics.Set
			pprof.Do(context.Background(), pprof.Labels("failover_test", label), func(context.Context) {
				for range transports {
					if tc.metrics {
						cfg.Metrics = metrics.NewSet()
						sets = append(sets, cfg.Metrics)
					}
					tr, err := New(cfg)
					if err != nil {
						t.Fatal(err)
					}
					live = append(live, tr)
				}
			})
			waitFor(t, "the Transports at work", func() bool { return sent.Load() >= 2*transports })
			live[0].Close()         // its cleanup finds it stopped
			runtime.KeepAlive(live) // and no more
			waitFor(t, "the dropped Transports' goroutines to end", func() bool {
				runtime.GC()
				return labelled(label) == 0
			})
			before := sent.Load()
			time.Sleep(3 * minProbeInterval) // three periods of each loop
			if after := sent.Load(); after != before {
				t.Errorf("%d probes or calls to the store after the Transports' goroutines ended", after-before)
			}
			runtime.KeepAlive(sets)
		})
	}
}

// waitFor waits until ok, for at most 20s, polling.
func waitFor(t *testing.T, what string, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("gave up waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// labelled returns how many goroutines have the failover_test label
// value.
func labelled(value string) int {
	var prof strings.Builder
	pprof.Lookup("goroutine").WriteTo(&prof, 1)
	n := 0
	for _, entry := range strings.Split(prof.String(), "\n\n") {
		if !strings.Contains(entry, `"failover_test":"`+value+`"`) {
			continue
		}
		count, _, _ := strings.Cut(entry, " @ ")
		count = count[strings.LastIndexByte(count, '\n')+1:] // after the header, for the first
		c, err := strconv.Atoi(count)
		if err != nil {
			c = 1
		}
		n += c
	}
	return n
}

// countingShared counts the calls to its Shared.
type countingShared struct {
	Shared
	calls *atomic.Int64
}

func (s *countingShared) Publish(ctx context.Context, e SharedEvent) error {
	s.calls.Add(1)
	return s.Shared.Publish(ctx, e)
}

func (s *countingShared) Load(ctx context.Context, upstreams []string) ([]SharedEvent, error) {
	s.calls.Add(1)
	return s.Shared.Load(ctx, upstreams)
}

func (s *countingShared) Subscribe(ctx context.Context, deliver func(SharedEvent)) error {
	s.calls.Add(1)
	return s.Shared.Subscribe(ctx, deliver)
}

func (s *countingShared) AcquireProbe(ctx context.Context, upstream, member string, ttl time.Duration) (bool, error) {
	s.calls.Add(1)
	return s.Shared.AcquireProbe(ctx, upstream, member, ttl)
}
