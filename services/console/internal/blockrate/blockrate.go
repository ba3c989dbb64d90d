// Package blockrate reads the limiter's per-scope decision counts (InfluxDB
// measurement limiter_decisions, fields allowed and blocked, tags gateway,
// scope, tier) and turns them into block rates per scope over time.
package blockrate

import (
	"context"
	"fmt"
	"regexp"
	"sort"
	"time"

	"github.com/influxdata/influxdb-client-go/v2/api"

	"github.com/floodgate-dev/floodgate/pkg/series"
)

// Point is one time bucket of one scope.
type Point struct {
	At               time.Time
	Allowed, Blocked int64
}

// Rate is blocked / (allowed + blocked); 0 without decisions.
func (p Point) Rate() float64 {
	if p.Allowed+p.Blocked == 0 {
		return 0
	}
	return float64(p.Blocked) / float64(p.Allowed+p.Blocked)
}

// Series is one scope's buckets, oldest first, and its totals.
type Series struct {
	Scope            string
	Points           []Point
	Allowed, Blocked int64
}

// Rate is the scope's block rate over the whole range.
func (s Series) Rate() float64 { return Point{Allowed: s.Allowed, Blocked: s.Blocked}.Rate() }

// Reader queries InfluxDB with Flux.
type Reader struct {
	Query  api.QueryAPI
	Bucket string // "floodgate/d30" on InfluxDB 1.8
}

var safeTag = regexp.MustCompile(`^[A-Za-z0-9._:@/-]{1,128}$`)

// Read returns every scope's block rate in [now-window, now) in buckets of
// step, busiest-blocking first; gateway, when set, narrows to one gateway.
func (r *Reader) Read(ctx context.Context, window, step time.Duration, gateway string) ([]Series, error) {
	if window <= 0 || step <= 0 || window/step > 2000 {
		return nil, fmt.Errorf("read block rate: window %s / step %s: at most 2000 buckets", window, step)
	}
	gw := ""
	if gateway != "" {
		if !safeTag.MatchString(gateway) {
			return nil, fmt.Errorf("read block rate: gateway %q: not a tag value", gateway)
		}
		gw = fmt.Sprintf(` and r.gateway == %q`, gateway)
	}
	q := fmt.Sprintf(`from(bucket: %q)
  |> range(start: -%s)
  |> filter(fn: (r) => r._measurement == "limiter_decisions" and (r._field == "allowed" or r._field == "blocked")%s)
  |> group(columns: ["scope", "_field"])
  |> aggregateWindow(every: %s, fn: sum, createEmpty: false)`, r.Bucket, window, gw, step)
	res, err := r.Query.Query(ctx, q)
	if err != nil {
		return nil, fmt.Errorf("query limiter_decisions: %w", err)
	}
	defer res.Close()
	type key struct {
		scope string
		at    int64
	}
	cells := map[key]*Point{}
	for res.Next() {
		rec := res.Record()
		scope, _ := rec.ValueByKey("scope").(string)
		f, ok := series.Number(rec.Value())
		n := int64(f)
		if !ok || scope == "" {
			continue
		}
		k := key{scope, rec.Time().UnixNano()}
		p := cells[k]
		if p == nil {
			p = &Point{At: rec.Time().UTC()}
			cells[k] = p
		}
		switch rec.Field() {
		case "allowed":
			p.Allowed += n
		case "blocked":
			p.Blocked += n
		}
	}
	if err := res.Err(); err != nil {
		return nil, fmt.Errorf("read limiter_decisions: %w", err)
	}
	by := map[string]*Series{}
	for k, p := range cells {
		s := by[k.scope]
		if s == nil {
			s = &Series{Scope: k.scope}
			by[k.scope] = s
		}
		s.Points = append(s.Points, *p)
		s.Allowed += p.Allowed
		s.Blocked += p.Blocked
	}
	out := make([]Series, 0, len(by))
	for _, s := range by {
		sort.Slice(s.Points, func(i, j int) bool { return s.Points[i].At.Before(s.Points[j].At) })
		out = append(out, *s)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Blocked != out[j].Blocked {
			return out[i].Blocked > out[j].Blocked
		}
		return out[i].Scope < out[j].Scope
	})
	return out, nil
}
