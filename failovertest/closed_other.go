//go:build !unix

package failovertest

import (
	"net"
	"testing"
)

// ClosedURL returns the URL of a loopback port that refuses connections:
// one a listener just gave up. (On Unix the port stays reserved instead.)
func ClosedURL(t testing.TB) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return "http://" + addr
}
