// Package redisshared implements [failover.Shared] on Redis, so that a
// fleet of processes, each with its own [failover.Transport], learns once
// that an upstream is down:
//
//	rdb := redis.NewClient(&redis.Options{Addr: "localhost:6379"})
//	t, err := failover.New(failover.Config{
//		Upstreams: upstreams,
//		Shared:    redisshared.New(rdb, redisshared.Options{Prefix: "myservice"}),
//	})
//	...
//	defer t.Close()
//
// What it keeps in Redis, for each upstream name, under
// "{Prefix}:v1:{kind}:{name}": "open" while the upstream's circuit is open,
// "closed" for a cooldown's length after the fleet closed it, "cool" while
// it cools down after a 429 (its value the reason), "probe" while a member
// holds the half-open probe (its value the member), and "rates", a hash of
// each member's request rate and when it expires (by the Redis server's
// clock). Every key
// expires when what it says ends, so nothing stale outlives its deadline;
// "open" and "cool" only ever grow longer. A duration past 24h is shared
// as 24h: readers take a longer one for corrupt. Events go to the pub/sub
// channel "{Prefix}:v1:events" as small JSON messages. Nothing else is written: no
// key, header or URL of any upstream. Every command touches one key, so a
// Redis Cluster serves it too.
//
// The "v1" is the schema of these keys and messages: a release that
// changes them changes it, so that processes of the new release never read
// state the old one left behind.
package redisshared

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"net"
	"reflect"
	"strconv"
	"strings"
	"time"

	"github.com/failover-go/failover"
	"github.com/redis/go-redis/v9"
)

// schema versions the keys and messages.
const schema = "v1"

// maxFor bounds the durations read from Redis or from messages: a value
// past it is taken as corrupt. Publish writes a longer one as maxFor.
const maxFor = 24 * time.Hour

// Options configure a Store.
type Options struct {
	// Prefix starts every key and the channel name, so that services (or
	// tenants) sharing a Redis do not share state. Zero means "failover".
	Prefix string
}

// Store is a [failover.Shared] on a Redis client. It is safe for concurrent
// use. It does not close the client.
type Store struct {
	rdb     redis.UniversalClient // the client of New, or its clone that honours deadlines (see bounded)
	prefix  string                // "{Prefix}:v1:"
	channel string
}

var _ failover.Shared = (*Store)(nil)

// New returns a Store on rdb, a *redis.Client, *redis.ClusterClient or any
// other redis.UniversalClient the program already has.
//
// The Transport bounds each call by Config.SharedSync through its
// context, and go-redis ignores a context's deadline on the socket unless
// the client's ContextTimeoutEnabled is set: without it, a Redis that
// accepts connections and never answers holds each call for the client's
// ReadTimeout, and with a ReadTimeout of -1 until Redis answers. On a
// *redis.Client, the Store therefore sends its commands through a clone of
// rdb (rdb.WithTimeout, with rdb's own timeouts) that has
// ContextTimeoutEnabled set: it shares rdb's connections, and each of the
// Store's calls ends at its context's deadline whatever rdb's options,
// while rdb's own commands keep rdb's. The clone runs none of rdb's hooks
// (go-redis does not carry them over to WithTimeout's clones): a hook that
// traces or counts rdb's commands sees the Store's only when rdb has
// ContextTimeoutEnabled set, and the Store then uses rdb itself. Two other
// cases keep the client's way, and a call then ends only when
// Redis answers or the client's timeout fires, with Transport.Close
// waiting for it no longer than it says: a client with a ReadTimeout or
// WriteTimeout of -2 (go-redis then sets no deadline on its connections,
// and the Store sets none behind its back), and any client but a
// *redis.Client (a *redis.ClusterClient, a *redis.Ring), which has no such
// clone: set ContextTimeoutEnabled in its options.
//
// New panics if rdb is nil (or a nil pointer), as every call of the Store
// would.
func New(rdb redis.UniversalClient, opts Options) *Store {
	if v := reflect.ValueOf(rdb); rdb == nil || v.Kind() == reflect.Pointer && v.IsNil() {
		panic("redisshared: New called with a nil client")
	}
	p := opts.Prefix
	if p == "" {
		p = "failover"
	}
	p += ":" + schema + ":"
	return &Store{rdb: bounded(rdb), prefix: p, channel: p + "events"}
}

// bounded returns a client like rdb whose commands end at their context's
// deadline: rdb itself when it already does so or cannot, else a clone.
func bounded(rdb redis.UniversalClient) redis.UniversalClient {
	c, ok := rdb.(*redis.Client)
	if !ok {
		return rdb
	}
	o := c.Options()
	// Options holds the timeouts as go-redis uses them: -1 is the -2 of
	// the client's options, no deadline set at all.
	if o.ContextTimeoutEnabled || o.ReadTimeout < 0 || o.WriteTimeout < 0 {
		return rdb
	}
	read, write := o.ReadTimeout, o.WriteTimeout
	clone := c.WithTimeout(read)
	co := clone.Options() // the clone's own copy
	co.WriteTimeout = write
	co.ContextTimeoutEnabled = true
	return clone
}

func (s *Store) key(kind, upstream string) string { return s.prefix + kind + ":" + upstream }

// extend sets KEYS[1] to ARGV[2] for ARGV[1] milliseconds, unless it
// already lasts longer, and not past ARGV[3] milliseconds: a key that lasts
// longer than that (maxFor) is garbage, which it replaces.
var extend = redis.NewScript(`
local left = redis.call('PTTL', KEYS[1])
if left < tonumber(ARGV[1]) or left > tonumber(ARGV[3]) then
	redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[1])
	return 1
end
return 0
`)

// setRate sets member ARGV[1]'s rate ARGV[2] in hash KEYS[1] until ARGV[3]
// milliseconds from the server's now, keeps the hash at least as long
// (never shorter: the other members' rates may last longer), and drops
// the members whose rate expired. A KEYS[1] that is not a hash is garbage,
// which it replaces.
var setRate = redis.NewScript(`
if redis.call('TYPE', KEYS[1]).ok ~= 'hash' then
	redis.call('DEL', KEYS[1])
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2] .. ' ' .. (now + tonumber(ARGV[3])))
if redis.call('PTTL', KEYS[1]) < tonumber(ARGV[3]) then
	redis.call('PEXPIRE', KEYS[1], ARGV[3])
end
local all = redis.call('HGETALL', KEYS[1])
for i = 1, #all, 2 do
	local untilMs = tonumber(string.match(all[i + 1], ' (%d+)$'))
	if untilMs == nil or untilMs < now then
		redis.call('HDEL', KEYS[1], all[i])
	end
end
return 1
`)

// message is an event on the channel.
type message struct {
	Upstream string  `json:"u"`
	Kind     string  `json:"k"`
	Millis   int64   `json:"ms,omitempty"`
	Reason   string  `json:"r,omitempty"`
	Rate     float64 `json:"rps,omitempty"`
	AtMicros int64   `json:"at,omitempty"` // unix microseconds
	Member   string  `json:"m"`
	Ref      string  `json:"ref,omitempty"` // Pin: the reference to the state
	Key      string  `json:"key,omitempty"` // Pin: the name of the key that holds it
}

var kinds = map[string]failover.SharedKind{}

func init() {
	for _, k := range []failover.SharedKind{failover.SharedOpen, failover.SharedClosed, failover.SharedCooling, failover.SharedFailure, failover.SharedReset, failover.SharedRate, failover.SharedPin} {
		kinds[k.String()] = k
	}
}

// Publish records e and sends it on the channel, in one round trip.
func (s *Store) Publish(ctx context.Context, e failover.SharedEvent) error {
	if _, ok := kinds[e.Kind.String()]; !ok {
		return errors.New("redisshared: unknown event kind")
	}
	// Past maxFor, every reader takes a duration for corrupt: a longer
	// one is shared for maxFor, not dropped.
	millis := min(e.For.Milliseconds(), maxFor.Milliseconds())
	msg, err := json.Marshal(message{Upstream: e.Upstream, Kind: e.Kind.String(), Millis: millis, Reason: string(e.Reason), Rate: e.Rate, AtMicros: micros(e.At), Member: e.Member, Ref: e.Ref, Key: e.Key})
	if err != nil {
		return err
	}
	ms := max(millis, 1)
	if e.Kind == failover.SharedRate {
		return setRate.Run(ctx, s.rdb, []string{s.key("rates", e.Upstream)}, e.Member, strconv.FormatFloat(e.Rate, 'g', 6, 64), ms).Err()
	}
	_, err = s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		switch e.Kind {
		case failover.SharedOpen:
			p.Del(ctx, s.key("closed", e.Upstream))
			extend.Eval(ctx, p, []string{s.key("open", e.Upstream)}, ms, "1", maxFor.Milliseconds())
		case failover.SharedCooling:
			reason := string(e.Reason)
			if reason == "" {
				reason = string(failover.CooldownRateLimited)
			}
			extend.Eval(ctx, p, []string{s.key("cool", e.Upstream)}, ms, reason, maxFor.Milliseconds())
		case failover.SharedClosed, failover.SharedReset:
			p.Del(ctx, s.key("open", e.Upstream))
			p.Del(ctx, s.key("probe", e.Upstream))
			p.Set(ctx, s.key("closed", e.Upstream), "1", time.Duration(ms)*time.Millisecond)
			if e.Kind == failover.SharedReset {
				p.Del(ctx, s.key("cool", e.Upstream))
			}
		}
		p.Publish(ctx, s.channel, msg)
		return nil
	})
	return err
}

// Load reads the open and cool keys of upstreams, in one round trip.
func (s *Store) Load(ctx context.Context, upstreams []string) ([]failover.SharedEvent, error) {
	type read struct {
		open   *redis.DurationCmd
		closed *redis.DurationCmd
		cool   *redis.DurationCmd
		why    *redis.StringCmd
		rates  *redis.MapStringStringCmd
	}
	reads := make([]read, len(upstreams))
	var clock *redis.TimeCmd
	cmds, _ := s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		clock = p.Time(ctx)
		for i, u := range upstreams {
			reads[i].rates = p.HGetAll(ctx, s.key("rates", u))
			reads[i].open = p.PTTL(ctx, s.key("open", u))
			reads[i].closed = p.PTTL(ctx, s.key("closed", u))
			reads[i].cool = p.PTTL(ctx, s.key("cool", u))
			reads[i].why = p.Get(ctx, s.key("cool", u))
		}
		return nil
	})
	for _, c := range cmds {
		// A missing key is an answer, and so is one of another type
		// (garbage another process left, which the next write
		// replaces); any other error makes the whole read unusable, or
		// absent state would read as closed.
		if err := c.Err(); err != nil && !errors.Is(err, redis.Nil) && !redis.HasErrorPrefix(err, "WRONGTYPE") {
			return nil, err
		}
	}
	if len(cmds) == 0 && len(upstreams) > 0 {
		return nil, errors.New("redisshared: empty pipeline")
	}
	now := clock.Val().UnixMilli()
	var out []failover.SharedEvent
	for i, u := range upstreams {
		for member, v := range reads[i].rates.Val() {
			rate, until, ok := strings.Cut(v, " ")
			r, err1 := strconv.ParseFloat(rate, 64)
			ms, err2 := strconv.ParseInt(until, 10, 64)
			// Compared in milliseconds: a far expiry would overflow a
			// Duration into anything.
			if ok && err1 == nil && err2 == nil && ms > now && ms-now <= maxFor.Milliseconds() && r > 0 && r < 1e9 {
				out = append(out, failover.SharedEvent{Upstream: u, Kind: failover.SharedRate, Rate: r, For: time.Duration(ms-now) * time.Millisecond, Member: member})
			}
		}
		if d := reads[i].open.Val(); d > 0 && d <= maxFor {
			out = append(out, failover.SharedEvent{Upstream: u, Kind: failover.SharedOpen, For: d})
		}
		if d := reads[i].closed.Val(); d > 0 && d <= maxFor {
			out = append(out, failover.SharedEvent{Upstream: u, Kind: failover.SharedClosed, For: d})
		}
		if d := reads[i].cool.Val(); d > 0 && d <= maxFor {
			out = append(out, failover.SharedEvent{Upstream: u, Kind: failover.SharedCooling, For: d, Reason: reason(reads[i].why.Val())})
		}
	}
	return out, nil
}

// reason returns r as a CooldownReason, or the default for anything
// unknown.
func reason(r string) failover.CooldownReason {
	if failover.CooldownReason(r) == failover.CooldownQuotaExhausted {
		return failover.CooldownQuotaExhausted
	}
	return failover.CooldownRateLimited
}

// Subscribe delivers the channel's events until ctx is done or the
// connection fails. Messages that do not parse are skipped.
//
// Every call into go-redis has a deadline, subscribeBound at most after
// it begins: go-redis connects a subscription (its handshake, and again
// after a broken connection) under the PubSub's lock, which its Close takes
// too, and waits for Redis's answers with no deadline but the context's,
// so that a Redis that accepts connections and never answers would hold
// the call past ctx's end, and Transport.Close with it. The reads wait in
// slices of half that, and a quiet spell of healthCheck is timed across
// them.
func (s *Store) Subscribe(ctx context.Context, deliver func(failover.SharedEvent)) error {
	setup, cancel := context.WithTimeout(ctx, subscribeBound)
	defer cancel()
	ps := s.rdb.Subscribe(setup, s.channel)
	defer ps.Close()
	// go-redis's blocking read does not watch ctx: closing ends it.
	stop := context.AfterFunc(ctx, func() { ps.Close() })
	defer stop()
	if _, err := ps.ReceiveTimeout(setup, subscribeBound); err != nil {
		return cmp.Or(ctx.Err(), err)
	}
	cancel()
	quiet, pinged := time.Now(), false
	for {
		// A connection that died without a word would keep the read
		// waiting for minutes: after a quiet spell a PING goes out, and
		// its answer must come before the next one is due. The read
		// times out before its context does: go-redis takes a context's
		// end for a broken connection, and connects again.
		call, cancel := context.WithTimeout(ctx, subscribeBound)
		msg, err := ps.ReceiveTimeout(call, min(healthCheck, subscribeBound/2))
		var nerr net.Error
		switch {
		case errors.As(err, &nerr) && nerr.Timeout() && ctx.Err() == nil:
			if time.Since(quiet) < healthCheck {
				cancel()
				continue
			}
			if pinged {
				cancel()
				return errors.New("redisshared: the subscription did not answer PING")
			}
			err := ps.Ping(call)
			cancel()
			if err != nil {
				return cmp.Or(ctx.Err(), err)
			}
			quiet, pinged = time.Now(), true
			continue
		case err != nil:
			cancel()
			return cmp.Or(ctx.Err(), err)
		}
		cancel()
		quiet, pinged = time.Now(), false
		if m, ok := msg.(*redis.Message); ok {
			if e, ok := s.decode(m.Payload); ok {
				deliver(e)
			}
		}
	}
}

// healthCheck is how long a subscription may be quiet before it is pinged.
var healthCheck = 15 * time.Second

// subscribeBound bounds each of Subscribe's calls into go-redis: far more
// than a Redis on a loaded machine takes to answer, and less than the
// second past its call's bound that Transport.Close waits for a call to
// return.
const subscribeBound = time.Second

func (s *Store) decode(payload string) (failover.SharedEvent, bool) {
	var m message
	if json.Unmarshal([]byte(payload), &m) != nil || m.Upstream == "" {
		return failover.SharedEvent{}, false
	}
	k, ok := kinds[m.Kind]
	// Compared in milliseconds: a huge count would overflow a Duration
	// into anything, a plausible hour included.
	if !ok || m.Millis < 0 || m.Millis > maxFor.Milliseconds() || m.Rate < 0 || m.Rate > 1e9 || m.Rate != m.Rate {
		return failover.SharedEvent{}, false
	}
	d := time.Duration(m.Millis) * time.Millisecond
	var at time.Time
	if m.AtMicros > 0 {
		at = time.UnixMicro(m.AtMicros)
	}
	return failover.SharedEvent{Upstream: m.Upstream, Kind: k, For: d, Reason: reason(m.Reason), Rate: m.Rate, At: at, Member: m.Member, Ref: m.Ref, Key: m.Key}, true
}

// micros is t in unix microseconds, 0 for the zero time.
func micros(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixMicro()
}

// acquire takes KEYS[1] for ARGV[1] for ARGV[2] milliseconds (SET NX PX),
// or renews it when ARGV[1] holds it already. A KEYS[1] that never
// expires or is not a string is garbage (no member's lease), which it
// replaces: left, it would keep every member from probing.
var acquire = redis.NewScript(`
if redis.call('TYPE', KEYS[1]).ok ~= 'string' or redis.call('PTTL', KEYS[1]) == -1 then
	redis.call('DEL', KEYS[1])
end
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
	return 1
end
if redis.call('GET', KEYS[1]) == ARGV[1] then
	redis.call('PEXPIRE', KEYS[1], ARGV[2])
	return 1
end
return 0
`)

// AcquireProbe takes the probe lease of upstream for member with SET NX
// and a TTL, in one script. A member that holds it already holds it for
// ttl from now.
func (s *Store) AcquireProbe(ctx context.Context, upstream, member string, ttl time.Duration) (bool, error) {
	n, err := acquire.Run(ctx, s.rdb, []string{s.key("probe", upstream)}, member, max(ttl, time.Millisecond).Milliseconds()).Int()
	return n == 1, err
}
