package web

import (
	"fmt"
	"html/template"
	"math"
	"strconv"
	"strings"

	"github.com/floodgate-dev/floodgate/pkg/events"
	"github.com/floodgate-dev/floodgate/services/console/internal/quota"
	"github.com/floodgate-dev/floodgate/services/console/internal/store"
)

// evidenceChart draws what a pattern compares: for distributed_ip distinct
// networks against the count that fires (a rate means nothing there), for
// the rate patterns the observed rate against the expected one and the line.
func evidenceChart(a *events.Abuse) (template.HTML, string) {
	e := a.Evidence
	if a.Pattern == events.PatternDistributedIP {
		bars := []chartBar{{"addresses", float64(e.DistinctIPs), "bar-observed"}, {"/24 + /64", float64(e.DistinctIP24 + e.DistinctIP64), "bar-observed"}}
		note := "Distinct client addresses and networks in the window"
		if b := e.Basis; b != nil {
			if b.NewNetworks > 0 {
				bars = append(bars, chartBar{"new nets", float64(b.NewNetworks), "bar-observed"})
				note += ", networks new to the principal within seconds (fan-out)"
			}
			bars = append(bars, chartBar{"threshold", float64(b.NetworkThreshold), "bar-threshold"})
			note += ", against the count of unshared networks that fires"
		}
		return barChart(bars, "", -1), note + "."
	}
	note := "Observed rate against the expected (baseline) rate and the firing threshold, events per second."
	if b := e.Basis; b != nil && b.Source == events.BasisLimit {
		note = fmt.Sprintf("Automation is measured against its limit: observed rate, the rate the limiter let through, and the line (%.0f %% of requests denied).", 100*b.DenialRatio)
	}
	return rateChart(e), note
}

type chartBar struct {
	label string
	v     float64
	class string
}

// barChart draws labelled horizontal bars; unit follows each value, written
// with prec decimals (-1: as few as it needs).
func barChart(bars []chartBar, unit string, prec int) template.HTML {
	maxV := 0.0
	for _, b := range bars {
		maxV = math.Max(maxV, b.v)
	}
	if maxV <= 0 {
		maxV = 1
	}
	var sb strings.Builder
	label := make([]string, len(bars))
	for i, b := range bars {
		label[i] = fmt.Sprintf("%s %.2f%s", b.label, b.v, unit)
	}
	fmt.Fprintf(&sb, `<svg class="chart" viewBox="0 0 420 %d" role="img" aria-label="%s">`, 10+30*len(bars), template.HTMLEscapeString(strings.Join(label, ", ")))
	for i, b := range bars {
		y := 8 + i*30
		wd := 260 * b.v / maxV
		fmt.Fprintf(&sb, `<text x="0" y="%d" class="chart-label">%s</text><rect x="80" y="%d" width="%.1f" height="20" class="%s"/><text x="%.1f" y="%d" class="chart-value">%s%s</text>`,
			y+15, b.label, y, math.Max(wd, 1), b.class, 86+wd, y+15, strconv.FormatFloat(b.v, 'f', prec, 64), unit)
	}
	sb.WriteString(`</svg>`)
	return template.HTML(sb.String()) //nolint:gosec // built from numbers and fixed labels only
}

// rateChart compares the observed rate with the expected rate and the threshold.
func rateChart(e events.Evidence) template.HTML {
	return barChart([]chartBar{{"observed", e.ObservedRate, "bar-observed"}, {"expected", e.BaselineRate, "bar-expected"},
		{"threshold", e.Threshold, "bar-threshold"}}, "/s", 2)
}

// scaleBars draws each scope's scale on a 0..1 axis (values above 1 run off the axis' end).
func scaleBars(scales []store.Scale) template.HTML {
	if len(scales) == 0 {
		return ""
	}
	h := 30*len(scales) + 10
	var sb strings.Builder
	fmt.Fprintf(&sb, `<svg class="chart" viewBox="0 0 460 %d" role="img" aria-label="limit scales">`, h)
	for i, sc := range scales {
		y := 5 + i*30
		wd := 300 * math.Min(sc.Value, 1.2)
		fmt.Fprintf(&sb, `<text x="0" y="%d" class="chart-label">%s</text><rect x="110" y="%d" width="%.1f" height="20" class="bar-scale"/><text x="%.1f" y="%d" class="chart-value">%s</text>`,
			y+15, template.HTMLEscapeString(sc.Scope), y, math.Max(wd, 1), 116+wd, y+15, strconv.FormatFloat(sc.Value, 'f', -1, 64))
	}
	fmt.Fprintf(&sb, `<line x1="410" x2="410" y1="0" y2="%d" class="axis-one"/></svg>`, h)
	return template.HTML(sb.String()) //nolint:gosec // scopes are escaped
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
