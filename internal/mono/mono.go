// Package mono turns time.Time readings into integers that keep the
// monotonic clock's order, for deadlines and timestamps kept in atomics.
//
// A time.Time from time.Now carries a reading of the monotonic clock, and
// Sub between two such values uses it; their UnixNano does not, and a
// wall-clock step (NTP, a VM resumed) moves it. A Time here is a time.Time's
// distance from an epoch taken when the process started, so comparing two of
// them compares monotonic readings.
package mono

import "time"

// epoch is the instant every Time is counted from. It is set once, when the
// package is initialised, and never written again.
var epoch = time.Now()

// base keeps every Time within about ±146 years of the epoch positive, so
// that the zero Time can mean "never" in the atomics that hold them (a
// time.Time without a monotonic reading, as inside a testing/synctest
// bubble, is counted by the wall clock and may lie before the epoch).
const base = 1 << 62

// Time is an instant as nanoseconds since the package's epoch, plus base.
// The zero Time is never a reading: it means "unset".
type Time int64

// Of returns the Time of t, saturating for a t centuries away.
func Of(t time.Time) Time { return Time(base).Add(t.Sub(epoch)) }

// Add returns m+d, saturating instead of overflowing, and never the zero
// Time or before it.
func (m Time) Add(d time.Duration) Time {
	s := int64(m) + int64(d)
	switch {
	case d > 0 && s < int64(m):
		return Time(1<<63 - 1)
	case s <= 0:
		return Time(1)
	}
	return Time(s)
}

// Sub returns m-n, saturating.
func (m Time) Sub(n Time) time.Duration {
	d := int64(m) - int64(n)
	switch {
	case n < 0 && d < int64(m), n > 0 && d > int64(m):
		if n < 0 {
			return time.Duration(1<<63 - 1)
		}
		return time.Duration(-1 << 63)
	}
	return time.Duration(d)
}

// Until returns how long from now until m, never negative.
func (m Time) Until(now Time) time.Duration { return max(0, m.Sub(now)) }

// Time returns m as a time.Time (with a monotonic reading when the epoch has
// one), for display.
func (m Time) Time() time.Time { return epoch.Add(time.Duration(int64(m) - base)) }
