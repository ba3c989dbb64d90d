// Package metric registers a component's Prometheus collectors one line
// each: a full metric name, its help and its labels, on an injected
// registry. Services keep their collectors in a per-component Metrics
// struct (STYLE.md) and fill it through a Factory instead of spelling out
// each Opts literal.
package metric

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"
)

// Factory registers collectors on one registry. A Factory from With panics
// on a duplicate name, as promauto does, which a component's constructor meets
// at start-up; one from Shared lets components share the registry. A nil
// registry gives working, unregistered collectors.
type Factory struct {
	reg  prometheus.Registerer
	errs *[]error // Shared: registration errors kept for Err; nil: panic
}

// With returns a Factory registering on reg that panics on a duplicate name.
func With(reg prometheus.Registerer) Factory { return Factory{reg: reg} }

// Shared returns a Factory registering on reg for collectors that several
// components register alike (every Kafka consumer and producer of a process
// shares the stream metrics): a collector already registered under the same
// description is returned instead of the new one. What cannot be registered
// (another collector under one of the names) does not panic; Err reports it.
func Shared(reg prometheus.Registerer) Factory { return Factory{reg: reg, errs: new([]error)} }

// Err joins the registration errors a Shared factory met so far (nil: none).
func (f Factory) Err() error {
	if f.errs == nil {
		return nil
	}
	return errors.Join(*f.errs...)
}

// Counter registers a counter.
func (f Factory) Counter(name, help string) prometheus.Counter {
	return register(f, prometheus.NewCounter(prometheus.CounterOpts{Name: name, Help: help}))
}

// CounterVec registers a counter with labels.
func (f Factory) CounterVec(name, help string, labels ...string) *prometheus.CounterVec {
	return register(f, prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, labels))
}

// Gauge registers a gauge.
func (f Factory) Gauge(name, help string) prometheus.Gauge {
	return register(f, prometheus.NewGauge(prometheus.GaugeOpts{Name: name, Help: help}))
}

// GaugeVec registers a gauge with labels.
func (f Factory) GaugeVec(name, help string, labels ...string) *prometheus.GaugeVec {
	return register(f, prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: name, Help: help}, labels))
}

// Histogram registers a histogram with the given buckets.
func (f Factory) Histogram(name, help string, buckets []float64) prometheus.Histogram {
	return register(f, prometheus.NewHistogram(prometheus.HistogramOpts{Name: name, Help: help, Buckets: buckets}))
}

// HistogramVec registers a histogram with the given buckets and labels.
func (f Factory) HistogramVec(name, help string, buckets []float64, labels ...string) *prometheus.HistogramVec {
	return register(f, prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: name, Help: help, Buckets: buckets}, labels))
}

// register registers c on f's registry. With a Shared factory, a collector of
// the same kind already registered under the same description is returned
// instead, and other errors are kept for Err; otherwise an error panics.
func register[C prometheus.Collector](f Factory, c C) C {
	if f.reg == nil {
		return c
	}
	err := f.reg.Register(c)
	if err == nil {
		return c
	}
	if f.errs == nil {
		panic(err)
	}
	var are prometheus.AlreadyRegisteredError
	if errors.As(err, &are) {
		if existing, ok := are.ExistingCollector.(C); ok {
			return existing
		}
	}
	*f.errs = append(*f.errs, err)
	return c
}
