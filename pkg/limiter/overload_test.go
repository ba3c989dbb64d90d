package limiter

import (
	"context"
	"testing"
	"time"

	"github.com/sony/gobreaker/v2"
	"github.com/stretchr/testify/require"

	"github.com/floodgate-dev/floodgate/pkg/events"
	"github.com/floodgate-dev/floodgate/pkg/redisx/redistest"
)

// TestTripRatio: the breaker opens on a failure ratio, not on a few failures
// in a row — one short stall under load (a handful of timeouts among many
// checks) leaves it closed for everybody.
func TestTripRatio(t *testing.T) {
	cases := []struct {
		name             string
		requests, failed uint32
		want             bool
	}{
		{"a 60 ms stall at 10k checks/s: 600 of 10,000", 10_000, 600, false},
		{"Redis down at low traffic", 12, 12, true},
		{"too few to judge", 6, 6, false},
		{"half failing", 200, 100, true},
		{"a third failing", 300, 100, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			require.Equal(t, tc.want, tripRatio(gobreaker.Counts{Requests: tc.requests, TotalFailures: tc.failed}, 10, 0.5))
		})
	}
}

// TestBatcherQueueIsBounded: a check finds the pipeline queue full and is
// refused at once; one that waits past its bound is taken out of the queue.
// Both are overload, never a Redis failure.
func TestBatcherQueueIsBounded(t *testing.T) {
	b := newScriptBatcher(nil, nil, 64, 2, time.Second, nil)
	_ = b.gc.Hold() // every flusher busy, never released: nothing here could send
	for range 2 {
		require.True(t, b.gc.Add(&batchItem{done: make(chan struct{})}))
	}
	start := time.Now()
	_, _, err := b.run(context.Background(), newBatchItem(0, time.Time{}), time.Second, false)
	require.ErrorIs(t, err, errOverloaded)
	require.Less(t, time.Since(start), 100*time.Millisecond, "refused at once")

	b.gc.MaxQueue = 10
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	_, _, err = b.run(ctx, newBatchItem(0, time.Time{}), 0, false)
	require.ErrorIs(t, err, errOverloaded)
	require.Equal(t, 2, b.gc.Queued(), "the check whose context ended left the queue")

	start = time.Now()
	_, _, err = b.run(context.Background(), newBatchItem(0, time.Time{}), 20*time.Millisecond, false)
	require.ErrorIs(t, err, errOverloaded)
	require.Equal(t, 2, b.gc.Queued(), "the check that waited past its bound left the queue")
	require.GreaterOrEqual(t, time.Since(start), 20*time.Millisecond, "after its bound")
}

// TestEngineShedsFromLocalStateNeverOpen: with the pipeline queue full, even
// a rule whose fail policy is open is enforced from this instance's local
// bucket (limit 1: the second check is denied), the answer says it was shed
// (X-RateLimit-Shed, not X-RateLimit-Error), and the breaker stays closed.
func TestEngineShedsFromLocalStateNeverOpen(t *testing.T) {
	rdb := redistest.Client(t)
	e := newTestEngine(t, rdb, failRules, nil)
	b := e.shards.single.batch
	release := b.gc.Hold() // every flusher busy, and the queue full
	for b.gc.Add(&batchItem{done: make(chan struct{})}) {
	}
	t.Cleanup(release)
	p := events.Principal{Kind: events.PrincipalUser, ID: redistest.Unique(t, "shed")}
	first := check(t, e, Request{Principal: p, Cost: 1})
	require.True(t, first.Allowed)
	require.True(t, first.Degraded)
	require.Equal(t, ShedReason, first.Error)
	second := check(t, e, Request{Principal: p, Cost: 1})
	require.False(t, second.Allowed, "the fail-open rule is enforced locally while shedding")
	require.True(t, second.Degraded)
	require.Equal(t, ShedReason, second.Error, "X-RateLimit-Shed, not X-RateLimit-Error: busy is not down (server.Headers)")
	require.Equal(t, gobreaker.StateClosed, e.shards.single.breaker.State(), "shedding says nothing about Redis")
}
