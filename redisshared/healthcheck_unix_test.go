//go:build unix

package redisshared

import (
	"context"
	"syscall"
	"testing"
	"time"

	"github.com/failover-go/failover"
)

// A subscription on a Redis that stops answering (SIGSTOP: the connection
// stays open, nothing comes back) ends with an error after a PING goes
// unanswered, instead of waiting for TCP keepalive.
func TestStoreSubscribeHealthCheck(t *testing.T) {
	srv := startRedis(t)
	s := New(srv.client(t), Options{})
	old := healthCheck
	healthCheck = 200 * time.Millisecond
	defer func() { healthCheck = old }()
	done := make(chan error, 1)
	go func() { done <- s.Subscribe(context.Background(), func(failover.SharedEvent) {}) }()
	time.Sleep(500 * time.Millisecond) // subscribed, one PING answered
	if err := srv.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Skipf("cannot stop redis-server: %v", err)
	}
	defer srv.cmd.Process.Signal(syscall.SIGCONT)
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("Subscribe returned no error")
		}
	case <-time.After(5 * time.Second):
		srv.cmd.Process.Signal(syscall.SIGCONT)
		t.Fatal("Subscribe still waits on a Redis that stopped answering")
	}
}
