package limiter

import (
	"sync"
	"time"
)

// overLimitCache remembers keys Redis said are over their limit, until their
// retry time, so an attack on one key is denied in-process (envoy ratelimit's
// local over-limit cache). An entry denied for cost c stands for any cost ≥ c.
// An entry stands only while its rule binds the same way (limit, burst, period,
// algorithm, adjuster scale), so a reloaded rules file, an override or a new scale
// takes effect at once; a penalty lifted meanwhile (it lives in Redis) takes
// effect at the entry's expiry.
type overLimitCache struct {
	mu      sync.Mutex
	max     int
	entries map[string]overLimitEntry
}

type overLimitEntry struct {
	tier    TierResult
	penalty float64 // the principal's multiplier when Redis denied: the 429 keeps its reason
	cost    int64
	until   time.Time
	rule    ruleSig // how the rule was bound when Redis denied
}

// ruleSig is what of a bound rule decides its limit.
type ruleSig struct {
	alg          Algorithm
	limit, burst int64
	period       time.Duration
	scale        float64
}

func (b *bound) sig() ruleSig {
	return ruleSig{alg: b.alg, limit: b.limit, burst: b.burst, period: b.period, scale: b.scale}
}

func newOverLimitCache(max int) *overLimitCache {
	return &overLimitCache{max: max, entries: make(map[string]overLimitEntry)}
}

func (c *overLimitCache) put(key string, rule ruleSig, t TierResult, penalty float64, cost int64, now, until time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.entries) >= c.max {
		for k, e := range c.entries {
			if !now.Before(e.until) {
				delete(c.entries, k)
			}
		}
		if len(c.entries) >= c.max {
			return // full of live entries: Redis keeps answering
		}
	}
	c.entries[key] = overLimitEntry{tier: t, penalty: penalty, cost: cost, until: until, rule: rule}
}

func (c *overLimitCache) get(key string, rule ruleSig, cost int64, now time.Time) (overLimitEntry, time.Duration, bool) {
	c.mu.Lock()
	e, ok := c.entries[key]
	if ok && (!now.Before(e.until) || e.rule != rule) {
		delete(c.entries, key)
		ok = false
	}
	c.mu.Unlock()
	if !ok || cost < e.cost {
		return overLimitEntry{}, 0, false
	}
	return e, e.until.Sub(now), true
}

func (e *Engine) fromOverLimitCache(groups []*group, cost int64, now time.Time) (Result, bool) {
	if e.overLimit == nil {
		return Result{}, false
	}
	for _, g := range groups {
		for _, b := range g.rules {
			if b.shadow {
				continue
			}
			ent, left, ok := e.overLimit.get(b.keys[0], b.sig(), cost, now)
			if !ok {
				continue
			}
			t := ent.tier
			t.RetryAfter, t.Remaining = left, 0
			t.ResetAfter = max(t.ResetAfter, left)
			r := Result{Allowed: false, Cached: true, Penalty: ent.penalty, Now: now.UTC(), Cost: int(cost), Tiers: []TierResult{t}}
			return r, true
		}
	}
	return Result{}, false
}

// localBuckets are the in-process token buckets of answers given without
// Redis — shed checks and the "local" fail policy. Each instance enforces its
// share of a rule: limit ÷ live limiter instances (redisx.LimitersKey), so N
// instances together admit about the limit, not N× it. A bucket is a mirror
// of Redis: every answer Redis gives for a key sets the key's bucket to
// its share of what Redis said remains, so an abusive principal whose
// bucket Redis has emptied is not given a fresh one when its next check is
// shed. Sharded by key; bounded (a full shard is cleared).
type localBuckets struct{ keyShards[localBucket] }

type localShard = keyShard[localBucket]

type localBucket struct {
	tokens float64
	ts     time.Time
	// seen is when Redis last answered for this key (observe). Within a
	// period of it the bucket does not refill on its own: Redis refills the
	// key, and a bucket refilling on both sides admitted the limit from each
	// (an abusive bot 1.4–1.55× its limit at 1.3–2× saturation, make chaos
	// overload).
	seen time.Time
	// debt is what this bucket admitted that Redis never heard of: every
	// answer from Redis is read against it, or each Redis answer would hand
	// the local side what Redis still holds again (an abusive bot 3.6× its
	// limit at 2× saturation, make chaos overload, 2026-11-27). It is paid
	// back by refill Redis threw away (Redis answered full) or by a key left
	// quiet until this bucket is full again; it never exceeds the capacity.
	debt float64
}

func newLocalBuckets(max int) *localBuckets {
	l := &localBuckets{}
	l.init(max)
	return l
}

// get returns key's bucket in s refilled to now (capacity cap, refilling
// limit per period); s.mu is held.
func (l *localBuckets) get(s *localShard, key string, limit, capacity float64, period time.Duration, now time.Time) *localBucket {
	b, ok := s.m[key]
	if !ok {
		if len(s.m) >= l.max {
			clear(s.m) // bounded memory beats perfect memory
		}
		b = &localBucket{tokens: capacity, ts: now}
		s.m[key] = b
		return b
	}
	if d := now.Sub(b.ts); d > 0 {
		if now.Sub(b.seen) >= period {
			b.tokens = min(capacity, b.tokens+float64(d)*limit/float64(period))
			if b.tokens >= capacity {
				b.debt = 0 // quiet long enough to be full: nothing is owed
			}
		}
		b.ts = now
	}
	return b
}

// share is one instance's part of a limit and a capacity among n instances;
// the capacity never drops below one unit.
func share(limit, capacity int64, n int64) (float64, float64) {
	n = max(n, 1)
	return float64(limit) / float64(n), max(float64(capacity)/float64(n), min(float64(capacity), 1))
}

// take consumes cost from this instance's share of key's bucket (limit and
// capacity among n instances). It reports whether it fits, the tokens left
// and the wait for cost.
func (l *localBuckets) take(key string, limit, capacity, cost int64, period time.Duration, n int64, now time.Time) (bool, int64, time.Duration) {
	lim, capf := share(limit, capacity, n)
	s := l.shard(key)
	s.mu.Lock()
	defer s.mu.Unlock()
	b := l.get(s, key, lim, capf, period, now)
	c := float64(cost)
	if b.tokens >= c {
		b.tokens -= c
		b.debt = min(capf, b.debt+c)
		return true, int64(b.tokens), 0
	}
	if c > capf {
		return false, int64(b.tokens), period
	}
	return false, int64(b.tokens), time.Duration((c - b.tokens) * float64(period) / lim)
}

// observe sets key's bucket to this instance's share of what Redis says
// remains, less what this bucket admitted that Redis does not know of (its
// debt), and for a period after it the bucket spends only that: Redis, not
// this bucket, refills a key it is answering. A key answered by Redis and
// by local answers at once (a limiter past its capacity sheds a share of
// its checks) is then admitted about its limit in total, not its limit from
// each side; a key Redis has not answered for a period refills here at this
// instance's share. Over-admission while shedding is bounded by one
// capacity per instance: the most debt a bucket carries.
//
// taken is what the answered check took (remaining is after it): a bucket
// Redis answered full had been throwing refill away, which pays the debt
// back at the refill rate since the previous answer.
func (l *localBuckets) observe(key string, limit, capacity, remaining, taken int64, period time.Duration, n int64, now time.Time) {
	lim, capf := share(limit, capacity, n)
	rem := float64(max(remaining, 0)) / float64(max(n, 1))
	s := l.shard(key)
	s.mu.Lock()
	b := l.get(s, key, lim, capf, period, now)
	if remaining+taken >= capacity && !b.seen.IsZero() && now.After(b.seen) {
		b.debt = max(0, b.debt-float64(now.Sub(b.seen))*lim/float64(period))
	}
	b.tokens, b.seen = max(0, min(capf, rem)-b.debt), now
	s.mu.Unlock()
}

// localLimits is a bound rule's effective limit and capacity (× its scale).
func localLimits(b *bound) (int64, int64) {
	lim := b.limit
	if b.alg != dayQuota && b.alg != dayQuotaPeek {
		lim = max(1, int64(float64(b.limit)*b.scale+1e-9))
	}
	capacity := lim
	if b.burst > 0 {
		capacity = max(lim, int64(float64(b.burst)*b.scale+1e-9))
	}
	return lim, capacity
}

// shed answers a check the limiter had no capacity to send to Redis: every
// rule from this instance's local bucket (whatever its fail policy — being
// busy is not an outage), marked degraded with the reason "overloaded".
func (e *Engine) shed(groups []*group, cost int64, now time.Time) Result {
	return e.answerLocally(groups, cost, ShedReason, true, now)
}

// ShedReason is Result.Error of a check answered from local state because
// the limiter was past its capacity.
const ShedReason = "overloaded"

// degrade answers from each rule's fail policy without Redis.
func (e *Engine) degrade(groups []*group, cost int64, reason string, now time.Time) Result {
	return e.answerLocally(groups, cost, reason, false, now)
}

func (e *Engine) answerLocally(groups []*group, cost int64, reason string, shed bool, now time.Time) Result {
	n := e.instances.Load()
	r := Result{Allowed: true, Degraded: true, Error: reason, Penalty: 1, Now: now.UTC(), Cost: int(cost)}
	for _, g := range groups {
		for _, b := range g.rules {
			if b.shadow {
				continue // shadow rules cannot deny; without Redis there is nothing to report
			}
			lim, capacity := localLimits(&b)
			t := TierResult{Rule: b.id, Tier: b.tier, Algorithm: b.alg, Limit: lim, Remaining: lim, Period: b.period, Scale: b.scale, Quota: b.limit, Allowed: true}
			policy := b.fail
			if shed {
				policy = FailLocal
			}
			switch policy {
			case FailClosed:
				t.Allowed, t.Remaining, t.RetryAfter, t.ResetAfter = false, 0, min(b.period, time.Second), min(b.period, time.Second)
			case FailLocal:
				ok, left, wait := e.local.take(b.keys[0], lim, capacity, cost, b.period, n, now)
				t.Allowed, t.Remaining, t.RetryAfter = ok, left, wait
				if !ok {
					t.ResetAfter = wait
				}
			}
			outcome := "allowed"
			if !t.Allowed {
				outcome = "denied"
				r.Allowed = false
			}
			e.m.degraded.WithLabelValues(string(policy), outcome).Inc()
			r.Tiers = append(r.Tiers, t)
		}
	}
	return r
}
