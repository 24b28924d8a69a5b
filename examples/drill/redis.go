package main

import (
	"bytes"
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os/exec"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// sharing is where a sharing fleet keeps its state: a Redis, and the
// prefix of its keys and channel.
type sharing struct {
	redis  *redisServer
	prefix string        // redisshared.Options.Prefix, unique to the drill
	sync   time.Duration // Config.SharedSync
}

// redisServer is the Redis of a sharing fleet: -redis's, or a redis-server
// that the drill started on a free loopback port and stops at the end.
type redisServer struct {
	opts *redis.Options // each member gets a client of its own from these

	cmd    *exec.Cmd     // nil unless the drill started it
	exited chan struct{} // closed when cmd has exited
	out    bytes.Buffer  // cmd's output; read only after exited is closed
}

// errNoRedis says what to do when -fleet has no Redis to share through.
var errNoRedis = errors.New("-fleet shares state through Redis: give -redis host:port (or a redis:// URL), " +
	"or put redis-server on PATH (apt-get install redis-server, brew install redis) and the drill starts its own")

// pingTimeout bounds the PING that checks a Redis before the drill.
const pingTimeout = 3 * time.Second

// connectRedis returns the Redis at addr, a host:port or a redis:// URL,
// once it answered PING; with addr "", a redis-server that it starts on a
// free loopback port, without persistence. The caller calls stop.
func connectRedis(ctx context.Context, addr string) (*redisServer, error) {
	if addr == "" {
		return startRedis(ctx)
	}
	opts := &redis.Options{Addr: addr}
	if strings.Contains(addr, "://") {
		var err error
		if opts, err = redis.ParseURL(addr); err != nil {
			return nil, fmt.Errorf("-redis: %v", err)
		}
	}
	s := &redisServer{opts: opts}
	if err := s.ping(ctx); err != nil {
		return nil, fmt.Errorf("-redis %s: no answer to PING: %v", opts.Addr, err)
	}
	return s, nil
}

// ping checks that s answers PING. It dials first, so that an address
// where nothing listens fails at once, without go-redis's dial retries and
// the log line of each.
func (s *redisServer) ping(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, pingTimeout)
	defer cancel()
	network := cmp.Or(s.opts.Network, "tcp")
	var d net.Dialer
	conn, err := d.DialContext(ctx, network, s.opts.Addr)
	if err != nil {
		return err
	}
	conn.Close()
	rdb := s.client()
	defer rdb.Close()
	return rdb.Ping(ctx).Err()
}

// startRedis starts redis-server from PATH on a free loopback port and
// waits until it answers PING.
func startRedis(ctx context.Context) (*redisServer, error) {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return nil, errNoRedis
	}
	// A free port: the kernel's pick, released for redis-server to take.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	s := &redisServer{opts: &redis.Options{Addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port))}, exited: make(chan struct{})}
	s.cmd = exec.Command(bin, "--port", strconv.Itoa(port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--loglevel", "warning")
	s.cmd.Stdout, s.cmd.Stderr = &s.out, &s.out
	if err := s.cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %v", bin, err)
	}
	go func() {
		s.cmd.Wait()
		close(s.exited)
	}()
	deadline := time.Now().Add(5 * time.Second)
	for {
		err := s.ping(ctx)
		if err == nil {
			return s, nil
		}
		select {
		case <-s.exited:
			return nil, fmt.Errorf("%s on %s exited: %s", bin, s.opts.Addr, strings.TrimSpace(s.out.String()))
		case <-ctx.Done():
			s.stop()
			return nil, ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			s.stop()
			return nil, fmt.Errorf("%s on %s did not answer PING: %v", bin, s.opts.Addr, err)
		}
	}
}

// client returns a new client of s.
func (s *redisServer) client() *redis.Client {
	opts := *s.opts
	opts.ContextTimeoutEnabled = true // SharedSync bounds every call
	return redis.NewClient(&opts)
}

// started reports whether the drill started s.
func (s *redisServer) started() bool { return s.cmd != nil }

// stop stops the redis-server that the drill started, if it did. Its
// data is lost: it holds only what expires within a breaker cooldown.
func (s *redisServer) stop() {
	if s.cmd == nil {
		return
	}
	s.cmd.Process.Kill()
	<-s.exited
}

// newPrefix returns a prefix for the sharing fleet's keys and channel that
// no other drill on the same Redis uses: "drill-" and 8 hex digits.
func newPrefix() string {
	var b [4]byte
	rand.Read(b[:])
	return "drill-" + hex.EncodeToString(b[:])
}

// minSharedSync bounds Config.SharedSync from below; see sharedSync.
const minSharedSync = 100 * time.Millisecond

// sharedSync is the sharing fleet's Config.SharedSync: its default of 1 s,
// scaled, but never under 100 ms. It is also the bound on each call to
// Redis, and a bound of a few dozen milliseconds would count a loaded
// machine's pauses as Redis errors. It matters little to the figures:
// members learn of open circuits, failures and probes by Redis's pub/sub
// as they happen, the period only reconciling what a member missed.
func (o options) sharedSync() time.Duration {
	return max(o.scaled(sharedSync), minSharedSync)
}

// waitShared waits until every member of a sharing run has read the
// shared state once, so that the drill starts with the fleet sharing.
func (r *run) waitShared(ctx context.Context) error {
	if r.spec.shared == nil {
		return nil
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		up := 0
		for _, m := range r.members {
			if m.metrics.GetOrCreateGauge("failover_shared_up", nil).Get() == 1 {
				up++
			}
		}
		if up == len(r.members) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s: %d of %d members reached Redis at %s", r.name, up, len(r.members), r.spec.shared.redis.opts.Addr)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
}
