package failover

import (
	"context"
	"errors"
	"io"
	"log"
	"log/slog"
	"net"
	"syscall"
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
func (b *background) reportLeft(msg string, deadline time.Time) {
	bounded(deadline, func() {
		if b.logger != nil {
			b.logger.Warn(msg)
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

// logFailover logs, at Info with the request's context (a handler may add
// its trace IDs), that the request's attempt number c.sent moves on from
// c.last, whose attempt failed, to u: why (the outcome, the status or the
// class of the error), never a URL, header or message.
func (c *call) logFailover(u *upstream) {
	l, ctx := c.t.logger, c.req.Context()
	if l == nil || !l.Enabled(ctx, slog.LevelInfo) {
		return
	}
	from := c.last
	attrs := make([]slog.Attr, 0, 6)
	attrs = append(attrs, slog.String("from", from.name), slog.String("to", u.name), slog.Int("attempt", int(c.sent)))
	var err error
	if c.held == nil || c.heldBy.u != from || int(c.heldBy.n) != int(c.sent)-1 {
		for i := len(c.errs) - 1; i >= 0; i-- {
			if r := c.errs[i]; r.u == from && r.err != nil {
				err = r.err
				break
			}
		}
	}
	switch {
	case err != nil:
		attrs = append(attrs, slog.String("error", errorClass(err)))
	case c.held != nil && c.heldBy.u == from:
		attrs = append(attrs, slog.String("outcome", c.heldBy.o.String()), slog.Int("status", c.held.StatusCode))
	}
	l.LogAttrs(ctx, slog.LevelInfo, "failover: failed over", attrs...)
}

// logSkip logs, at Debug with the request's context, that the request
// passed over u, and why.
func (c *call) logSkip(u *upstream, av availability) {
	l, ctx := c.t.logger, c.req.Context()
	if l == nil || !l.Enabled(ctx, slog.LevelDebug) {
		return
	}
	attrs := make([]slog.Attr, 0, 4)
	attrs = append(attrs, slog.String("upstream", u.name), slog.String("reason", string(av.reason)), slog.Int("round", int(c.roundNo)))
	if av.known && av.wait > 0 {
		attrs = append(attrs, slog.Duration("retry_after", av.wait))
	}
	l.LogAttrs(ctx, slog.LevelDebug, "failover: upstream skipped", attrs...)
}

// errorClass names the kind of an attempt's error for the Logger: a
// word of a short fixed list, never its message, which may quote a URL.
func errorClass(err error) string {
	var dns *net.DNSError
	var op *net.OpError
	switch {
	case errors.Is(err, ErrAuthorize):
		return "authorize" // its Authorizer failed: nothing was sent
	case errors.Is(err, ErrAttemptTimeout):
		return "attempt_timeout"
	case errors.Is(err, ErrFirstByteTimeout), errors.Is(err, ErrFirstContentTimeout):
		return "first_byte_timeout"
	case errors.Is(err, ErrBodyNotReplayable):
		return "body_not_replayable"
	case errors.Is(err, context.Canceled):
		return "canceled"
	case timedOut(err), errors.Is(err, context.DeadlineExceeded):
		return "timeout"
	case errors.As(err, &dns):
		return "dns"
	case errors.Is(err, syscall.ECONNREFUSED):
		return "connection_refused"
	case errors.Is(err, syscall.ECONNRESET):
		return "connection_reset"
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return "eof"
	case certError(err):
		return "tls_certificate"
	case errors.As(err, &op):
		return "network"
	case malformedAnswer(err):
		return "malformed_answer"
	}
	return "other"
}
