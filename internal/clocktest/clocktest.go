// Package clocktest makes the time.Time readings of a wall-clock step, for
// tests of code that must not notice one.
package clocktest

import (
	"time"
	"unsafe"
)

// layout is time.Time's memory layout (GOROOT/src/time/time.go): wall holds,
// when its top bit (hasMonotonic) is set, 33 bits of seconds since 1885 and
// 30 bits of nanoseconds; ext holds the monotonic reading.
type layout struct {
	wall uint64
	ext  int64
	loc  *time.Location
}

const (
	hasMonotonic = 1 << 63
	nsecShift    = 30
	nsecMask     = 1<<nsecShift - 1
)

// StepWall returns t with its wall-clock reading moved by d and its
// monotonic reading kept: the reading time.Now returns after the system
// clock was stepped by d (NTP, a VM resumed) since t. time.Time has no
// constructor for a reading whose two clocks disagree, which is what a
// step makes, so this one writes the fields; TestStepWall checks it against
// the time package. It panics when t has no monotonic reading.
func StepWall(t time.Time, d time.Duration) time.Time {
	p := (*layout)(unsafe.Pointer(&t))
	if p.wall&hasMonotonic == 0 {
		panic("clocktest: StepWall needs a reading of time.Now, with its monotonic clock")
	}
	sec := int64(p.wall << 1 >> (nsecShift + 1))
	ns := sec*int64(time.Second) + int64(p.wall&nsecMask) + int64(d)
	p.wall = hasMonotonic | uint64(ns/int64(time.Second))<<nsecShift | uint64(ns%int64(time.Second))
	return t
}
