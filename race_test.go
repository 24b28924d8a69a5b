//go:build race

package failover

// raceEnabled: under -race, sync.Pool drops a quarter of what it is
// given, at random, so what comes from a pool is sometimes allocated.
const raceEnabled = true
