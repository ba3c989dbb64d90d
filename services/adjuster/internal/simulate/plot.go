package simulate

import (
	"fmt"
	"html"
	"io"
	"math"
	"strings"
	"time"

	"github.com/floodgate-dev/floodgate/services/adjuster/internal/control"
)

// Plot geometry.
const (
	plotW    = 1000
	panelH   = 250
	marginL  = 60
	marginR  = 170
	marginT  = 55
	gap      = 60
	marginB  = 40
	innerW   = plotW - marginL - marginR
	totalH   = marginT + panelH + gap + panelH + marginB
	bottomY0 = marginT + panelH + gap
)

var (
	signalColors = map[string]string{
		control.SignalCPU: "#d62728", control.SignalMem: "#9467bd",
		control.SignalErrorRate: "#ff7f0e", control.SignalAbuseRate: "#8c564b",
	}
	scopePalette = []string{"#1f77b4", "#2ca02c", "#17becf", "#e377c2", "#7f7f7f", "#bcbd22"}
)

// SVG writes the replay as a standalone SVG image: signals and the thresholds
// they are compared with on top, the scale of every scope below, each change
// marked, and stale stretches shaded.
func (r Result) SVG(w io.Writer, title string) error {
	var b strings.Builder
	r.svg(&b, title)
	_, err := io.WriteString(w, b.String())
	return err
}

// HTML writes a self-contained page: the SVG and a table of every change.
func (r Result) HTML(w io.Writer, title string) error {
	var b strings.Builder
	fmt.Fprintf(&b, "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>%s</title>\n", html.EscapeString(title))
	b.WriteString("<style>body{font-family:sans-serif;margin:2em}table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:2px 8px;font-size:13px}pre{background:#f6f6f6;padding:1em}</style></head><body>\n")
	r.svg(&b, title)
	b.WriteString("\n<h2>Changes</h2>\n<table><tr><th>time (UTC)</th><th>scope</th><th>old</th><th>new</th><th>rule</th><th>why</th></tr>\n")
	for _, t := range r.Ticks {
		for _, ch := range t.Changes {
			fmt.Fprintf(&b, "<tr><td>%s</td><td>%s</td><td>%.4g</td><td>%.4g</td><td>%s</td><td>%s</td></tr>\n",
				t.At.UTC().Format("2006-01-02 15:04:05"), html.EscapeString(ch.Scope), ch.Old, ch.New,
				html.EscapeString(ch.Rule), html.EscapeString(ch.Why))
		}
	}
	fmt.Fprintf(&b, "</table>\n<h2>Summary</h2>\n<pre>%s</pre>\n</body></html>\n", html.EscapeString(r.Summary()))
	_, err := io.WriteString(w, b.String())
	return err
}

func (r Result) svg(b *strings.Builder, title string) {
	if len(r.Ticks) == 0 {
		fmt.Fprintf(b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="60"><text x="10" y="30">no data</text></svg>`, plotW)
		return
	}
	t0, t1 := r.Ticks[0].At, r.Ticks[len(r.Ticks)-1].At
	span := t1.Sub(t0).Seconds()
	if span <= 0 {
		span = 1
	}
	x := func(t time.Time) float64 { return marginL + innerW*t.Sub(t0).Seconds()/span }
	maxScale := 1.0
	for _, s := range r.Scopes {
		maxScale = math.Max(maxScale, r.Rules.Scopes[s].Max)
	}
	maxScale = math.Ceil(maxScale*10) / 10
	ySig := func(v float64) float64 { return marginT + panelH*(1-v) }
	yScale := func(v float64) float64 { return bottomY0 + panelH*(1-v/maxScale) }

	fmt.Fprintf(b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">`+"\n",
		plotW, totalH, plotW, totalH)
	fmt.Fprintf(b, `<rect width="100%%" height="100%%" fill="white"/>`+"\n")
	fmt.Fprintf(b, `<text x="%d" y="22" font-size="15" font-weight="bold">%s</text>`+"\n", marginL, html.EscapeString(title))

	// Stale stretches, shaded in both panels.
	for i, t := range r.Ticks {
		if len(t.Stale) == 0 {
			continue
		}
		xe := x(t.At.Add(r.Rules.Tick.D()))
		if i+1 < len(r.Ticks) {
			xe = x(r.Ticks[i+1].At)
		}
		xe = math.Min(xe, marginL+innerW)
		for _, y0 := range []float64{marginT, bottomY0} {
			fmt.Fprintf(b, `<rect x="%.1f" y="%.1f" width="%.1f" height="%d" fill="#eeeeee"><title>stale: %s</title></rect>`+"\n",
				x(t.At), y0, math.Max(xe-x(t.At), 0.5), panelH, strings.Join(t.Stale, ", "))
		}
	}
	// Axes and grid.
	for _, p := range []struct {
		y0    float64
		label string
		ticks []float64
		y     func(float64) float64
		fmtv  string
	}{
		{marginT, "signals (fraction)", []float64{0, 0.25, 0.5, 0.75, 1}, ySig, "%.2f"},
		{bottomY0, "scale", gridSteps(maxScale), yScale, "%.2f"},
	} {
		fmt.Fprintf(b, `<rect x="%d" y="%.1f" width="%d" height="%d" fill="none" stroke="#333"/>`+"\n", marginL, p.y0, innerW, panelH)
		fmt.Fprintf(b, `<text x="%d" y="%.1f" font-weight="bold">%s</text>`+"\n", marginL, p.y0-8, p.label)
		for _, v := range p.ticks {
			fmt.Fprintf(b, `<line x1="%d" x2="%d" y1="%.1f" y2="%.1f" stroke="#ddd"/>`, marginL, marginL+innerW, p.y(v), p.y(v))
			fmt.Fprintf(b, `<text x="%d" y="%.1f" text-anchor="end">`+p.fmtv+`</text>`+"\n", marginL-6, p.y(v)+4, v)
		}
		for _, tt := range timeTicks(t0, t1) {
			fmt.Fprintf(b, `<line x1="%.1f" x2="%.1f" y1="%.1f" y2="%.1f" stroke="#eee"/>`, x(tt), x(tt), p.y0, p.y0+panelH)
			fmt.Fprintf(b, `<text x="%.1f" y="%.1f" text-anchor="middle" fill="#555">%s</text>`+"\n", x(tt), p.y0+panelH+15, tt.UTC().Format("15:04"))
		}
	}
	// Thresholds.
	legendY := marginT + 10
	var labelYs []float64 // threshold labels already placed, nudged apart so none overlap
	threshold := func(v float64, color, label string) {
		fmt.Fprintf(b, `<line x1="%d" x2="%d" y1="%.1f" y2="%.1f" stroke="%s" stroke-dasharray="6 4" stroke-width="1"/>`+"\n",
			marginL, marginL+innerW, ySig(v), ySig(v), color)
		ly := ySig(v) + 3
		for moved := true; moved; {
			moved = false
			for _, y := range labelYs {
				if math.Abs(ly-y) < 11 {
					ly, moved = y+11, true
				}
			}
		}
		labelYs = append(labelYs, ly)
		fmt.Fprintf(b, `<text x="%d" y="%.1f" fill="%s" font-size="10">%s</text>`+"\n", marginL+innerW+4, ly, color, label)
	}
	if rr := r.Rules.CPUHigh; !rr.Disabled {
		threshold(rr.Above, signalColors[control.SignalCPU], fmt.Sprintf("cpu_high %g", rr.Above))
	}
	if rr := r.Rules.Recover; !rr.Disabled {
		threshold(rr.CPUBelow, signalColors[control.SignalCPU], fmt.Sprintf("recover cpu %g", rr.CPUBelow))
		threshold(rr.MemBelow, signalColors[control.SignalMem], fmt.Sprintf("recover mem %g", rr.MemBelow))
	}
	if rr := r.Rules.ErrorRateHigh; !rr.Disabled {
		threshold(rr.Above, signalColors[control.SignalErrorRate], fmt.Sprintf("error_rate_high %g", rr.Above))
	}
	if rr := r.Rules.AbuseHigh; !rr.Disabled {
		threshold(rr.Above, signalColors[control.SignalAbuseRate], fmt.Sprintf("abuse_high %g", rr.Above))
	}
	// Signal lines; a missing reading breaks the line.
	for _, name := range control.AllSignals {
		var path strings.Builder
		pen := false
		for _, t := range r.Ticks {
			rd := t.Signals.Get(name)
			if !rd.OK || len(t.Stale) > 0 && contains(t.Stale, name) {
				pen = false
				continue
			}
			cmd := "L"
			if !pen {
				cmd, pen = "M", true
			}
			fmt.Fprintf(&path, "%s%.1f,%.1f ", cmd, x(t.At), ySig(rd.Value))
		}
		fmt.Fprintf(b, `<path d="%s" fill="none" stroke="%s" stroke-width="1.5"/>`+"\n", path.String(), signalColors[name])
	}
	legend := func(y0 float64, i int, color, label string) {
		y := y0 + float64(i)*16
		fmt.Fprintf(b, `<line x1="%d" x2="%d" y1="%.1f" y2="%.1f" stroke="%s" stroke-width="3"/><text x="%d" y="%.1f">%s</text>`+"\n",
			plotW-95, plotW-75, y, y, color, plotW-70, y+4, html.EscapeString(label))
	}
	for i, name := range control.AllSignals {
		legend(float64(legendY)+panelH-90, i, signalColors[name], name)
	}
	// Scales as step lines, changes marked.
	for i, scope := range r.Scopes {
		color := scopePalette[i%len(scopePalette)]
		var path strings.Builder
		prev := 0.0
		for j, t := range r.Ticks {
			v := t.Scales[scope]
			if j == 0 {
				fmt.Fprintf(&path, "M%.1f,%.1f ", x(t.At), yScale(v))
			} else {
				fmt.Fprintf(&path, "L%.1f,%.1f L%.1f,%.1f ", x(t.At), yScale(prev), x(t.At), yScale(v))
			}
			prev = v
		}
		// Earlier scopes are drawn wider so a later scope on the same values leaves them visible.
		width := math.Max(1.5, 4.5-1.5*float64(i))
		fmt.Fprintf(b, `<path d="%s" fill="none" stroke="%s" stroke-width="%.1f"/>`+"\n", path.String(), color, width)
		for _, t := range r.Ticks {
			for _, ch := range t.Changes {
				if ch.Scope == scope {
					fmt.Fprintf(b, `<circle cx="%.1f" cy="%.1f" r="3" fill="%s"><title>%s %s: %.4g → %.4g (%s)</title></circle>`+"\n",
						x(t.At), yScale(ch.New), color, t.At.UTC().Format("15:04:05"), html.EscapeString(ch.Rule), ch.Old, ch.New, html.EscapeString(ch.Why))
				}
			}
		}
		legend(bottomY0+10, i, color, scope)
	}
	fmt.Fprintf(b, `<text x="%d" y="%d" fill="#555">time (UTC); grey: a signal was missing or stale</text>`+"\n", marginL, totalH-8)
	b.WriteString("</svg>\n")
}

func contains(s []string, v string) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

func gridSteps(max float64) []float64 {
	step := 0.25
	if max > 2 {
		step = 0.5
	}
	if max > 5 {
		step = 1
	}
	var out []float64
	for v := 0.0; v <= max+1e-9; v += step {
		out = append(out, v)
	}
	return out
}

// timeTicks picks round times for the x axis, about eight of them.
func timeTicks(t0, t1 time.Time) []time.Time {
	span := t1.Sub(t0)
	steps := []time.Duration{time.Minute, 2 * time.Minute, 5 * time.Minute, 10 * time.Minute, 15 * time.Minute,
		30 * time.Minute, time.Hour, 2 * time.Hour, 6 * time.Hour, 12 * time.Hour, 24 * time.Hour}
	step := steps[len(steps)-1]
	for _, s := range steps {
		if span/s <= 8 {
			step = s
			break
		}
	}
	var out []time.Time
	for t := t0.Truncate(step); !t.After(t1); t = t.Add(step) {
		if !t.Before(t0) {
			out = append(out, t)
		}
	}
	return out
}
