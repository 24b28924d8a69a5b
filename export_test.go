package failover

import "testing"

// ClosedURL gives the external tests and benchmarks (package failover_test) the same
// refusing port as the internal ones.
func ClosedURL(tb testing.TB) string { return closedURL(tb) }
