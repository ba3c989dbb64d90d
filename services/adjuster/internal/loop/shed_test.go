package loop

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/floodgate-dev/floodgate/pkg/events"
	"github.com/floodgate-dev/floodgate/pkg/limiter"
	"github.com/floodgate-dev/floodgate/pkg/redisx/redistest"
	"github.com/floodgate-dev/floodgate/services/adjuster/internal/control"
	"github.com/floodgate-dev/floodgate/services/adjuster/internal/effects"
	"github.com/floodgate-dev/floodgate/services/adjuster/internal/settings"
)

// TestShedLevelReachesTheLimiter: a CPU signal over the shed lines makes the
// loop write the shed level to Redis, where a real limiter engine reads it and
// refuses bulk and best_effort requests while serving critical ones; the hash
// lives three ticks unless rewritten; a dry run and the kill switch write level
// 0; and the level comes back down once the signal does.
func TestShedLevelReachesTheLimiter(t *testing.T) {
	ctx := context.Background()
	rdb := redistest.Client(t)
	shedKey, scalesKey := redistest.Unique(t, "fg:test:shed"), redistest.Unique(t, "fg:test:scales")
	now := time.Now().UTC().Truncate(time.Second)
	src := &scripted{sig: func(n time.Time) control.Signals { return fresh(n, 0.5, 0.4, 0.01, 0.01) }}
	store := &memSettings{s: settings.Settings{Rules: control.Defaults(), Overrides: map[string]settings.Override{}}}
	l := New(Config{Source: src, Scales: &effects.RedisScales{Client: rdb, Key: scalesKey}, Shed: &effects.RedisShed{Client: rdb, Key: shedKey},
		Publisher: &memPublisher{}, Settings: store, Defaults: control.Defaults(), ActorID: "shed-test",
		Now: func() time.Time { return now }, Registerer: prometheus.NewRegistry()})
	require.NoError(t, l.Start(ctx))
	tick := func(d time.Duration) { now = now.Add(d); l.Tick(ctx); require.Empty(t, l.Status().Errors) }

	rules, err := limiter.ParseRules("r.yaml", []byte("version: 1\nrules:\n  - {id: p, tier: principal, limit: 1000, period: 1h}\n"))
	require.NoError(t, err)
	rt := limiter.NewRuntime(rdb, slog.New(slog.DiscardHandler), prometheus.NewRegistry())
	rt.ScalesKey, rt.OverridesKey, rt.ShedKey = scalesKey, redistest.Unique(t, "fg:test:overrides"), shedKey
	e, err := limiter.NewEngine(limiter.EngineConfig{Redis: rdb, Rules: limiter.NewRuleStore(rules), Runtime: rt, Budget: 2 * time.Second})
	require.NoError(t, err)
	require.NoError(t, e.Load(ctx))
	p := events.Principal{Kind: events.PrincipalBot, ID: redistest.Unique(t, "b")}
	served := func(prio limiter.Priority) bool {
		t.Helper()
		require.NoError(t, rt.Refresh(ctx))
		r, err := e.Check(ctx, limiter.Request{Principal: p, Method: "GET", Route: "/x", Cost: 1, Priority: prio})
		require.NoError(t, err)
		require.Equal(t, !r.Allowed, r.Shed, "only shedding refuses here")
		return r.Allowed
	}

	tick(0)
	require.Equal(t, "0", rdb.HGet(ctx, shedKey, "level").Val())
	require.True(t, served(limiter.PriorityBulk))

	src.set(func(n time.Time) control.Signals { return fresh(n, 0.96, 0.5, 0.01, 0.01) })
	tick(30 * time.Second)
	require.Equal(t, 2, l.Status().Shed.Level)
	require.Equal(t, "2", rdb.HGet(ctx, shedKey, "level").Val())
	require.Equal(t, "5000", rdb.HGet(ctx, shedKey, "retry_after_ms").Val())
	ttl := rdb.PTTL(ctx, shedKey).Val()
	require.Greater(t, ttl, 80*time.Second)
	require.LessOrEqual(t, ttl, 90*time.Second, "three ticks")
	require.False(t, served(limiter.PriorityBulk))
	require.False(t, served(limiter.PriorityBestEffort))
	require.True(t, served(limiter.PriorityDegraded))
	require.True(t, served(limiter.PriorityCritical))

	store.update(func(s *settings.Settings) { s.DryRun = true })
	tick(30 * time.Second)
	require.Equal(t, 2, l.Status().Shed.Level, "the dry run still decides")
	require.Equal(t, "0", rdb.HGet(ctx, shedKey, "level").Val(), "but applies nothing")
	require.True(t, served(limiter.PriorityBulk))
	store.update(func(s *settings.Settings) { s.DryRun = false })
	tick(30 * time.Second)
	require.False(t, served(limiter.PriorityBulk))

	store.update(func(s *settings.Settings) { s.Frozen = true })
	tick(30 * time.Second)
	require.Equal(t, "0", rdb.HGet(ctx, shedKey, "level").Val(), "the kill switch stops shedding")
	require.True(t, served(limiter.PriorityBestEffort))
	store.update(func(s *settings.Settings) { s.Frozen = false })

	src.set(func(n time.Time) control.Signals { return fresh(n, 0.5, 0.4, 0.01, 0.01) })
	for range 6 {
		tick(30 * time.Second)
	}
	require.Equal(t, "0", rdb.HGet(ctx, shedKey, "level").Val(), "released once the signal is clear")
	require.True(t, served(limiter.PriorityBulk))
}
