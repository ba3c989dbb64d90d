package limiter

import (
	"context"
	"net/netip"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/floodgate-dev/floodgate/pkg/events"
	"github.com/floodgate-dev/floodgate/pkg/redisx"
	"github.com/floodgate-dev/floodgate/pkg/redisx/redistest"
)

// TestSlidingLogState checks what the model test cannot see: the sorted set
// itself (size bound, unique members, TTL), the cap on overridden limits, and
// the refund after a split decision.
func TestSlidingLogState(t *testing.T) {
	rdb := redistest.Client(t)
	ctx := context.Background()
	rules := `
version: 1
rules:
  - {id: log, tier: principal, kinds: [bot], limit: 10000, period: 1m, algorithm: sliding_window_log}
  - {id: small, tier: principal, kinds: [user], limit: 3, period: 1h, algorithm: sliding_window_log}
  - {id: per-ip, tier: ip, kinds: [user], limit: 1, period: 1h, algorithm: sliding_window_log}
`
	e := newTestEngine(t, rdb, rules, nil)

	t.Run("same millisecond, large costs: unique members, bounded set, TTL", func(t *testing.T) {
		now := int64(1_800_000_000_000)
		e.fixedNow = func() int64 { return now }
		t.Cleanup(func() { e.fixedNow = nil })
		p := principal(t)
		key := redisx.BucketKey(string(p.Kind), p.ID, "log|swl")
		for i := range 4 { // 2,500 members per call: ZADD in chunks, indices continue within the millisecond
			r := check(t, e, Request{Principal: p, Cost: 2500})
			require.True(t, r.Allowed, "call %d", i)
			require.Equal(t, int64(10000-2500*(i+1)), r.Tiers[0].Remaining)
		}
		n, err := rdb.ZCard(ctx, key).Result()
		require.NoError(t, err)
		require.Equal(t, int64(10000), n, "every unit is its own member")
		r := check(t, e, Request{Principal: p, Cost: 1})
		require.False(t, r.Allowed)
		require.Equal(t, time.Minute, r.RetryAfter)
		n, err = rdb.ZCard(ctx, key).Result()
		require.NoError(t, err)
		require.Equal(t, int64(10000), n, "a denial adds nothing")
		ttl, err := rdb.PTTL(ctx, key).Result()
		require.NoError(t, err)
		require.InDelta(t, time.Minute.Seconds(), ttl.Seconds(), 1, "the key lives as long as its newest unit")

		now += time.Minute.Milliseconds() // every unit expires: the trim keeps the set at the limit
		require.True(t, check(t, e, Request{Principal: p, Cost: 7}).Allowed)
		n, err = rdb.ZCard(ctx, key).Result()
		require.NoError(t, err)
		require.Equal(t, int64(7), n)
	})

	t.Run("an override cannot grow the set past the cap", func(t *testing.T) {
		p := principal(t)
		require.NoError(t, rdb.HSet(ctx, e.rt.OverridesKey, "principal:"+p.Key(), `{"limits":{"log":50000}}`).Err())
		require.NoError(t, e.rt.Refresh(ctx))
		r := check(t, e, Request{Principal: p, Cost: 1})
		require.True(t, r.Allowed)
		require.Equal(t, int64(maxLogLimit), r.Tiers[0].Limit)
	})

	t.Run("Redis time: the limit holds", func(t *testing.T) {
		p := events.Principal{Kind: events.PrincipalUser, ID: redistest.Unique(t, "swl")}
		for range 3 {
			require.True(t, check(t, e, Request{Principal: p, Cost: 1}).Allowed)
		}
		r := check(t, e, Request{Principal: p, Cost: 1})
		require.False(t, r.Allowed)
		require.Equal(t, "small", r.Rule)
		require.Greater(t, r.RetryAfter, 59*time.Minute)
	})

	t.Run("IP denies: the principal's log is refunded", func(t *testing.T) {
		id := redistest.Unique(t, "swl")
		ip := netip.MustParseAddr("198.51.100.91")
		t.Cleanup(func() { _ = rdb.Del(ctx, redisx.BucketKey("ip", ipBucketID(ip), "per-ip|swl")) })
		a := events.Principal{Kind: events.PrincipalUser, ID: id + "a"}
		b := events.Principal{Kind: events.PrincipalUser, ID: id + "b"}
		require.True(t, check(t, e, Request{Principal: a, IP: ip, Cost: 1}).Allowed)
		r := check(t, e, Request{Principal: b, IP: ip, Cost: 1})
		require.False(t, r.Allowed)
		require.Equal(t, events.TierIP, r.Tier)
		n, err := rdb.ZCard(ctx, redisx.BucketKey(string(b.Kind), b.ID, "small|swl")).Result()
		require.NoError(t, err)
		require.Zero(t, n, "the principal group committed and was refunded")
	})
}
