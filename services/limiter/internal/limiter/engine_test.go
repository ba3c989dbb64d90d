package limiter

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/floodgate-dev/floodgate/pkg/events"
	"github.com/floodgate-dev/floodgate/pkg/redisx"
	"github.com/floodgate-dev/floodgate/pkg/redisx/redistest"
)

func principal(t *testing.T) events.Principal {
	return events.Principal{Kind: events.PrincipalBot, ID: redistest.Unique(t, "lim")}
}

func TestEngineAllowsUpToLimitThenDenies(t *testing.T) {
	rdb := redistest.Client(t)
	e, err := NewEngine(rdb, []Rule{{Tier: events.TierPrincipal, Limit: 5, Period: time.Hour}})
	require.NoError(t, err)
	ctx := context.Background()
	p := principal(t)
	for i := 4; i >= 0; i-- {
		r, err := e.Check(ctx, Request{Principal: p, Cost: 1})
		require.NoError(t, err)
		require.True(t, r.Allowed)
		require.Equal(t, i, r.Remaining)
		require.Equal(t, 5, r.Limit)
		require.Equal(t, 1.0, r.Penalty)
	}
	r, err := e.Check(ctx, Request{Principal: p, Cost: 1})
	require.NoError(t, err)
	require.False(t, r.Allowed)
	require.Equal(t, events.TierPrincipal, r.Tier)
	require.Zero(t, r.Remaining)
	// One token refills every 12 minutes: retry no earlier than that.
	require.InDelta(t, (12 * time.Minute).Seconds(), r.RetryAfter.Seconds(), 1)
	require.WithinDuration(t, time.Now(), r.Now, 5*time.Second, "decision time is Redis time")
}

func TestEngineIsAllOrNothingAcrossTiers(t *testing.T) {
	rdb := redistest.Client(t)
	e, err := NewEngine(rdb, []Rule{
		{Tier: events.TierPrincipal, Limit: 10, Period: time.Hour},
		{Tier: events.TierEndpoint, Limit: 2, Period: time.Hour},
	})
	require.NoError(t, err)
	ctx := context.Background()
	p := principal(t)
	for range 2 {
		r, err := e.Check(ctx, Request{Principal: p, Cost: 1})
		require.NoError(t, err)
		require.True(t, r.Allowed)
	}
	// The endpoint tier is empty: denied, and the principal tier must not be charged.
	for range 3 {
		r, err := e.Check(ctx, Request{Principal: p, Cost: 1})
		require.NoError(t, err)
		require.False(t, r.Allowed)
		require.Equal(t, events.TierEndpoint, r.Tier)
	}
	tokens, err := rdb.HGet(ctx, redisx.BucketKey(string(p.Kind), p.ID, "principal"), "t").Float64()
	require.NoError(t, err)
	require.InDelta(t, 8, tokens, 0.01, "denied checks consumed principal tokens")
}

func TestEngineAppliesPenaltyMultiplier(t *testing.T) {
	rdb := redistest.Client(t)
	e, err := NewEngine(rdb, []Rule{{Tier: events.TierPrincipal, Limit: 50, Period: time.Hour}})
	require.NoError(t, err)
	ctx := context.Background()
	p := principal(t)
	require.NoError(t, rdb.HSet(ctx, redisx.PenaltyKey(string(p.Kind), p.ID), "m", "0.1").Err())
	for i := 0; i < 5; i++ {
		r, err := e.Check(ctx, Request{Principal: p, Cost: 1})
		require.NoError(t, err)
		require.True(t, r.Allowed)
		require.Equal(t, 5, r.Limit)
		require.InDelta(t, 0.1, r.Penalty, 1e-9)
	}
	r, err := e.Check(ctx, Request{Principal: p, Cost: 1})
	require.NoError(t, err)
	require.False(t, r.Allowed)
	require.Equal(t, events.TierPenalty, r.Tier, "a denial under a penalty is attributed to it")

	// A cost larger than the penalized limit can never fit: denied with a finite retry.
	q := principal(t)
	require.NoError(t, rdb.HSet(ctx, redisx.PenaltyKey(string(q.Kind), q.ID), "m", "0.1").Err())
	r, err = e.Check(ctx, Request{Principal: q, Cost: 6})
	require.NoError(t, err)
	require.False(t, r.Allowed)
	require.GreaterOrEqual(t, r.RetryAfter, time.Hour)
}

func TestEngineRefillsOverTime(t *testing.T) {
	rdb := redistest.Client(t)
	e, err := NewEngine(rdb, []Rule{{Tier: events.TierPrincipal, Limit: 4, Period: 200 * time.Millisecond}})
	require.NoError(t, err)
	ctx := context.Background()
	p := principal(t)
	for range 4 {
		r, err := e.Check(ctx, Request{Principal: p, Cost: 1})
		require.NoError(t, err)
		require.True(t, r.Allowed)
	}
	r, err := e.Check(ctx, Request{Principal: p, Cost: 1})
	require.NoError(t, err)
	require.False(t, r.Allowed)
	time.Sleep(250 * time.Millisecond) // a whole period: the bucket is full again
	r, err = e.Check(ctx, Request{Principal: p, Cost: 4})
	require.NoError(t, err)
	require.True(t, r.Allowed)
}

func TestEngineRecoversFromScriptFlush(t *testing.T) {
	rdb := redistest.Client(t)
	e, err := NewEngine(rdb, []Rule{{Tier: events.TierPrincipal, Limit: 3, Period: time.Hour}})
	require.NoError(t, err)
	ctx := context.Background()
	require.NoError(t, e.Load(ctx))
	require.NoError(t, rdb.ScriptFlush(ctx).Err())
	r, err := e.Check(ctx, Request{Principal: principal(t), Cost: 1})
	require.NoError(t, err, "EVALSHA must fall back to EVAL on NOSCRIPT")
	require.True(t, r.Allowed)
}

func TestEngineKeepsHostileIDsApart(t *testing.T) {
	rdb := redistest.Client(t)
	e, err := NewEngine(rdb, []Rule{{Tier: events.TierPrincipal, Limit: 1, Period: time.Hour}})
	require.NoError(t, err)
	ctx := context.Background()
	base := redistest.Unique(t, "x")
	// "a:b" of kind bot and "b" of kind "bot:a" would share a naive key.
	for _, p := range []events.Principal{
		{Kind: events.PrincipalBot, ID: base + ":a}{b"},
		{Kind: events.PrincipalBot, ID: base + ":a"},
		{Kind: events.PrincipalUser, ID: base + ":a}{b"},
	} {
		r, err := e.Check(ctx, Request{Principal: p, Cost: 1})
		require.NoError(t, err)
		require.True(t, r.Allowed, "%s shares a bucket with another principal", p.Key())
	}
}

func TestNewEngineRejectsBadRules(t *testing.T) {
	_, err := NewEngine(nil, nil)
	require.Error(t, err)
	_, err = NewEngine(nil, []Rule{{Tier: events.TierPrincipal, Limit: 0, Period: time.Second}})
	require.ErrorContains(t, err, "not positive")
}

func BenchmarkEngineCheck(b *testing.B) {
	rdb := redistest.Client(b)
	e, err := NewEngine(rdb, []Rule{{Tier: events.TierPrincipal, Limit: 1 << 30, Period: time.Second}})
	require.NoError(b, err)
	ctx := context.Background()
	p := events.Principal{Kind: events.PrincipalBot, ID: redistest.Unique(b, "bench")}
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, err := e.Check(ctx, Request{Principal: p, Cost: 1}); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "checks/s")
}
