// Package metric registers a component's Prometheus collectors one line
// each: a full metric name, its help and its labels, on an injected
// registry. Services keep their collectors in a per-component Metrics
// struct (STYLE.md) and fill it through a Factory instead of spelling out
// each Opts literal.
package metric

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
)

// Factory registers collectors on one registry; it panics on a duplicate
// name, as promauto does, which a component's constructor meets at start-up.
// A nil registry gives working, unregistered collectors.
type Factory struct{ f promauto.Factory }

// With returns a Factory registering on reg.
func With(reg prometheus.Registerer) Factory { return Factory{f: promauto.With(reg)} }

// Counter registers a counter.
func (f Factory) Counter(name, help string) prometheus.Counter {
	return f.f.NewCounter(prometheus.CounterOpts{Name: name, Help: help})
}

// CounterVec registers a counter with labels.
func (f Factory) CounterVec(name, help string, labels ...string) *prometheus.CounterVec {
	return f.f.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, labels)
}

// Gauge registers a gauge.
func (f Factory) Gauge(name, help string) prometheus.Gauge {
	return f.f.NewGauge(prometheus.GaugeOpts{Name: name, Help: help})
}

// GaugeVec registers a gauge with labels.
func (f Factory) GaugeVec(name, help string, labels ...string) *prometheus.GaugeVec {
	return f.f.NewGaugeVec(prometheus.GaugeOpts{Name: name, Help: help}, labels)
}

// Histogram registers a histogram with the given buckets.
func (f Factory) Histogram(name, help string, buckets []float64) prometheus.Histogram {
	return f.f.NewHistogram(prometheus.HistogramOpts{Name: name, Help: help, Buckets: buckets})
}

// HistogramVec registers a histogram with the given buckets and labels.
func (f Factory) HistogramVec(name, help string, buckets []float64, labels ...string) *prometheus.HistogramVec {
	return f.f.NewHistogramVec(prometheus.HistogramOpts{Name: name, Help: help, Buckets: buckets}, labels)
}
