package failover

import (
	"context"
	"log"
	"log/slog"

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

// reportLeft tells the Logger, else log.Print, what Close left running.
func (t *Transport) reportLeft(msg string) {
	if t.logger != nil {
		t.logger.Warn(msg)
		return
	}
	log.Print(msg)
}

// logf writes one record about no upstream in particular, when a Logger is
// set.
func (t *Transport) logf(level slog.Level, msg string, attrs ...slog.Attr) {
	if t.logger == nil || !t.logger.Enabled(context.Background(), level) {
		return
	}
	t.logger.LogAttrs(context.Background(), level, "failover: "+msg, attrs...)
}
