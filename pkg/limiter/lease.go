package limiter

import (
	"context"
	"sync"
	"time"
)

// Leases (a rule's `lease: L`, token bucket only) trade exactness for speed,
// as Gubernator's GLOBAL behaviour and Unkey's local limits do: when Redis
// admits a check on a leasing rule, the script takes up to L units of the
// key's bucket at once (min(L, its whole tokens)), and this instance spends
// what the check did not need in-process until the lease ends. A check whose
// every rule has a lease with units left is answered without Redis.
//
// Bound: over any interval T a key is admitted at most
//
//	capacity + rate × T + I × L
//
// with I limiter instances: units are taken from Redis before they are spent,
// so leasing never spends what Redis did not grant; what it costs is that a
// bucket Redis sees emptier than it is may meanwhile refill up to its cap
// once per outstanding lease (at most L per instance) and that units sitting
// in one instance's lease are not available to another (under-admission,
// until the lease ends). A lease ends after min(period, leaseLife), or at once
// when its rule binds differently (a reloaded limit, a new scale or a
// penalty's multiplier — a penalty written meanwhile takes effect at the
// lease's end); its unused units are given back to Redis.
type leases struct{ keyShards[lease] }

const leaseLife = time.Second

type leaseShard = keyShard[lease]

// keyShards holds values by key in 64 maps, each behind its own lock, so
// that checks of different keys seldom wait for each other (the leases, the
// local buckets). Each map holds at most max values; what a full one drops
// is its user's choice.
type keyShards[V any] struct {
	max    int // per shard
	shards [64]keyShard[V]
}

type keyShard[V any] struct {
	mu sync.Mutex
	m  map[string]*V
}

// init makes the maps, room for max values in all.
func (k *keyShards[V]) init(max int) {
	k.max = (max + len(k.shards) - 1) / len(k.shards)
	for i := range k.shards {
		k.shards[i].m = make(map[string]*V)
	}
}

// shard is key's shard, by FNV-1a of the key.
func (k *keyShards[V]) shard(key string) *keyShard[V] {
	h := uint32(2166136261) // FNV-1a
	for i := 0; i < len(key); i++ {
		h = (h ^ uint32(key[i])) * 16777619
	}
	return &k.shards[h%uint32(len(k.shards))]
}

// lease is one key's units held by this instance, and how often the key is
// checked here: a key checked about once per leaseLife asks for no lease —
// it would take units, let them expire and give them back at every check:
// twice the Redis calls (peerbench, 10,000 users at under one check a second
// each).
type lease struct {
	since     time.Time // start of the current counting window
	n, prev   int64     // checks in the current and the previous window
	units     int64
	expires   time.Time
	sig       ruleSig
	mult      float64 // the penalty multiplier the units were granted under
	limit     int64   // the effective limit Redis reported at the take
	remaining int64   // what Redis said remained after the take
	// what giving the units back needs: the rule as bound and its tag's key
	back       bound
	penaltyKey string
}

func newLeases(max int) *leases {
	l := &leases{}
	l.init(max)
	return l
}

// take spends cost from key's lease when one is live, bound the same way and
// holds enough. Units of a lease found ended (or bound differently) are
// returned as stale, for the caller to give back; the key's record stays.
func (l *leases) take(key string, sig ruleSig, cost int64, now time.Time) (got lease, ok bool, stale *lease) {
	s := l.shard(key)
	s.mu.Lock()
	defer s.mu.Unlock()
	le := s.m[key]
	if le == nil {
		return lease{}, false, nil
	}
	if le.units > 0 && (!now.Before(le.expires) || le.sig != sig) {
		old := *le
		stale, le.units = &old, 0
	}
	if le.units < cost {
		return lease{}, false, stale
	}
	le.units -= cost
	return *le, true, stale
}

// demand counts this check of key and returns the checks of key on this
// instance in the last leaseLife (the larger of the current and the
// previous window).
func (l *leases) demand(key string, now time.Time) (int64, *lease) {
	s := l.shard(key)
	s.mu.Lock()
	defer s.mu.Unlock()
	le := s.m[key]
	var evicted *lease
	if le == nil {
		evicted = l.room(s)
		le = &lease{since: now}
		s.m[key] = le
	}
	if d := now.Sub(le.since); d >= leaseLife {
		if d >= 2*leaseLife {
			le.prev = 0
		} else {
			le.prev = le.n
		}
		le.n, le.since = 0, now
	}
	le.n++
	return max(le.n, le.prev), evicted
}

// room evicts one record from a full shard (s.mu held), returning it when
// it holds units to give back.
func (l *leases) room(s *leaseShard) *lease {
	if len(s.m) < l.max {
		return nil
	}
	for k, le := range s.m { // bounded memory: evict one
		delete(s.m, k)
		if le.units > 0 {
			return le
		}
		return nil
	}
	return nil
}

// give puts back what take spent when the check as a whole could not be
// answered from leases.
func (l *leases) give(key string, cost int64) {
	s := l.shard(key)
	s.mu.Lock()
	if le := s.m[key]; le != nil {
		le.units += cost
	}
	s.mu.Unlock()
}

// put adds units Redis granted beyond a check's cost to key's lease: to the
// live one when it is bound the same way (its end stays), else as a new
// lease. Units of the lease it replaces, if any, are returned to be given
// back.
func (l *leases) put(key string, add lease, now time.Time) (stale *lease) {
	s := l.shard(key)
	s.mu.Lock()
	defer s.mu.Unlock()
	le := s.m[key]
	if le == nil {
		stale = l.room(s)
		le = &lease{since: now}
		s.m[key] = le
	}
	if le.units > 0 && now.Before(le.expires) && le.sig == add.sig && le.mult == add.mult {
		le.units += add.units
		le.limit, le.remaining = add.limit, add.remaining
		return stale
	}
	if le.units > 0 {
		old := *le
		stale = &old
	}
	since, n, prev := le.since, le.n, le.prev
	*le = add
	le.since, le.n, le.prev = since, n, prev
	return stale
}

// leaseLifetime is how long a rule's lease lives: its period, at most leaseLife.
func leaseLifetime(b *bound) time.Duration { return min(b.period, leaseLife) }

// hasLeases reports whether any rule of the check leases: the only checks
// that read or write this instance's leases.
func (e *Engine) hasLeases(groups []*group) bool {
	for _, g := range groups {
		for i := range g.rules {
			if g.rules[i].lease > 0 {
				return true
			}
		}
	}
	return false
}

// fromLeases answers a check from this instance's leases when every rule it
// binds leases and has the units; otherwise it spends nothing.
func (e *Engine) fromLeases(groups []*group, plan string, now time.Time) (Result, bool) {
	for _, g := range groups {
		for i := range g.rules {
			if g.rules[i].lease == 0 {
				return Result{}, false
			}
		}
	}
	type spent struct {
		key  string
		cost int64
	}
	var taken [4]spent
	done := taken[:0]
	r := Result{Allowed: true, Penalty: 1, Scale: 1, Now: now.UTC(), Plan: plan}
	for _, g := range groups {
		for i := range g.rules {
			b := &g.rules[i]
			le, ok, stale := e.leases.take(b.keys[0], b.sig(), b.cost, now)
			if stale != nil {
				e.giveBack(stale)
			}
			if !ok {
				for _, d := range done {
					e.leases.give(d.key, d.cost)
				}
				return Result{}, false
			}
			done = append(done, spent{b.keys[0], b.cost})
			if g.penalize {
				r.Penalty = le.mult
			}
			r.Cost = int(b.cost)
			r.Tiers = append(r.Tiers, TierResult{Rule: b.id, Tier: b.tier, Algorithm: b.alg, Limit: le.limit,
				Remaining: le.remaining + le.units, Period: b.period, Scale: b.scale, Quota: b.limit, Allowed: true})
		}
	}
	e.m.leaseHits.Inc()
	return r, true
}

// askLeases turns off, for this call, the lease of every rule whose key was
// checked once on this instance in the last leaseLife: a sparse key goes to
// Redis exactly, as without a lease. (Sizing the lease to the key's checks
// instead ramped hot keys up slowly — 52 instead of 64 of 80 checks from
// leases in TestLeaseBoundAcrossInstances — and did not change peerbench.)
func (e *Engine) askLeases(groups []*group, now time.Time) {
	for _, g := range groups {
		for i := range g.rules {
			b := &g.rules[i]
			if b.lease == 0 {
				continue
			}
			n, evicted := e.leases.demand(b.keys[0], now)
			if evicted != nil {
				e.giveBack(evicted)
			}
			if n < 2 {
				b.lease = 0
			}
		}
	}
}

// keepLease puts the units Redis granted a leasing rule beyond the check's
// cost into this instance's lease.
func (e *Engine) keepLease(g *group, b *bound, t TierResult, took int64, mult float64, now time.Time) {
	if took <= b.cost {
		return
	}
	back := *b
	back.keys = []string{b.keys[0]}
	stale := e.leases.put(b.keys[0], lease{units: took - b.cost, expires: now.Add(leaseLifetime(b)), sig: b.sig(), mult: mult,
		limit: t.Limit, remaining: t.Remaining, back: back, penaltyKey: g.penaltyKey}, now)
	if stale != nil {
		e.giveBack(stale)
	}
}

// giveBack returns a lease's unused units to its Redis bucket (the script's
// refund, capped at the bucket's capacity), in the background.
func (e *Engine) giveBack(le *lease) {
	if le.units <= 0 {
		return
	}
	b := le.back
	b.cost, b.lease = le.units, 0
	g := &group{penaltyKey: le.penaltyKey, rules: []bound{b}}
	e.m.leaseReturned.Add(float64(le.units))
	go e.refund(context.Background(), g, "1")
}
