package limiter

import (
	"context"
	"net/netip"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/floodgate-dev/floodgate/pkg/events"
	"github.com/floodgate-dev/floodgate/pkg/redisx"
	"github.com/floodgate-dev/floodgate/pkg/redisx/redistest"
)

// A check with Request.At runs on that clock, not Redis TIME: a bucket of one
// per hour refills exactly when At says an hour has passed.
func TestEngineRequestAtIsTheScriptClock(t *testing.T) {
	rdb := redistest.Client(t)
	e := newTestEngine(t, rdb, `
version: 1
rules:
  - {id: p, tier: principal, limit: 1, period: 1h}
quotas:
  - {kind: bot, plan: default, limit: 100}
`, nil)
	p := principal(t)
	t.Cleanup(func() { cleanKeys(rdb, "fg:{"+string(p.Kind)+":"+p.ID+"}:*") })
	at := time.Date(2024, 3, 1, 23, 59, 0, 0, time.UTC)
	r := check(t, e, Request{Principal: p, Cost: 1, At: at})
	require.True(t, r.Allowed)
	require.Equal(t, at, r.Now, "the decision's time is At")
	require.Equal(t, DefaultPlan, r.Plan)
	r = check(t, e, Request{Principal: p, Cost: 1, At: at.Add(59 * time.Minute)})
	require.False(t, r.Allowed, "59 minutes later on At's clock: still empty")
	r = check(t, e, Request{Principal: p, Cost: 1, At: at.Add(61 * time.Minute)})
	require.True(t, r.Allowed, "61 minutes later on At's clock: refilled")
	// The daily quota counted on At's days, not today's.
	ctx := context.Background()
	n, err := rdb.Get(ctx, redisx.DayUsageKey(string(p.Kind), p.ID, "2024-03-01")).Int()
	require.NoError(t, err)
	require.Equal(t, 1, n)
	n, err = rdb.Get(ctx, redisx.DayUsageKey(string(p.Kind), p.ID, "2024-03-02")).Int()
	require.NoError(t, err)
	require.Equal(t, 1, n)
}

// An engine with a KeyPrefix reads and writes only keys under it: the same
// principal's keys without the prefix are neither read nor written.
func TestEngineKeyPrefixIsolatesEveryKey(t *testing.T) {
	rdb := redistest.Client(t)
	ctx := context.Background()
	rules := `
version: 1
rules:
  - {id: ip, tier: ip, limit: 100, period: 1h}
  - {id: p, tier: principal, limit: 2, period: 1h}
quotas:
  - {kind: bot, plan: default, limit: 100}
`
	prefix := redistest.Unique(t, "fgtest-prefix") + ":"
	t.Cleanup(func() { cleanKeys(rdb, prefix+"*") })
	iso := newTestEngine(t, rdb, rules, func(c *EngineConfig) { c.KeyPrefix = prefix })
	prod := newTestEngine(t, rdb, rules, nil)
	p := principal(t)
	t.Cleanup(func() { cleanKeys(rdb, "fg:{"+string(p.Kind)+":"+p.ID+"}:*") })
	n := time.Now().UnixNano()
	addr := netip.AddrFrom4([4]byte{10, byte(n >> 16), byte(n >> 8), byte(n)})
	req := Request{Principal: p, Cost: 1, IP: addr}
	// A production penalty of 0.5 does not reach the isolated engine.
	require.NoError(t, rdb.HSet(ctx, redisx.PenaltyKey(string(p.Kind), p.ID), redisx.PenaltyFieldMultiplier, "0.5").Err())
	t.Cleanup(func() { rdb.Del(ctx, redisx.PenaltyKey(string(p.Kind), p.ID)) })
	for range 2 {
		require.True(t, check(t, iso, req).Allowed)
	}
	r := check(t, iso, req)
	require.False(t, r.Allowed)
	require.Equal(t, 1.0, r.Penalty, "the production penalty is not read")
	var keys []string
	for _, pat := range []string{"*" + p.ID + "*", "*{ip:" + addr.String() + "}*"} {
		it := rdb.Scan(ctx, 0, pat, 1000).Iterator()
		for it.Next(ctx) {
			keys = append(keys, it.Val())
		}
		require.NoError(t, it.Err())
	}
	require.GreaterOrEqual(t, len(keys), 4, "penalty, principal bucket, IP bucket, day key(s)")
	for _, k := range keys {
		if k == redisx.PenaltyKey(string(p.Kind), p.ID) {
			continue
		}
		require.Truef(t, len(k) > len(prefix) && k[:len(prefix)] == prefix, "key %s outside the prefix", k)
	}
	require.Equal(t, int64(1), rdb.Exists(ctx, prefix+redisx.BucketKey(string(p.Kind), p.ID, "p|tb")).Val())
	require.Equal(t, int64(1), rdb.Exists(ctx, prefix+redisx.BucketKey("ip", addr.String(), "ip|tb")).Val())
	// The production engine still has the principal's whole bucket (at half, penalized).
	r = check(t, prod, req)
	require.True(t, r.Allowed)
	require.Equal(t, 0.5, r.Penalty)
	require.Equal(t, events.TierPrincipal, r.Tier)

	t.Run("prefix with a brace is refused", func(t *testing.T) {
		_, err := NewEngine(EngineConfig{Redis: rdb, Rules: NewRuleStore(SinglePrincipalRules(1, time.Second)), KeyPrefix: "a{b}:"})
		require.ErrorContains(t, err, "key prefix")
	})
}

// cleanKeys deletes the test's keys matching pattern.
func cleanKeys(rdb redis.UniversalClient, pattern string) {
	ctx := context.Background()
	it := rdb.Scan(ctx, 0, pattern, 1000).Iterator()
	for it.Next(ctx) {
		rdb.Del(ctx, it.Val())
	}
}

// A replay follows its decisions' time only. Its keys outlive the wall clock:
// a bucket of 10 a second, emptied at T, still holds 3 tokens at T+300ms on
// the replay's clock however much later (wall clock) that check is replayed —
// Redis TTLs run on the wall clock, and a bucket whose key expired after its
// wall-clock refill time would come back full. The over-limit cache and the
// local buckets follow At too: an entry cached at T for an hour does not deny
// a request replayed at T+2h.
func TestReplayFollowsOnlyTheDecisionsTime(t *testing.T) {
	rdb := redistest.Client(t)
	ctx := context.Background()

	t.Run("keys outlive a replay slower than the traffic", func(t *testing.T) {
		e := newTestEngine(t, rdb, "version: 1\nrules:\n  - {id: burst, tier: principal, limit: 10, period: 1s}\n", nil)
		p := principal(t)
		t.Cleanup(func() { cleanKeys(rdb, "fg:{"+string(p.Kind)+":"+p.ID+"}:*") })
		at := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
		for i := range 10 {
			require.True(t, check(t, e, Request{Principal: p, Cost: 1, At: at}).Allowed, "check %d", i)
		}
		time.Sleep(2200 * time.Millisecond) // past the live TTL of this bucket (refill 1 s + 1 s)
		allowed := 0
		for range 5 {
			if check(t, e, Request{Principal: p, Cost: 1, At: at.Add(300 * time.Millisecond)}).Allowed {
				allowed++
			}
		}
		require.Equal(t, 3, allowed, "300 ms on the replay's clock refill 3 tokens, whatever the wall clock did")
		ttl, err := rdb.PTTL(ctx, redisx.BucketKey(string(p.Kind), p.ID, "burst|tb")).Result()
		require.NoError(t, err)
		require.Greater(t, ttl, ReplayKeyTTL-time.Minute, "a replay's key lives ReplayKeyTTL, not its refill time")
	})

	t.Run("live checks keep their short TTL", func(t *testing.T) {
		e := newTestEngine(t, rdb, "version: 1\nrules:\n  - {id: burst, tier: principal, limit: 10, period: 1s}\n", nil)
		p := principal(t)
		t.Cleanup(func() { cleanKeys(rdb, "fg:{"+string(p.Kind)+":"+p.ID+"}:*") })
		require.True(t, check(t, e, Request{Principal: p, Cost: 1}).Allowed)
		ttl, err := rdb.PTTL(ctx, redisx.BucketKey(string(p.Kind), p.ID, "burst|tb")).Result()
		require.NoError(t, err)
		require.LessOrEqual(t, ttl, 2*time.Second)
	})

	t.Run("the over-limit cache runs on At", func(t *testing.T) {
		e := newTestEngine(t, rdb, "version: 1\nrules:\n  - {id: hourly, tier: principal, limit: 1, period: 1h}\n",
			func(c *EngineConfig) { c.OverLimitEntries = 100 })
		p := principal(t)
		t.Cleanup(func() { cleanKeys(rdb, "fg:{"+string(p.Kind)+":"+p.ID+"}:*") })
		at := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
		require.True(t, check(t, e, Request{Principal: p, Cost: 1, At: at}).Allowed)
		r := check(t, e, Request{Principal: p, Cost: 1, At: at.Add(time.Minute)})
		require.False(t, r.Allowed)
		r = check(t, e, Request{Principal: p, Cost: 1, At: at.Add(2 * time.Minute)})
		require.False(t, r.Allowed)
		require.True(t, r.Cached, "denied from the cache within the hour on At's clock")
		require.Equal(t, at.Add(2*time.Minute), r.Now)
		r = check(t, e, Request{Principal: p, Cost: 1, At: at.Add(2 * time.Hour)})
		require.True(t, r.Allowed, "two hours later on At's clock the entry has expired and the bucket refilled")
		require.False(t, r.Cached)
	})
}
