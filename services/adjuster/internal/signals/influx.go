// Package signals reads the adjuster's inputs from InfluxDB with Flux queries.
//
// What is read (all over the window ending at the step's time):
//
//	cpu               Telegraf's cpu input: 1 - median(usage_idle)/100 where cpu = "cpu-total"
//	mem               Telegraf's mem input: mean(used_percent)/100
//	error rate        http_responses (written by gateways; field count = responses since
//	                  the previous point, tag code_class = 1xx..5xx): sum(5xx) / sum(all).
//	                  Nothing in Floodgate writes it yet: without points the signal is
//	                  missing and the scopes depending on it hold.
//	abuse rate        sum(event_count) of the detector's enforced abuse_detections
//	                  (tag mode = "enforced"; event_count = the decisions that made up
//	                  the detection) over sum(allowed + blocked) of the limiter's
//	                  limiter_decisions (one point per gateway, scope and tier per flush,
//	                  counts since the previous flush; the shadow field is left out, it
//	                  counts a second observation of a decision already counted)
//	redis latency     median(budget_used) of the limiters' limiter_redis points (one per
//	                  limiter per flush: p99 Redis pipeline round trip ÷ the limiter's
//	                  Redis budget), clamped to [0, 1]; 0 when limiter_decisions has
//	                  points but no limiter decided through a pipeline (an idle Redis
//	                  is not a slow one)
//
// CPU and Redis latency take the median of the window's points (every host's
// or limiter's pooled): one noisy point — a single slow flush, a host's
// spike — cannot move it, where a maximum held a shed level for as long as
// the window remembered it. The error and abuse rates are ratios of sums: a
// point weighs by the responses or decisions it counts.
//
// A signal with no point in the window is missing (Reading.OK false); the time of
// the newest point decides whether it is stale.
package signals

import (
	"context"
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/influxdata/influxdb-client-go/v2/api"
	"golang.org/x/sync/errgroup"

	"github.com/floodgate-dev/floodgate/pkg/series"
	"github.com/floodgate-dev/floodgate/services/adjuster/internal/control"
)

// Measurement and field names the queries read.
const (
	MeasurementHTTPResponses   = "http_responses"    // gateways (contract in docs/adjuster.md)
	MeasurementDecisions       = "limiter_decisions" // services/limiter ScopeCounts
	MeasurementAbuseDetections = "abuse_detections"  // services/detector InfluxRecorder
	MeasurementRedis           = "limiter_redis"     // services/limiter ScopeCounts.TrackRedis
)

// Fields and tags of the measurements above that the queries depend on.
var (
	decisionFields = []string{"allowed", "blocked"}
	enforcedOnly   = map[string]string{"mode": "enforced"}
)

// Filters narrow each query to a fleet: tag = value pairs ANDed together.
type Filters struct {
	// Hosts applies to cpu and mem (e.g. {"role": "api"}).
	Hosts map[string]string
	// HTTP applies to http_responses (e.g. {"service": "gateway"}).
	HTTP map[string]string
	// Abuse applies to abuse_detections (tags pattern, severity, mode,
	// principal_kind, detector_version); mode is always "enforced".
	Abuse map[string]string
	// Decisions applies to limiter_decisions (tags gateway, scope, tier),
	// e.g. {"gateway": "edge-eu"}; its gateway, if any, to limiter_redis.
	Decisions map[string]string
}

// Influx reads signals with Flux from InfluxDB 2.x or 1.8 (bucket "db/rp").
type Influx struct {
	Query   api.QueryAPI
	Bucket  string
	Filters Filters
}

// Read returns the signals over the window (how far back each query
// aggregates) ending at now.
func (x *Influx) Read(ctx context.Context, now time.Time, win time.Duration) (control.Signals, error) {
	var s control.Signals
	if win <= 0 {
		return s, fmt.Errorf("read signals: window %s must be positive", win)
	}
	start, stop := now.Add(-win), now
	var err error
	if s.CPU, err = x.cpu(ctx, start, stop); err != nil {
		return s, err
	}
	mem, err := x.aggregate(ctx, start, stop, "mem", []string{"used_percent"}, x.Filters.Hosts, "mean")
	if err != nil {
		return s, fmt.Errorf("read mem: %w", err)
	}
	if mem.OK {
		s.Mem = control.Reading{Value: clamp01(mem.Value / 100), At: mem.At, OK: true}
	}
	if s.ErrorRate, err = x.errorRate(ctx, start, stop); err != nil {
		return s, err
	}
	decisions, err := x.aggregate(ctx, start, stop, MeasurementDecisions, decisionFields, x.Filters.Decisions, "sum")
	if err != nil {
		return s, fmt.Errorf("read limiter decisions: %w", err)
	}
	if decisions.OK && decisions.Value > 0 {
		abuse := merge(x.Filters.Abuse, enforcedOnly)
		abusive, err := x.aggregate(ctx, start, stop, MeasurementAbuseDetections, []string{"event_count"}, abuse, "sum")
		if err != nil {
			return s, fmt.Errorf("read abuse detections: %w", err)
		}
		detections, err := x.aggregate(ctx, start, stop, MeasurementAbuseDetections, []string{"event_count"}, abuse, "count")
		if err != nil {
			return s, fmt.Errorf("count abuse detections: %w", err)
		}
		// No detection in the window is a rate of 0, not a missing signal:
		// the limiter's points prove the pipeline is alive.
		s.AbuseRate = control.Reading{Value: clamp01(abusive.Value / decisions.Value), At: decisions.At, OK: true}
		s.AbusePerSec = detections.Value / win.Seconds()
		rtt, err := x.redisLatency(ctx, start, stop)
		if err != nil {
			return s, err
		}
		s.RedisLatency = redisReading(decisions, rtt)
	}
	return s, nil
}

// ReadShed reads only what shedding reads — CPU, the error rate and the
// Redis latency — over the window ending at now, its queries at once: the
// shed tick is short, and a slow InfluxDB must not stretch it.
func (x *Influx) ReadShed(ctx context.Context, now time.Time, win time.Duration) (control.Signals, error) {
	var s control.Signals
	if win <= 0 {
		return s, fmt.Errorf("read shed signals: window %s must be positive", win)
	}
	start, stop := now.Add(-win), now
	var decisions, rtt agg
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() (err error) { s.CPU, err = x.cpu(gctx, start, stop); return err })
	g.Go(func() (err error) { s.ErrorRate, err = x.errorRate(gctx, start, stop); return err })
	g.Go(func() (err error) {
		if decisions, err = x.aggregate(gctx, start, stop, MeasurementDecisions, decisionFields, x.Filters.Decisions, "sum"); err != nil {
			return fmt.Errorf("read limiter decisions: %w", err)
		}
		return nil
	})
	g.Go(func() (err error) { rtt, err = x.redisLatency(gctx, start, stop); return err })
	if err := g.Wait(); err != nil {
		return control.Signals{}, err
	}
	if decisions.OK && decisions.Value > 0 {
		s.RedisLatency = redisReading(decisions, rtt)
	}
	return s, nil
}

// cpu reads 1 − the median of usage_idle / 100.
func (x *Influx) cpu(ctx context.Context, start, stop time.Time) (control.Reading, error) {
	idle, err := x.aggregate(ctx, start, stop, "cpu", []string{"usage_idle"}, merge(x.Filters.Hosts, map[string]string{"cpu": "cpu-total"}), "median")
	if err != nil {
		return control.Reading{}, fmt.Errorf("read cpu: %w", err)
	}
	if !idle.OK {
		return control.Reading{}, nil
	}
	return control.Reading{Value: clamp01(1 - idle.Value/100), At: idle.At, OK: true, Points: idle.Points}, nil
}

// errorRate reads Σ 5xx / Σ all responses.
func (x *Influx) errorRate(ctx context.Context, start, stop time.Time) (control.Reading, error) {
	all, err := x.aggregate(ctx, start, stop, MeasurementHTTPResponses, []string{"count"}, x.Filters.HTTP, "sum")
	if err != nil {
		return control.Reading{}, fmt.Errorf("read http responses: %w", err)
	}
	if !all.OK || all.Value <= 0 {
		return control.Reading{}, nil
	}
	five, err := x.aggregate(ctx, start, stop, MeasurementHTTPResponses, []string{"count"}, merge(x.Filters.HTTP, map[string]string{"code_class": "5xx"}), "sum")
	if err != nil {
		return control.Reading{}, fmt.Errorf("read http 5xx: %w", err)
	}
	return control.Reading{Value: clamp01(five.Value / all.Value), At: all.At, OK: true}, nil
}

// redisLatency reads the median budget_used of the limiters' limiter_redis points.
func (x *Influx) redisLatency(ctx context.Context, start, stop time.Time) (agg, error) {
	rtt, err := x.aggregate(ctx, start, stop, MeasurementRedis, []string{"budget_used"}, gatewayOnly(x.Filters.Decisions), "median")
	if err != nil {
		return agg{}, fmt.Errorf("read limiter redis latency: %w", err)
	}
	return rtt, nil
}

// redisReading is the Redis latency signal: the median budget used, or 0 (an
// idle Redis) when the limiters decided without a pipeline.
func redisReading(decisions, rtt agg) control.Reading {
	if rtt.OK {
		return control.Reading{Value: clamp01(rtt.Value), At: rtt.At, OK: true, Points: rtt.Points}
	}
	return control.Reading{At: decisions.At, OK: true}
}

// agg is one aggregate, the time of the newest point it covered and how
// many points it covered.
type agg struct {
	Value  float64
	At     time.Time
	OK     bool
	Points int
}

// aggregate runs fn (mean, median, sum, max or count) over the fields across every series
// that matches (the fields' values pooled), and finds the newest point's time,
// in one query.
func (x *Influx) aggregate(ctx context.Context, start, stop time.Time, measurement string, fields []string, tags map[string]string, fn string) (agg, error) {
	q := FluxAggregate(x.Bucket, start, stop, measurement, fields, tags, fn)
	res, err := x.Query.Query(ctx, q)
	if err != nil {
		return agg{}, err
	}
	defer res.Close()
	var out agg
	var haveValue bool
	for res.Next() {
		rec := res.Record()
		switch rec.Result() {
		case "agg":
			v, ok := series.Number(rec.Value())
			if ok && !math.IsNaN(v) {
				out.Value, haveValue = v, true
			}
		case "last":
			if ts, ok := rec.ValueByKey("_time").(time.Time); ok {
				out.At = ts
			}
		case "n":
			if v, ok := series.Number(rec.Value()); ok {
				out.Points = int(v)
			}
		}
	}
	if err := res.Err(); err != nil {
		return agg{}, err
	}
	out.OK = haveValue && !out.At.IsZero()
	return out, nil
}

// FluxAggregate builds the query aggregate runs; fn "median" is the exact
// 0.5 quantile (the mean of the two middle points of an even count). Every
// value from configuration is quoted as a Flux string literal.
func FluxAggregate(bucket string, start, stop time.Time, measurement string, fields []string, tags map[string]string, fn string) string {
	call := fn + "()"
	if fn == "median" {
		call = `quantile(q: 0.5, method: "exact_mean")`
	}
	var f strings.Builder
	fmt.Fprintf(&f, "r._measurement == %s and (", Quote(measurement))
	for i, field := range fields {
		if i > 0 {
			f.WriteString(" or ")
		}
		fmt.Fprintf(&f, "r._field == %s", Quote(field))
	}
	f.WriteString(")")
	for _, k := range slices.Sorted(maps.Keys(tags)) {
		fmt.Fprintf(&f, " and r[%s] == %s", Quote(k), Quote(tags[k]))
	}
	return fmt.Sprintf(`data = from(bucket: %s)
  |> range(start: %s, stop: %s)
  |> filter(fn: (r) => %s)
  |> toFloat()
  |> group()
data |> %s |> yield(name: "agg")
data |> max(column: "_time") |> keep(columns: ["_time"]) |> yield(name: "last")
data |> count() |> yield(name: "n")
`, Quote(bucket), start.UTC().Format(time.RFC3339Nano), stop.UTC().Format(time.RFC3339Nano), f.String(), call)
}

// Quote returns s as a Flux string literal: backslash, double quote and the
// interpolation opener "${" are escaped, so no value can end the literal or
// splice an expression into the query.
func Quote(s string) string {
	var b strings.Builder
	b.Grow(len(s) + 2)
	b.WriteByte('"')
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == '\\' || c == '"':
			b.WriteByte('\\')
			b.WriteByte(c)
		case c == '$' && i+1 < len(s) && s[i+1] == '{':
			b.WriteString(`\$`)
		case c == '\n':
			b.WriteString(`\n`)
		case c == '\r':
			b.WriteString(`\r`)
		case c == '\t':
			b.WriteString(`\t`)
		default:
			b.WriteByte(c)
		}
	}
	b.WriteByte('"')
	return b.String()
}

// gatewayOnly keeps the gateway tag of a limiter_decisions filter: the one
// tag limiter_redis points share with them.
func gatewayOnly(tags map[string]string) map[string]string {
	if g, ok := tags["gateway"]; ok {
		return map[string]string{"gateway": g}
	}
	return nil
}

func merge(a, b map[string]string) map[string]string {
	out := make(map[string]string, len(a)+len(b))
	maps.Copy(out, a)
	maps.Copy(out, b)
	return out
}

func clamp01(v float64) float64 { return math.Min(1, math.Max(0, v)) }
