package promtest_test

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
	"github.com/stretchr/testify/require"

	"github.com/floodgate-dev/floodgate/pkg/promtest"
)

func TestGatherAndValue(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	c := promauto.With(reg).NewCounterVec(prometheus.CounterOpts{Name: "test_calls_total"}, []string{"route", "code"})
	c.WithLabelValues("/a", "200").Add(3)
	c.WithLabelValues("/a", "500").Add(1)
	c.WithLabelValues("/b", "200").Add(5)
	h := promauto.With(reg).NewHistogram(prometheus.HistogramOpts{Name: "test_seconds"})
	h.Observe(0.1)
	h.Observe(0.2)
	promauto.With(reg).NewGauge(prometheus.GaugeOpts{Name: "test_open"}).Set(7)

	require.Len(t, promtest.Gather(t, reg, "test_calls_total"), 3)
	require.Empty(t, promtest.Gather(t, reg, "test_missing"))
	require.Equal(t, 3.0, promtest.Value(t, reg, "test_calls_total", map[string]string{"route": "/a", "code": "200"}))
	require.Equal(t, 4.0, promtest.Value(t, reg, "test_calls_total", map[string]string{"route": "/a"}))
	require.Equal(t, 9.0, promtest.Value(t, reg, "test_calls_total", nil))
	require.Zero(t, promtest.Value(t, reg, "test_calls_total", map[string]string{"route": "/c"}))
	require.Zero(t, promtest.Value(t, reg, "test_calls_total", map[string]string{"method": ""}), "a label the series lacks is not an empty one")
	require.Equal(t, 2.0, promtest.Value(t, reg, "test_seconds", nil), "a histogram's sample count")
	require.Equal(t, 7.0, promtest.Value(t, reg, "test_open", nil))
	promauto.With(reg).NewCounter(prometheus.CounterOpts{Name: "test_plain_total"}).Add(2)
	require.Equal(t, 2.0, promtest.Counter(t, reg, "test_plain_total"))
}
