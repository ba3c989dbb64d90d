package stream

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/require"

	"github.com/floodgate-dev/floodgate/pkg/kafkatest"
	"github.com/floodgate-dev/floodgate/pkg/stream/streamtest"
)

const waitFor = 20 * time.Second

func TestConsumerOrderedDeliveryAndCommit(t *testing.T) {
	const (
		topic      = "orders"
		partitions = 3
		keys       = 12
		perKey     = 25
	)
	addr := kafkatest.Start(t, map[string]int32{topic: partitions, topic + ".dlq": 1})

	var msgs []kafka.Message
	for i := range perKey {
		for k := range keys {
			msgs = append(msgs, kafka.Message{Topic: topic, Key: []byte("principal-" + strconv.Itoa(k)), Value: []byte(strconv.Itoa(i))})
		}
	}
	publish(t, addr, msgs...)

	var mu sync.Mutex
	seen := map[string][]int{}                // key → values in handling order
	offsets := map[int][]int64{}              // partition → offsets in handling order
	keyPartition := map[string]map[int]bool{} // key → partitions it was seen on
	var total atomic.Int64
	reg := prometheus.NewRegistry()
	c, err := NewConsumer(fastConsumerConfig(t, addr, topic, "g-ordered", reg), func(_ context.Context, m kafka.Message) error {
		v, err := strconv.Atoi(string(m.Value))
		if err != nil {
			return Permanent(err)
		}
		mu.Lock()
		k := string(m.Key)
		seen[k] = append(seen[k], v)
		offsets[m.Partition] = append(offsets[m.Partition], m.Offset)
		if keyPartition[k] == nil {
			keyPartition[k] = map[int]bool{}
		}
		keyPartition[k][m.Partition] = true
		mu.Unlock()
		total.Add(1)
		return nil
	})
	require.NoError(t, err)
	stop := runConsumer(t, c)

	require.Eventually(t, func() bool { return total.Load() == int64(len(msgs)) }, waitFor, 10*time.Millisecond)
	require.NoError(t, stop())

	require.Len(t, seen, keys)
	for k, vs := range seen {
		require.Len(t, vs, perKey, "key %s handled exactly once per message", k)
		for i, v := range vs {
			require.Equal(t, i, v, "key %s out of order: %v", k, vs)
		}
		require.Len(t, keyPartition[k], 1, "a key stays on one partition")
	}
	for p, offs := range offsets {
		for i := 1; i < len(offs); i++ {
			require.Greater(t, offs[i], offs[i-1], "partition %d handled out of order", p)
		}
	}
	requireAllCommitted(t, addr, "g-ordered", topic, partitions, "drain commits every handled offset")
	require.Equal(t, float64(len(msgs)), streamtest.MetricValue(t, reg, "floodgate_stream_consumed_total",
		map[string]string{"topic": topic, "group": "g-ordered", "outcome": "ok"}))
	require.Equal(t, float64(len(msgs)), streamtest.MetricValue(t, reg, "floodgate_stream_handle_seconds", nil))
}

// permanentType is a decoder-style error that marks itself permanent.
type permanentType struct{}

func (permanentType) Error() string   { return "schema violation: field ts missing" }
func (permanentType) Permanent() bool { return true }

func TestConsumerFailureHandling(t *testing.T) {
	const maxAttempts = 3
	transientErr := errors.New("dynamodb throttled")
	tests := []struct {
		name string
		// fail decides the outcome of attempt n (1-based) on the target message.
		fail         func(attempt int) error
		wantDLQ      bool
		wantClass    ErrorClass
		wantAttempts int // handler invocations on the target
		wantErrMsg   string
		wantOutcome  string // consumed_total outcome for the target
	}{
		{
			name: "transient twice then success",
			fail: func(n int) error {
				if n <= 2 {
					return transientErr
				}
				return nil
			},
			wantAttempts: 3,
			wantOutcome:  outcomeRetried,
		},
		{
			name:         "poison goes to the DLQ at once",
			fail:         func(int) error { return fmt.Errorf("decode decision: %w", Permanent(errors.New("bad json"))) },
			wantDLQ:      true,
			wantClass:    ClassPoison,
			wantAttempts: 1,
			wantErrMsg:   "decode decision: bad json",
			wantOutcome:  outcomeDLQ,
		},
		{
			name:         "error with Permanent() is poison",
			fail:         func(int) error { return fmt.Errorf("validate: %w", permanentType{}) },
			wantDLQ:      true,
			wantClass:    ClassPoison,
			wantAttempts: 1,
			wantErrMsg:   "validate: schema violation: field ts missing",
			wantOutcome:  outcomeDLQ,
		},
		{
			name:         "retries exhausted",
			fail:         func(int) error { return transientErr },
			wantDLQ:      true,
			wantClass:    ClassTransientExhausted,
			wantAttempts: maxAttempts,
			wantErrMsg:   "dynamodb throttled",
			wantOutcome:  outcomeDLQ,
		},
		{
			name:         "panic",
			fail:         func(int) error { panic("nil map in scorer") },
			wantDLQ:      true,
			wantClass:    ClassHandlerPanic,
			wantAttempts: 1,
			wantErrMsg:   "handler panic: nil map in scorer",
			wantOutcome:  outcomeDLQ,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			const topic, dlqTopic, group = "decisions", "decisions.dlq", "g-fail"
			addr := kafkatest.Start(t, map[string]int32{topic: 1, dlqTopic: 1})
			target := kafka.Message{
				Topic:   topic,
				Key:     []byte("bot_abc123"),
				Value:   []byte{'{', 0x00, 0xff, 0xfe, '}'}, // not even UTF-8: must survive byte for byte
				Headers: CloudEventHeaders("decision.v1", "evt-1", "test", time.Now()),
				Time:    time.Date(2026, 5, 6, 7, 8, 9, 10_000_000, time.UTC),
			}
			publish(t, addr,
				kafka.Message{Topic: topic, Key: []byte("bot_abc123"), Value: []byte("before")},
				target,
				kafka.Message{Topic: topic, Key: []byte("bot_abc123"), Value: []byte("after")},
			)

			var mu sync.Mutex
			var handled collector // successful handling, in order
			attempts := 0
			reg := prometheus.NewRegistry()
			cfg := fastConsumerConfig(t, addr, topic, group, reg)
			cfg.MaxAttempts = maxAttempts
			start := time.Now()
			c, err := NewConsumer(cfg, func(_ context.Context, m kafka.Message) error {
				if m.Offset == 1 {
					mu.Lock()
					attempts++
					n := attempts
					mu.Unlock()
					if err := tt.fail(n); err != nil {
						return err
					}
				}
				return handled.handle(context.Background(), m)
			})
			require.NoError(t, err)
			stop := runConsumer(t, c)
			require.Eventually(t, func() bool { return handled.has("after") }, waitFor, 10*time.Millisecond)
			require.NoError(t, stop())

			mu.Lock()
			defer mu.Unlock()
			require.Equal(t, tt.wantAttempts, attempts)
			if tt.wantDLQ {
				require.Equal(t, []string{"before", "after"}, handled.values())
			} else {
				require.Equal(t, []string{"before", string(target.Value), "after"}, handled.values(), "handled once, in order")
			}
			require.Equal(t, []int64{3}, kafkatest.CommittedOffsets(t, addr, group, topic, 1), "everything committed")
			require.Equal(t, 1.0, streamtest.MetricValue(t, reg, "floodgate_stream_consumed_total",
				map[string]string{"outcome": tt.wantOutcome}))

			dlqEnd := kafkatest.EndOffsets(t, addr, dlqTopic, 1)[0]
			if !tt.wantDLQ {
				require.Zero(t, dlqEnd, "nothing dead-lettered")
				require.Zero(t, streamtest.MetricValue(t, reg, "floodgate_stream_dlq_total", nil))
				return
			}
			require.EqualValues(t, 1, dlqEnd)
			require.Equal(t, 1.0, streamtest.MetricValue(t, reg, "floodgate_stream_dlq_total",
				map[string]string{"topic": topic, "class": string(tt.wantClass)}))
			dl := kafkatest.ReadPartition(t, addr, dlqTopic, 0, 1)[0]
			require.Equal(t, target.Key, dl.Key, "key byte-identical")
			require.Equal(t, target.Value, dl.Value, "value byte-identical")

			h := kafkatest.Headers(dl.Headers)
			for _, orig := range target.Headers {
				require.Equal(t, string(orig.Value), h[orig.Key], "original header %s kept", orig.Key)
			}
			require.Equal(t, topic, h[HeaderDLQSourceTopic])
			require.Equal(t, "0", h[HeaderDLQPartition])
			require.Equal(t, "1", h[HeaderDLQOffset])
			require.Equal(t, "2026-05-06T07:08:09.010Z", h[HeaderDLQTimestamp])
			require.Equal(t, group, h[HeaderDLQConsumerGroup])
			require.Equal(t, "stream-test", h[HeaderDLQService])
			require.Equal(t, string(tt.wantClass), h[HeaderDLQErrorClass])
			require.Equal(t, tt.wantErrMsg, h[HeaderDLQErrorMessage])
			require.Equal(t, strconv.Itoa(tt.wantAttempts), h[HeaderDLQAttempts])

			rec, err := ParseDLQRecord(dl)
			require.NoError(t, err)
			require.Equal(t, tt.wantClass, rec.ErrorClass)
			require.Equal(t, tt.wantAttempts, rec.Attempts)
			require.True(t, target.Time.Equal(rec.Timestamp))
			require.WithinRange(t, rec.FirstFailure, start.Add(-time.Second).Truncate(time.Millisecond), time.Now())
			require.Len(t, rec.Headers, len(target.Headers))
		})
	}
}

// flakyPublisher fails its first n publishes, then delegates.
type flakyPublisher struct {
	next      publisher
	failFirst int64
	calls     atomic.Int64
}

func (f *flakyPublisher) Publish(ctx context.Context, msgs ...kafka.Message) error {
	if f.calls.Add(1) <= f.failFirst {
		return errors.New("broker not available")
	}
	return f.next.Publish(ctx, msgs...)
}

func TestConsumerDLQPublishRetriedBeforeCommit(t *testing.T) {
	tests := []struct {
		name       string
		failFirst  int64 // DLQ publishes that fail
		wantCommit int64 // committed offset after shutdown
		wantDLQ    int64
	}{
		// The DLQ recovers: the poison message is dead-lettered, then
		// everything is committed.
		{name: "dlq recovers", failFirst: 3, wantCommit: 3, wantDLQ: 1},
		// The DLQ never recovers: at the drain deadline the poison message is
		// neither handled nor dead-lettered, so nothing from it on is committed.
		{name: "dlq down until shutdown", failFirst: 1 << 40, wantCommit: 1, wantDLQ: 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			const topic, dlqTopic, group = "events", "events.dlq", "g-dlq"
			addr := kafkatest.Start(t, map[string]int32{topic: 1, dlqTopic: 1})
			publish(t, addr,
				kafka.Message{Topic: topic, Value: []byte("ok")},
				kafka.Message{Topic: topic, Value: []byte("poison")},
				kafka.Message{Topic: topic, Value: []byte("ok")},
			)
			reg := prometheus.NewRegistry()
			cfg := fastConsumerConfig(t, addr, topic, group, reg)
			cfg.DrainTimeout = 300 * time.Millisecond
			var handledAfter atomic.Bool
			c, err := NewConsumer(cfg, func(_ context.Context, m kafka.Message) error {
				if string(m.Value) == "poison" {
					return Permanent(errors.New("poison"))
				}
				if m.Offset == 2 {
					handledAfter.Store(true)
				}
				return nil
			})
			require.NoError(t, err)
			flaky := &flakyPublisher{next: c.dlq, failFirst: tt.failFirst}
			c.dlq = flaky
			stop := runConsumer(t, c)

			require.Eventually(t, func() bool { return flaky.calls.Load() > min(tt.failFirst, 5) }, waitFor, 5*time.Millisecond)
			if tt.wantDLQ > 0 {
				require.Eventually(t, handledAfter.Load, waitFor, 5*time.Millisecond)
			} else {
				// Give the commit loop a few intervals: it must not move past
				// the poison message while its dead-lettering is retried.
				time.Sleep(4 * cfg.CommitInterval)
				require.Equal(t, []int64{1}, kafkatest.CommittedOffsets(t, addr, group, topic, 1))
				require.False(t, handledAfter.Load(), "the partition waits for the poison message")
			}
			require.NoError(t, stop())
			require.Equal(t, []int64{tt.wantCommit}, kafkatest.CommittedOffsets(t, addr, group, topic, 1))
			require.Equal(t, []int64{tt.wantDLQ}, kafkatest.EndOffsets(t, addr, dlqTopic, 1))
			require.GreaterOrEqual(t, streamtest.MetricValue(t, reg, "floodgate_stream_dlq_publish_errors_total", nil), 1.0)
		})
	}
}

func TestConsumerGracefulDrainAndResume(t *testing.T) {
	const (
		topic      = "resume"
		partitions = 2
		n          = 200
		group      = "g-resume"
	)
	addr := seeded(t, topic, partitions, n, 10)

	reg := prometheus.NewRegistry()

	// First consumer: slow handlers; stop it mid-stream.
	var mu sync.Mutex
	first := map[pos]bool{}
	var inFlightAtCancel atomic.Int64
	var cancelled atomic.Bool
	var ctxErrDuringDrain atomic.Int64
	c1, err := NewConsumer(fastConsumerConfig(t, addr, topic, group, reg), func(ctx context.Context, m kafka.Message) error {
		wasCancelled := cancelled.Load()
		time.Sleep(20 * time.Millisecond)
		if cancelled.Load() && !wasCancelled {
			inFlightAtCancel.Add(1)
		}
		if cancelled.Load() && ctx.Err() != nil {
			ctxErrDuringDrain.Add(1)
		}
		mu.Lock()
		first[pos{m.Partition, m.Offset}] = true
		mu.Unlock()
		return nil
	})
	require.NoError(t, err)
	stop1 := runConsumer(t, c1)
	require.Eventually(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(first) >= 40
	}, waitFor, 5*time.Millisecond)
	cancelled.Store(true)
	require.NoError(t, stop1(), "clean drain")
	require.Zero(t, ctxErrDuringDrain.Load(), "handler context stays alive during the drain")

	committed := kafkatest.CommittedOffsets(t, addr, group, topic, partitions)
	mu.Lock()
	handled1 := len(first)
	for p := range partitions {
		// Each partition is handled in order, so the first consumer handled
		// exactly the offsets below what it committed.
		for o := int64(0); o < committed[p]; o++ {
			require.True(t, first[pos{p, o}], "partition %d offset %d committed but not handled", p, o)
		}
		for q := range first {
			if q.partition == p {
				require.Less(t, q.offset, committed[p], "partition %d offset %d handled but not committed", p, q.offset)
			}
		}
	}
	mu.Unlock()
	require.Less(t, handled1, n, "stopped mid-stream")
	t.Logf("first consumer handled %d, committed %v, %d handlers were in flight at cancel", handled1, committed, inFlightAtCancel.Load())

	// Second consumer, same group: resumes exactly at the committed offsets.
	var second sync.Map
	var count2 atomic.Int64
	firstSeen := make([]atomic.Int64, partitions)
	for p := range firstSeen {
		firstSeen[p].Store(-1)
	}
	c2, err := NewConsumer(fastConsumerConfig(t, addr, topic, group, reg), func(_ context.Context, m kafka.Message) error {
		firstSeen[m.Partition].CompareAndSwap(-1, m.Offset)
		if _, dup := second.LoadOrStore(pos{m.Partition, m.Offset}, true); !dup {
			count2.Add(1)
		}
		return nil
	})
	require.NoError(t, err)
	stop2 := runConsumer(t, c2)
	require.Eventually(t, func() bool { return int(count2.Load()) == n-handled1 }, waitFor, 5*time.Millisecond)
	require.NoError(t, stop2())

	redelivered := 0
	for p := range partitions {
		if committed[p] < kafkatest.EndOffsets(t, addr, topic, partitions)[p] {
			require.Equal(t, committed[p], firstSeen[p].Load(), "partition %d resumes right after the last committed offset", p)
		}
	}
	second.Range(func(k, _ any) bool {
		if first[k.(pos)] {
			redelivered++
		}
		return true
	})
	require.Zero(t, redelivered, "a clean drain commits everything handled: no redelivery")
	require.Equal(t, n, handled1+int(count2.Load()), "no message lost")
	requireAllCommitted(t, addr, group, topic, partitions)
}

func TestConsumerRunTwice(t *testing.T) {
	addr := kafkatest.Start(t, map[string]int32{"x": 1})
	c, err := NewConsumer(fastConsumerConfig(t, addr, "x", "g", prometheus.NewRegistry()),
		func(context.Context, kafka.Message) error { return nil })
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	require.NoError(t, c.Run(ctx), "a consumer cancelled before it starts stops cleanly")
	require.Error(t, c.Run(context.Background()))
}

func TestConsumerRebalanceLosesNothing(t *testing.T) {
	const (
		topic      = "rebalance"
		partitions = 4
		n          = 400
		group      = "g-rebalance"
	)
	addr := seeded(t, topic, partitions, n, 40)

	var mu sync.Mutex
	handled := map[pos]int{}
	byConsumer := [2]map[int]bool{{}, {}} // partitions each consumer handled
	handler := func(id int) Handler {
		return func(_ context.Context, m kafka.Message) error {
			time.Sleep(2 * time.Millisecond)
			mu.Lock()
			handled[pos{m.Partition, m.Offset}]++
			byConsumer[id][m.Partition] = true
			mu.Unlock()
			return nil
		}
	}
	distinct := func() int {
		mu.Lock()
		defer mu.Unlock()
		return len(handled)
	}
	reg := prometheus.NewRegistry()
	c1, err := NewConsumer(fastConsumerConfig(t, addr, topic, group, reg), handler(0))
	require.NoError(t, err)
	stop1 := runConsumer(t, c1)
	require.Eventually(t, func() bool { return distinct() >= 60 }, waitFor, 5*time.Millisecond)

	joined := time.Now()
	c2, err := NewConsumer(fastConsumerConfig(t, addr, topic, group, reg), handler(1))
	require.NoError(t, err)
	stop2 := runConsumer(t, c2)
	require.Eventually(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(byConsumer[1]) > 0
	}, waitFor, 5*time.Millisecond, "the second member gets partitions")
	t.Logf("second member handling after %v", time.Since(joined).Round(time.Millisecond))

	require.Eventually(t, func() bool { return distinct() == n }, waitFor, 5*time.Millisecond)
	require.NoError(t, stop1())
	require.NoError(t, stop2())

	mu.Lock()
	defer mu.Unlock()
	dups := 0
	for _, times := range handled {
		dups += times - 1
	}
	t.Logf("rebalance: %d redelivered (handled twice), partitions c1=%v c2=%v", dups, byConsumer[0], byConsumer[1])
	// The first member commits what it finished before it rejoins, and stops
	// fetching its old partitions: the new owner starts where it stopped.
	require.Zero(t, dups, "commit on revoke: nothing handled twice")
	requireAllCommitted(t, addr, group, topic, partitions)
}

func TestConsumerRebalanceCutsOffSlowHandler(t *testing.T) {
	const topic, group = "slow", "g-slow"
	addr := kafkatest.Start(t, map[string]int32{topic: 1, topic + ".dlq": 1})
	publish(t, addr, kafka.Message{Topic: topic, Value: []byte("slow")})

	reg := prometheus.NewRegistry()
	blocking := make(chan struct{})
	var calls, handled atomic.Int64
	handler := func(ctx context.Context, m kafka.Message) error {
		if calls.Add(1) == 1 {
			close(blocking)
			<-ctx.Done() // a long call that honours its context
			return ctx.Err()
		}
		handled.Add(1)
		return nil
	}
	c1, err := NewConsumer(fastConsumerConfig(t, addr, topic, group, reg), handler)
	require.NoError(t, err)
	stop1 := runConsumer(t, c1)
	select {
	case <-blocking:
	case <-time.After(waitFor):
		t.Fatal("first handler call never started")
	}

	// A second member joins: the first must give up the running handler at
	// the rebalance deadline (RebalanceTimeout/2), commit nothing past it,
	// and whoever owns the partition next handles the message again.
	c2, err := NewConsumer(fastConsumerConfig(t, addr, topic, group, reg), handler)
	require.NoError(t, err)
	stop2 := runConsumer(t, c2)
	require.Eventually(t, func() bool { return handled.Load() == 1 }, waitFor, 5*time.Millisecond)
	require.NoError(t, stop1())
	require.NoError(t, stop2())

	require.EqualValues(t, 2, calls.Load(), "cut off once, then handled once")
	require.Equal(t, 1.0, streamtest.MetricValue(t, reg, "floodgate_stream_abandoned_total", nil))
	require.Zero(t, streamtest.MetricValue(t, reg, "floodgate_stream_dlq_total", nil), "a cut-off handler is not a failure")
	require.Equal(t, []int64{1}, kafkatest.CommittedOffsets(t, addr, group, topic, 1))
}

// TestConsumerHandlesReplaysOnlyForTheFailedGroup: a dead letter replayed onto its
// source topic reaches the handler of the group that failed it and no other group,
// which already handled the original.
func TestConsumerHandlesReplaysOnlyForTheFailedGroup(t *testing.T) {
	const topic = "replayed"
	addr := kafkatest.Start(t, map[string]int32{topic: 1, topic + ".dlq": 1})
	rec := DLQRecord{Key: []byte("k"), Value: []byte("replayed"), SourceTopic: topic, Partition: 0, Offset: 7,
		Timestamp: time.Now(), ConsumerGroup: "g-failed", Service: "quota", ErrorClass: ClassTransientExhausted,
		ErrorMessage: "dynamodb throttled", Attempts: 5, FirstFailure: time.Now()}
	publish(t, addr, kafka.Message{Topic: topic, Key: []byte("k"), Value: []byte("fresh")}, rec.Replay())

	for _, tc := range []struct {
		group string
		want  []string
	}{
		{"g-failed", []string{"fresh", "replayed"}},
		{"g-other", []string{"fresh"}},
	} {
		t.Run(tc.group, func(t *testing.T) {
			var got collector
			reg := prometheus.NewRegistry()
			c, err := NewConsumer(fastConsumerConfig(t, addr, topic, tc.group, reg), got.handle)
			require.NoError(t, err)
			stop := runConsumer(t, c)
			require.Eventually(t, func() bool { return len(got.values()) == len(tc.want) }, waitFor, 10*time.Millisecond)
			require.Eventually(t, func() bool {
				return streamtest.MetricValue(t, reg, "floodgate_stream_consumed_total",
					map[string]string{"topic": topic, "group": tc.group, "outcome": "ok"})+
					streamtest.MetricValue(t, reg, "floodgate_stream_consumed_total",
						map[string]string{"topic": topic, "group": tc.group, "outcome": "replay_skipped"}) == 2
			}, waitFor, 10*time.Millisecond)
			require.NoError(t, stop())
			require.Equal(t, int64(2), kafkatest.CommittedOffsets(t, addr, tc.group, topic, 1)[0], "both messages are committed either way")
			require.Equal(t, tc.want, got.values())
			skipped := float64(2 - len(tc.want))
			require.Equal(t, skipped, streamtest.MetricValue(t, reg, "floodgate_stream_consumed_total",
				map[string]string{"topic": topic, "group": tc.group, "outcome": "replay_skipped"}))
		})
	}
}

// TestConsumerStartFromRewindsWithoutMovingCommitsBack: a consumer that rebuilds
// state from history re-reads messages before the committed offset, and the
// group's committed offset never goes back meanwhile; OnRevoke reports the partition.
func TestConsumerStartFromRewindsWithoutMovingCommitsBack(t *testing.T) {
	const topic = "rewind"
	addr := seeded(t, topic, 1, 10, 10)
	var handled collector
	pause := make(chan struct{})
	paused := make(chan struct{}, 1)
	handler := func(ctx context.Context, m kafka.Message) error {
		if m.Offset == 8 && pause != nil {
			paused <- struct{}{}
			<-pause
		}
		return handled.handle(ctx, m)
	}

	first, err := NewConsumer(fastConsumerConfig(t, addr, topic, "g-rewind", prometheus.NewRegistry()), handled.handle)
	require.NoError(t, err)
	stop := runConsumer(t, first)
	require.Eventually(t, func() bool { return len(handled.handledOffsets()) == 10 }, waitFor, 10*time.Millisecond)
	require.NoError(t, stop())
	require.Equal(t, int64(10), kafkatest.CommittedOffsets(t, addr, "g-rewind", topic, 1)[0])

	handled.reset()
	publish(t, addr, kafka.Message{Topic: topic, Value: []byte("10")})
	cfg := fastConsumerConfig(t, addr, topic, "g-rewind", prometheus.NewRegistry())
	var asked []int64
	var revoked []int
	cfg.StartFrom = func(_ context.Context, partition int, committed int64) (int64, error) {
		asked = append(asked, committed)
		return committed - 4, nil
	}
	cfg.OnRevoke = func(partition int) { revoked = append(revoked, partition) }
	second, err := NewConsumer(cfg, handler)
	require.NoError(t, err)
	stop = runConsumer(t, second)
	<-paused // offsets 6 and 7 are re-handled; several commit intervals pass
	time.Sleep(10 * cfg.CommitInterval)
	require.Equal(t, int64(10), kafkatest.CommittedOffsets(t, addr, "g-rewind", topic, 1)[0], "re-reading history moved the group's offset back")
	close(pause)
	require.Eventually(t, func() bool { return len(handled.handledOffsets()) == 5 }, waitFor, 10*time.Millisecond)
	require.NoError(t, stop())
	require.Equal(t, []int64{10}, asked, "StartFrom gets the committed offset")
	require.Equal(t, []int64{6, 7, 8, 9, 10}, handled.handledOffsets(), "history from the rewound offset, then the new message")
	require.Equal(t, int64(11), kafkatest.CommittedOffsets(t, addr, "g-rewind", topic, 1)[0])
	require.Equal(t, []int{0}, revoked)
}

// TestConsumerStartFromFailureStillConsumes: when the rewind's offset lookup
// keeps failing (a broker just back), the partition is consumed from its
// committed offset after a few tries — on main it was parked until a
// rebalance that a single instance never has.
func TestConsumerStartFromFailureStillConsumes(t *testing.T) {
	const topic, group = "rewind-fails", "g-rewind-fails"
	addr := seeded(t, topic, 1, 3, 3)
	var handled collector
	first, err := NewConsumer(fastConsumerConfig(t, addr, topic, group, prometheus.NewRegistry()), handled.handle)
	require.NoError(t, err)
	stop := runConsumer(t, first)
	require.Eventually(t, func() bool { return len(handled.handledOffsets()) == 3 }, waitFor, 10*time.Millisecond)
	require.NoError(t, stop())
	require.Equal(t, int64(3), kafkatest.CommittedOffsets(t, addr, group, topic, 1)[0])

	handled.reset()
	publish(t, addr, kafka.Message{Topic: topic, Value: []byte("3")}, kafka.Message{Topic: topic, Value: []byte("4")})
	var tries atomic.Int32
	cfg := fastConsumerConfig(t, addr, topic, group, prometheus.NewRegistry())
	cfg.StartFrom = func(context.Context, int, int64) (int64, error) {
		tries.Add(1)
		return 0, errors.New("list offsets: broker not ready")
	}
	second, err := NewConsumer(cfg, handled.handle)
	require.NoError(t, err)
	stop = runConsumer(t, second)
	require.Eventually(t, func() bool { return len(handled.handledOffsets()) == 2 }, waitFor, 10*time.Millisecond,
		"the partition is consumed although the rewind failed")
	require.NoError(t, stop())
	require.Equal(t, int32(3), tries.Load(), "three tries, then the committed offset")
	require.Equal(t, []int64{3, 4}, handled.handledOffsets())
}

// committedNow returns the group's committed offset of partition 0, or -2
// when it cannot be read (the group may not exist yet).
func committedNow(addr, group, topic string) int64 {
	client := &kafka.Client{Addr: kafka.TCP(addr), Timeout: 5 * time.Second}
	resp, err := client.OffsetFetch(context.Background(), &kafka.OffsetFetchRequest{GroupID: group, Topics: map[string][]int{topic: {0}}})
	if err != nil || resp.Error != nil || len(resp.Topics[topic]) != 1 {
		return -2
	}
	return resp.Topics[topic][0].CommittedOffset
}

func numbered(topic string, from, n int) []kafka.Message {
	out := make([]kafka.Message, 0, n)
	for i := from; i < from+n; i++ {
		out = append(out, kafka.Message{Topic: topic, Key: []byte("k" + strconv.Itoa(i%7)), Value: []byte(strconv.Itoa(i))})
	}
	return out
}

// TestBatchConsumerCommitsOnlyAfterTheHandler: batches are bounded by count
// and linger, handed over in offset order, and a batch's offsets are
// committed only after its handler returned nil — while it runs, the group's
// offset is where the previous batch ended.
func TestBatchConsumerCommitsOnlyAfterTheHandler(t *testing.T) {
	const topic, group = "batches", "g-batches"
	addr := kafkatest.Start(t, map[string]int32{topic: 1, topic + ".dlq": 1})
	publish(t, addr, numbered(topic, 0, 25)...)

	var mu sync.Mutex
	var sizes []int
	var next int64
	var commitErrs []string
	reg := prometheus.NewRegistry()
	c, err := NewBatchConsumer(fastConsumerConfig(t, addr, topic, group, reg),
		BatchConfig{MaxMessages: 10, Linger: 300 * time.Millisecond},
		func(_ context.Context, b *Batch) error {
			committed := committedNow(addr, group, topic)
			time.Sleep(150 * time.Millisecond) // three commit intervals
			committedAtEnd := committedNow(addr, group, topic)
			mu.Lock()
			defer mu.Unlock()
			sizes = append(sizes, len(b.Messages))
			first := b.Messages[0].Offset
			if first > 0 && (committed != first || committedAtEnd != first) {
				commitErrs = append(commitErrs, "batch at "+strconv.FormatInt(first, 10)+": committed "+
					strconv.FormatInt(committed, 10)+" then "+strconv.FormatInt(committedAtEnd, 10))
			}
			if first == 0 && committedAtEnd > 0 {
				commitErrs = append(commitErrs, "first batch committed while its handler ran")
			}
			for _, m := range b.Messages {
				if m.Offset != next {
					commitErrs = append(commitErrs, "offset "+strconv.FormatInt(m.Offset, 10)+" out of order")
				}
				next = m.Offset + 1
			}
			return nil
		})
	require.NoError(t, err)
	stop := runConsumer(t, c)
	require.Eventually(t, func() bool { mu.Lock(); defer mu.Unlock(); return next == 25 }, waitFor, 10*time.Millisecond)
	require.Eventually(t, func() bool { return committedNow(addr, group, topic) == 25 }, waitFor, 10*time.Millisecond,
		"the last batch is committed right after its handler, not at shutdown")
	require.NoError(t, stop())
	mu.Lock()
	defer mu.Unlock()
	require.Empty(t, commitErrs)
	require.Equal(t, []int{10, 10, 5}, sizes, "two full batches, then the rest after the linger")
	require.Equal(t, 25.0, streamtest.MetricValue(t, reg, "floodgate_stream_consumed_total", map[string]string{"topic": topic, "outcome": "ok"}))
	require.Equal(t, 3.0, streamtest.MetricValue(t, reg, "floodgate_stream_batch_messages", nil))
}

// TestBatchConsumerFailures: a transient failure retries the whole batch;
// Reject dead-letters single messages (event_time for an EventTimeError) and
// keeps the rest; a permanent error dead-letters the batch; panics too. Each
// batch is committed only once it is handled or dead-lettered.
func TestBatchConsumerFailures(t *testing.T) {
	transient := errors.New("dynamodb throttled")
	tests := []struct {
		name        string
		handle      func(b *Batch) error
		wantClasses map[int64]ErrorClass // offset → class dead-lettered
		wantOK      float64
		wantRetried float64
		wantAttempt int
	}{
		{
			name: "transient then success",
			handle: func(b *Batch) error {
				if b.Attempt < 3 {
					return transient
				}
				return nil
			},
			wantRetried: 4, wantAttempt: 3,
		},
		{
			name: "reject single messages",
			handle: func(b *Batch) error {
				b.Reject(1, Permanent(errors.New("bad json")))
				b.Reject(3, &EventTimeError{Time: time.Date(2160, 1, 1, 0, 0, 0, 0, time.UTC), Now: time.Now(), Reason: "more than 2m0s in the future"})
				return nil
			},
			wantClasses: map[int64]ErrorClass{1: ClassPoison, 3: ClassEventTime},
			wantOK:      2, wantAttempt: 1,
		},
		{
			name:        "permanent batch error",
			handle:      func(*Batch) error { return Permanent(errors.New("schema gone")) },
			wantClasses: map[int64]ErrorClass{0: ClassPoison, 1: ClassPoison, 2: ClassPoison, 3: ClassPoison},
			wantAttempt: 1,
		},
		{
			name:        "exhausted",
			handle:      func(*Batch) error { return transient },
			wantClasses: map[int64]ErrorClass{0: ClassTransientExhausted, 1: ClassTransientExhausted, 2: ClassTransientExhausted, 3: ClassTransientExhausted},
			wantAttempt: 3,
		},
		{
			name:        "panic",
			handle:      func(*Batch) error { panic("boom") },
			wantClasses: map[int64]ErrorClass{0: ClassHandlerPanic, 1: ClassHandlerPanic, 2: ClassHandlerPanic, 3: ClassHandlerPanic},
			wantAttempt: 1,
		},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			topic, group := "batchfail"+strconv.Itoa(i), "g-batchfail"
			addr := kafkatest.Start(t, map[string]int32{topic: 1, topic + ".dlq": 1})
			publish(t, addr, numbered(topic, 0, 4)...)
			reg := prometheus.NewRegistry()
			var attempts atomic.Int64
			type seen struct {
				topic, group        string
				partition, messages int
				first, last         int64
				attempt             int
			}
			var invs []seen // one partition: calls are sequential
			cfg := fastConsumerConfig(t, addr, topic, group, reg)
			cfg.Middleware = []HandlerMiddleware{func(next HandlerFunc) HandlerFunc {
				return func(ctx context.Context, inv *Invocation) error {
					invs = append(invs, seen{inv.Topic, inv.Group, inv.Partition, len(inv.Messages),
						inv.Messages[0].Offset, inv.Messages[len(inv.Messages)-1].Offset, inv.Attempt})
					return next(ctx, inv)
				}
			}}
			c, err := NewBatchConsumer(cfg, BatchConfig{MaxMessages: 4, Linger: time.Minute}, func(_ context.Context, b *Batch) error {
				attempts.Store(int64(b.Attempt))
				return tt.handle(b)
			})
			require.NoError(t, err)
			stop := runConsumer(t, c)
			require.Eventually(t, func() bool { return committedNow(addr, group, topic) == 4 }, waitFor, 10*time.Millisecond)
			require.NoError(t, stop())
			require.EqualValues(t, tt.wantAttempt, attempts.Load())
			require.Len(t, invs, tt.wantAttempt, "the middleware wraps every attempt")
			for i, inv := range invs {
				require.Equal(t, seen{topic, group, 0, 4, 0, 3, i + 1}, inv)
			}
			if len(tt.wantClasses) > 0 {
				for _, dl := range kafkatest.ReadPartition(t, addr, topic+".dlq", 0, len(tt.wantClasses)) {
					rec, err := ParseDLQRecord(dl)
					require.NoError(t, err)
					require.Equal(t, tt.wantClasses[rec.Offset], rec.ErrorClass, "offset %d", rec.Offset)
					require.Equal(t, group, rec.ConsumerGroup)
				}
			}
			require.Equal(t, []int64{int64(len(tt.wantClasses))}, kafkatest.EndOffsets(t, addr, topic+".dlq", 1))
			require.Equal(t, tt.wantOK, streamtest.MetricValue(t, reg, "floodgate_stream_consumed_total", map[string]string{"outcome": "ok"}))
			require.Equal(t, tt.wantRetried, streamtest.MetricValue(t, reg, "floodgate_stream_consumed_total", map[string]string{"outcome": "retried"}))
			require.Equal(t, float64(len(tt.wantClasses)), streamtest.MetricValue(t, reg, "floodgate_stream_consumed_total", map[string]string{"outcome": "dlq"}))
		})
	}
}

// TestBatchConsumerRebalanceFlushesTheBatchBeingGathered: when a second
// member joins, the first hands over the batch it was gathering (its linger
// is far away), commits it and gives up the partition: nothing is handled
// twice and everything is committed.
func TestBatchConsumerRebalanceFlushesTheBatchBeingGathered(t *testing.T) {
	const topic, group, partitions = "batch-rebalance", "g-batch-rebalance", 4
	addr := kafkatest.Start(t, map[string]int32{topic: partitions, topic + ".dlq": 1})
	publish(t, addr, numbered(topic, 0, 200)...)

	var mu sync.Mutex
	handled := map[string]int{}
	var total atomic.Int64
	handler := func(_ context.Context, b *Batch) error {
		mu.Lock()
		defer mu.Unlock()
		for _, m := range b.Messages {
			handled[strconv.Itoa(m.Partition)+"/"+strconv.FormatInt(m.Offset, 10)]++
		}
		total.Add(int64(len(b.Messages)))
		return nil
	}
	bc := BatchConfig{MaxMessages: 1000, Linger: time.Minute}
	c1, err := NewBatchConsumer(fastConsumerConfig(t, addr, topic, group, prometheus.NewRegistry()), bc, handler)
	require.NoError(t, err)
	stop1 := runConsumer(t, c1)
	time.Sleep(time.Second) // c1 owns every partition and is gathering
	require.Zero(t, total.Load(), "nothing handed over before the linger")

	c2, err := NewBatchConsumer(fastConsumerConfig(t, addr, topic, group, prometheus.NewRegistry()), bc, handler)
	require.NoError(t, err)
	stop2 := runConsumer(t, c2)
	require.Eventually(t, func() bool { return total.Load() == 200 }, waitFor, 10*time.Millisecond,
		"the revoked batches are handed over at the rebalance")
	require.NoError(t, stop1())
	require.NoError(t, stop2())
	require.EqualValues(t, 200, total.Load())
	mu.Lock()
	defer mu.Unlock()
	for k, n := range handled {
		require.Equal(t, 1, n, "%s handled %d times", k, n)
	}
	requireAllCommitted(t, addr, group, topic, partitions)
}

func TestBatchConfigValidate(t *testing.T) {
	require.NoError(t, BatchConfig{}.Validate())
	d := BatchConfig{}.withDefaults()
	require.Equal(t, BatchConfig{MaxMessages: 10_000, MaxBytes: 16 << 20, Linger: time.Second}, d)
	err := BatchConfig{MaxMessages: -1, MaxBytes: -1, Linger: time.Microsecond}.Validate()
	require.ErrorIs(t, err, ErrInvalidConfig)
	for _, f := range []string{"MaxMessages", "MaxBytes", "Linger"} {
		require.ErrorContains(t, err, "BatchConfig."+f+":")
	}
	_, err = NewBatchConsumer(ConsumerConfig{}, BatchConfig{}, func(context.Context, *Batch) error { return nil })
	require.ErrorIs(t, err, ErrInvalidConfig)
	_, err = NewBatchConsumer(ConsumerConfig{}, BatchConfig{}, nil)
	require.ErrorIs(t, err, ErrInvalidConfig)
}

func TestOffsetTrackCommitsOnlyContiguousPrefix(t *testing.T) {
	type step struct {
		finish     int64
		wantCommit int64 // -1: nothing to commit
	}
	tests := []struct {
		name  string
		begin []int64
		steps []step
	}{
		{
			name:  "in order",
			begin: []int64{0, 1, 2},
			steps: []step{{0, 0}, {1, 1}, {2, 2}},
		},
		{
			name:  "out of order waits for the gap",
			begin: []int64{10, 11, 12, 13},
			steps: []step{{12, -1}, {13, -1}, {10, 10}, {11, 13}},
		},
		{
			name:  "reverse order",
			begin: []int64{5, 6, 7},
			steps: []step{{7, -1}, {6, -1}, {5, 7}},
		},
		{
			name:  "offset gaps (transaction markers, compaction) are not holes",
			begin: []int64{3, 7, 8, 20},
			steps: []step{{7, -1}, {3, 7}, {20, 7}, {8, 20}},
		},
		{
			name:  "unknown offsets are ignored",
			begin: []int64{1, 2},
			steps: []step{{99, -1}, {0, -1}, {1, 1}, {2, 2}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tr := newOffsetTrack()
			for _, o := range tt.begin {
				require.True(t, tr.begin(o))
			}
			for i, s := range tt.steps {
				tr.finish(s.finish)
				off, ok := tr.commitPoint()
				if s.wantCommit < 0 {
					require.False(t, ok, "step %d (finish %d): committed %d", i, s.finish, off)
					continue
				}
				require.True(t, ok, "step %d (finish %d)", i, s.finish)
				require.Equal(t, s.wantCommit, off, "step %d (finish %d)", i, s.finish)
			}
			require.Zero(t, tr.inFlight())
		})
	}
}

func TestOffsetTrackCommittedAndRedelivery(t *testing.T) {
	tr := newOffsetTrack()
	for o := int64(0); o < 4; o++ {
		require.True(t, tr.begin(o))
	}
	tr.finish(0)
	tr.finish(1)
	off, ok := tr.commitPoint()
	require.True(t, ok)
	require.EqualValues(t, 1, off)
	tr.markCommitted(off)
	_, ok = tr.commitPoint()
	require.False(t, ok, "nothing new to commit")

	// After a rebalance kafka-go fetches again from the committed offset:
	// messages already taken are refused, new ones are accepted.
	require.False(t, tr.begin(2), "in flight")
	require.False(t, tr.begin(1), "finished")
	require.True(t, tr.begin(4))
	require.Equal(t, 3, tr.inFlight())

	tr.finish(3)
	tr.finish(4)
	_, ok = tr.commitPoint()
	require.False(t, ok, "2 is still in flight")
	tr.finish(2)
	off, ok = tr.commitPoint()
	require.True(t, ok)
	require.EqualValues(t, 4, off)

	// The backing array is reused after the queue empties.
	for o := int64(5); o < 2000; o++ {
		require.True(t, tr.begin(o))
		tr.finish(o)
	}
	off, _ = tr.commitPoint()
	require.EqualValues(t, 1999, off)
}

type validationError struct{ field string }

func (e *validationError) Error() string   { return "invalid " + e.field }
func (e *validationError) Permanent() bool { return true }

type notPermanent struct{}

func (notPermanent) Error() string   { return "looks permanent, is not" }
func (notPermanent) Permanent() bool { return false }

func TestIsPermanent(t *testing.T) {
	base := errors.New("boom")
	tests := []struct {
		name string
		err  error
		want bool
	}{
		{"nil", nil, false},
		{"plain", base, false},
		{"Permanent", Permanent(base), true},
		{"wrapped Permanent", fmt.Errorf("decode: %w", Permanent(base)), true},
		{"interface", &validationError{"ts"}, true},
		{"wrapped interface", fmt.Errorf("decode: %w", &validationError{"ts"}), true},
		{"joined", errors.Join(base, &validationError{"ip"}), true},
		{"Permanent() false", notPermanent{}, false},
		{"Permanent() false wrapping true", fmt.Errorf("%w: %w", notPermanent{}, Permanent(base)), true},
		{"context error", fmt.Errorf("call: %w", errors.New("deadline")), false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			require.Equal(t, tt.want, IsPermanent(tt.err))
		})
	}
	require.Nil(t, Permanent(nil))
	require.ErrorIs(t, Permanent(base), base, "Permanent keeps errors.Is working")
}

func TestConsumerConfigValidate(t *testing.T) {
	valid := func() ConsumerConfig {
		return ConsumerConfig{
			Brokers: []string{"127.0.0.1:9092"}, Topic: "t", GroupID: "g", Service: "s",
			Logger: slog.New(slog.DiscardHandler), Registerer: prometheus.NewRegistry(),
		}
	}
	tests := []struct {
		name   string
		mutate func(*ConsumerConfig)
		field  string // "" = valid
	}{
		{"valid with defaults", func(*ConsumerConfig) {}, ""},
		{"no brokers", func(c *ConsumerConfig) { c.Brokers = nil }, "Brokers"},
		{"empty broker", func(c *ConsumerConfig) { c.Brokers = []string{""} }, "Brokers"},
		{"no topic", func(c *ConsumerConfig) { c.Topic = "" }, "Topic"},
		{"no group", func(c *ConsumerConfig) { c.GroupID = "" }, "GroupID"},
		{"no service", func(c *ConsumerConfig) { c.Service = "" }, "Service"},
		{"dlq is source", func(c *ConsumerConfig) { c.DLQTopic = "t" }, "DLQTopic"},
		{"negative attempts", func(c *ConsumerConfig) { c.MaxAttempts = -1 }, "MaxAttempts"},
		{"negative drain", func(c *ConsumerConfig) { c.DrainTimeout = -time.Second }, "DrainTimeout"},
		{"max below initial backoff", func(c *ConsumerConfig) {
			c.InitialBackoff, c.MaxBackoff = time.Second, 10*time.Millisecond
		}, "MaxBackoff"},
		{"heartbeat not below session", func(c *ConsumerConfig) {
			c.HeartbeatInterval, c.SessionTimeout = 2*time.Second, time.Second
		}, "HeartbeatInterval"},
		{"heartbeat above a third of the session", func(c *ConsumerConfig) {
			c.HeartbeatInterval, c.SessionTimeout = 3*time.Second, 6*time.Second
		}, "HeartbeatInterval"},
		{"heartbeat above a third of the default session", func(c *ConsumerConfig) { c.HeartbeatInterval = 3 * time.Second }, "HeartbeatInterval"},
		{"rebalance shorter than the session", func(c *ConsumerConfig) { c.RebalanceTimeout = 2 * time.Second }, "RebalanceTimeout"},
		{"bad start offset", func(c *ConsumerConfig) { c.StartOffset = 42 }, "StartOffset"},
		{"no logger", func(c *ConsumerConfig) { c.Logger = nil }, "Logger"},
		{"no registerer", func(c *ConsumerConfig) { c.Registerer = nil }, "Registerer"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := valid()
			tt.mutate(&cfg)
			err := cfg.Validate()
			if tt.field == "" {
				require.NoError(t, err)
				d := cfg.withDefaults()
				require.Equal(t, "t.dlq", d.DLQTopic)
				require.Equal(t, DefaultMaxAttempts, d.MaxAttempts)
				require.Equal(t, kafka.FirstOffset, d.StartOffset)
				require.Equal(t, time.Second, d.HeartbeatInterval, "group defaults: heartbeat 1s")
				require.Equal(t, 6*time.Second, d.SessionTimeout, "group defaults: session 6s")
				require.Equal(t, 20*time.Second, d.RebalanceTimeout, "group defaults: rebalance 20s")
				c := &Consumer{cfg: d}
				require.Equal(t, DefaultDrainTimeout, c.revokeTimeout(), "a revoked partition gets the whole drain budget")
				return
			}
			require.ErrorIs(t, err, ErrInvalidConfig)
			require.ErrorContains(t, err, "ConsumerConfig."+tt.field+":")
			_, nerr := NewConsumer(cfg, func(context.Context, kafka.Message) error { return nil })
			require.ErrorIs(t, nerr, ErrInvalidConfig)
		})
	}
}

func TestNewMetricsSharesARegistry(t *testing.T) {
	reg := prometheus.NewRegistry()
	m1, err := NewMetrics(reg)
	require.NoError(t, err)
	m2, err := NewMetrics(reg)
	require.NoError(t, err, "a second registration on the same registry reuses the collectors")
	m1.consumed.WithLabelValues("a", "g1", outcomeOK).Inc()
	m2.consumed.WithLabelValues("a", "g2", outcomeOK).Inc()
	require.Equal(t, 2.0, streamtest.MetricValue(t, reg, "floodgate_stream_consumed_total", map[string]string{"topic": "a"}))

	// Two consumers on one registry.
	for _, group := range []string{"g1", "g2"} {
		cfg := ConsumerConfig{
			Brokers: []string{"127.0.0.1:1"}, Topic: "a", GroupID: group, Service: "s",
			Logger: slog.New(slog.DiscardHandler), Registerer: reg,
		}
		_, err := NewConsumer(cfg, func(context.Context, kafka.Message) error { return nil })
		require.NoError(t, err)
	}

	// A conflicting collector under one of the names is an error, not a panic.
	other := prometheus.NewRegistry()
	other.MustRegister(prometheus.NewCounter(prometheus.CounterOpts{Name: "floodgate_stream_dlq_total", Help: "x"}))
	_, err = NewMetrics(other)
	require.Error(t, err)
}
