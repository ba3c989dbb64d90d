package ledger_test

import (
	"context"
	"log/slog"
	"math"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/require"

	"github.com/floodgate-dev/floodgate/services/quota/internal/quotatest"
)

// BenchmarkLedger measures the consumer against the in-process broker,
// DynamoDB Local and Redis: events/s, DynamoDB writes per 1M events and the
// ledger lag. backlog: a stream of events already produced is drained.
// steady: events are produced at a fixed rate while the consumer keeps up.
// Run with -benchtime=1x (one op is a whole scenario).
func BenchmarkLedger(b *testing.B) {
	scenarios := []struct {
		name       string
		events     int
		principals int
		rate       int // events/s produced while consuming; 0 = backlog first
		flush      string
	}{
		{"backlog/1M-events/1k-principals", 1_000_000, 1_000, 0, "1s"},
		{"steady/10k-per-s/500-principals", 200_000, 500, 10_000, "1s"},
	}
	for _, sc := range scenarios {
		b.Run(sc.name, func(b *testing.B) {
			for range b.N {
				benchScenario(b, sc.events, sc.principals, sc.rate, sc.flush)
			}
		})
	}
}

func benchScenario(b *testing.B, events, principals, rate int, flush string) {
	b.StopTimer()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	st := newConsumerStack(b, "quota-bench", map[string]string{
		"FLOODGATE_QUOTA_FLUSH_INTERVAL":  flush,
		"FLOODGATE_QUOTA_SESSION_TIMEOUT": "1s", "FLOODGATE_QUOTA_HEARTBEAT_INTERVAL": "200ms",
		"FLOODGATE_QUOTA_JOIN_BACKOFF": "100ms", "FLOODGATE_QUOTA_FETCH_MAX_WAIT": "100ms",
	})
	broker, group, db, cfg := st.broker, st.group, st.db, st.cfg
	c, _, reg := st.consumer(b, db, slog.LevelError)

	w := quotatest.NewWorkload(11, principals)
	w.Days = w.Days[1:] // today only: the steady state of one day
	msgs := w.Messages(events, 0)
	writer := quotatest.Writer(broker)
	defer writer.Close()
	if rate == 0 {
		quotatest.Produce(ctx, b, writer, cfg.DecisionsTopic, msgs)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	b.StartTimer()
	start := time.Now()
	go func() { done <- c.Run(runCtx) }()
	if rate > 0 {
		produceAt(ctx, b, writer, cfg.DecisionsTopic, msgs, rate)
	}
	for {
		ok, err := quotatest.Committed(ctx, broker, group, cfg.DecisionsTopic)
		if err == nil && ok {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	elapsed := time.Since(start)
	b.StopTimer()
	stop()
	require.NoError(b, <-done)
	require.Equal(b, w.Expected, quotatest.LedgerTotals(ctx, b, db, st.table, w.Principals))

	writes := counterVecSum(b, reg, "floodgate_quota_ledger_writes_total")
	b.ReportMetric(float64(events)/elapsed.Seconds(), "events/s")
	b.ReportMetric(writes*1e6/float64(events), "writes/1M-events")
	p50, p99, maxLag := histogramQuantiles(b, reg, "floodgate_quota_ledger_lag_seconds")
	b.ReportMetric(p50, "lag-p50-s")
	b.ReportMetric(p99, "lag-p99-s")
	b.ReportMetric(maxLag, "lag-max-bucket-s")
	b.Logf("%d events, %d principals, rate %d/s: %.1fs, %.0f UpdateItem calls", events, principals, rate, elapsed.Seconds(), writes)
}

// produceAt writes msgs at about rate per second, in 100ms slices.
func produceAt(ctx context.Context, b *testing.B, writer *kafka.Writer, topic string, msgs []kafka.Message, rate int) {
	per := max(1, rate/10)
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for i := 0; i < len(msgs); i += per {
		<-tick.C
		quotatest.Produce(ctx, b, writer, topic, msgs[i:min(i+per, len(msgs))])
	}
}

func gather(b *testing.B, reg *prometheus.Registry, name string) *dto.MetricFamily {
	mfs, err := reg.Gather()
	require.NoError(b, err)
	for _, mf := range mfs {
		if mf.GetName() == name {
			return mf
		}
	}
	b.Fatalf("metric %s not found", name)
	return nil
}

func counterVecSum(b *testing.B, reg *prometheus.Registry, name string) float64 {
	var sum float64
	for _, m := range gather(b, reg, name).GetMetric() {
		sum += m.GetCounter().GetValue()
	}
	return sum
}

// histogramQuantiles returns the upper bounds of the buckets holding the
// median and the 99th percentile, and of the highest non-empty bucket.
func histogramQuantiles(b *testing.B, reg *prometheus.Registry, name string) (p50, p99, top float64) {
	h := gather(b, reg, name).GetMetric()[0].GetHistogram()
	n := float64(h.GetSampleCount())
	p50, p99, top = math.NaN(), math.NaN(), math.NaN()
	var prev uint64
	for _, bk := range h.GetBucket() {
		c := float64(bk.GetCumulativeCount())
		if math.IsNaN(p50) && c >= 0.5*n {
			p50 = bk.GetUpperBound()
		}
		if math.IsNaN(p99) && c >= 0.99*n {
			p99 = bk.GetUpperBound()
		}
		if bk.GetCumulativeCount() > prev {
			top = bk.GetUpperBound()
		}
		prev = bk.GetCumulativeCount()
	}
	if uint64(n) > prev { // samples beyond the last bucket
		top = math.Inf(1)
		if math.IsNaN(p50) {
			p50 = top
		}
		if math.IsNaN(p99) {
			p99 = top
		}
	}
	return p50, p99, top
}
