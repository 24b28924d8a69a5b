package circuit

import (
	"math"
	"time"
)

// growthScale sets how fast the open time grows: an upstream failing for
// age opens for (age/growthScale)^1.5 seconds.
const growthScale = 24 * time.Second

// maxJitter is the largest share of a grown open time that jitter takes
// off.
const maxJitter = 0.1

// OpenTime returns how long a circuit opens for when its upstream has been
// failing for age: (age/24s)^1.5 seconds, a curve steeper than age so that
// a short outage is probed every few seconds and a long one about once a
// minute, shortened by up to 10 % as u (in [0, 1)) says so that a fleet's
// probes spread, and kept within [base, max(base, limit)].
func OpenTime(age, base, limit time.Duration, u float64) time.Duration {
	limit = max(limit, base)
	var grown time.Duration
	if age > 0 {
		// Compared as floats: a float64 as large as limit may not fit
		// a Duration.
		grown = limit
		if g := math.Pow(age.Seconds()/growthScale.Seconds(), 1.5) * float64(time.Second); g < float64(limit) {
			grown = time.Duration(g)
		}
	}
	grown -= time.Duration(float64(grown) * maxJitter * min(max(u, 0), 1))
	return max(base, grown)
}

// resumed returns the age at which a failing episode resumes when its
// circuit trips again, the episode having been age old when the circuit
// closed, healthy ago, after an open of last: age less the share of it
// that healthy is of last, so that each healthy moment steps the open
// time down and an upstream healthy for as long as its last open starts
// afresh (0).
func resumed(age, healthy, last time.Duration) time.Duration {
	if age <= 0 || healthy >= last {
		return 0
	}
	return time.Duration(float64(age) * (1 - float64(max(healthy, 0))/float64(last)))
}
