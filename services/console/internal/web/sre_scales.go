package web

import (
	"context"
	"encoding/json"
	"fmt"
	"html/template"
	"math"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/floodgate-dev/floodgate/pkg/events"
	"github.com/floodgate-dev/floodgate/services/console/internal/adjuster"
	"github.com/floodgate-dev/floodgate/services/console/internal/store"
)

// maxChanges bounds the scale changes (adjustment events) one page reads.
const maxChanges = 500

type scalesView struct {
	Title  string
	Scales []store.Scale
	Bars   template.HTML
	Error  string

	// History: the applied scale per scope over the window (InfluxDB) and
	// every change in it with its cause (adjustment events, adjuster audit).
	Window   string
	Windows  []struct{ Value, Label string }
	Scope    string
	Series   []adjuster.ScaleSeries
	Chart    template.HTML
	Changes  []changeRow
	More     bool
	HistErrs []string
	Notes    []string // history sources that are not configured
}

// changeRow is one line of the changes table: a scale change (an adjustment
// event) or a settings change that explains them (kill switch, override …).
type changeRow struct {
	At       time.Time
	Scope    string
	Old, New string
	Kind     string // "scale" or "settings"
	Rule     string
	Cause    string
	Who      string
	Signals  string
	DryRun   bool
}

func (s *Server) scales(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	v := scalesView{Title: "Limit scales", Window: q.Get("window"), Scope: strings.TrimSpace(q.Get("scope"))}
	if v.Window == "" {
		v.Window = "24h"
	}
	var err error
	if v.Scales, err = s.cfg.Store.Scales(r.Context(), s.cfg.ScalesKey); err != nil {
		w.WriteHeader(http.StatusServiceUnavailable)
		v.Error = "Scales could not be read (Redis): " + err.Error()
	}
	v.Bars = scaleBars(v.Scales)
	v.Windows = chartWindows()
	win, step := chartWindow(v.Window)
	if step == 0 {
		if v.Error == "" {
			w.WriteHeader(http.StatusBadRequest)
		}
		v.HistErrs = append(v.HistErrs, "window must be one of 1h, 6h, 24h, 168h")
		s.render(w, r, "scales", v)
		return
	}
	s.scaleHistory(r.Context(), &v, win, step)
	s.render(w, r, "scales", v)
}

// scaleHistory fills the chart and the changes table; each source that fails
// adds an error and leaves the rest of the page intact.
func (s *Server) scaleHistory(ctx context.Context, v *scalesView, win, step time.Duration) {
	ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	to := s.cfg.Now()
	from := to.Add(-win)
	if s.cfg.ScaleSeries == nil {
		v.Notes = append(v.Notes, "No InfluxDB is configured (FLOODGATE_INFLUX_URL): no scale history chart.")
	} else {
		var err error
		if v.Series, err = s.cfg.ScaleSeries.Read(ctx, win, step, v.Scope); err != nil {
			s.cfg.Log.Warn("scale history", "err", err)
			v.HistErrs = append(v.HistErrs, "The scale history could not be read (InfluxDB): "+err.Error())
		}
	}
	if s.cfg.Adjustments == nil {
		v.Notes = append(v.Notes, "No Kafka broker is configured (FLOODGATE_KAFKA_BROKERS): scale changes and their causes are not shown.")
	} else {
		adj, more, skipped, err := s.cfg.Adjustments.Read(ctx, from, to.Add(time.Second), maxChanges)
		if err != nil {
			s.cfg.Log.Warn("scale changes", "err", err)
			v.HistErrs = append(v.HistErrs, "The scale changes could not be read (Kafka "+s.cfg.Adjustments.Topic+"): "+err.Error())
		}
		if skipped > 0 {
			v.HistErrs = append(v.HistErrs, fmt.Sprintf("%d adjustment event(s) did not decode and are not shown.", skipped))
		}
		v.More = more
		for _, a := range adj {
			if v.Scope != "" && !strings.HasPrefix(a.Scope, v.Scope) {
				continue
			}
			v.Changes = append(v.Changes, adjustmentRow(a))
		}
	}
	if s.cfg.Adjuster != nil {
		recs, err := s.cfg.Adjuster.Audit(ctx, 200)
		if err != nil {
			v.HistErrs = append(v.HistErrs, "The adjuster's settings history could not be read: "+err.Error())
		}
		for _, rec := range recs {
			if rec.At.Before(from) || rec.At.After(to) {
				continue
			}
			if row, ok := settingsRow(rec, v.Scope); ok {
				v.Changes = append(v.Changes, row)
			}
		}
	}
	sort.SliceStable(v.Changes, func(i, j int) bool { return v.Changes[i].At.After(v.Changes[j].At) })
	v.Chart = scaleHistoryChart(v.Series, v.Changes, from, to)
}

func adjustmentRow(a adjuster.Adjustment) changeRow {
	row := changeRow{At: a.TS, Scope: a.Scope, Old: fmtScale(a.OldScale), New: fmtScale(a.NewScale), Kind: "scale",
		Rule: a.Rule, Cause: a.Reason, DryRun: a.DryRun,
		Signals: fmt.Sprintf("cpu %s · errors %s · abuse %s/s", fmtSignal(a.Signals.CPU), fmtSignal(a.Signals.ErrorRate), fmtSignal(a.Signals.AbuseRate))}
	switch a.Actor.Kind {
	case events.ActorOperator:
		row.Who = "SRE " + a.Actor.ID
	default:
		row.Who = "loop " + a.Actor.ID
	}
	if row.Cause == "" {
		row.Cause = "rule " + a.Rule
	}
	return row
}

// settingsRow turns one adjuster audit record into a row: the kill switch,
// dry run and overrides explain scale changes (or their absence).
func settingsRow(rec adjuster.AuditRecord, scope string) (changeRow, bool) {
	type override struct {
		Scale     float64   `json:"scale"`
		ExpiresAt time.Time `json:"expires_at"`
	}
	type doc struct {
		DryRun    bool                `json:"dry_run"`
		Frozen    bool                `json:"frozen"`
		Overrides map[string]override `json:"overrides"`
	}
	var before, after doc
	_ = json.Unmarshal(rec.Before, &before)
	_ = json.Unmarshal(rec.After, &after)
	row := changeRow{At: rec.At, Kind: "settings", Rule: rec.Action, Who: "SRE " + rec.Actor, Cause: rec.Reason}
	onOff := map[bool]string{true: "on", false: "off"}
	switch rec.Action {
	case "mode.update":
		var parts []string
		if before.Frozen != after.Frozen {
			parts = append(parts, "kill switch "+onOff[after.Frozen])
		}
		if before.DryRun != after.DryRun {
			parts = append(parts, "dry run "+onOff[after.DryRun])
		}
		if len(parts) == 0 {
			parts = append(parts, "mode unchanged")
		}
		row.Rule = strings.Join(parts, ", ")
		row.Scope = "all"
	case "override.set", "override.delete":
		for sc := range union(before.Overrides, after.Overrides) {
			b, hadB := before.Overrides[sc]
			a, hasA := after.Overrides[sc]
			if hadB == hasA && b == a {
				continue
			}
			row.Scope = sc
			if hadB {
				row.Old = fmtScale(b.Scale)
			}
			if hasA {
				row.New = fmtScale(a.Scale) + " until " + a.ExpiresAt.UTC().Format("01-02 15:04Z")
				row.Rule = "override set"
			} else {
				row.Rule = "override removed"
			}
		}
	case "rules.update":
		row.Rule, row.Scope = "rules changed", "all"
	}
	if scope != "" && row.Scope != "all" && !strings.HasPrefix(row.Scope, scope) {
		return changeRow{}, false
	}
	return row, true
}

func union[V any](a, b map[string]V) map[string]struct{} {
	out := map[string]struct{}{}
	for k := range a {
		out[k] = struct{}{}
	}
	for k := range b {
		out[k] = struct{}{}
	}
	return out
}

func fmtScale(f float64) string { return strconv.FormatFloat(f, 'f', -1, 64) }

func fmtSignal(f float64) string { return strconv.FormatFloat(f, 'g', 4, 64) }

// scaleHistoryChart draws each scope's applied scale as a step line over the
// window, with a marker (its cause in a tooltip) at every applied change.
func scaleHistoryChart(series []adjuster.ScaleSeries, changes []changeRow, from, to time.Time) template.HTML {
	if len(series) == 0 {
		return ""
	}
	const left, top, plotW, plotH = 44, 10, 600, 200
	maxV := 1.0
	for _, ss := range series {
		for _, p := range ss.Points {
			maxV = math.Max(maxV, p.Scale)
		}
	}
	maxV = math.Ceil(maxV*4) / 4
	span := to.Sub(from).Seconds()
	x := func(t time.Time) float64 {
		return left + plotW*math.Min(math.Max(t.Sub(from).Seconds()/span, 0), 1)
	}
	y := func(v float64) float64 { return top + plotH*(1-v/maxV) }
	n := min(len(series), len(lineClasses))
	var sb strings.Builder
	fmt.Fprintf(&sb, `<svg class="chart" id="scale-chart" viewBox="0 0 %d %d" role="img" aria-label="applied limit scale per scope over time, %d scopes, %d changes; the table below lists every change">`,
		left+plotW+10, top+plotH+40+18*n, n, len(changes))
	for i := 0; i <= 4; i++ {
		v := maxV * float64(i) / 4
		fmt.Fprintf(&sb, `<line x1="%d" x2="%d" y1="%.1f" y2="%.1f" class="grid"/><text x="%d" y="%.1f" class="chart-value" text-anchor="end">%s</text>`,
			left, left+plotW, y(v), y(v), left-4, y(v)+4, strconv.FormatFloat(v, 'f', 2, 64))
	}
	fmt.Fprintf(&sb, `<line x1="%d" x2="%d" y1="%.1f" y2="%.1f" class="axis-one"/>`, left, left+plotW, y(1), y(1))
	fmt.Fprintf(&sb, `<text x="%d" y="%d" class="chart-label">%s</text><text x="%d" y="%d" class="chart-label" text-anchor="end">%s</text>`,
		left, top+plotH+16, from.UTC().Format("01-02 15:04"), left+plotW, top+plotH+16, to.UTC().Format("01-02 15:04Z"))
	class := map[string]string{}
	for i := range n {
		ss := series[i]
		class[ss.Scope] = lineClasses[i]
		var pts []string
		for j, p := range ss.Points {
			if j > 0 { // a step: hold the previous value until this point
				pts = append(pts, fmt.Sprintf("%.1f,%.1f", x(p.At), y(ss.Points[j-1].Scale)))
			}
			pts = append(pts, fmt.Sprintf("%.1f,%.1f", x(p.At), y(p.Scale)))
		}
		last := ss.Points[len(ss.Points)-1]
		pts = append(pts, fmt.Sprintf("%.1f,%.1f", x(to), y(last.Scale)))
		fmt.Fprintf(&sb, `<polyline class="line %s" points="%s"><title>%s: scale %s at the end</title></polyline>`,
			lineClasses[i], strings.Join(pts, " "), template.HTMLEscapeString(ss.Scope), fmtScale(last.Scale))
		lx, ly := left, top+plotH+36+18*i // one scope per line: route scopes are long
		fmt.Fprintf(&sb, `<rect x="%d" y="%d" width="12" height="4" class="swatch %s"/><text x="%d" y="%d" class="chart-label">%s</text>`,
			lx, ly-4, lineClasses[i], lx+16, ly, template.HTMLEscapeString(ss.Scope))
	}
	for _, c := range changes {
		cls, ok := class[c.Scope]
		if !ok || c.Kind != "scale" || c.DryRun {
			continue
		}
		nv, err := strconv.ParseFloat(c.New, 64)
		if err != nil {
			continue
		}
		fmt.Fprintf(&sb, `<circle class="marker %s" cx="%.1f" cy="%.1f" r="4"><title>%s %s: %s → %s (%s): %s</title></circle>`,
			cls, x(c.At), y(nv), c.At.UTC().Format("01-02 15:04:05Z"), template.HTMLEscapeString(c.Scope), c.Old, c.New,
			template.HTMLEscapeString(c.Who), template.HTMLEscapeString(c.Cause))
	}
	sb.WriteString(`</svg>`)
	return template.HTML(sb.String()) //nolint:gosec // scopes, names and causes are escaped, the rest are numbers
}
