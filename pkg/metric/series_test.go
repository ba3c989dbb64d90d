package metric

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"
)

// TestSeriesResolvesOnce: the series is resolved at the first Get and the
// same one is counted into afterwards.
func TestSeriesResolvesOnce(t *testing.T) {
	vec := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "x_total", Help: "x"}, []string{"k"})
	var s Series
	resolved := 0
	get := func() prometheus.Counter {
		return s.Get(func() prometheus.Counter { resolved++; return vec.WithLabelValues("a") })
	}
	get().Inc()
	get().Add(2)
	require.Equal(t, 1, resolved)
	require.Equal(t, 3.0, testutil.ToFloat64(vec.WithLabelValues("a")))
	require.Equal(t, 0.0, testutil.ToFloat64(vec.WithLabelValues("b")))
}
