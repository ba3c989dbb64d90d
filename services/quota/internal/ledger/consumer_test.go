package ledger_test

import (
	"context"
	"encoding/json"
	"log/slog"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/require"

	"github.com/floodgate-dev/floodgate/pkg/config"
	"github.com/floodgate-dev/floodgate/pkg/dynamo"
	"github.com/floodgate-dev/floodgate/pkg/redisx"
	"github.com/floodgate-dev/floodgate/pkg/redisx/redistest"
	"github.com/floodgate-dev/floodgate/pkg/stream"
	"github.com/floodgate-dev/floodgate/services/quota/internal/ledger"
	"github.com/floodgate-dev/floodgate/services/quota/internal/quotatest"
)

func envMap(m map[string]string) config.Getenv {
	return func(k string) string {
		if v, ok := m[k]; ok {
			return v
		}
		return os.Getenv(k)
	}
}

// TestConsumerExactUnderInjectedFaults runs the consumer in process against
// the in-process broker, DynamoDB Local (with injected throttling and lost
// answers) and Redis: the ledger equals the workload's totals, poison goes to
// the DLQ, and the Redis day counters are re-seeded — also after one is lost.
func TestConsumerExactUnderInjectedFaults(t *testing.T) {
	if testing.Short() {
		t.Skip("needs the local stack; run `make test`")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	broker := quotatest.Broker(t)
	db, prefix := quotatest.LedgerTable(t)
	rdb := redistest.Client(t)
	group := redistest.Unique(t, "quota")

	cfg, err := ledger.ConfigFromEnv(envMap(map[string]string{
		"FLOODGATE_KAFKA_BROKERS": broker, "FLOODGATE_QUOTA_GROUP": group,
		"FLOODGATE_QUOTA_FLUSH_INTERVAL": "100ms", "FLOODGATE_QUOTA_SESSION_TIMEOUT": "1s",
		"FLOODGATE_QUOTA_HEARTBEAT_INTERVAL": "200ms", "FLOODGATE_QUOTA_REBALANCE_TIMEOUT": "2s",
		"FLOODGATE_QUOTA_JOIN_BACKOFF": "100ms", "FLOODGATE_QUOTA_FETCH_MAX_WAIT": "50ms",
	}))
	require.NoError(t, err)
	faulty := newFaultyDB(db, 0.2, 0.1)
	store := ledger.NewStore(faulty, prefix+dynamo.TableQuotaLedger, cfg.RetentionDays, time.Now)
	reg := prometheus.NewRegistry()
	metrics := ledger.NewMetrics(reg)
	dlq := stream.NewProducer(stream.ProducerConfig{Brokers: []string{broker}, Registerer: reg})
	defer dlq.Close()
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn + 4}))
	c := ledger.NewConsumer(cfg, store, ledger.NewReseeder(rdb, time.Hour, time.Now), dlq, log, metrics, time.Now)

	w := quotatest.NewWorkload(7, 40)
	msgs := w.Messages(3000, 250)
	// A producer retry after a lost acknowledgement writes the same decision again
	// at a later offset: every 10th message comes twice and must count once.
	var withDups []kafka.Message
	dups := 0
	for i, m := range msgs {
		withDups = append(withDups, m)
		if i%10 == 0 && json.Valid(m.Value) { // not the poison ones
			withDups = append(withDups, m)
			dups++
		}
	}
	msgs = withDups
	writer := quotatest.Writer(broker)
	defer writer.Close()
	quotatest.Produce(ctx, t, writer, cfg.DecisionsTopic, msgs)

	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- c.Run(runCtx) }()
	waitCommitted(ctx, t, broker, group, cfg.DecisionsTopic)

	require.Equal(t, w.Expected, quotatest.LedgerTotals(ctx, t, db, prefix+dynamo.TableQuotaLedger, w.Principals))
	require.Positive(t, faulty.throttled.Load())
	require.Positive(t, faulty.lost.Load())
	require.Equal(t, float64(12), counterValue(t, metrics.DLQ), "every poison message is dead-lettered")
	require.Equal(t, float64(dups), counterValue(t, metrics.Messages.WithLabelValues("duplicate")), "every retried write is recognised")

	// Today's counters were re-seeded from the ledger.
	today := time.Now().UTC().Format(ledger.DayLayout)
	for _, p := range w.Principals {
		want := w.Expected[quotatest.DayKey{Principal: p.Key(), Day: today}]
		if want == 0 {
			continue
		}
		got, err := rdb.Get(ctx, redisx.DayUsageKey(string(p.Kind), p.ID, today)).Int64()
		require.NoError(t, err, p.Key())
		require.Equal(t, want, got, p.Key())
	}

	t.Run("a lost day counter comes back from the ledger", func(t *testing.T) {
		p := w.Principals[0]
		key := redisx.DayUsageKey(string(p.Kind), p.ID, today)
		require.NoError(t, rdb.Del(ctx, key).Err())
		d := w.Decision()
		for d.Principal != p || !d.Allowed || d.TS.UTC().Format(ledger.DayLayout) != today {
			d = w.Decision()
		}
		quotatest.Produce(ctx, t, writer, cfg.DecisionsTopic, []kafka.Message{quotatest.Message(d)})
		want := w.Expected[quotatest.DayKey{Principal: p.Key(), Day: today}]
		require.Eventually(t, func() bool {
			v, err := rdb.Get(ctx, key).Result()
			return err == nil && v == strconv.FormatInt(want, 10)
		}, 20*time.Second, 50*time.Millisecond)
		ttl, err := rdb.PTTL(ctx, key).Result()
		require.NoError(t, err)
		require.Positive(t, ttl, "the re-seeded counter expires")
		require.LessOrEqual(t, ttl, 25*time.Hour)
	})

	stop()
	require.NoError(t, <-done)
}

func waitCommitted(ctx context.Context, t *testing.T, broker, group, topic string) {
	t.Helper()
	require.Eventually(t, func() bool {
		ok, err := quotatest.Committed(ctx, broker, group, topic)
		return err == nil && ok
	}, 60*time.Second, 100*time.Millisecond, "the group commits every partition to its end")
}

func counterValue(t *testing.T, c prometheus.Counter) float64 {
	t.Helper()
	var m dto.Metric
	require.NoError(t, c.Write(&m))
	return m.GetCounter().GetValue()
}
