package ledger_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/redis/go-redis/v9"
	"github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/require"

	"github.com/floodgate-dev/floodgate/pkg/config"
	"github.com/floodgate-dev/floodgate/pkg/dynamo"
	"github.com/floodgate-dev/floodgate/pkg/events"
	"github.com/floodgate-dev/floodgate/pkg/redisx"
	"github.com/floodgate-dev/floodgate/pkg/redisx/redistest"
	"github.com/floodgate-dev/floodgate/pkg/stacktest"
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

// consumerStack is a quota consumer on the real stack for one test or
// benchmark: a fresh broker, a ledger table in DynamoDB Local, the local
// Redis, a unique group, and the consumer's config from vars on top.
type consumerStack struct {
	broker, group, table string
	db                   *dynamodb.Client
	rdb                  redis.UniversalClient
	cfg                  ledger.Config
}

func newConsumerStack(tb testing.TB, group string, vars map[string]string) *consumerStack {
	tb.Helper()
	s := &consumerStack{broker: quotatest.Broker(tb), rdb: redistest.Client(tb), group: redistest.Unique(tb, group)}
	db, prefix := quotatest.LedgerTable(tb)
	s.db, s.table = db, prefix+dynamo.TableQuotaLedger
	vars["FLOODGATE_KAFKA_BROKERS"], vars["FLOODGATE_QUOTA_GROUP"] = s.broker, s.group
	cfg, err := ledger.ConfigFromEnv(envMap(vars))
	require.NoError(tb, err)
	s.cfg = cfg
	return s
}

// consumer is the stack's consumer writing the ledger through db (the
// stack's own, or one wrapping it) and logging from level on.
func (s *consumerStack) consumer(tb testing.TB, db ledger.DynamoAPI, level slog.Level) (*ledger.Consumer, *ledger.Metrics, *prometheus.Registry) {
	tb.Helper()
	reg := prometheus.NewRegistry()
	metrics := ledger.NewMetrics(reg)
	store := ledger.NewStore(db, s.table, s.cfg.RetentionDays, time.Now)
	store.Bounds = s.cfg.DayBounds // as the service wires it
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	c, err := ledger.NewConsumer(s.cfg, store, ledger.NewReseeder(s.rdb, time.Hour, time.Now), log, reg, metrics, time.Now)
	require.NoError(tb, err)
	return c, metrics, reg
}

// TestConsumerExactUnderInjectedFaults runs the consumer in process against
// the in-process broker, DynamoDB Local (with injected throttling and lost
// answers) and Redis: the ledger equals the workload's totals, poison goes to
// the DLQ, and the Redis day counters are re-seeded — also after one is lost.
func TestConsumerExactUnderInjectedFaults(t *testing.T) {
	ctx := stacktest.Context(t, 90*time.Second, "needs the local stack; run `make test`")
	st := newConsumerStack(t, "quota", map[string]string{
		"FLOODGATE_QUOTA_FLUSH_INTERVAL": "100ms", "FLOODGATE_QUOTA_SESSION_TIMEOUT": "1s",
		"FLOODGATE_QUOTA_HEARTBEAT_INTERVAL": "200ms", "FLOODGATE_QUOTA_REBALANCE_TIMEOUT": "2s",
		"FLOODGATE_QUOTA_JOIN_BACKOFF": "100ms", "FLOODGATE_QUOTA_FETCH_MAX_WAIT": "50ms",
	})
	broker, group, db, rdb, cfg := st.broker, st.group, st.db, st.rdb, st.cfg
	faulty := newFaultyDB(db, 0.2, 0.1)
	c, metrics, _ := st.consumer(t, faulty, slog.LevelWarn+4)

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
	// Decisions dated in year 2160, or older than the event-time window (S4),
	// must not count: they are dead-lettered as event_time.
	var outOfWindow int
	for i, ts := range []time.Time{time.Date(2160, 1, 1, 0, 0, 0, 0, time.UTC), time.Now().Add(-40 * 24 * time.Hour)} {
		for j := range 3 {
			d := events.Decision{ID: fmt.Sprintf("oow-%d-%d-%d", i, j, time.Now().UnixNano()), TS: ts.Truncate(time.Millisecond),
				Principal: w.Principals[j], IP: netip.MustParseAddr("203.0.113.9"), Method: "GET", Route: "/v1/things",
				Allowed: true, Tier: "principal", Cost: 1000, Limit: 100, Remaining: 50, Gateway: "attacker"}
			msgs = append(msgs, quotatest.Message(d))
			outOfWindow++
		}
	}
	writer := quotatest.Writer(broker)
	defer writer.Close()
	quotatest.Produce(ctx, t, writer, cfg.DecisionsTopic, msgs)

	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- c.Run(runCtx) }()
	waitCommitted(ctx, t, broker, group, cfg.DecisionsTopic)

	require.Equal(t, w.Expected, quotatest.LedgerTotals(ctx, t, db, st.table, w.Principals))
	require.Positive(t, faulty.throttled.Load())
	require.Positive(t, faulty.lost.Load())
	require.Equal(t, float64(12+outOfWindow), counterValue(t, metrics.DLQ), "every poison or out-of-window message is refused")
	classes := dlqClasses(ctx, t, broker, cfg.DecisionsTopic+".dlq", 12+outOfWindow)
	require.Equal(t, map[stream.ErrorClass]int{stream.ClassPoison: 12, stream.ClassEventTime: outOfWindow}, classes,
		"and dead-lettered with its reason before the batch is committed")
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

// dlqClasses reads n dead letters from the DLQ (every partition) and counts them by class.
func dlqClasses(ctx context.Context, t *testing.T, broker, topic string, n int) map[stream.ErrorClass]int {
	t.Helper()
	client := &kafka.Client{Addr: kafka.TCP(broker), Timeout: 5 * time.Second}
	meta, err := client.Metadata(ctx, &kafka.MetadataRequest{Topics: []string{topic}})
	require.NoError(t, err)
	out := map[stream.ErrorClass]int{}
	total := 0
	for _, p := range meta.Topics[0].Partitions {
		r := kafka.NewReader(kafka.ReaderConfig{Brokers: []string{broker}, Topic: topic, Partition: p.ID, MaxWait: 100 * time.Millisecond})
		conn, err := kafka.DialLeader(ctx, "tcp", broker, topic, p.ID)
		require.NoError(t, err)
		end, err := conn.ReadLastOffset()
		conn.Close()
		require.NoError(t, err)
		for i := int64(0); i < end; i++ {
			m, err := r.FetchMessage(ctx)
			require.NoError(t, err)
			rec, err := stream.ParseDLQRecord(m)
			require.NoError(t, err)
			out[rec.ErrorClass]++
			total++
		}
		r.Close()
	}
	require.Equal(t, n, total, "dead letters on %s", topic)
	return out
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
