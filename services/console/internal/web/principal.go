package web

import (
	"fmt"
	"html/template"
	"math"
	"net/http"

	"strings"

	"github.com/floodgate-dev/floodgate/pkg/events"
	"github.com/floodgate-dev/floodgate/services/console/internal/quota"
	"github.com/floodgate-dev/floodgate/services/console/internal/store"
)

// UsageDays is how many days of quota usage the principal page shows.
const UsageDays = 14

type principalView struct {
	Title      string
	Principal  string
	Kind, ID   string
	Penalty    store.Penalty
	HasPenalty bool
	Allow      store.AllowEntry
	Allowed    bool
	History    []store.Alert
	Audit      []store.AuditEntry
	Usage      quota.Report
	UsageOK    bool
	UsageError string
	Timeline   template.HTML
	Errors     []string
}

// principal shows one principal: its live penalty, detections, audit log and
// the quota service's daily usage with a timeline chart.
func (s *Server) principal(w http.ResponseWriter, r *http.Request) {
	p := events.Principal{Kind: events.PrincipalKind(r.PathValue("kind")), ID: r.PathValue("id")}
	if err := p.Validate(); err != nil {
		s.fail(w, r, http.StatusNotFound, "no such principal: "+err.Error())
		return
	}
	ctx := r.Context()
	key := p.Key()
	v := principalView{Title: key, Principal: key, Kind: string(p.Kind), ID: p.ID}
	var err error
	if v.Penalty, v.HasPenalty, err = s.cfg.Store.GetPenalty(ctx, key); err != nil {
		v.Errors = append(v.Errors, "live penalty unavailable (Redis): "+err.Error())
	}
	if v.Allow, v.Allowed, err = s.cfg.Store.GetAllow(ctx, key); err != nil {
		v.Errors = append(v.Errors, "allowlist unavailable: "+err.Error())
	}
	if v.History, err = s.cfg.Store.History(ctx, key, 50); err != nil {
		v.Errors = append(v.Errors, "detections unavailable (DynamoDB): "+err.Error())
	}
	if v.Audit, err = s.cfg.Store.AuditLog(ctx, key, 20); err != nil {
		v.Errors = append(v.Errors, "audit log unavailable: "+err.Error())
	}
	if s.cfg.Quota == nil {
		v.UsageError = "No quota service is configured (FLOODGATE_CONSOLE_QUOTA_URL)."
	} else if v.Usage, err = s.cfg.Quota.Usage(ctx, string(p.Kind), p.ID, UsageDays); err != nil {
		s.cfg.Log.Warn("quota usage", "principal", key, "err", err)
		v.UsageError = "Quota usage is unavailable (quota service): " + err.Error()
	} else {
		v.UsageOK = true
		v.Timeline = usageChart(v.Usage.Days, v.History)
	}
	s.render(w, r, "principal", v)
}

// usageChart draws allowed units per day as bars, and marks the days with a
// detection (a red tick above the bar).
func usageChart(days []quota.Day, hist []store.Alert) template.HTML {
	if len(days) == 0 {
		return ""
	}
	detected := map[string]int{}
	for _, a := range hist {
		detected[a.DetectedAt.UTC().Format("2006-01-02")]++
	}
	maxV := int64(1)
	for _, d := range days {
		maxV = max(maxV, d.Units)
	}
	const left, top, plotH, barW, gap = 56, 14, 140, 30, 6
	width := left + len(days)*(barW+gap) + 10
	height := top + plotH + 34
	var sb strings.Builder
	var total int64
	for _, d := range days {
		total += d.Units
	}
	fmt.Fprintf(&sb, `<svg class="chart" id="usage-chart" viewBox="0 0 %d %d" role="img" aria-label="allowed units per day, last %d days, %d in total">`,
		width, height, len(days), total)
	fmt.Fprintf(&sb, `<line x1="%d" x2="%d" y1="%d" y2="%d" class="axis"/><text x="%d" y="%d" class="chart-value" text-anchor="end">%d</text><text x="%d" y="%d" class="chart-value" text-anchor="end">0</text>`,
		left-4, left-4, top, top+plotH, left-8, top+10, maxV, left-8, top+plotH)
	for i, d := range days {
		x := left + i*(barW+gap)
		h := float64(plotH) * float64(d.Units) / float64(maxV)
		y := float64(top+plotH) - h
		fmt.Fprintf(&sb, `<rect x="%d" y="%.1f" width="%d" height="%.1f" class="bar-usage"><title>%s: %d units</title></rect>`,
			x, y, barW, math.Max(h, 0.5), d.Day, d.Units)
		if n := detected[d.Day]; n > 0 {
			fmt.Fprintf(&sb, `<rect x="%d" y="%d" width="%d" height="4" class="bar-detected"><title>%s: %d detection(s)</title></rect>`, x, top-8, barW, d.Day, n)
		}
		if i%2 == 0 || len(days) <= 7 {
			fmt.Fprintf(&sb, `<text x="%d" y="%d" class="chart-label" text-anchor="middle">%s</text>`, x+barW/2, top+plotH+16, d.Day[5:])
		}
	}
	sb.WriteString(`</svg>`)
	return template.HTML(sb.String()) //nolint:gosec // numbers and validated YYYY-MM-DD days only
}
