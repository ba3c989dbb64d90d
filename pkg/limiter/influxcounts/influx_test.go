package influxcounts

import (
	"context"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/floodgate-dev/floodgate/pkg/events"
	"github.com/floodgate-dev/floodgate/pkg/limiter"
	"github.com/floodgate-dev/floodgate/pkg/limiter/limitertest"
	"github.com/floodgate-dev/floodgate/pkg/redisx/redistest"
	"github.com/floodgate-dev/floodgate/pkg/series/seriestest"
)

func TestScopeCountsReachInfluxDB(t *testing.T) {
	client, bucket := seriestest.Influx(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	gateway := redistest.Unique(t, "gw")
	start := time.Now().Add(-time.Second)
	c := NewScopeCounts(client, "", bucket, gateway, time.Now, slog.New(slog.DiscardHandler))
	for range 3 {
		c.Observe("bot-global", events.TierPrincipal, true, false)
	}
	c.Observe("bot-global", events.TierPrincipal, false, false)
	c.Observe("trial", events.TierPrincipal, true, true)
	c.Flush()

	q := fmt.Sprintf(`from(bucket: %q) |> range(start: %s) |> filter(fn: (r) => r._measurement == "limiter_decisions" and r.gateway == %q)`,
		bucket, start.UTC().Format(time.RFC3339), gateway)
	got := map[string]int64{}
	for deadline := time.Now().Add(15 * time.Second); time.Now().Before(deadline) && len(got) < 6; time.Sleep(200 * time.Millisecond) {
		res, err := client.QueryAPI("").Query(ctx, q)
		require.NoError(t, err)
		for res.Next() {
			rec := res.Record()
			got[fmt.Sprintf("%s.%s", rec.ValueByKey("scope"), rec.Field())] = rec.Value().(int64)
			_, hasPrincipal := rec.Values()["principal"]
			require.False(t, hasPrincipal, "no principal ids in tags")
		}
		require.NoError(t, res.Err())
	}
	require.Equal(t, map[string]int64{
		"bot-global.allowed": 3, "bot-global.blocked": 1, "bot-global.shadow": 0,
		"trial.allowed": 0, "trial.blocked": 0, "trial.shadow": 1,
	}, got)
}

func TestRedisRoundTripsReachInfluxDB(t *testing.T) {
	client, bucket := seriestest.Influx(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	// Every check of a real engine on the real Redis is one pipeline.
	rtt := limiter.NewRedisLatency()
	for _, batch := range []int{1, 64} {
		e := limitertest.Engine(t, redistest.Client(t), limitertest.OneBucket, func(c *limiter.EngineConfig) { c.RedisLatency, c.RedisBatch = rtt, batch })
		p := limitertest.Principal(t)
		for range 5 {
			limitertest.Check(t, e, limiter.Request{Principal: p, Cost: 1})
		}
	}
	got := rtt.Take()
	require.EqualValues(t, 10, got.Pipelines, "one round trip per check, batched or not")
	require.Positive(t, got.P50)
	require.LessOrEqual(t, got.P50, got.P99)
	require.LessOrEqual(t, got.P99, got.Max)
	require.Less(t, got.Max, 2*time.Second, "within the engine's budget")
	require.Zero(t, rtt.Take().Pipelines, "Take starts over")

	// Known round trips: the point carries their p99 as a share of the budget.
	gateway := redistest.Unique(t, "gw")
	start := time.Now().Add(-time.Second)
	c := NewScopeCounts(client, "", bucket, gateway, time.Now, slog.New(slog.DiscardHandler))
	c.TrackRedis(rtt, 50*time.Millisecond)
	for range 99 {
		rtt.Record(2 * time.Millisecond)
	}
	rtt.Record(40 * time.Millisecond)
	c.Flush()
	c.Flush() // nothing recorded since: no second point

	q := fmt.Sprintf(`from(bucket: %q) |> range(start: %s) |> filter(fn: (r) => r._measurement == "limiter_redis" and r.gateway == %q)`,
		bucket, start.UTC().Format(time.RFC3339), gateway)
	fields := map[string][]any{}
	for deadline := time.Now().Add(15 * time.Second); time.Now().Before(deadline) && len(fields) < 5; time.Sleep(200 * time.Millisecond) {
		clear(fields)
		res, err := client.QueryAPI("").Query(ctx, q)
		require.NoError(t, err)
		for res.Next() {
			fields[res.Record().Field()] = append(fields[res.Record().Field()], res.Record().Value())
		}
		require.NoError(t, res.Err())
	}
	require.Equal(t, []any{int64(100)}, fields["pipelines"])
	require.Len(t, fields["p99_ms"], 1, "one point per flush with round trips")
	require.InDelta(t, 2, fields["p50_ms"][0], 0.05)
	require.InDelta(t, 2, fields["p99_ms"][0], 0.05, "the 99th of 100 round trips")
	require.InDelta(t, 40, fields["max_ms"][0], 0.5)
	require.InDelta(t, 0.04, fields["budget_used"][0], 0.001, "p99 2 ms of a 50 ms budget")
}
