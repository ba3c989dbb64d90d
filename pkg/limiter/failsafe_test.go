package limiter

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/floodgate-dev/floodgate/pkg/events"
	"github.com/floodgate-dev/floodgate/pkg/limiter/admission"
	"github.com/floodgate-dev/floodgate/pkg/redisx"
	"github.com/floodgate-dev/floodgate/pkg/redisx/redistest"
)

// countingHook counts every command and pipeline a client sends (or tries to).
type countingHook struct{ calls atomic.Int64 }

func (h *countingHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *countingHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.calls.Add(1)
		return next(ctx, cmd)
	}
}

func (h *countingHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		h.calls.Add(1)
		return next(ctx, cmds)
	}
}

// deadRedis is a client for a port nothing listens on.
func deadRedis(t *testing.T) (redis.UniversalClient, *countingHook) {
	c := redistest.Dead(t)
	h := &countingHook{}
	c.AddHook(h)
	return c, h
}

type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

// failRules: one rule per fail policy, and one in shadow.
var failRules = mustRead("limitertest/testdata/fail-rules.yaml")

func TestEngineFailPoliciesWhenRedisIsUnreachable(t *testing.T) {
	rdb, _ := deadRedis(t)
	clock := &fakeClock{now: time.Date(2030, 1, 1, 12, 0, 0, 0, time.UTC)}
	e := newTestEngine(t, rdb, failRules, func(c *EngineConfig) {
		c.Budget, c.BreakerFailures, c.Clock = 300*time.Millisecond, 1000, clock.Now
	})
	cases := []struct {
		name    string
		kind    events.PrincipalKind
		allowed []bool
	}{
		{"open allows", events.PrincipalUser, []bool{true, true, true}},
		{"closed denies", events.PrincipalBot, []bool{false, false}},
		{"local enforces an in-process bucket", events.PrincipalAPIKey, []bool{true, true, false, false}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := events.Principal{Kind: tc.kind, ID: redistest.Unique(t, "dead")}
			for i, want := range tc.allowed {
				r := check(t, e, Request{Principal: p, Cost: 1})
				require.Equal(t, want, r.Allowed, "request %d", i)
				require.True(t, r.Degraded)
				require.Contains(t, r.Error, "redis")
				require.False(t, r.Shadow, "shadow rules are not evaluated without Redis")
				if !want {
					require.Positive(t, r.RetryAfter, "the contract's Retry-After")
				}
			}
		})
	}
	t.Run("local bucket refills on the local clock", func(t *testing.T) {
		p := events.Principal{Kind: events.PrincipalAPIKey, ID: redistest.Unique(t, "dead")}
		require.True(t, check(t, e, Request{Principal: p, Cost: 2}).Allowed)
		require.False(t, check(t, e, Request{Principal: p, Cost: 1}).Allowed)
		clock.Advance(30 * time.Minute)
		require.True(t, check(t, e, Request{Principal: p, Cost: 1}).Allowed)
	})
}

func TestBreakerStopsCallingADeadRedis(t *testing.T) {
	rdb, hook := deadRedis(t)
	e := newTestEngine(t, rdb, failRules, func(c *EngineConfig) {
		c.Budget, c.BreakerFailures, c.BreakerOpen = 300*time.Millisecond, 2, time.Hour
	})
	p := events.Principal{Kind: events.PrincipalUser, ID: "breaker"}
	for range 2 {
		r := check(t, e, Request{Principal: p, Cost: 1})
		require.True(t, r.Degraded)
		require.Equal(t, "redis unavailable", r.Error)
	}
	before := hook.calls.Load()
	require.Positive(t, before, "the first checks did try Redis")
	for range 100 {
		r := check(t, e, Request{Principal: p, Cost: 1})
		require.True(t, r.Allowed, "fail open")
		require.True(t, r.Degraded)
		require.Equal(t, "redis circuit open", r.Error)
	}
	require.Equal(t, before, hook.calls.Load(), "an open breaker must not call Redis")
}

func TestOverLimitCacheDeniesWithoutRedis(t *testing.T) {
	rdb := redistest.Client(t)
	hook := &countingHook{}
	rdb.AddHook(hook)
	clock := &fakeClock{now: time.Now()}
	rules := "version: 1\nrules:\n  - {id: p, tier: principal, limit: 2, period: 1m}\n  - {id: s, tier: principal, limit: 1, period: 1m, shadow: true}\n"
	e := newTestEngine(t, rdb, rules, func(c *EngineConfig) { c.OverLimitEntries, c.Clock = 100, clock.Now })
	p := principal(t)
	require.True(t, check(t, e, Request{Principal: p, Cost: 1}).Allowed)
	require.True(t, check(t, e, Request{Principal: p, Cost: 1}).Allowed, "shadow denials are never cached")
	r := check(t, e, Request{Principal: p, Cost: 1})
	require.False(t, r.Allowed)
	require.False(t, r.Cached)
	calls := hook.calls.Load()

	for range 50 {
		r = check(t, e, Request{Principal: p, Cost: 1})
		require.False(t, r.Allowed)
		require.True(t, r.Cached)
		require.Equal(t, "p", r.Rule)
		require.Equal(t, 2, r.Limit)
		require.Positive(t, r.RetryAfter)
	}
	require.Equal(t, calls, hook.calls.Load(), "keys known over their limit must not reach Redis")

	// Another principal is unaffected; after the retry time Redis is asked again.
	require.True(t, check(t, e, Request{Principal: principal(t), Cost: 1}).Allowed)
	clock.Advance(31 * time.Second)
	calls = hook.calls.Load()
	r = check(t, e, Request{Principal: p, Cost: 1})
	require.False(t, r.Cached)
	require.Greater(t, hook.calls.Load(), calls)
}

func TestOverLimitCacheEntryCoversOnlyLargerCosts(t *testing.T) {
	c := newOverLimitCache(2)
	now := time.Now()
	sig := ruleSig{alg: TokenBucket, limit: 5, burst: 5, period: time.Second, scale: 1}
	c.put("k", sig, TierResult{Rule: "r"}, 0.5, 5, now, now.Add(time.Minute))
	_, _, ok := c.get("k", sig, 4, now)
	require.False(t, ok, "a denial of cost 5 says nothing about cost 4")
	ent, left, ok := c.get("k", sig, 5, now)
	require.True(t, ok)
	require.Equal(t, 0.5, ent.penalty)
	require.Equal(t, time.Minute, left)
	for _, changed := range []ruleSig{{alg: GCRA, limit: 5, burst: 5, period: time.Second, scale: 1},
		{alg: TokenBucket, limit: 6, burst: 5, period: time.Second, scale: 1}, {alg: TokenBucket, limit: 5, burst: 6, period: time.Second, scale: 1},
		{alg: TokenBucket, limit: 5, burst: 5, period: time.Minute, scale: 1}, {alg: TokenBucket, limit: 5, burst: 5, period: time.Second, scale: 2}} {
		c.put("k", sig, TierResult{Rule: "r"}, 0.5, 5, now, now.Add(time.Minute))
		_, _, ok = c.get("k", changed, 5, now)
		require.False(t, ok, "the rule now binds as %+v: the entry no longer stands", changed)
	}
	c.put("k", sig, TierResult{Rule: "r"}, 0.5, 5, now, now.Add(time.Minute))
	_, _, ok = c.get("k", sig, 9, now.Add(time.Minute))
	require.False(t, ok, "expired")
	c.put("a", sig, TierResult{}, 1, 1, now, now.Add(time.Hour))
	c.put("b", sig, TierResult{}, 1, 1, now, now.Add(time.Hour))
	c.put("c", sig, TierResult{}, 1, 1, now, now.Add(time.Hour))
	_, _, ok = c.get("c", sig, 1, now)
	require.False(t, ok, "a full cache of live entries takes no more")
}

func TestOverLimitCacheKeepsThePenaltyReason(t *testing.T) {
	rdb := redistest.Client(t)
	e := newTestEngine(t, rdb, "version: 1\nrules:\n  - {id: p, tier: principal, limit: 10, period: 1h}\n", func(c *EngineConfig) { c.OverLimitEntries = 100 })
	p := principal(t)
	require.NoError(t, rdb.HSet(context.Background(), redisx.PenaltyKey(string(p.Kind), p.ID), redisx.PenaltyFieldMultiplier, "0.1").Err())
	require.True(t, check(t, e, Request{Principal: p, Cost: 1}).Allowed)
	for i := range 3 {
		r := check(t, e, Request{Principal: p, Cost: 1})
		require.False(t, r.Allowed)
		require.Equal(t, i > 0, r.Cached)
		require.Equal(t, events.TierPenalty, r.Tier, "check %d", i)
		require.InDelta(t, 0.1, r.Penalty, 1e-9) // the contract's abnormal-usage problem (server.DenialProblem)
	}
}

// TestLocalBucketsShareTheLimitWithRedis: a key served by Redis and by local
// answers at once (a limiter past its capacity sheds some of its checks)
// is admitted about its limit in total, not its limit from each side: local
// admissions are debt that every Redis answer is read against. Redis is
// modelled as the token bucket it runs; an abusive key sends 1,000 checks/s
// against a limit of 50/s for 10 s, half of them shed (in stretches).
func TestLocalBucketsShareTheLimitWithRedis(t *testing.T) {
	// answered by Redis in stretches of 20 ms, as admission limits open and close
	admitted, _ := splitChecks(10_000, time.Millisecond, func(i int) bool { return (i/20)%2 == 0 })
	most := float64(splitLimit) + splitLimit*10
	t.Logf("admitted %d, %.2f× the limit", admitted, float64(admitted)/most)
	require.LessOrEqual(t, float64(admitted), 1.2*most, "both sides together stay near the limit")
	require.GreaterOrEqual(t, float64(admitted), 0.9*most, "and still admit it")
}

// TestLocalBucketsAdmitAKeyUnderItsLimit: the same split for a key at half
// its limit (25 checks/s against 50/s): every check is admitted, by Redis
// or locally — Redis's answers keep the local bucket full.
func TestLocalBucketsAdmitAKeyUnderItsLimit(t *testing.T) {
	_, denied := splitChecks(250, 40*time.Millisecond, func(i int) bool { return (i/5)%2 == 0 }) // 10 s
	require.Zero(t, denied, "a key under its limit is never denied, shed or not")
}

// splitLimit is splitChecks' limit, a second's worth.
const splitLimit = 50

// splitChecks sends n checks of one key, one every step, to Redis when
// byRedis(i) and otherwise to local buckets that observe Redis's answers,
// and counts the checks admitted and denied on both sides. Redis is
// modelled as the token bucket it runs (splitLimit a second, full at the
// start).
func splitChecks(n int, step time.Duration, byRedis func(i int) bool) (admitted, denied int) {
	const limit, period = splitLimit, time.Second
	l := newLocalBuckets(100)
	start := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	redisTokens, redisAt := float64(limit), start
	for i := range n {
		now := start.Add(time.Duration(i) * step)
		if byRedis(i) {
			redisTokens = min(limit, redisTokens+float64(now.Sub(redisAt))*limit/float64(period))
			redisAt = now
			taken := int64(0)
			if redisTokens >= 1 {
				redisTokens--
				admitted++
				taken = 1
			} else {
				denied++
			}
			l.observe("k", limit, limit, int64(redisTokens), taken, period, 1, now)
			continue
		}
		if ok, _, _ := l.take("k", limit, limit, 1, period, 1, now); ok {
			admitted++
		} else {
			denied++
		}
	}
	return admitted, denied
}

// TestShedAbuserStaysNearItsLimit: the engine on real Redis with room for two
// checks in flight, 64 callers hammering one abusive bot (limit 50/s, fail
// open): most checks are shed and answered from the local bucket while
// Redis answers the rest, its answers arriving while local answers spend.
// Together they admit the limit plus at most one capacity (the local
// bucket's debt bound), not the limit from each side. Before the debt, every
// Redis answer handed the local side what Redis still held again: 435 local
// admissions beside Redis's 299 in 5 s (2.4× the limit).
func TestShedAbuserStaysNearItsLimit(t *testing.T) {
	rdb := redistest.Client(t)
	const limit = 50
	e := newTestEngine(t, rdb, "version: 1\nrules:\n  - {id: abuser, tier: principal, kinds: [bot], limit: 50, period: 1s, fail: open}\n", func(c *EngineConfig) {
		adm := admission.DefaultConfig()
		adm.Min, adm.Initial, adm.Max = 2, 2, 2
		// No queue: a check past the two in flight is shed at once. With
		// the queue a quiet machine's Redis frees a permit within its wait,
		// nothing is shed, and the local bucket this test is about is never
		// asked.
		adm.Queue = admission.QueueConfig{}
		c.admission = &adm
	})
	bot := events.Principal{Kind: events.PrincipalBot, ID: redistest.Unique(t, "abuser")}
	var byRedis, local, denied atomic.Int64
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	start := time.Now()
	var wg sync.WaitGroup
	for range 64 {
		wg.Go(func() {
			for ctx.Err() == nil {
				r, err := e.Check(context.Background(), Request{Principal: bot, Method: "GET", Route: "/x", Cost: 1})
				switch {
				case err != nil:
					t.Error(err)
					return
				case r.Allowed && r.Degraded:
					require.Equal(t, ShedReason, r.Error, "shed, never failed open")
					local.Add(1)
				case r.Allowed:
					byRedis.Add(1)
				default:
					denied.Add(1)
				}
				time.Sleep(time.Millisecond)
			}
		})
	}
	wg.Wait()
	most := limit + limit*time.Since(start).Seconds() // Redis's burst and refill
	admitted := float64(byRedis.Load() + local.Load())
	t.Logf("Redis admitted %d, local %d, denied %d; the limit allows %.0f: %.2f×", byRedis.Load(), local.Load(), denied.Load(), most, admitted/most)
	require.Positive(t, local.Load(), "checks were shed and answered locally")
	require.Positive(t, denied.Load())
	require.LessOrEqual(t, admitted, most+limit, "at most one capacity beyond the limit")
}
