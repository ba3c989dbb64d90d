package adjuster

import (
	"context"
	"fmt"
	"regexp"
	"sort"
	"time"

	"github.com/influxdata/influxdb-client-go/v2/api"
	"github.com/segmentio/kafka-go"

	"github.com/floodgate-dev/floodgate/pkg/events"
	"github.com/floodgate-dev/floodgate/pkg/kafkascan"
	"github.com/floodgate-dev/floodgate/pkg/series"
)

// ScalePoint is a scope's applied scale at the end of one time bucket.
type ScalePoint struct {
	At    time.Time
	Scale float64
}

// ScaleSeries is one scope's scale over time, oldest first.
type ScaleSeries struct {
	Scope  string
	Points []ScalePoint
}

// Series reads the adjuster's scale series from InfluxDB: measurement
// series.AdjusterScales, one point per managed scope per tick, tag scope,
// tag dry_run, field scale (pkg/series; written by the adjuster's
// effects.InfluxSeries).
type Series struct {
	Query  api.QueryAPI
	Bucket string // "floodgate/d30" on InfluxDB 1.8
}

var safeScope = regexp.MustCompile(`^[A-Za-z0-9._:@/{} -]{1,128}$`)

// Read returns each scope's applied scale (dry_run=false ticks) in
// [now-window, now), the last value of each bucket of step, by scope;
// prefix, when set, keeps only the scopes starting with it.
func (s *Series) Read(ctx context.Context, window, step time.Duration, prefix string) ([]ScaleSeries, error) {
	if window <= 0 || step <= 0 || window/step > 2000 {
		return nil, fmt.Errorf("read scale series: window %s / step %s: at most 2000 buckets", window, step)
	}
	imports, filter := "", ""
	if prefix != "" {
		if !safeScope.MatchString(prefix) {
			return nil, fmt.Errorf("read scale series: scope %q: not a scope", prefix)
		}
		imports = "import \"strings\"\n"
		filter = fmt.Sprintf(` and strings.hasPrefix(v: r.%s, prefix: %q)`, series.TagScope, prefix)
	}
	q := fmt.Sprintf(`%sfrom(bucket: %q)
  |> range(start: -%s)
  |> filter(fn: (r) => r._measurement == %q and r._field == %q and r.%s == "false"%s)
  |> group(columns: [%q])
  |> aggregateWindow(every: %s, fn: last, createEmpty: false)`,
		imports, s.Bucket, window, series.AdjusterScales, series.FieldScale, series.TagDryRun, filter, series.TagScope, step)
	res, err := s.Query.Query(ctx, q)
	if err != nil {
		return nil, fmt.Errorf("query %s: %w", series.AdjusterScales, err)
	}
	defer res.Close()
	by := map[string]*ScaleSeries{}
	for res.Next() {
		rec := res.Record()
		scope, _ := rec.ValueByKey(series.TagScope).(string)
		v, ok := rec.Value().(float64)
		if !ok || scope == "" {
			continue
		}
		ss := by[scope]
		if ss == nil {
			ss = &ScaleSeries{Scope: scope}
			by[scope] = ss
		}
		ss.Points = append(ss.Points, ScalePoint{At: rec.Time().UTC(), Scale: v})
	}
	if err := res.Err(); err != nil {
		return nil, fmt.Errorf("read %s: %w", series.AdjusterScales, err)
	}
	out := make([]ScaleSeries, 0, len(by))
	for _, ss := range by {
		sort.Slice(ss.Points, func(i, j int) bool { return ss.Points[i].At.Before(ss.Points[j].At) })
		out = append(out, *ss)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Scope < out[j].Scope })
	return out, nil
}

// Adjustment is one adjustment.v1 event read back with its coordinates.
type Adjustment struct {
	events.Adjustment
	Partition int
	Offset    int64
}

// Adjustments reads the adjustment.v1 events (one per scale change, with its
// rule, reason, signals and actor) back from their topic: the adjuster keeps
// no other record of why each scale changed, and the topic keeps them 90 days.
type Adjustments struct {
	Client *kafka.Client
	Topic  string // floodgate.adjustments.v1
}

// Read returns up to limit events with a timestamp in [from, to), newest first;
// more reports that older ones in the range were left out. Messages that do
// not decode are skipped and counted in skipped.
func (a *Adjustments) Read(ctx context.Context, from, to time.Time, limit int) (out []Adjustment, more bool, skipped int, err error) {
	ranges, err := kafkascan.Since(ctx, a.Client, a.Topic, from)
	if err != nil {
		return nil, false, 0, err
	}
	for _, pr := range ranges {
		start := pr.Start
		if pr.End-start > int64(limit) { // keep the newest limit
			start, more = pr.End-int64(limit), true
		}
		err := kafkascan.Scan(ctx, a.Client, a.Topic, pr.Partition, start, pr.End, func(m kafka.Message) bool {
			ev, err := events.DecodeAdjustment(m.Value)
			if err != nil {
				skipped++
				return true
			}
			if !ev.TS.Before(from) && ev.TS.Before(to) {
				out = append(out, Adjustment{Adjustment: ev, Partition: m.Partition, Offset: m.Offset})
			}
			return true
		})
		if err != nil {
			return nil, false, 0, err
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].TS.After(out[j].TS) })
	if len(out) > limit {
		out, more = out[:limit], true
	}
	return out, more, skipped, nil
}
