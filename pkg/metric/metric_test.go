package metric_test

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/floodgate-dev/floodgate/pkg/metric"
)

func TestFactoryRegistersEachKindWithItsNameHelpAndLabels(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewPedanticRegistry()
	f := metric.With(reg)
	f.Counter("t_plain_total", "A counter.").Add(2)
	f.CounterVec("t_vec_total", "A counter by kind.", "kind").WithLabelValues("a").Inc()
	f.Gauge("t_gauge", "A gauge.").Set(3)
	f.GaugeVec("t_gauge_vec", "A gauge by kind.", "kind").WithLabelValues("b").Set(4)
	f.Histogram("t_seconds", "A histogram.", []float64{1, 2}).Observe(1.5)
	f.HistogramVec("t_vec_seconds", "A histogram by kind.", []float64{1}, "kind").WithLabelValues("c").Observe(0.5)

	n, err := testutil.GatherAndCount(reg)
	require.NoError(t, err)
	require.Equal(t, 6, n)
	mfs, err := reg.Gather()
	require.NoError(t, err)
	got := map[string]string{}
	for _, mf := range mfs {
		got[mf.GetName()] = mf.GetHelp()
		if len(mf.GetMetric()[0].GetLabel()) > 0 {
			require.Equal(t, "kind", mf.GetMetric()[0].GetLabel()[0].GetName(), mf.GetName())
		}
	}
	require.Equal(t, map[string]string{
		"t_plain_total": "A counter.", "t_vec_total": "A counter by kind.", "t_gauge": "A gauge.",
		"t_gauge_vec": "A gauge by kind.", "t_seconds": "A histogram.", "t_vec_seconds": "A histogram by kind.",
	}, got)
	require.Panics(t, func() { f.Counter("t_plain_total", "again") }, "a duplicate name must not register silently")
}

func TestSharedReturnsTheRegisteredCollectorAndReportsConflicts(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewPedanticRegistry()
	a, b := metric.Shared(reg), metric.Shared(reg)
	c1 := a.CounterVec("t_shared_total", "Shared.", "topic")
	c2 := b.CounterVec("t_shared_total", "Shared.", "topic")
	require.Same(t, c1, c2, "a second component gets the collector already registered")
	c2.WithLabelValues("x").Inc()
	require.Equal(t, 1.0, testutil.ToFloat64(c1.WithLabelValues("x")))
	require.NoError(t, a.Err())
	require.NoError(t, b.Err())

	require.NotPanics(t, func() { b.GaugeVec("t_shared_total", "Another kind.", "topic") })
	require.ErrorContains(t, b.Err(), "t_shared_total", "a conflicting collector is reported, not registered")
	require.NoError(t, a.Err(), "each factory reports its own conflicts")

	g := metric.Shared(nil).Gauge("t_unregistered", "No registry.")
	g.Set(2)
	require.Equal(t, 2.0, testutil.ToFloat64(g))
}
