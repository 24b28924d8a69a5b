//go:build !race

package failover

// raceEnabled: see race_test.go.
const raceEnabled = false
