//go:build !unix

package failover_test

import (
	"net"
	"testing"
)

// refusingURL returns the URL of a loopback port that refuses connections:
// one a listener just gave up. (On Unix the port stays reserved instead.)
func refusingURL(tb testing.TB) string {
	tb.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return "http://" + addr
}
