package ledger_test

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/require"

	"github.com/floodgate-dev/floodgate/pkg/events"
	"github.com/floodgate-dev/floodgate/pkg/redisx"
	"github.com/floodgate-dev/floodgate/pkg/redisx/redistest"
	"github.com/floodgate-dev/floodgate/pkg/stacktest"
	"github.com/floodgate-dev/floodgate/pkg/stream"
	"github.com/floodgate-dev/floodgate/services/quota/internal/ledger"
	"github.com/floodgate-dev/floodgate/services/quota/internal/quotatest"
)

// TestSecurityOverCostEventsS3 replays finding S3 of issue 22 against the real
// stack (the broker, DynamoDB Local, Redis): a decision event with cost
// 1,000,000 naming a victim. On main it put the victim's ledger at 1,000,000,
// quota-locking it for hours, and re-seeding never lowered it. Now the quota
// consumer bounds an event's cost (FLOODGATE_EVENT_MAX_COST, default 10,000):
// the event is dead-lettered with the reason, and the ledger and the Redis
// day counter hold the victim's own traffic only.
func TestSecurityOverCostEventsS3(t *testing.T) {
	ctx := stacktest.Context(t, 90*time.Second, "needs the local stack; run `make test`")
	st := newConsumerStack(t, "quota-s3", map[string]string{
		"FLOODGATE_QUOTA_FLUSH_INTERVAL": "100ms", "FLOODGATE_QUOTA_FETCH_MAX_WAIT": "50ms",
	})
	broker, group, db, rdb, cfg := st.broker, st.group, st.db, st.rdb, st.cfg
	require.Equal(t, int64(events.DefaultMaxCost), cfg.MaxEventCost)
	c, metrics, _ := st.consumer(t, db, slog.LevelWarn+4)

	victim := events.Principal{Kind: events.PrincipalBot, ID: redistest.Unique(t, "victim")}
	now := time.Now().UTC().Truncate(time.Millisecond)
	dec := func(id string, cost int64) kafka.Message {
		return quotatest.Message(events.Decision{ID: id + "-" + group, TS: now, Principal: victim, IP: netip.MustParseAddr("203.0.113.7"),
			Method: "POST", Route: "/v1/things", Allowed: true, Tier: "principal", Cost: cost, Limit: 100, Remaining: 50, Gateway: "attacker"})
	}
	writer := quotatest.Writer(broker)
	defer writer.Close()
	quotatest.Produce(ctx, t, writer, cfg.DecisionsTopic, []kafka.Message{
		dec("own-1", 3), dec("attack", 1_000_000), dec("own-2", events.DefaultMaxCost), dec("attack-2", events.DefaultMaxCost+1),
	})

	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- c.Run(runCtx) }()
	waitCommitted(ctx, t, broker, group, cfg.DecisionsTopic)
	stop()
	require.NoError(t, <-done)

	day := now.Format(ledger.DayLayout)
	want := int64(3 + events.DefaultMaxCost)
	require.Equal(t, map[quotatest.DayKey]int64{{Principal: victim.Key(), Day: day}: want},
		quotatest.LedgerTotals(ctx, t, db, st.table, []events.Principal{victim}),
		"the ledger holds the victim's own units, nothing of the attack")
	got, err := rdb.Get(ctx, redisx.DayUsageKey(string(victim.Kind), victim.ID, day)).Int64()
	require.NoError(t, err)
	require.Equal(t, want, got, "and so does the day counter the limiter enforces")
	require.Equal(t, 2.0, counterValue(t, metrics.DLQ))
	require.Equal(t, map[stream.ErrorClass]int{stream.ClassPoison: 2}, dlqClasses(ctx, t, broker, cfg.DecisionsTopic+".dlq", 2),
		"both over-cost events are dead-lettered")
	msgs := dlqMessages(ctx, t, broker, cfg.DecisionsTopic+".dlq")
	require.Len(t, msgs, 2)
	for _, m := range msgs {
		require.Contains(t, m, "is over the 10000 an event may carry (FLOODGATE_EVENT_MAX_COST); nothing of it was counted")
	}
}

// dlqMessages returns the error messages of every dead letter on topic.
func dlqMessages(ctx context.Context, t *testing.T, broker, topic string) []string {
	t.Helper()
	client := &kafka.Client{Addr: kafka.TCP(broker), Timeout: 5 * time.Second}
	meta, err := client.Metadata(ctx, &kafka.MetadataRequest{Topics: []string{topic}})
	require.NoError(t, err)
	var out []string
	for _, p := range meta.Topics[0].Partitions {
		conn, err := kafka.DialLeader(ctx, "tcp", broker, topic, p.ID)
		require.NoError(t, err)
		end, err := conn.ReadLastOffset()
		conn.Close()
		require.NoError(t, err)
		r := kafka.NewReader(kafka.ReaderConfig{Brokers: []string{broker}, Topic: topic, Partition: p.ID, MaxWait: 100 * time.Millisecond})
		for i := int64(0); i < end; i++ {
			m, err := r.FetchMessage(ctx)
			require.NoError(t, err)
			rec, err := stream.ParseDLQRecord(m)
			require.NoError(t, err)
			out = append(out, rec.ErrorMessage)
		}
		r.Close()
	}
	return out
}

func TestMaxEventCostIsValidated(t *testing.T) {
	for _, v := range []string{"0", "1000001", "-5"} {
		_, err := ledger.ConfigFromEnv(envMap(map[string]string{"FLOODGATE_EVENT_MAX_COST": v}))
		require.ErrorContains(t, err, "FLOODGATE_EVENT_MAX_COST")
	}
	cfg, err := ledger.ConfigFromEnv(envMap(map[string]string{"FLOODGATE_EVENT_MAX_COST": "50000"}))
	require.NoError(t, err)
	require.Equal(t, int64(50000), cfg.MaxEventCost)
}

// TestSecurityDayBoundT1 replays row 1 of issue 37 against the real stack: a
// producer that may write to the decisions topic sends events at the cost
// cap (10,000, each accepted on its own) naming one bot. On c2eb6a5 nine of
// them took the ledger to 90,001 units, past the bot's 86,400 daily quota.
// Now the ledger bounds what one principal can be charged in a day
// (FLOODGATE_EVENT_DAY_QUOTAS, the largest quota of its kind, plus
// FLOODGATE_EVENT_DAY_SLACK: 86,400 + 10 % = 95,040 by default): the events
// that would pass it are dead-lettered with the reason and counted in
// floodgate_quota_over_day_bound_total, and the ledger and the Redis day
// counter hold no more than the bound — whether the excess arrives in one
// batch or after the day's item exists. The bot's own later units still count.
func TestSecurityDayBoundT1(t *testing.T) {
	ctx := stacktest.Context(t, 120*time.Second, "needs the local stack; run `make test`")
	st := newConsumerStack(t, "quota-t1", map[string]string{
		"FLOODGATE_QUOTA_FLUSH_INTERVAL": "100ms", "FLOODGATE_QUOTA_FETCH_MAX_WAIT": "50ms",
	})
	broker, group, db, rdb, cfg := st.broker, st.group, st.db, st.rdb, st.cfg
	bound, ok := cfg.DayBounds.Bound(events.PrincipalBot)
	require.True(t, ok)
	require.Equal(t, int64(95_040), bound, "86,400 + 10 %")
	c, metrics, _ := st.consumer(t, db, slog.LevelWarn+4)

	victim := events.Principal{Kind: events.PrincipalBot, ID: redistest.Unique(t, "victim")}
	other := events.Principal{Kind: events.PrincipalBot, ID: redistest.Unique(t, "other")}
	now := time.Now().UTC().Truncate(time.Millisecond)
	// Decision ids are unique per decision, as the limiter's are: the ledger
	// skips an id it has seen on the partition, so two bots' decisions must
	// not share one (when both bots hash to one partition, a shared "r1-0"
	// dropped the second bot's first eight as duplicates).
	dec := func(p events.Principal, id string, cost int64) kafka.Message {
		return quotatest.Message(events.Decision{ID: p.ID + "-" + id + "-" + group, TS: now, Principal: p, IP: netip.MustParseAddr("203.0.113.7"),
			Method: "POST", Route: "/v1/things", Allowed: true, Tier: "principal", Cost: cost, Limit: 100, Remaining: 50, Gateway: "attacker"})
	}
	atCap := func(p events.Principal, round string, n int) []kafka.Message {
		var out []kafka.Message
		for i := range n {
			out = append(out, dec(p, fmt.Sprintf("%s-%d", round, i), events.DefaultMaxCost))
		}
		return out
	}
	writer := quotatest.Writer(broker)
	defer writer.Close()
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- c.Run(runCtx) }()

	// Round 1: the victim's own unit and eight at the cap (80,001, under the
	// bound); twelve at the cap for another bot in the same batch (one
	// write would be 120,000: more than the bound on a new item).
	quotatest.Produce(ctx, t, writer, cfg.DecisionsTopic,
		append(append([]kafka.Message{dec(victim, "own-1", 1)}, atCap(victim, "r1", 8)...), atCap(other, "r1", 12)...))
	waitCommitted(ctx, t, broker, group, cfg.DecisionsTopic)
	// Round 2: four more at the cap for the victim (its item holds 80,001),
	// then the victim's own 5 units later on.
	quotatest.Produce(ctx, t, writer, cfg.DecisionsTopic, atCap(victim, "r2", 4))
	waitCommitted(ctx, t, broker, group, cfg.DecisionsTopic)
	quotatest.Produce(ctx, t, writer, cfg.DecisionsTopic, []kafka.Message{dec(victim, "own-2", 5)})
	waitCommitted(ctx, t, broker, group, cfg.DecisionsTopic)
	stop()
	require.NoError(t, <-done)

	day := now.Format(ledger.DayLayout)
	want := map[quotatest.DayKey]int64{
		{Principal: victim.Key(), Day: day}: 1 + 9*events.DefaultMaxCost + 5, // 90,006: the ninth fits, the tenth would be 100,001
		{Principal: other.Key(), Day: day}:  9 * events.DefaultMaxCost,
	}
	require.Equal(t, want, quotatest.LedgerTotals(ctx, t, db, st.table, []events.Principal{victim, other}),
		"the ledger holds no principal past its day's bound")
	for _, p := range []events.Principal{victim, other} {
		got, err := rdb.Get(ctx, redisx.DayUsageKey(string(p.Kind), p.ID, day)).Int64()
		require.NoError(t, err)
		require.Equal(t, want[quotatest.DayKey{Principal: p.Key(), Day: day}], got, "nor does the day counter the limiter enforces")
		require.LessOrEqual(t, got, bound)
	}
	require.Equal(t, 6.0, counterValue(t, metrics.OverDayBound), "3 of the victim's, 3 of the other's")
	require.Equal(t, 6.0, counterValue(t, metrics.DLQ))
	msgs := dlqMessages(ctx, t, broker, cfg.DecisionsTopic+".dlq")
	require.Len(t, msgs, 6)
	for _, m := range msgs {
		require.Contains(t, m, "over the 95040 a principal of its kind may be charged in a day")
		require.Contains(t, m, "nothing of it was counted")
	}
}

func TestDayBoundsAreValidated(t *testing.T) {
	for k, v := range map[string]string{"FLOODGATE_EVENT_DAY_QUOTAS": "robot=5", "FLOODGATE_EVENT_DAY_SLACK": "101"} {
		_, err := ledger.ConfigFromEnv(envMap(map[string]string{k: v}))
		require.ErrorContains(t, err, k)
	}
	cfg, err := ledger.ConfigFromEnv(envMap(map[string]string{"FLOODGATE_EVENT_DAY_QUOTAS": "none"}))
	require.NoError(t, err)
	_, ok := cfg.DayBounds.Bound(events.PrincipalBot)
	require.False(t, ok)
}
