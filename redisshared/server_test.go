package redisshared

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// redisServer is a real redis-server on a free loopback port, started for
// one test and stopped after it. Tests skip, saying why, when there is no
// redis-server binary, unless FAILOVER_REQUIRE_REDIS is set (as .ci/run
// sets it, after installing redis-server), in which case they fail.
type redisServer struct {
	t    *testing.T
	Addr string
	port int
	cmd  *exec.Cmd
	args []string // more arguments to redis-server
}

func startRedis(t *testing.T, args ...string) *redisServer {
	t.Helper()
	if _, err := exec.LookPath("redis-server"); err != nil {
		if os.Getenv("FAILOVER_REQUIRE_REDIS") != "" {
			t.Fatalf("FAILOVER_REQUIRE_REDIS is set and there is no redis-server: %v", err)
		}
		t.Skip("no redis-server on PATH (apt-get install redis-server); set FAILOVER_REQUIRE_REDIS=1 to fail instead")
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	s := &redisServer{t: t, port: port, Addr: "127.0.0.1:" + strconv.Itoa(port), args: args}
	s.start()
	t.Cleanup(s.Kill)
	return s
}

func (s *redisServer) start() {
	s.t.Helper()
	args := append([]string{"--port", strconv.Itoa(s.port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--protected-mode", "no", "--loglevel", "warning"}, s.args...)
	s.cmd = exec.Command("redis-server", args...)
	s.cmd.Dir = s.t.TempDir() // for a cluster's nodes.conf
	if err := s.cmd.Start(); err != nil {
		s.t.Fatalf("start redis-server: %v", err)
	}
	rdb := redis.NewClient(&redis.Options{Addr: s.Addr, MaxRetries: -1})
	defer rdb.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		err := rdb.Ping(ctx).Err()
		cancel()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			s.Kill()
			s.t.Fatalf("redis-server on %s did not answer: %v", s.Addr, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Kill stops the server at once, losing its data.
func (s *redisServer) Kill() {
	if s.cmd != nil && s.cmd.Process != nil {
		s.cmd.Process.Kill()
		s.cmd.Wait()
		s.cmd = nil
	}
}

// Restart starts a new, empty server on the same port.
func (s *redisServer) Restart() {
	s.Kill()
	s.start()
}

// client returns a client of s, closed when the test ends.
func (s *redisServer) client(t *testing.T) *redis.Client {
	rdb := redis.NewClient(&redis.Options{Addr: s.Addr, DialTimeout: 500 * time.Millisecond, MaxRetries: -1, ContextTimeoutEnabled: true})
	t.Cleanup(func() { rdb.Close() })
	return rdb
}

func (s *redisServer) String() string { return fmt.Sprintf("redis-server %s", s.Addr) }
