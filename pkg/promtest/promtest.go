// Package promtest reads what a Prometheus registry gathers, for tests that
// check a metric by its labels.
package promtest

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
)

// Series is one series of a metric: its labels and its value (a counter's
// or a gauge's value, a histogram's or a summary's sample count).
type Series struct {
	Labels map[string]string
	Value  float64
}

// Gather returns every series of the metric called name that g gathers, in
// g's order; none when g has no such metric. It fails t when g cannot gather.
func Gather(t testing.TB, g prometheus.Gatherer, name string) []Series {
	t.Helper()
	mfs, err := g.Gather()
	require.NoError(t, err)
	var out []Series
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			s := Series{Labels: map[string]string{}}
			for _, l := range m.GetLabel() {
				s.Labels[l.GetName()] = l.GetValue()
			}
			switch {
			case m.Counter != nil:
				s.Value = m.GetCounter().GetValue()
			case m.Gauge != nil:
				s.Value = m.GetGauge().GetValue()
			case m.Histogram != nil:
				s.Value = float64(m.GetHistogram().GetSampleCount())
			case m.Summary != nil:
				s.Value = float64(m.GetSummary().GetSampleCount())
			case m.Untyped != nil:
				s.Value = m.GetUntyped().GetValue()
			}
			out = append(out, s)
		}
	}
	return out
}

// Value is the sum of the series of metric name whose labels include every
// one of want (all of its series for an empty want); 0 when none has them.
func Value(t testing.TB, g prometheus.Gatherer, name string, want map[string]string) float64 {
	t.Helper()
	sum := 0.0
	for _, s := range Gather(t, g, name) {
		if s.Has(want) {
			sum += s.Value
		}
	}
	return sum
}

// Counter is the value of the first series of the metric called name (for a
// counter without labels, its value). It fails t when g has no such metric.
func Counter(t testing.TB, g prometheus.Gatherer, name string) float64 {
	t.Helper()
	series := Gather(t, g, name)
	if len(series) == 0 {
		t.Fatalf("no metric %s", name)
	}
	return series[0].Value
}

// Has reports whether s has every label of want with its value.
func (s Series) Has(want map[string]string) bool {
	for k, v := range want {
		if got, ok := s.Labels[k]; !ok || got != v {
			return false
		}
	}
	return true
}
