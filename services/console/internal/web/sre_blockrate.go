package web

import (
	"fmt"
	"html/template"
	"net/http"
	"strings"
	"time"

	"github.com/floodgate-dev/floodgate/services/console/internal/blockrate"
)

var blockWindows = []struct {
	Value, Label string
	Step         time.Duration
}{{"1h", "last hour", time.Minute}, {"6h", "last 6 hours", 5 * time.Minute}, {"24h", "last 24 hours", 15 * time.Minute}, {"168h", "last 7 days", 2 * time.Hour}}

// chartWindows are blockWindows for a page's window select.
func chartWindows() []struct{ Value, Label string } {
	out := make([]struct{ Value, Label string }, 0, len(blockWindows))
	for _, bw := range blockWindows {
		out = append(out, struct{ Value, Label string }{bw.Value, bw.Label})
	}
	return out
}

// chartWindow is the length and step of the chart window named value (step 0
// when value names none of blockWindows).
func chartWindow(value string) (win, step time.Duration) {
	for _, bw := range blockWindows {
		if bw.Value == value {
			win, _ = time.ParseDuration(bw.Value)
			return win, bw.Step
		}
	}
	return 0, 0
}

// chartScopes is how many scopes the chart draws (the table lists them all).
const chartScopes = 8

type blockView struct {
	Title   string
	Window  string
	Windows []struct{ Value, Label string }
	Gateway string
	Series  []blockrate.Series
	Chart   template.HTML
	Error   string
}

func (s *Server) blockRate(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	v := blockView{Title: "Block rate", Window: q.Get("window"), Gateway: q.Get("gateway")}
	if v.Window == "" {
		v.Window = "6h"
	}
	v.Windows = chartWindows()
	win, step := chartWindow(v.Window)
	if step == 0 {
		w.WriteHeader(http.StatusBadRequest)
		v.Error = "window must be one of 1h, 6h, 24h, 168h"
		s.render(w, r, "blockrate", v)
		return
	}
	if s.cfg.BlockRate == nil {
		w.WriteHeader(http.StatusServiceUnavailable)
		v.Error = "No InfluxDB is configured (FLOODGATE_INFLUX_URL)."
		s.render(w, r, "blockrate", v)
		return
	}
	var err error
	if v.Series, err = s.cfg.BlockRate.Read(r.Context(), win, step, v.Gateway); err != nil {
		s.cfg.Log.Warn("block rate", "err", err)
		w.WriteHeader(http.StatusServiceUnavailable)
		v.Error = "The block rate could not be read (InfluxDB): " + err.Error()
	}
	v.Chart = blockChart(v.Series, s.cfg.Now().Add(-win), s.cfg.Now())
	s.render(w, r, "blockrate", v)
}

var lineClasses = []string{"l0", "l1", "l2", "l3", "l4", "l5", "l6", "l7"}

// blockChart draws each of the busiest scopes' block rate (0..100 %) over the window.
func blockChart(series []blockrate.Series, from, to time.Time) template.HTML {
	if len(series) == 0 {
		return ""
	}
	const left, top, plotW, plotH = 44, 10, 600, 200
	span := to.Sub(from).Seconds()
	x := func(t time.Time) float64 { return left + plotW*t.Sub(from).Seconds()/span }
	y := func(rate float64) float64 { return top + plotH*(1-rate) }
	var sb strings.Builder
	n := min(len(series), chartScopes)
	fmt.Fprintf(&sb, `<svg class="chart" id="block-chart" viewBox="0 0 %d %d" role="img" aria-label="block rate per scope, %d scopes">`, left+plotW+10, top+plotH+40+18*((n+2)/3), n)
	for _, pct := range []float64{0, 0.25, 0.5, 0.75, 1} {
		fmt.Fprintf(&sb, `<line x1="%d" x2="%d" y1="%.1f" y2="%.1f" class="grid"/><text x="%d" y="%.1f" class="chart-value" text-anchor="end">%.0f%%</text>`,
			left, left+plotW, y(pct), y(pct), left-4, y(pct)+4, pct*100)
	}
	fmt.Fprintf(&sb, `<text x="%d" y="%d" class="chart-label">%s</text><text x="%d" y="%d" class="chart-label" text-anchor="end">%s</text>`,
		left, top+plotH+16, from.UTC().Format("01-02 15:04"), left+plotW, top+plotH+16, to.UTC().Format("01-02 15:04Z"))
	for i := range n {
		s := series[i]
		var pts []string
		for _, p := range s.Points {
			pts = append(pts, fmt.Sprintf("%.1f,%.1f", x(p.At), y(p.Rate())))
		}
		if len(pts) == 1 {
			pts = append(pts, pts[0])
		}
		fmt.Fprintf(&sb, `<polyline class="line %s" points="%s"><title>%s: %.1f%% blocked</title></polyline>`,
			lineClasses[i], strings.Join(pts, " "), template.HTMLEscapeString(s.Scope), 100*s.Rate())
		lx, ly := left+(i%3)*200, top+plotH+36+18*(i/3)
		fmt.Fprintf(&sb, `<rect x="%d" y="%d" width="12" height="4" class="swatch %s"/><text x="%d" y="%d" class="chart-label">%s</text>`,
			lx, ly-4, lineClasses[i], lx+16, ly, template.HTMLEscapeString(s.Scope))
	}
	sb.WriteString(`</svg>`)
	return template.HTML(sb.String()) //nolint:gosec // scopes are escaped, the rest are numbers
}
