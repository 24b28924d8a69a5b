package mono

import (
	"testing"
	"time"

	"github.com/failover-go/failover/internal/clocktest"
)

// Two readings are as far apart as the monotonic clock says, whatever the
// wall clock did between them.
func TestOfKeepsMonotonicOrder(t *testing.T) {
	start := time.Now()
	for _, step := range []time.Duration{-time.Hour, 0, time.Hour} {
		later := clocktest.StepWall(start.Add(time.Second), step)
		if got := Of(later).Sub(Of(start)); got != time.Second {
			t.Errorf("step %v: %v apart, want 1s", step, got)
		}
	}
	if Of(start) == 0 {
		t.Error("a reading is the zero Time, which means unset")
	}
	if got := Of(start).Time(); !got.Equal(start) {
		t.Errorf("Time() = %v, want %v", got, start)
	}
}

// Arithmetic saturates rather than wrapping.
func TestSaturates(t *testing.T) {
	m := Of(time.Now())
	if got := m.Add(1<<63 - 1); got < m {
		t.Errorf("Add(max) wrapped to %d", got)
	}
	if got := m.Add(-1 << 63); got != 1 {
		t.Errorf("Add(min) = %d", got)
	}
	if got := Of(time.Now().Add(1<<63 - 1)); got != 1<<63-1 {
		t.Errorf("Of(centuries ahead) = %d, want the largest Time", got)
	}
	if got := Of(time.Now().Add(-1 << 63)); got != 1 {
		t.Errorf("Of(centuries ago) = %d, want the smallest Time", got)
	}
	if got := Time(1<<63 - 1).Sub(Time(-1 << 62)); got != 1<<63-1 {
		t.Errorf("Sub overflowing = %v, want the largest Duration", got)
	}
	if got := Time(-1 << 62).Sub(Time(1<<63 - 1)); got != -1<<63 {
		t.Errorf("Sub underflowing = %v, want the smallest Duration", got)
	}
	if got := m.Until(m.Add(time.Second)); got != 0 {
		t.Errorf("Until a past instant = %v, want 0", got)
	}
}
