package loop

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"sync"
	"testing"
	"time"

	influxdb2 "github.com/influxdata/influxdb-client-go/v2"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/require"

	"github.com/floodgate-dev/floodgate/migrations"
	"github.com/floodgate-dev/floodgate/pkg/config"
	"github.com/floodgate-dev/floodgate/pkg/events"
	"github.com/floodgate-dev/floodgate/pkg/kafkatest"
	"github.com/floodgate-dev/floodgate/pkg/redisx/redistest"
	"github.com/floodgate-dev/floodgate/pkg/stream"
	"github.com/floodgate-dev/floodgate/services/adjuster/internal/control"
	"github.com/floodgate-dev/floodgate/services/adjuster/internal/effects"
	"github.com/floodgate-dev/floodgate/services/adjuster/internal/settings"
)

// scripted is a Source returning whatever the test set last.
type scripted struct {
	mu  sync.Mutex
	sig func(now time.Time) control.Signals
}

func (s *scripted) set(f func(now time.Time) control.Signals) { s.mu.Lock(); s.sig = f; s.mu.Unlock() }
func (s *scripted) Read(_ context.Context, now time.Time, _ time.Duration) (control.Signals, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.sig(now), nil
}

func fresh(now time.Time, cpu, mem, errRate, abuse float64) control.Signals {
	r := func(v float64) control.Reading {
		return control.Reading{Value: v, At: now.Add(-5 * time.Second), OK: true}
	}
	return control.Signals{CPU: r(cpu), Mem: r(mem), ErrorRate: r(errRate), AbuseRate: r(abuse), RedisLatency: r(0.1), AbusePerSec: 0.5}
}

// memSettings is a SettingsSource the test edits directly.
type memSettings struct {
	mu sync.Mutex
	s  settings.Settings
}

func (m *memSettings) Get(context.Context) (settings.Settings, bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.s.Clone(), m.s.Version > 0, nil
}

func (m *memSettings) update(f func(*settings.Settings)) {
	m.mu.Lock()
	defer m.mu.Unlock()
	f(&m.s)
	m.s.Version++
}

// pdReceiver records PagerDuty Events v2 posts.
type pdReceiver struct {
	mu     sync.Mutex
	events []map[string]any
}

func (p *pdReceiver) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	var ev map[string]any
	_ = json.Unmarshal(body, &ev)
	p.mu.Lock()
	p.events = append(p.events, ev)
	p.mu.Unlock()
	w.WriteHeader(http.StatusAccepted)
	_, _ = w.Write([]byte(`{"status":"success","message":"Event processed","dedup_key":"x"}`))
}

func (p *pdReceiver) actions() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []string
	for _, e := range p.events {
		out = append(out, e["event_action"].(string)+" "+e["dedup_key"].(string))
	}
	return out
}

// TestLoopAgainstTheRealStack ticks the loop with a frozen clock against real
// Redis (a unique scales key), an in-process Kafka-protocol broker with the
// migrations' topics, the real InfluxDB and a local PagerDuty receiver.
func TestLoopAgainstTheRealStack(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	rdb := redistest.Client(t)
	key := redistest.Unique(t, "fg:test:scales")
	t.Cleanup(func() { rdb.Del(context.Background(), key) })

	broker := kafkatest.Start(t, nil)
	ms, err := migrations.Load()
	require.NoError(t, err)
	for _, m := range ms {
		require.NoError(t, migrations.NewKafka([]string{broker}, 1, nil).Apply(ctx, m.Kafka.Topics, func(string) {}))
	}
	producer := stream.NewProducer(stream.ProducerConfig{Brokers: []string{broker}})
	t.Cleanup(func() { _ = producer.Close() })

	env := config.NewEnv(os.Getenv)
	influx := influxdb2.NewClient(env.String("FLOODGATE_INFLUX_URL", config.DefaultInfluxURL), env.String("FLOODGATE_INFLUX_TOKEN", ""))
	t.Cleanup(influx.Close)
	pd := &pdReceiver{}
	pdSrv := httptest.NewServer(pd)
	t.Cleanup(pdSrv.Close)

	// A pre-existing scale in Redis: the loop must resume from it.
	require.NoError(t, rdb.HSet(ctx, key, "global", "0.5").Err())

	now := time.Now().UTC().Add(-time.Hour).Truncate(time.Second) // inside the 30-day retention; ticks advance it
	clock := func() time.Time { return now }
	src := &scripted{sig: func(n time.Time) control.Signals { return fresh(n, 0.6, 0.5, 0.01, 0.01) }}
	store := &memSettings{s: settings.Settings{Rules: control.Defaults(), Overrides: map[string]settings.Override{}}}
	reg := prometheus.NewRegistry()
	actor := redistest.Unique(t, "adjuster-test")
	l := New(Config{
		Source: src, Scales: &effects.RedisScales{Client: rdb, Key: key},
		Publisher: &effects.KafkaAdjustments{Producer: producer, Topic: config.DefaultAdjustmentsTopic, Source: "floodgate/adjuster-test"},
		Series:    &effects.InfluxSeries{Write: influx.WriteAPIBlocking("", env.String("FLOODGATE_INFLUX_BUCKET", config.DefaultInfluxBucket))},
		Alerter:   effects.NewPagerDuty("test-routing-key", pdSrv.URL+"/v2/enqueue"),
		Settings:  store, Defaults: control.Defaults(), ActorID: actor, Now: clock, Registerer: reg,
	})
	require.NoError(t, l.Start(ctx))
	scales := func() map[string]string { return rdb.HGetAll(ctx, key).Val() }
	tick := func(d time.Duration) { now = now.Add(d); l.Tick(ctx) }

	// Mid-band signals: nothing changes, but every managed scope is written.
	tick(0)
	require.Empty(t, l.Status().Errors)
	require.Equal(t, map[string]string{"global": "0.5", "tier:ip": "1"}, scales())

	// CPU over 85 %: global ×0.7, read back from Redis.
	src.set(func(n time.Time) control.Signals { return fresh(n, 0.92, 0.5, 0.01, 0.01) })
	tick(30 * time.Second)
	require.Equal(t, "0.35", scales()["global"])

	// Dry run: the loop computes and records, Redis keeps its value.
	store.update(func(s *settings.Settings) { s.DryRun = true })
	tick(time.Minute)
	require.Equal(t, "0.35", scales()["global"], "dry run must not write")
	require.Equal(t, 0.245, l.Status().Scales["global"], "the dry run's own trajectory")
	store.update(func(s *settings.Settings) { s.DryRun = false })

	// Kill switch: nothing moves, even with CPU high.
	store.update(func(s *settings.Settings) { s.Frozen = true })
	tick(time.Minute)
	require.Equal(t, "0.35", scales()["global"])
	require.Equal(t, 0.35, l.Status().Scales["global"], "leaving the dry run resumed from Redis")

	// An override applies while frozen, and expires.
	store.update(func(s *settings.Settings) {
		s.Overrides["tier:ip"] = settings.Override{Scale: 0.2, ExpiresAt: now.Add(90 * time.Second), Actor: "alice", Reason: "botnet on /login"}
	})
	tick(30 * time.Second)
	require.Equal(t, "0.2", scales()["tier:ip"])

	// A stale signal alerts (log, metric, PagerDuty) and never raises.
	store.update(func(s *settings.Settings) { s.Frozen = false })
	src.set(func(n time.Time) control.Signals {
		s := fresh(n, 0.2, 0.3, 0.0, 0.0)
		s.ErrorRate.At = n.Add(-time.Hour)
		return s
	})
	tick(10 * time.Minute) // past the override's expiry and every cooldown
	require.Equal(t, "0.35", scales()["global"], "a stale error rate must hold global")
	require.Equal(t, "0.22", scales()["tier:ip"], "tier:ip does not depend on the error rate and recovers")
	var alerts dto.Metric
	require.NoError(t, l.m.alerts.WithLabelValues(control.SignalErrorRate).Write(&alerts))
	require.Equal(t, 1.0, alerts.GetCounter().GetValue())
	// Fresh again: the alert resolves and global rises.
	src.set(func(n time.Time) control.Signals { return fresh(n, 0.2, 0.3, 0.0, 0.0) })
	tick(time.Minute)
	require.Equal(t, "0.385", scales()["global"])
	require.Equal(t, []string{"trigger floodgate:adjuster:signal:error_rate", "resolve floodgate:adjuster:signal:error_rate"}, pd.actions())

	// Every change is an adjustment.v1 event on the topic, in order, keyed by scope.
	r := kafka.NewReader(kafka.ReaderConfig{Brokers: []string{broker}, Topic: config.DefaultAdjustmentsTopic, MaxWait: 100 * time.Millisecond})
	t.Cleanup(func() { _ = r.Close() })
	var got []events.Adjustment
	for len(got) < 6 {
		m, err := r.FetchMessage(ctx)
		require.NoError(t, err)
		a, err := events.DecodeAdjustment(m.Value)
		require.NoError(t, err)
		require.Equal(t, a.Scope, string(m.Key))
		got = append(got, a)
	}
	type row struct {
		scope, rule string
		old, new    float64
		dry         bool
		actor       events.ActorKind
	}
	var rows []row
	for _, a := range got {
		rows = append(rows, row{a.Scope, a.Rule, a.OldScale, a.NewScale, a.DryRun, a.Actor.Kind})
	}
	require.Equal(t, []row{
		{"global", control.RuleCPUHigh, 0.5, 0.35, false, events.ActorLoop},
		{"global", control.RuleCPUHigh, 0.35, 0.245, true, events.ActorLoop},
		{"tier:ip", control.RuleOverride, 1, 0.2, false, events.ActorOperator},
		{"tier:ip", control.RuleRecover, 0.2, 0.22, false, events.ActorLoop},
		{"global", control.RuleRecover, 0.35, 0.385, false, events.ActorLoop},
		{"tier:ip", control.RuleRecover, 0.22, 0.242, false, events.ActorLoop},
	}, rows)
	require.Equal(t, "alice", got[2].Actor.ID)
	require.Contains(t, got[2].Reason, "botnet on /login")
	require.Equal(t, actor, got[0].Actor.ID)
	require.InDelta(t, 0.92, got[0].Signals.CPU, 1e-9)

	// The scale series is in InfluxDB.
	q := `from(bucket: "` + env.String("FLOODGATE_INFLUX_BUCKET", config.DefaultInfluxBucket) + `")
  |> range(start: ` + now.Add(-time.Hour).Format(time.RFC3339) + `, stop: ` + now.Add(time.Second).Format(time.RFC3339) + `)
  |> filter(fn: (r) => r._measurement == "adjuster_scales" and r._field == "scale" and r.scope == "global" and r.dry_run == "true")`
	res, err := influx.QueryAPI("").Query(ctx, q)
	require.NoError(t, err)
	var dryPoints []float64
	for res.Next() {
		dryPoints = append(dryPoints, res.Record().Value().(float64))
	}
	require.NoError(t, res.Err())
	require.Contains(t, dryPoints, 0.245)
}

// failingScales refuses writes, to show an unapplied change is retried, not lost.
type failingScales struct {
	Scales
	fail bool
}

func (f *failingScales) Set(ctx context.Context, s map[string]float64) error {
	if f.fail {
		return context.DeadlineExceeded
	}
	return f.Scales.Set(ctx, s)
}

type memPublisher struct{ got []events.Adjustment }

func (m *memPublisher) Publish(_ context.Context, a []events.Adjustment) error {
	m.got = append(m.got, a...)
	return nil
}

func TestAWriteFailureIsRetriedNextTick(t *testing.T) {
	ctx := context.Background()
	rdb := redistest.Client(t)
	key := redistest.Unique(t, "fg:test:scales")
	t.Cleanup(func() { rdb.Del(context.Background(), key) })
	now := time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)
	sc := &failingScales{Scales: &effects.RedisScales{Client: rdb, Key: key}, fail: true}
	pub := &memPublisher{}
	l := New(Config{
		Source: &scripted{sig: func(n time.Time) control.Signals { return fresh(n, 0.95, 0.5, 0, 0) }},
		Scales: sc, Publisher: pub, Settings: &memSettings{s: settings.Settings{Rules: control.Defaults()}},
		Defaults: control.Defaults(), ActorID: "test", Now: func() time.Time { return now },
	})
	require.NoError(t, l.Start(ctx))
	l.Tick(ctx)
	require.Empty(t, pub.got, "no event for a change that was not applied")
	require.Equal(t, 1.0, l.Status().Scales["global"])
	require.NotEmpty(t, l.Status().Errors)
	sc.fail = false
	now = now.Add(30 * time.Second)
	l.Tick(ctx)
	require.Len(t, pub.got, 1)
	require.Equal(t, "0.7", rdb.HGet(ctx, key, "global").Val())
}

// blockingSource holds a tick inside Read until released.
type blockingSource struct {
	entered, release chan struct{}
}

func (b *blockingSource) Read(_ context.Context, now time.Time, _ time.Duration) (control.Signals, error) {
	close(b.entered)
	<-b.release
	return fresh(now, 0.6, 0.5, 0, 0), nil
}

// The admin API reads status and hands over settings while a tick waits on I/O.
func TestStatusAndUseDoNotWaitForATick(t *testing.T) {
	ctx := context.Background()
	src := &blockingSource{entered: make(chan struct{}), release: make(chan struct{})}
	l := New(Config{
		Source: src, Scales: &effects.MemScales{}, Publisher: &memPublisher{},
		Settings: &memSettings{s: settings.Settings{Rules: control.Defaults()}}, Defaults: control.Defaults(), ActorID: "test",
	})
	require.NoError(t, l.Start(ctx))
	done := make(chan struct{})
	go func() { l.Tick(ctx); close(done) }()
	<-src.entered
	_ = l.Status()
	l.Use(settings.Settings{Version: 7, Rules: control.Defaults()})
	require.Equal(t, int64(7), l.Settings().Version)
	close(src.release)
	<-done
}

// Leaving a dry run resumes from what Redis holds, even for scopes the live
// loop never wrote: the dry run's hypothetical cuts never reach the limiter.
func TestLeavingDryRunResumesFromAppliedScales(t *testing.T) {
	ctx := context.Background()
	now := time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)
	sc := &effects.MemScales{}
	pub := &memPublisher{}
	store := &memSettings{s: settings.Settings{Version: 1, DryRun: true, Rules: control.Defaults()}}
	l := New(Config{
		Source: &scripted{sig: func(n time.Time) control.Signals { return fresh(n, 0.95, 0.5, 0, 0) }},
		Scales: sc, Publisher: pub, Settings: store, Defaults: control.Defaults(), ActorID: "test",
		Now: func() time.Time { return now },
	})
	require.NoError(t, l.Start(ctx))
	l.Tick(ctx)
	got, err := sc.Load(ctx)
	require.NoError(t, err)
	require.Empty(t, got, "a dry run writes nothing")
	require.Len(t, pub.got, 1)
	require.True(t, pub.got[0].DryRun)

	store.update(func(s *settings.Settings) { s.DryRun = false })
	now = now.Add(10 * time.Second) // inside the cooldown of the dry-run cut
	l.Tick(ctx)
	got, err = sc.Load(ctx)
	require.NoError(t, err)
	require.Equal(t, map[string]float64{"global": 1, "tier:ip": 1}, got)
	require.Len(t, pub.got, 1, "no change reached Redis without its event")
}
