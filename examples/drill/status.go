package main

import (
	"fmt"
	"io"
	"slices"
	"strings"
	"time"
)

// status draws the live status: on a terminal, a block of lines redrawn in
// place four times a second; otherwise one plain line a second.
type status struct {
	w      io.Writer
	tty    bool
	runs   []*run // plain, then the failover runs
	phases []phase
	start  time.Time
	total  time.Duration
	drawn  int // lines of the last frame, to move back over
}

func (s *status) loop(done <-chan struct{}) {
	every := time.Second
	if s.tty {
		every = 250 * time.Millisecond
	}
	tick := time.NewTicker(every)
	defer tick.Stop()
	for {
		select {
		case <-done:
			if s.tty {
				s.draw() // the final state; plain lines have it already
			}
			return
		case <-tick.C:
			s.draw()
		}
	}
}

func (s *status) draw() {
	el := min(time.Since(s.start), s.total)
	p := s.phases[phaseAt(s.phases, el)]
	plain := callerStats(s.runs[0], el)

	if !s.tty {
		// A line per failover run, the first one with the time, the
		// phase and the plain caller.
		for i, r := range s.runs[1:] {
			var ups []string
			for _, h := range r.ft.Health() {
				ups = append(ups, fmt.Sprintf("%s %s %.1f%% p99 %s", h.Name, h.State, 100*h.SuccessRate, p99(h.P99, h.Window)))
			}
			head := fmt.Sprintf("%5.1fs %-12s | plain %s", el.Seconds(), p.name, plain.short())
			if i > 0 {
				head = strings.Repeat(" ", len(head))
			}
			fmt.Fprintf(s.w, "%s | %s %s | %s\n", head, r.name, callerStats(r, el).short(), strings.Join(ups, ", "))
		}
		return
	}
	width := len("plain")
	for _, r := range s.runs {
		width = max(width, len(r.name))
	}
	lines := []string{
		fmt.Sprintf("drill %4.1fs/%.0fs  phase: %s (%.1fs left)", el.Seconds(), s.total.Seconds(), p.name, (p.end - el).Seconds()),
		fmt.Sprintf("%-*s  caller %s", width, "plain", plain.long()),
	}
	for _, r := range s.runs[1:] {
		lines = append(lines, fmt.Sprintf("%-*s  caller %s", width, r.name, callerStats(r, el).long()))
		for _, h := range r.ft.Health() {
			state := h.State
			if h.Cooldown > 0 {
				state = "cooling " + fmtDur(h.Cooldown)
			}
			if h.Suspect {
				state += ", suspect"
			}
			lines = append(lines, fmt.Sprintf("  %-9s %-15s success %5.1f %%  p99 %7s  (last %d attempts)",
				h.Name, state, 100*h.SuccessRate, p99(h.P99, h.Window), h.Window))
		}
	}
	var b strings.Builder
	if s.drawn > 0 {
		fmt.Fprintf(&b, "\x1b[%dA", s.drawn) // back to the first line
	}
	for _, l := range lines {
		b.WriteString("\x1b[2K" + l + "\n")
	}
	s.drawn = len(lines)
	io.WriteString(s.w, b.String())
}

// p99 formats an upstream's p99, "-" before its first attempt.
func p99(d time.Duration, window int) string {
	if window == 0 {
		return "-"
	}
	return fmtDur(d)
}

// caller is what a run's caller saw over the last second.
type caller struct {
	n, ok   int
	p99     time.Duration
	waiting int64
}

func (c caller) long() string {
	if c.n == 0 {
		return fmt.Sprintf("no answers in the last 1s, %d waiting", c.waiting)
	}
	return fmt.Sprintf("success %5.1f %%  p99 %7s  (last 1s), %d waiting", 100*ratio(c.ok, c.n), fmtDur(c.p99), c.waiting)
}

func (c caller) short() string {
	if c.n == 0 {
		return fmt.Sprintf("no answers, %d waiting", c.waiting)
	}
	return fmt.Sprintf("%.1f%% p99 %s, %d waiting", 100*ratio(c.ok, c.n), fmtDur(c.p99), c.waiting)
}

// callerStats returns what r's caller saw over the second before now: the
// requests that ended in it, and those still waiting.
func callerStats(r *run, now time.Duration) caller {
	c := caller{waiting: r.inflight.Load()}
	var lat []time.Duration
	r.mu.Lock()
	for i := len(r.records) - 1; i >= 0; i-- {
		rec := r.records[i]
		if rec.end < now-time.Second {
			break
		}
		c.n++
		if rec.ok {
			c.ok++
		}
		lat = append(lat, rec.latency)
	}
	r.mu.Unlock()
	slices.Sort(lat)
	c.p99 = percentile(lat, 0.99)
	return c
}
