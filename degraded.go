package failover

import "time"

// DegradedConfig sets when an upstream is degraded: slow or failing often,
// though not enough to open its circuit. A degraded upstream is tried after
// the healthy ones (its circuit stays closed) and comes back by itself when
// its figures recover; Health and the metrics report it. The zero value
// never degrades an upstream.
type DegradedConfig struct {
	// Latency degrades an upstream whose recent p99 exceeds it. Zero
	// means latency never degrades.
	Latency time.Duration

	// SuccessRate degrades an upstream whose recent success rate is
	// below it (0 < rate <= 1). Zero means it never does.
	SuccessRate float64

	// Window is how far back "recent" reaches, here and in the figures
	// a Router sees (Candidate.P50 and SuccessRate). Zero means 30s.
	Window time.Duration

	// MinSamples is the fewest recent attempts to judge from. Zero
	// means 20.
	MinSamples int
}

// Defaults of the recent figures' windows (DegradedConfig, HangConfig,
// HedgeConfig).
const (
	defaultRecentWindow = 30 * time.Second
	defaultMinSamples   = 20
)

func (c DegradedConfig) enabled() bool { return c.Latency > 0 || c.SuccessRate > 0 }

func (c DegradedConfig) withDefaults() DegradedConfig {
	if c.Window == 0 {
		c.Window = defaultRecentWindow
	}
	if c.MinSamples == 0 {
		c.MinSamples = defaultMinSamples
	}
	return c
}

func (c DegradedConfig) validate() error {
	switch {
	case c.Latency < 0:
		return configError("Degraded.Latency", "must not be negative")
	case c.SuccessRate < 0 || c.SuccessRate > 1 || c.SuccessRate != c.SuccessRate:
		return configError("Degraded.SuccessRate", "must be within [0, 1]")
	case c.Window < 0:
		return configError("Degraded.Window", "must not be negative")
	case c.MinSamples < 0:
		return configError("Degraded.MinSamples", "must not be negative")
	}
	return nil
}

// isDegraded reports whether u is degraded at now: demotion, Health and
// the failover_degraded gauge all ask it.
func (t *Transport) isDegraded(u *upstream, now time.Time) bool {
	return t.degraded.enabled() && t.degraded.degraded(u.recent.get(&u.window, now))
}

// degraded reports whether figures f say an upstream is degraded.
func (c DegradedConfig) degraded(f figures) bool {
	return c.enabled() && f.n >= c.MinSamples &&
		((c.Latency > 0 && f.p99 > c.Latency) || (c.SuccessRate > 0 && f.rate < c.SuccessRate))
}
