package loop

import (
	"context"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/floodgate-dev/floodgate/pkg/events"
	"github.com/floodgate-dev/floodgate/pkg/limiter"
	"github.com/floodgate-dev/floodgate/pkg/redisx/redistest"
	"github.com/floodgate-dev/floodgate/services/adjuster/internal/control"
	"github.com/floodgate-dev/floodgate/services/adjuster/internal/effects"
	"github.com/floodgate-dev/floodgate/services/adjuster/internal/settings"
)

// TestShedLevelReachesTheLimiter: a CPU signal over the shed lines makes the
// loop's shed tick write the shed level to Redis, where a real limiter engine
// reads it and refuses bulk and best_effort requests while serving critical
// ones; the hash lives three shed ticks unless rewritten; a dry run and the
// kill switch write level 0; and the level comes back down once the signal
// does — or once every signal goes missing.
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
	tick := func(d time.Duration) {
		now = now.Add(d)
		l.Tick(ctx)
		l.ShedTick(ctx)
		require.Empty(t, l.Status().Errors)
	}

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
	require.Greater(t, ttl, 8*time.Second)
	require.LessOrEqual(t, ttl, 9*time.Second, "three shed ticks")
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
	for range 3 {
		tick(3 * time.Second)
	}
	require.Equal(t, "0", rdb.HGet(ctx, shedKey, "level").Val(), "released once the signal is clear, one level a tick")
	require.True(t, served(limiter.PriorityBulk))

	// The metrics pipeline breaks at level 3: the level still comes down,
	// and each shed signal is counted and alerted on as unknown.
	src.set(func(n time.Time) control.Signals { return fresh(n, 0.99, 0.4, 0.01, 0.01) })
	tick(30 * time.Second)
	require.Equal(t, 3, l.Status().Shed.Level)
	src.set(func(time.Time) control.Signals { return control.Signals{} })
	for range 4 { // the hold (5s), then one level a tick
		tick(3 * time.Second)
	}
	st := l.Status().Shed
	require.Equal(t, 0, st.Level, "a missing signal holds nothing: %+v", st)
	require.Equal(t, []string{control.SignalCPU, control.SignalErrorRate, control.SignalRedisLatency}, st.Unknown)
	require.Equal(t, "0", rdb.HGet(ctx, shedKey, "level").Val())
}

// TestShedAlertsOnUnknownSignals: a shed signal going missing is counted,
// pages once (key shed:<signal>) and resolves when the signal is back; the
// status says when the level steps down.
func TestShedAlertsOnUnknownSignals(t *testing.T) {
	ctx := context.Background()
	now := time.Now().UTC().Truncate(time.Second)
	src := &scripted{sig: func(n time.Time) control.Signals {
		return control.Signals{RedisLatency: control.Reading{Value: 0.95, At: n, OK: true}}
	}}
	pages := &memAlerter{}
	reg := prometheus.NewRegistry()
	store := &memSettings{s: settings.Settings{Rules: control.Defaults(), Overrides: map[string]settings.Override{}}}
	l := New(Config{Source: src, Scales: &memScales{}, Publisher: &memPublisher{}, Settings: store, Defaults: control.Defaults(),
		Alerter: pages, Now: func() time.Time { return now }, Registerer: reg})
	require.NoError(t, l.Start(ctx))
	tick := func(d time.Duration) control.ShedStep { now = now.Add(d); l.ShedTick(ctx); return l.Status().Shed }

	st := tick(0)
	require.Equal(t, 3, st.Level)
	tick(3 * time.Second)
	require.Equal(t, []string{"trigger shed:cpu", "trigger shed:error_rate"}, pages.got, "paged once per unknown signal")
	require.Equal(t, 2.0, testutil.ToFloat64(l.m.shedUnknown.WithLabelValues(control.SignalCPU)), "counted every shed tick")
	require.Equal(t, 0.0, testutil.ToFloat64(l.m.shedKnown.WithLabelValues(control.SignalCPU)))
	require.Equal(t, 1.0, testutil.ToFloat64(l.m.shedKnown.WithLabelValues(control.SignalRedisLatency)))

	src.set(func(n time.Time) control.Signals {
		s := fresh(n, 0.5, 0.4, 0.01, 0)
		s.RedisLatency = control.Reading{Value: 0.1, At: n, OK: true}
		return s
	})
	st = tick(3 * time.Second)
	require.Equal(t, 2, st.Level)
	require.NotNil(t, st.StepDownAt)
	require.Equal(t, now.Add(3*time.Second), *st.StepDownAt, "the next step is a tick away")
	require.Equal(t, now.Add(6*time.Second), *st.ZeroAt)
	require.Equal(t, []string{"trigger shed:cpu", "trigger shed:error_rate", "resolve shed:cpu", "resolve shed:error_rate"}, pages.got)
}

type memAlerter struct{ got []string }

func (m *memAlerter) Trigger(_ context.Context, key, _ string, _ map[string]any) error {
	m.got = append(m.got, "trigger "+key)
	return nil
}

func (m *memAlerter) Resolve(_ context.Context, key string) error {
	m.got = append(m.got, "resolve "+key)
	return nil
}

type memScales struct{ m map[string]float64 }

func (m *memScales) Load(context.Context) (map[string]float64, error) { return m.m, nil }
func (m *memScales) Set(_ context.Context, s map[string]float64) error {
	m.m = s
	return nil
}

// shedOnly is a Source whose ReadShed the shed tick must prefer.
type shedOnly struct{ full, shed int }

func (s *shedOnly) Read(_ context.Context, now time.Time, _ time.Duration) (control.Signals, error) {
	s.full++
	return control.Signals{}, nil
}

func (s *shedOnly) ReadShed(_ context.Context, now time.Time, w time.Duration) (control.Signals, error) {
	s.shed++
	if w != control.Defaults().Shed.Window.D() {
		return control.Signals{}, fmt.Errorf("window %s, want the shed window", w)
	}
	return control.Signals{RedisLatency: control.Reading{Value: 0.8, At: now, OK: true, Points: 3}}, nil
}

func TestShedTickReadsTheShedWindowOnly(t *testing.T) {
	ctx := context.Background()
	src := &shedOnly{}
	store := &memSettings{s: settings.Settings{Rules: control.Defaults(), Overrides: map[string]settings.Override{}}}
	l := New(Config{Source: src, Scales: &memScales{}, Publisher: &memPublisher{}, Settings: store, Defaults: control.Defaults(),
		Registerer: prometheus.NewRegistry()})
	require.NoError(t, l.Start(ctx))
	l.ShedTick(ctx)
	require.Equal(t, 1, src.shed)
	require.Zero(t, src.full, "the shed tick reads only the shed signals")
	require.Equal(t, 2, l.Status().Shed.Level, "redis latency 0.8 > 0.7")
}
