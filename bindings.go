package failover

import (
	"hash/maphash"
	"sync"
	"time"

	"github.com/failover-go/failover/internal/mono"
)

// A bindings table remembers where something lives: which upstream (and
// which of its keys) holds a piece of state a request may reference
// (pinning), or serves a conversation whose prompt the provider has
// cached (affinity). It is bounded in both ways a caller cannot control:
// an entry lives for its TTL from its last use, and past max entries the
// oldest is forgotten first. Entries are found by a hash of their name,
// seeded per process, so that a caller cannot aim collisions at it.
type bindings struct {
	ttl    time.Duration
	shards [bindingShards]bindingShard
}

// bindingShards spreads the table's lock over requests in parallel.
const bindingShards = 16

// bindingShard is one part of a bindings table: its entries and the
// order they came in, for forgetting the oldest.
type bindingShard struct {
	mu    sync.Mutex
	m     map[uint64]binding
	ring  []slot // entries in the order they came in; ring[next] is the oldest once full
	next  int
	limit int
	seq   uint64 // numbers the entries, so that a slot knows its own
}

// slot is an entry's place in the order they came in.
type slot struct {
	h   uint64
	seq uint64
}

// binding is where one thing lives, until when.
type binding struct {
	u     *upstream
	key   string // the name of u's key that holds it; "": any (an upstream without Keys)
	until mono.Time
	seq   uint64 // its slot's
}

// bindingSeed hashes every table's names: one per process.
var bindingSeed = maphash.MakeSeed()

// hashName returns the hash a bindings table files s under.
func hashName(s string) uint64 { return maphash.String(bindingSeed, s) }

// newBindings returns a table of at most about n entries, each living ttl
// from its last use.
func newBindings(n int, ttl time.Duration) *bindings {
	b := &bindings{ttl: ttl}
	per := max(1, (n+bindingShards-1)/bindingShards)
	for i := range b.shards {
		b.shards[i].limit = per
	}
	return b
}

func (b *bindings) shard(h uint64) *bindingShard { return &b.shards[h>>60] }

// lookup returns where h lives at now, and extends its life by the
// table's TTL from now: a conversation's cache lives on as it is used.
func (b *bindings) lookup(h uint64, now time.Time) (binding, bool) {
	s := b.shard(h)
	m := mono.Of(now)
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.m[h]
	if !ok {
		return binding{}, false
	}
	if e.until <= m {
		delete(s.m, h)
		return binding{}, false
	}
	e.until = m.Add(b.ttl)
	s.m[h] = e
	return e, true
}

// peek is lookup without extending the entry's life.
func (b *bindings) peek(h uint64, now time.Time) (binding, bool) {
	s := b.shard(h)
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.m[h]
	if !ok || e.until <= mono.Of(now) {
		return binding{}, false
	}
	return e, true
}

// bind records that h lives at u (its key named key) from now, for the
// table's TTL, or for d when d is positive and shorter (what a fleet's
// member said is left).
func (b *bindings) bind(h uint64, u *upstream, key string, now time.Time, d time.Duration) {
	if d <= 0 || d > b.ttl {
		d = b.ttl
	}
	s := b.shard(h)
	e := binding{u: u, key: key, until: mono.Of(now).Add(d)}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.m == nil {
		s.m = make(map[uint64]binding)
	}
	if old, ok := s.m[h]; ok {
		e.seq = old.seq
		s.m[h] = e
		return
	}
	s.seq++
	e.seq = s.seq
	if len(s.ring) < s.limit {
		s.ring = append(s.ring, slot{h, e.seq})
	} else {
		// Full: forget the oldest entry, unless it went meanwhile and
		// its hash came back in a slot of its own.
		if old := s.ring[s.next]; s.m[old.h].seq == old.seq {
			delete(s.m, old.h)
		}
		s.ring[s.next] = slot{h, e.seq}
		s.next = (s.next + 1) % len(s.ring)
	}
	s.m[h] = e
}

// len returns how many entries the table holds, expired ones included
// until they are looked up or pushed out.
func (b *bindings) len() int {
	n := 0
	for i := range b.shards {
		s := &b.shards[i]
		s.mu.Lock()
		n += len(s.m)
		s.mu.Unlock()
	}
	return n
}
