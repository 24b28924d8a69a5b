package failover

import (
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"time"
)

// background is what a Transport runs besides its requests, and what Close
// stops: the probe loops, the fleet's goroutines, and the idle connections
// of the Base that New made. Neither it nor its goroutines hold the
// Transport (the circuits' hooks and the gauges hold it weakly), so that a
// Transport dropped without Close becomes unreachable; the cleanup that New
// attaches to it then stops its background as Close would.
type background struct {
	once      sync.Once
	probes    *prober // nil without probes
	fleet     *fleet  // nil without Config.Shared
	upstreams []*upstream
	base      *http.Transport // the Base that New made; nil for the caller's
	logger    *slog.Logger
}

// stop stops b once, whether Close or the cleanup comes first: see
// [Transport.Close] for how long it waits.
func (b *background) stop() { b.once.Do(b.close) }

// dropped is the cleanup of a Transport that became unreachable. Cleanups
// run one at a time, and stop may wait a second or more for user code.
// They run outside any synctest bubble, whose channels they must not
// close: a test closes the Transports it makes in a bubble.
func (b *background) dropped() { go b.stop() }

// hasGoroutines reports whether New started goroutines that only stop ends.
func (b *background) hasGoroutines() bool { return b.probes != nil || b.fleet != nil }

func (b *background) close() {
	start := time.Now()
	end := start.Add(closeGrace) // when stop returns at the latest
	p := b.probes
	if p != nil {
		p.cancel() // at once, while the fleet stops
	}
	if f := b.fleet; f != nil {
		end = start.Add(f.closeWait())
		f.stopOnce.Do(func() { f.stop(end) })
	}
	if p != nil {
		if left := p.stop(b.upstreams, start.Add(closeGrace-closeLogWait)); len(left) > 0 {
			b.reportLeft("failover: Close returns while probes are still in user code that ignored their context, each to end on its own and count for nothing: "+strings.Join(left, ", "), end)
		}
	}
	if b.base != nil {
		b.base.CloseIdleConnections()
	}
}
