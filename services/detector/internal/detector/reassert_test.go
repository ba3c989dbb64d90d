package detector

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/floodgate-dev/floodgate/pkg/events"
	"github.com/floodgate-dev/floodgate/pkg/redisx"
	"github.com/floodgate-dev/floodgate/pkg/redisx/redistest"
	"github.com/floodgate-dev/floodgate/pkg/stacktest"
)

// TestPenaltiesComeBackAfterRedisLosesThem: a FLUSHALL on a Redis the test
// starts itself; every penalty the store applied and that has not expired is
// back within 2 s with its original multiplier, level and expiry (never
// extended), an expired one is not, and a second instance watching the same
// Redis (it applied nothing) notices the loss without rewriting anything.
func TestPenaltiesComeBackAfterRedisLosesThem(t *testing.T) {
	stacktest.Needs(t, "starts redis-server")
	proc := redistest.NewProc(t)
	rdb := proc.Client()
	t.Cleanup(func() { _ = rdb.Close() })
	ctx := context.Background()
	s := NewPenaltyStore(rdb)
	other := NewPenaltyStore(rdb)
	var rewrote, otherRewrote []int
	s.onReassert = func(n int) { rewrote = append(rewrote, n) }
	other.onReassert = func(n int) { otherRewrote = append(otherRewrote, n) }

	bots := []events.Principal{{Kind: events.PrincipalBot, ID: "b1"}, {Kind: events.PrincipalBot, ID: "b2"}}
	exp := time.Now().Add(10 * time.Minute).Truncate(time.Millisecond)
	for i, b := range bots {
		n, err := s.Apply(ctx, b, "abuse-"+b.ID, events.Penalty{Multiplier: 0.1, Level: int64(i + 1), ExpiresAt: exp})
		require.NoError(t, err)
		require.Equal(t, PenaltyApplied, n)
	}
	short := events.Principal{Kind: events.PrincipalBot, ID: "short"}
	_, err := s.Apply(ctx, short, "abuse-short", events.Penalty{Multiplier: 0.5, Level: 1, ExpiresAt: time.Now().Add(300 * time.Millisecond)})
	require.NoError(t, err)

	rctx, stop := context.WithCancel(ctx)
	defer stop()
	go func() { _ = s.RunReassert(rctx, 100*time.Millisecond, slog.New(slog.DiscardHandler)) }()
	go func() { _ = other.RunReassert(rctx, 100*time.Millisecond, slog.New(slog.DiscardHandler)) }()
	time.Sleep(500 * time.Millisecond) // markers set; the short penalty expired
	require.Empty(t, rewrote, "no loss yet")

	require.NoError(t, rdb.FlushAll(ctx).Err())
	flushed := time.Now()
	require.Eventually(t, func() bool {
		for _, b := range bots {
			if n, _ := rdb.Exists(ctx, redisx.PenaltyKey("bot", b.ID)).Result(); n == 0 {
				return false
			}
		}
		return true
	}, 2*time.Second, 20*time.Millisecond, "penalties back within 2 s")
	t.Logf("penalties back %v after FLUSHALL", time.Since(flushed).Round(time.Millisecond))
	for i, b := range bots {
		m, at, err := s.Get(ctx, b)
		require.NoError(t, err)
		require.InDelta(t, 0.1, m, 1e-9)
		require.Equal(t, exp.UnixMilli(), at.UnixMilli(), "the original expiry, not extended")
		lvl, err := rdb.HGet(ctx, redisx.PenaltyKey("bot", b.ID), "level").Int()
		require.NoError(t, err)
		require.Equal(t, i+1, lvl, "escalation level kept")
		ttl, err := rdb.PTTL(ctx, redisx.PenaltyKey("bot", b.ID)).Result()
		require.NoError(t, err)
		require.LessOrEqual(t, ttl, time.Until(exp)+time.Second)
	}
	n, err := rdb.Exists(ctx, redisx.PenaltyKey("bot", "short")).Result()
	require.NoError(t, err)
	require.Zero(t, n, "an expired penalty is not written again")
	require.Eventually(t, func() bool { return len(rewrote) == 1 && len(otherRewrote) == 1 }, 2*time.Second, 20*time.Millisecond,
		"both instances saw one loss")
	require.Equal(t, []int{2}, rewrote)
	require.Equal(t, []int{0}, otherRewrote, "an instance re-asserts only what it applied")
}

func TestMarkersCoverEverySlotBand(t *testing.T) {
	t.Parallel()
	keys := markers("fg:detector:")
	require.Len(t, keys, markerBands)
	for i, k := range keys {
		require.Equal(t, i, redisx.Slot(k)/(16384/markerBands), k)
	}
}
