//go:build unix

package redisshared

import (
	"context"
	"io"
	"log/slog"
	"net"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/failover-go/failover"
	"github.com/redis/go-redis/v9"
)

// inFlight is a Store that counts its calls under way (Subscribe aside).
type inFlight struct {
	*Store
	n atomic.Int32
}

func (s *inFlight) Publish(ctx context.Context, e failover.SharedEvent) error {
	s.n.Add(1)
	defer s.n.Add(-1)
	return s.Store.Publish(ctx, e)
}

func (s *inFlight) Load(ctx context.Context, upstreams []string) ([]failover.SharedEvent, error) {
	s.n.Add(1)
	defer s.n.Add(-1)
	return s.Store.Load(ctx, upstreams)
}

func (s *inFlight) AcquireProbe(ctx context.Context, upstream, member string, ttl time.Duration) (bool, error) {
	s.n.Add(1)
	defer s.n.Add(-1)
	return s.Store.AcquireProbe(ctx, upstream, member, ttl)
}

// A Transport on a client that never times out (ReadTimeout -1, no
// ContextTimeoutEnabled) closes while a call waits on a Redis that stopped
// answering (SIGSTOP: the connection stays open, nothing comes back): the
// call ends at its context's deadline, so that Close does not have to leave
// it behind (it would log so), and no goroutine of the fleet's or the
// Store's outlives Close.
func TestCloseRedisStopped(t *testing.T) {
	srv := startRedis(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr, ReadTimeout: -1, MaxRetries: -1})
	defer rdb.Close()
	calls := &inFlight{Store: New(rdb, Options{Prefix: t.Name()})}
	if o := rdb.Options(); o.ContextTimeoutEnabled || o.ReadTimeout != 0 {
		t.Fatalf("New changed the client's options: ContextTimeoutEnabled %v, ReadTimeout %v", o.ContextTimeoutEnabled, o.ReadTimeout)
	}
	var logs lockedBuffer
	tr := newSharing(t, calls, &logs)
	waitFor(t, "the Transport to share", func() bool { return metric(tr, "failover_shared_up") == 1 })

	if err := srv.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatalf("cannot stop redis-server: %v", err) // the test is the stopped server: without it, it proves nothing
	}
	defer srv.cmd.Process.Signal(syscall.SIGCONT)
	waitFor(t, "a call to wait on the stopped Redis", func() bool { return calls.n.Load() > 0 })

	checkClose(t, tr, &logs)
	if n := calls.n.Load(); n != 0 {
		t.Errorf("%d calls to Redis still under way after Close", n)
	}
}

// newSharing returns a Transport on shared that logs to logs, and closes
// it when the test ends.
func newSharing(t *testing.T, shared failover.Shared, logs *lockedBuffer) *failover.Transport {
	t.Helper()
	tr, err := failover.New(failover.Config{
		Upstreams:  []failover.Upstream{{Name: "primary", BaseURL: "http://127.0.0.1:1"}},
		Shared:     shared,
		SharedSync: 10 * time.Millisecond,
		Logger:     slog.New(slog.NewTextHandler(logs, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tr.Close() })
	return tr
}

// checkClose closes tr and checks that it left no call to the store behind
// (it would log so) and that no goroutine of the fleet's or of the Store's
// outlives Close.
func checkClose(t *testing.T, tr *failover.Transport, logs *lockedBuffer) {
	t.Helper()
	start := time.Now()
	closed := make(chan struct{})
	go func() {
		tr.Close()
		close(closed)
	}()
	select {
	case <-closed:
	case <-time.After(10 * time.Second):
		t.Fatalf("Close still waits after 10s; its goroutines:\n%s", ours())
	}
	t.Logf("Close returned after %v", time.Since(start).Round(time.Millisecond))
	if logs.count("goes on past its bound") > 0 {
		t.Errorf("Close left a call to Redis behind:\n%s", logs.b.String())
	}
	// The fleet's goroutines have ended when Close returns; the one
	// that waited for them for Close may still be on its way out.
	deadline := time.Now().Add(time.Second)
	for ours() != "" && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if s := ours(); s != "" {
		t.Errorf("goroutines of the Transport's or the Store's outlive Close:\n%s", s)
	}
}

// ours returns the stacks of the goroutines that run code of the fleet's
// or of the Store's.
func ours() string {
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	var out []string
	for g := range strings.SplitSeq(string(buf), "\n\n") {
		if strings.Contains(g, "failover.(*fleet)") || strings.Contains(g, "redisshared.(*Store)") {
			out = append(out, g)
		}
	}
	return strings.Join(out, "\n\n")
}

// waitFor polls cond until it holds, for 10s at most.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("no %s after 10s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// A subscription that starts while Redis has stopped answering (SIGSTOP:
// the kernel still accepts the connection, and go-redis then waits for
// the handshake's answer, under the PubSub's lock that its Close takes
// too) ends soon after its context does, rather than when Redis answers.
func TestStoreSubscribeStoppedCanceled(t *testing.T) {
	srv := startRedis(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr, ReadTimeout: -1, MaxRetries: -1})
	defer rdb.Close()
	s := New(rdb, Options{Prefix: t.Name()})
	if err := srv.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatalf("cannot stop redis-server: %v", err) // the test is the stopped server: without it, it proves nothing
	}
	defer srv.cmd.Process.Signal(syscall.SIGCONT)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Subscribe(ctx, func(failover.SharedEvent) {}) }()
	time.Sleep(100 * time.Millisecond) // connecting, or waiting for the handshake
	cancel()
	select {
	case err := <-done:
		if err == nil {
			t.Error("Subscribe on a stopped Redis returned no error")
		}
	case <-time.After(10 * time.Second):
		srv.cmd.Process.Signal(syscall.SIGCONT)
		t.Fatal("Subscribe still waits on a stopped Redis 10s after its context ended")
	}
}

// A Transport whose subscription is being set up when Redis stops
// answering closes as TestCloseRedisStopped's does: no call left behind,
// no goroutine of the fleet's or the Store's after Close.
func TestCloseRedisStoppedSubscribing(t *testing.T) {
	srv := startRedis(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr, ReadTimeout: -1, MaxRetries: -1})
	defer rdb.Close()
	if err := srv.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatalf("cannot stop redis-server: %v", err)
	}
	defer srv.cmd.Process.Signal(syscall.SIGCONT)
	subs := &subscribing{Store: New(rdb, Options{Prefix: t.Name()})}
	var logs lockedBuffer
	tr := newSharing(t, subs, &logs)
	waitFor(t, "a subscription to wait on the stopped Redis", func() bool { return subs.n.Load() > 0 })
	time.Sleep(100 * time.Millisecond) // connecting, or waiting for the handshake
	checkClose(t, tr, &logs)
}

// subscribing is a Store that counts its subscriptions under way.
type subscribing struct {
	*Store
	n atomic.Int32
}

func (s *subscribing) Subscribe(ctx context.Context, deliver func(failover.SharedEvent)) error {
	s.n.Add(1)
	defer s.n.Add(-1)
	return s.Store.Subscribe(ctx, deliver)
}

// A subscription whose connection breaks reconnects inside go-redis's
// read, under the PubSub's lock: when the new connection is accepted and
// never answered (here a TCP proxy in front of Redis that stops forwarding,
// as one whose backend hangs would), the subscription still ends soon after
// its context does.
func TestStoreSubscribeReconnectHangs(t *testing.T) {
	srv := startRedis(t)
	p := newProxy(t, srv.Addr)
	rdb := redis.NewClient(&redis.Options{Addr: p.addr, ReadTimeout: -1, MaxRetries: -1})
	defer rdb.Close()
	s := New(rdb, Options{Prefix: t.Name()})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	got := make(chan failover.SharedEvent, 1)
	done := make(chan error, 1)
	go func() {
		done <- s.Subscribe(ctx, func(e failover.SharedEvent) {
			select {
			case got <- e:
			default:
			}
		})
	}()
	// Subscribed: an event published on Redis directly comes through.
	direct := New(srv.client(t), Options{Prefix: t.Name()})
	deadline := time.Now().Add(10 * time.Second)
	for subscribed := false; !subscribed; {
		if time.Now().After(deadline) {
			t.Fatal("the subscription delivers nothing after 10s")
		}
		direct.Publish(context.Background(), failover.SharedEvent{Upstream: "u", Kind: failover.SharedFailure, At: time.Now(), Member: "m"})
		select {
		case <-got:
			subscribed = true
		case <-time.After(100 * time.Millisecond):
		}
	}
	p.silent.Store(true)
	p.breakAll()
	time.Sleep(200 * time.Millisecond) // go-redis reconnects, and waits for the handshake
	cancel()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		p.close()
		t.Fatal("Subscribe still waits on a connection that never answers 10s after its context ended")
	}
}

// proxy forwards loopback connections to a Redis, until silent: then it
// accepts them and never answers.
type proxy struct {
	addr   string
	ln     net.Listener
	silent atomic.Bool
	mu     sync.Mutex
	conns  []net.Conn
}

func newProxy(t *testing.T, to string) *proxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{addr: ln.Addr().String(), ln: ln}
	t.Cleanup(p.close)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			p.mu.Lock()
			p.conns = append(p.conns, c)
			p.mu.Unlock()
			if p.silent.Load() {
				continue // held open, never answered
			}
			b, err := net.Dial("tcp", to)
			if err != nil {
				c.Close()
				continue
			}
			p.mu.Lock()
			p.conns = append(p.conns, b)
			p.mu.Unlock()
			go func() { io.Copy(b, c); b.Close() }()
			go func() { io.Copy(c, b); c.Close() }()
		}
	}()
	return p
}

// breakAll closes every connection the proxy holds.
func (p *proxy) breakAll() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		c.Close()
	}
	p.conns = nil
}

func (p *proxy) close() {
	p.ln.Close()
	p.breakAll()
}
