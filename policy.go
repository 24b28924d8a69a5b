package failover

import (
	"errors"
	"fmt"
)

// Policy per upstream: Upstream.Breaker and Upstream.Timeouts replace
// Config's for one upstream. Whatever reads an upstream's breaker or
// timeouts reads the ones in effect, upstream.breaker and
// upstream.timeouts: its circuit, the attempt's timers, stalled,
// othersTimedOut, and what the fleet is told.

// policy returns uc's breaker and timeouts in effect under cfg:
// uc.Breaker's fields over cfg.Breaker's, field by field, then the
// defaults; and timeoutsOf's.
func (uc Upstream) policy(cfg Config) (BreakerConfig, Timeouts) {
	b := cfg.Breaker
	if o := uc.Breaker; o != nil {
		b = o.over(b)
	}
	return b.withDefaults(), timeoutsOf(uc, cfg)
}

// over returns c with each zero field taken from inherited.
func (c BreakerConfig) over(inherited BreakerConfig) BreakerConfig {
	if c.FailureThreshold == 0 {
		c.FailureThreshold = inherited.FailureThreshold
	}
	if c.FailureRate == 0 {
		c.FailureRate = inherited.FailureRate
	}
	if c.MinRequests == 0 {
		c.MinRequests = inherited.MinRequests
	}
	if c.FailurePeriod == 0 {
		c.FailurePeriod = inherited.FailurePeriod
	}
	if c.Cooldown == 0 {
		c.Cooldown = inherited.Cooldown
	}
	if c.MaxCooldown == 0 {
		c.MaxCooldown = inherited.MaxCooldown
	}
	if c.SuccessThreshold == 0 {
		c.SuccessThreshold = inherited.SuccessThreshold
	}
	return c
}

// validatePolicy checks the i-th upstream's Breaker and AttemptTimeout as
// New checks Config's, naming the field under Upstreams[i]. Each bound is
// a field's own, so fields that pass here and in Config.Breaker pass
// together, whichever side each comes from.
func (uc Upstream) validatePolicy(i int) error {
	prefix := fmt.Sprintf("Upstreams[%d].", i)
	if b := uc.Breaker; b != nil {
		if err := b.validate(); err != nil {
			var cerr *ConfigError
			if errors.As(err, &cerr) {
				return configError(prefix+cerr.Field, cerr.Reason)
			}
			return err
		}
	}
	if uc.AttemptTimeout < 0 {
		return configError(prefix+"AttemptTimeout", "must not be negative")
	}
	return nil
}

// breakerJSON is a BreakerConfig in effect as Health's JSON shows it: the
// rule that trips the circuit (a consecutive count, or a failure rate with
// its minimum and period), then the shortest and longest open times and
// the successes that close it; durations in seconds.
type breakerJSON struct {
	FailureThreshold uint    `json:"failure_threshold,omitempty"`
	FailureRate      float64 `json:"failure_rate,omitempty"`
	MinRequests      uint    `json:"min_requests,omitempty"`
	FailurePeriod    float64 `json:"failure_period_seconds,omitempty"`
	Cooldown         float64 `json:"cooldown_seconds"`
	MaxCooldown      float64 `json:"max_cooldown_seconds"`
	SuccessThreshold uint    `json:"success_threshold"`
}

func (c BreakerConfig) json() breakerJSON {
	j := breakerJSON{Cooldown: c.Cooldown.Seconds(), MaxCooldown: c.MaxCooldown.Seconds(), SuccessThreshold: c.SuccessThreshold}
	if c.FailureRate > 0 {
		j.FailureRate, j.MinRequests, j.FailurePeriod = c.FailureRate, c.MinRequests, c.FailurePeriod.Seconds()
	} else {
		j.FailureThreshold = c.FailureThreshold
	}
	return j
}
