package web

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"

	"github.com/floodgate-dev/floodgate/pkg/precision"
	"github.com/floodgate-dev/floodgate/pkg/tick"
)

// PrecisionConfig sets the precision page, metrics and thresholds.
type PrecisionConfig struct {
	// Window is what the metrics and the thresholds judge: the detections
	// made in the last Window (default 7 days, at most 31).
	Window time.Duration
	// Thresholds are each pattern's precision floor over Window; MinJudged
	// judged verdicts are needed before a pattern is judged at all.
	Thresholds precision.Thresholds
}

func (c PrecisionConfig) window() time.Duration {
	if c.Window <= 0 {
		return 7 * 24 * time.Hour
	}
	return c.Window
}

// precisionMetrics are the gauges RefreshPrecision sets; Prometheus alerts on
// floodgate_console_pattern_precision_ratio < floodgate_console_pattern_precision_threshold
// (deploy/prometheus/alerts.yml).
type precisionMetrics struct {
	group     *prometheus.GaugeVec // precision per pattern, kind, route, network
	verdicts  *prometheus.GaugeVec // verdicts per group and verdict
	pattern   *prometheus.GaugeVec // precision per pattern
	judged    *prometheus.GaugeVec // judged verdicts per pattern
	threshold *prometheus.GaugeVec // each pattern's threshold
	minJudged prometheus.Gauge
	refreshed prometheus.Gauge
}

func newPrecisionMetrics(f promauto.Factory) precisionMetrics {
	dims := []string{"pattern", "kind", "route", "network"}
	return precisionMetrics{
		group: f.NewGaugeVec(prometheus.GaugeOpts{Name: "floodgate_console_precision_ratio",
			Help: "Precision (confirmed / (confirmed + false_positive)) of the detections made in the precision window, per pattern, principal kind, top route and network class; absent when none was judged."}, dims),
		verdicts: f.NewGaugeVec(prometheus.GaugeOpts{Name: "floodgate_console_verdicts",
			Help: "Reviewer verdicts on the detections made in the precision window, per pattern, kind, route, network class and verdict."}, append(dims, "verdict")),
		pattern: f.NewGaugeVec(prometheus.GaugeOpts{Name: "floodgate_console_pattern_precision_ratio",
			Help: "Precision of a pattern's detections made in the precision window; absent when none was judged."}, []string{"pattern"}),
		judged: f.NewGaugeVec(prometheus.GaugeOpts{Name: "floodgate_console_pattern_judged",
			Help: "Confirmed and false-positive verdicts on a pattern's detections made in the precision window."}, []string{"pattern"}),
		threshold: f.NewGaugeVec(prometheus.GaugeOpts{Name: "floodgate_console_pattern_precision_threshold",
			Help: "The precision a pattern must keep (FLOODGATE_CONSOLE_PRECISION_THRESHOLDS); alerts need floodgate_console_pattern_judged >= floodgate_console_precision_min_judged."}, []string{"pattern"}),
		minJudged: f.NewGauge(prometheus.GaugeOpts{Name: "floodgate_console_precision_min_judged",
			Help: "Judged verdicts a pattern needs in the precision window before its threshold is checked (FLOODGATE_CONSOLE_PRECISION_MIN_JUDGED)."}),
		refreshed: f.NewGauge(prometheus.GaugeOpts{Name: "floodgate_console_precision_refreshed_timestamp_seconds",
			Help: "When the precision gauges were last computed from the stored verdicts."}),
	}
}

// RefreshPrecision recomputes the precision gauges from the stored verdicts
// now and then every interval until ctx ends.
func (s *Server) RefreshPrecision(ctx context.Context, every time.Duration) error {
	s.refreshPrecision(ctx)
	return tick.Every(ctx, every, s.refreshPrecision)
}

func (s *Server) refreshPrecision(ctx context.Context) {
	now := s.cfg.Now()
	since := now.Add(-s.cfg.Precision.window())
	js, err := s.cfg.Store.Judged(ctx, since, now)
	if err != nil {
		if ctx.Err() == nil {
			s.cfg.Log.Error("refresh precision", "err", err)
		}
		return
	}
	m := s.precision
	m.group.Reset()
	m.verdicts.Reset()
	m.pattern.Reset()
	m.judged.Reset()
	for g, c := range precision.ByGroup(js, since) {
		l := []string{g.Pattern, g.Kind, g.Route, g.Network}
		if p, ok := c.Precision(); ok {
			m.group.WithLabelValues(l...).Set(p)
		}
		m.verdicts.WithLabelValues(append(l, "confirmed")...).Set(float64(c.Confirmed))
		m.verdicts.WithLabelValues(append(l, "false_positive")...).Set(float64(c.FalsePositive))
		m.verdicts.WithLabelValues(append(l, "unsure")...).Set(float64(c.Unsure))
	}
	th := s.cfg.Precision.Thresholds
	for _, r := range precision.Compute(js, precision.DimPattern, since, now, s.cfg.Precision.window()).Rows {
		if p, ok := r.Total.Precision(); ok {
			m.pattern.WithLabelValues(r.Value).Set(p)
		}
		m.judged.WithLabelValues(r.Value).Set(float64(r.Total.Judged()))
		m.threshold.WithLabelValues(r.Value).Set(th.For(r.Value))
	}
	m.minJudged.Set(float64(th.MinJudged))
	m.refreshed.Set(float64(now.Unix()))
}

type precisionView struct {
	Title    string
	Dim      precision.Dim
	Dims     []precision.Dim
	Days     int
	Table    precision.Table
	Breaches []precision.Breach
	Error    string
}

// precisionQuery reads dim (default pattern) and days (1..31, default 7).
func precisionQuery(r *http.Request) (precision.Dim, int, error) {
	q := r.URL.Query()
	dim := precision.DimPattern
	if v := q.Get("by"); v != "" {
		d, err := precision.ParseDim(v)
		if err != nil {
			return "", 0, err
		}
		dim = d
	}
	days := 7
	if v := q.Get("days"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 31 {
			return "", 0, errBadDays
		}
		days = n
	}
	return dim, days, nil
}

var errBadDays = errors.New("days must be 1..31")

func (s *Server) precisionTable(r *http.Request) (precisionView, int) {
	v := precisionView{Title: "Precision", Dims: precision.Dims}
	dim, days, err := precisionQuery(r)
	if err != nil {
		v.Error = err.Error()
		return v, http.StatusBadRequest
	}
	v.Dim, v.Days = dim, days
	now := s.cfg.Now()
	since := now.Add(-time.Duration(days) * 24 * time.Hour)
	js, err := s.cfg.Store.Judged(r.Context(), since, now)
	if err != nil {
		v.Error = "Verdicts could not be read: " + err.Error()
		return v, http.StatusServiceUnavailable
	}
	v.Table = precision.Compute(js, dim, since, now, 24*time.Hour)
	byPattern := v.Table
	if dim != precision.DimPattern {
		byPattern = precision.Compute(js, precision.DimPattern, since, now, 24*time.Hour)
	}
	v.Breaches = s.cfg.Precision.Thresholds.Breaches(byPattern)
	return v, http.StatusOK
}

// precisionPage is GET /precision: precision per pattern, kind, route or
// network class, per day, from the stored verdicts.
func (s *Server) precisionPage(w http.ResponseWriter, r *http.Request) {
	v, code := s.precisionTable(r)
	if code != http.StatusOK {
		w.WriteHeader(code)
	}
	s.render(w, r, "precision", v)
}

// apiPrecision is GET /api/v1/precision: the same table as JSON.
func (s *Server) apiPrecision(w http.ResponseWriter, r *http.Request) {
	v, code := s.precisionTable(r)
	if code != http.StatusOK {
		s.fail(w, r, code, v.Error)
		return
	}
	type count struct {
		Confirmed     int64    `json:"confirmed"`
		FalsePositive int64    `json:"false_positive"`
		Unsure        int64    `json:"unsure"`
		Precision     *float64 `json:"precision"`
	}
	conv := func(c precision.Count) count {
		out := count{Confirmed: c.Confirmed, FalsePositive: c.FalsePositive, Unsure: c.Unsure}
		if p, ok := c.Precision(); ok {
			out.Precision = &p
		}
		return out
	}
	type row struct {
		Value string  `json:"value"`
		Total count   `json:"total"`
		Days  []count `json:"days"`
	}
	rows := func(r precision.Row) row {
		out := row{Value: r.Value, Total: conv(r.Total)}
		for _, c := range r.Buckets {
			out.Days = append(out.Days, conv(c))
		}
		return out
	}
	list := make([]row, 0, len(v.Table.Rows))
	for _, r := range v.Table.Rows {
		list = append(list, rows(r))
	}
	starts := make([]string, 0, len(v.Table.Starts))
	for _, t := range v.Table.Starts {
		starts = append(starts, t.Format("2006-01-02"))
	}
	breaches := make([]map[string]any, 0, len(v.Breaches))
	for _, b := range v.Breaches {
		p, _ := b.Count.Precision()
		breaches = append(breaches, map[string]any{"pattern": b.Pattern, "precision": p, "threshold": b.Threshold, "judged": b.Count.Judged()})
	}
	writeJSON(w, http.StatusOK, map[string]any{"by": v.Dim, "days": starts, "rows": list, "all": rows(v.Table.All), "below_threshold": breaches})
}
