package failover

import "testing"

// ClosedURL gives the external tests (package failover_test) the same
// refusing port as the internal ones.
func ClosedURL(t *testing.T) string { return closedURL(t) }
