package failover

import (
	"context"
	"log"
	"log/slog"
	"time"

	"github.com/failover-go/failover/internal/circuit"
)

// changed fans a change of u's circuit out: the trips metric, the log, the
// fleet and Config.OnStateChange. The circuit calls it after releasing its
// lock, on the goroutine that made the change.
func (t *Transport) changed(u *upstream, c circuit.Change) {
	from, to := State(c.From), State(c.To)
	if from == Closed && to == Open {
		u.m.trips.Inc()
	}
	level := slog.LevelInfo
	if to == Open {
		level = slog.LevelWarn
	}
	if c.Remote {
		t.log(level, "circuit "+to.String(), u, slog.String("from", from.String()), slog.String("by", "fleet"))
	} else {
		t.log(level, "circuit "+to.String(), u, slog.String("from", from.String()))
	}
	if t.fleet != nil {
		t.fleet.changed(u, c)
	}
	if t.onStateChange != nil {
		t.onStateChange(StateChange{Upstream: u.name, From: from, To: to, At: c.At})
	}
}

// log writes one record about u, when a Logger is set.
func (t *Transport) log(level slog.Level, msg string, u *upstream, attrs ...slog.Attr) {
	if t.logger == nil || !t.logger.Enabled(context.Background(), level) {
		return
	}
	attrs = append(attrs, slog.String("upstream", u.name))
	t.logger.LogAttrs(context.Background(), level, "failover: "+msg, attrs...)
}

// reportPanic reports a panic recovered on a goroutine of the Transport's
// own (a probe, an abandoned hedge) to the Logger, else to log.Print, so
// that it is never silent. msg is already scrubbed of credentials.
func (t *Transport) reportPanic(msg string) {
	if t.logger != nil {
		t.logger.Error(msg)
		return
	}
	log.Print(msg)
}

// reportLeft tells the Logger, else log.Print, what Close left running,
// waiting for it until deadline (see bounded).
func (t *Transport) reportLeft(msg string, deadline time.Time) {
	bounded(deadline, func() {
		if t.logger != nil {
			t.logger.Warn(msg)
			return
		}
		log.Print(msg)
	})
}

// closeLogWait is what Close keeps of its bound for telling the Logger
// what it leaves behind.
const closeLogWait = 100 * time.Millisecond

// bounded runs f, user code that Close calls (the Logger), on a goroutine
// of its own and waits for it until deadline: an f that blocks is left to
// return on its own, as a probe stuck in user code is. A panic of f's in
// time goes on in the caller, as if f ran there; a later one is dropped,
// rather than end the process from a goroutine of ours.
func bounded(deadline time.Time, f func()) {
	done := make(chan any, 1)
	go func() {
		defer func() { done <- recover() }()
		f()
	}()
	wait := time.NewTimer(time.Until(deadline))
	defer wait.Stop()
	select {
	case v := <-done:
		if v != nil {
			panic(v)
		}
	case <-wait.C:
	}
}

// logf writes one record about no upstream in particular, when a Logger is
// set.
func (t *Transport) logf(level slog.Level, msg string, attrs ...slog.Attr) {
	if t.logger == nil || !t.logger.Enabled(context.Background(), level) {
		return
	}
	t.logger.LogAttrs(context.Background(), level, "failover: "+msg, attrs...)
}
