// Package effects is where the adjuster's decisions leave the process: scales
// in Redis for the limiter, adjustment.v1 events on Kafka, the scale series in
// InfluxDB and alerts to PagerDuty.
package effects

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/PagerDuty/go-pagerduty"
	influxdb2 "github.com/influxdata/influxdb-client-go/v2"
	"github.com/influxdata/influxdb-client-go/v2/api"
	"github.com/influxdata/influxdb-client-go/v2/api/write"
	"github.com/redis/go-redis/v9"
	"github.com/segmentio/kafka-go"

	"github.com/floodgate-dev/floodgate/pkg/events"
	"github.com/floodgate-dev/floodgate/pkg/series"
	"github.com/floodgate-dev/floodgate/pkg/stream"
	"github.com/floodgate-dev/floodgate/services/adjuster/internal/control"
)

// RedisScales keeps the scales in one Redis hash (redisx.ScalesKey in
// production): field = scope, value = the scale as a decimal string.
type RedisScales struct {
	Client redis.UniversalClient
	Key    string
}

// Load returns every scope's scale; fields that are not a scale in (0, 10] are skipped.
func (r *RedisScales) Load(ctx context.Context) (map[string]float64, error) {
	m, err := r.Client.HGetAll(ctx, r.Key).Result()
	if err != nil {
		return nil, fmt.Errorf("read scales %s: %w", r.Key, err)
	}
	out := make(map[string]float64, len(m))
	for scope, v := range m {
		f, err := strconv.ParseFloat(v, 64)
		if err == nil && f > 0 && f <= 10 {
			out[scope] = f
		}
	}
	return out, nil
}

// Set writes scales (scope → scale) in one HSET.
func (r *RedisScales) Set(ctx context.Context, scales map[string]float64) error {
	if len(scales) == 0 {
		return nil
	}
	args := make([]any, 0, 2*len(scales))
	for _, scope := range slices.Sorted(maps.Keys(scales)) {
		args = append(args, scope, FormatScale(scales[scope]))
	}
	if err := r.Client.HSet(ctx, r.Key, args...).Err(); err != nil {
		return fmt.Errorf("write scales %s: %w", r.Key, err)
	}
	return nil
}

// MemScales keeps the scales in memory as RedisScales keeps them in Redis
// (Set adds to what is there): the loop's double in tests and simulations.
// It is safe for concurrent use; the zero value is ready.
type MemScales struct {
	mu sync.Mutex
	m  map[string]float64
}

// Load returns a copy of every scope's scale.
func (s *MemScales) Load(context.Context) (map[string]float64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[string]float64, len(s.m))
	maps.Copy(out, s.m)
	return out, nil
}

// Set adds scales (scope → scale), replacing the scopes' earlier scales.
func (s *MemScales) Set(_ context.Context, scales map[string]float64) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.m == nil {
		s.m = map[string]float64{}
	}
	maps.Copy(s.m, scales)
	return nil
}

// RedisShed writes the shed level every limiter polls (redisx.ShedKey in
// production; fields as limiter.ParseShedding reads them) in one transaction,
// with a time to live of a few ticks: if the adjuster stops, the hash expires
// and nothing is shed.
type RedisShed struct {
	Client redis.UniversalClient
	Key    string
}

// Set replaces the shed hash.
func (r *RedisShed) Set(ctx context.Context, level int, retry time.Duration, reason string, ttl time.Duration) error {
	_, err := r.Client.TxPipelined(ctx, func(p redis.Pipeliner) error {
		p.Del(ctx, r.Key)
		p.HSet(ctx, r.Key, "level", level, "retry_after_ms", retry.Milliseconds(), "reason", reason)
		p.PExpire(ctx, r.Key, ttl)
		return nil
	})
	if err != nil {
		return fmt.Errorf("write shed level %s: %w", r.Key, err)
	}
	return nil
}

// FormatScale spells a scale the way the limiter parses it.
func FormatScale(v float64) string { return strconv.FormatFloat(v, 'f', -1, 64) }

// KafkaAdjustments publishes adjustment.v1 events, keyed by scope.
type KafkaAdjustments struct {
	Producer *stream.Producer
	Topic    string
	Source   string // CloudEvents source, e.g. "floodgate/adjuster"
}

// Publish validates, encodes and publishes the events and waits for acks=all.
func (k *KafkaAdjustments) Publish(ctx context.Context, adj []events.Adjustment) error {
	if len(adj) == 0 {
		return nil
	}
	msgs := make([]kafka.Message, 0, len(adj))
	for i := range adj {
		a := &adj[i]
		b, err := events.EncodeAdjustment(a)
		if err != nil {
			return fmt.Errorf("encode adjustment %s: %w", a.ID, err)
		}
		msgs = append(msgs, kafka.Message{Topic: k.Topic, Key: []byte(a.Key()), Value: b,
			Headers: stream.CloudEventHeaders(events.CETypeAdjustment, a.ID, k.Source, a.TS)})
	}
	if err := k.Producer.Publish(ctx, msgs...); err != nil {
		return fmt.Errorf("publish %d adjustments: %w", len(msgs), err)
	}
	return nil
}

// Point is one tick of the scale series.
type Point struct {
	At      time.Time
	Scales  map[string]float64
	Signals control.Signals
	DryRun  bool
	Frozen  bool
	// ShedLevel is the shed level the tick decided (written as applied
	// unless DryRun).
	ShedLevel int
}

// InfluxSeries writes the scale series: measurement adjuster_scales, one point
// per scope per tick (tag scope, dry_run; field scale), and adjuster_signals
// with the signals the tick saw (a field per fresh signal).
type InfluxSeries struct {
	Write api.WriteAPIBlocking
}

// MeasurementScales and MeasurementSignals are the series the adjuster writes.
const (
	MeasurementScales  = series.AdjusterScales
	MeasurementSignals = series.AdjusterSignals
)

// Record writes one tick.
func (x *InfluxSeries) Record(ctx context.Context, p Point) error {
	pts := make([]*write.Point, 0, len(p.Scales)+1)
	dry := strconv.FormatBool(p.DryRun)
	for _, scope := range slices.Sorted(maps.Keys(p.Scales)) {
		pts = append(pts, influxdb2.NewPoint(MeasurementScales,
			map[string]string{series.TagScope: scope, series.TagDryRun: dry},
			map[string]any{series.FieldScale: p.Scales[scope], series.FieldFrozen: p.Frozen}, p.At))
	}
	fields := map[string]any{"abuse_per_sec": p.Signals.AbusePerSec, series.FieldShedLevel: p.ShedLevel}
	for _, name := range control.AllSignals {
		if r := p.Signals.Get(name); r.OK {
			fields[name] = r.Value
		}
	}
	pts = append(pts, influxdb2.NewPoint(MeasurementSignals, map[string]string{series.TagDryRun: dry}, fields, p.At))
	if err := x.Write.WritePoint(ctx, pts...); err != nil {
		return fmt.Errorf("write scale series: %w", err)
	}
	return nil
}

// PagerDuty raises and resolves adjuster alerts through Events API v2. The
// dedup key is the alert key, so a repeated trigger is one incident.
type PagerDuty struct {
	client     *pagerduty.Client
	routingKey string
}

// NewPagerDuty returns an alerter; endpoint overrides the Events API URL (tests
// point it at a local receiver).
func NewPagerDuty(routingKey, endpoint string) *PagerDuty {
	var opts []pagerduty.ClientOptions
	if endpoint != "" {
		opts = append(opts, pagerduty.WithV2EventsAPIEndpoint(endpoint))
	}
	return &PagerDuty{client: pagerduty.NewClient("", opts...), routingKey: routingKey}
}

// Trigger opens (or updates) the incident for key.
func (p *PagerDuty) Trigger(ctx context.Context, key, summary string, details map[string]any) error {
	_, err := p.client.ManageEventWithContext(ctx, &pagerduty.V2Event{
		RoutingKey: p.routingKey, Action: "trigger", DedupKey: "floodgate:adjuster:" + key, Client: "Floodgate adjuster",
		Payload: &pagerduty.V2Payload{Summary: summary, Source: "floodgate-adjuster", Severity: "warning",
			Component: "adjuster", Class: key, Details: details},
	})
	if err != nil {
		return fmt.Errorf("page %s: %w", key, err)
	}
	return nil
}

// Resolve closes the incident for key.
func (p *PagerDuty) Resolve(ctx context.Context, key string) error {
	_, err := p.client.ManageEventWithContext(ctx, &pagerduty.V2Event{
		RoutingKey: p.routingKey, Action: "resolve", DedupKey: "floodgate:adjuster:" + key,
	})
	if err != nil {
		return fmt.Errorf("resolve page %s: %w", key, err)
	}
	return nil
}
