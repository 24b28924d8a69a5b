package clocktest

import (
	"testing"
	"time"
)

// A stepped reading differs from the original on the wall clock by the
// step, and not at all on the monotonic clock, which Sub and Before use.
func TestStepWall(t *testing.T) {
	for _, step := range []time.Duration{-time.Hour, time.Hour, 1500 * time.Millisecond, -time.Nanosecond} {
		now := time.Now()
		later := now.Add(300 * time.Millisecond)
		stepped := StepWall(later, step)
		if got := stepped.UnixNano() - later.UnixNano(); got != int64(step) {
			t.Errorf("step %v: the wall clock moved %v", step, time.Duration(got))
		}
		if got := stepped.Sub(now); got != 300*time.Millisecond {
			t.Errorf("step %v: Sub = %v, want 300ms on the monotonic clock", step, got)
		}
		if got := stepped.Round(0).Sub(later.Round(0)); got != step {
			t.Errorf("step %v: without the monotonic reading, %v apart", step, got)
		}
	}
}

func TestStepWallNeedsMonotonic(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Error("StepWall accepted a time without a monotonic reading")
		}
	}()
	StepWall(time.Unix(0, 0), time.Hour)
}
