//go:build unix

package failovertest

import (
	"fmt"
	"syscall"
	"testing"
)

// ClosedURL returns the URL of a loopback port that refuses connections. The
// port is bound but never listened on until the test ends, so no server that
// the test starts later can take it (a closed listener's port could be).
// Point an Upstream at it to test failover from a refused connection.
func ClosedURL(t testing.TB) string {
	t.Helper()
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Close(fd) })
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	sa, err := syscall.Getsockname(fd)
	if err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("http://127.0.0.1:%d", sa.(*syscall.SockaddrInet4).Port)
}
