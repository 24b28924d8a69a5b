//go:build !unix

package failover

import (
	"net"
	"testing"
)

// closedURL returns the URL of a loopback port that refuses connections:
// one a listener just gave up. (On Unix the port stays reserved instead.)
func closedURL(t testing.TB) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return "http://" + addr
}
