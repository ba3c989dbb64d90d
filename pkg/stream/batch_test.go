package stream

import (
	"context"
	"errors"
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
			var traced atomic.Int64
			var invs []Invocation
			cfg := fastConsumerConfig(t, addr, topic, group, reg)
			cfg.TraceHook = func(ctx context.Context, inv Invocation) (context.Context, func(error)) {
				invs = append(invs, inv) // one partition: calls are sequential
				return ctx, func(error) { traced.Add(1) }
			}
			c, err := NewBatchConsumer(cfg, BatchConfig{MaxMessages: 4, Linger: time.Minute}, func(_ context.Context, b *Batch) error {
				attempts.Store(int64(b.Attempt))
				return tt.handle(b)
			})
			require.NoError(t, err)
			stop := runConsumer(t, c)
			require.Eventually(t, func() bool { return committedNow(addr, group, topic) == 4 }, waitFor, 10*time.Millisecond)
			require.NoError(t, stop())
			require.EqualValues(t, tt.wantAttempt, attempts.Load())
			require.EqualValues(t, tt.wantAttempt, traced.Load(), "the trace hook wraps every attempt")
			for _, inv := range invs {
				require.Equal(t, Invocation{Topic: topic, Group: group, Partition: 0, FirstOffset: 0, LastOffset: 3, Messages: 4, Attempt: inv.Attempt}, inv)
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
	require.Equal(t, kafkatest.EndOffsets(t, addr, topic, partitions), kafkatest.CommittedOffsets(t, addr, group, topic, partitions))
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
