package stream

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/require"

	"github.com/floodgate-dev/floodgate/pkg/kafkatest"
	"github.com/floodgate-dev/floodgate/pkg/stream/streamtest"
)

// The batcher puts a key where kafka.Hash (the AsyncProducer's and the
// journal replay's balancer) puts it.
func TestPartitionOfIsKafkaHash(t *testing.T) {
	t.Parallel()
	parts := make([]int, 12)
	for i := range parts {
		parts[i] = i
	}
	h := &kafka.Hash{}
	for i := range 5000 {
		key := []byte("bot:bot_" + strconv.Itoa(i*7919))
		for _, n := range []int{1, 3, 12} {
			require.Equal(t, h.Balance(kafka.Message{Key: key}, parts[:n]...), partitionOf(key, n), "key %s over %d", key, n)
		}
	}
}

// What append encodes, messages decodes (the path of a batch given up on,
// to the journal).
func TestRecordBatchRoundTrip(t *testing.T) {
	t.Parallel()
	b := &recordBatch{buf: make([]byte, recordBatchHeader)}
	t0 := time.UnixMilli(1_780_000_000_000)
	var want []kafka.Message
	for i := range 300 {
		m := kafka.Message{Topic: "t", Partition: 2, Key: []byte("user:" + strconv.Itoa(i)), Value: []byte(fmt.Sprintf(`{"n":%d}`, i)),
			Time: t0.Add(time.Duration(i%7-3) * time.Millisecond), Headers: CloudEventHeaders("decision.v1", strconv.Itoa(i), "src", t0)}
		if i == 5 {
			m.Key, m.Headers = nil, append(m.Headers, kafka.Header{Key: "empty"})
		}
		b.append(m.Time.UnixMilli(), m.Key, m.Value, m.Headers)
		want = append(want, m)
	}
	b.seal()
	got, err := b.messages("t", 2)
	require.NoError(t, err)
	require.Equal(t, want, got)
}

// Every appended message is on the topic, in its key's partition, in order
// per key, with its headers and time, and counted as sent.
func TestRecordBatcherDeliversEveryMessage(t *testing.T) {
	const topic, partitions, n = "batched", 6, 20_000
	addr := kafkatest.Start(t, map[string]int32{topic: partitions})
	reg := prometheus.NewRegistry()
	r := NewRecordBatcher(AsyncProducerConfig{Brokers: []string{addr}, Topic: topic, Name: "decisions", BatchSize: 500,
		Logger: streamtest.Logger(t, slog.LevelInfo), Registerer: reg})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	require.Eventually(t, r.Ready, 10*time.Second, 5*time.Millisecond)

	ts := time.Date(2026, 7, 1, 0, 0, 0, 123e6, time.UTC)
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			key, value := make([]byte, 0, 32), make([]byte, 0, 64)
			for i := g; i < n; i += 4 {
				key = fmt.Appendf(key[:0], "user:%d", i%97)
				value = fmt.Appendf(value[:0], `{"i":%d}`, i)
				require.True(t, r.TryAppend(kafka.Message{Key: key, Value: value, Time: ts,
					Headers: []kafka.Header{{Key: HeaderCEID, Value: []byte(strconv.Itoa(i))}}}))
			}
		})
	}
	wg.Wait()
	cancel()
	require.NoError(t, <-done)
	require.False(t, r.TryAppend(kafka.Message{Key: []byte("late")}), "refused once stopped")

	seen := make(map[int]bool, n)
	last := map[string]int{}
	for p, end := range kafkatest.EndOffsets(t, addr, topic, partitions) {
		for _, m := range kafkatest.ReadPartition(t, addr, topic, p, int(end)) {
			require.Equal(t, partitionOf(m.Key, partitions), p, "key %s", m.Key)
			var i int
			_, err := fmt.Sscanf(string(m.Value), `{"i":%d}`, &i)
			require.NoError(t, err)
			require.Equal(t, strconv.Itoa(i), kafkatest.Headers(m.Headers)[HeaderCEID])
			require.True(t, m.Time.Equal(ts), "time %v", m.Time)
			require.False(t, seen[i], "message %d twice", i)
			seen[i] = true
			if prev, ok := last[string(m.Key)]; ok && prev%4 == i%4 {
				require.Less(t, prev, i, "one appender's messages of a key stay in order")
			}
			last[string(m.Key)] = i
		}
	}
	require.Len(t, seen, n, "every message on the topic")
	require.InDelta(t, n, testutil.ToFloat64(r.sent), 0)
	require.InDelta(t, 1, testutil.ToFloat64(r.droppedClosed), 0)
}

// A batch the broker will not take is decoded and handed to OnFailed; a
// record over batchBytes is sealed in a batch of its own, so the next
// record still goes through.
func TestRecordBatcherHandsFailedBatchesOn(t *testing.T) {
	const topic = "batched-fail"
	addr := kafkatest.Start(t, map[string]int32{topic: 1})
	var mu sync.Mutex
	var failed []kafka.Message
	r := NewRecordBatcher(AsyncProducerConfig{Brokers: []string{addr}, Topic: topic, WriteAttempts: 2,
		InitialBackoff: time.Millisecond, MaxBackoff: 2 * time.Millisecond,
		OnFailed: func(m []kafka.Message) { mu.Lock(); failed = append(failed, m...); mu.Unlock() },
		Logger:   streamtest.Logger(t, slog.LevelInfo), Registerer: prometheus.NewRegistry()})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	require.Eventually(t, r.Ready, 10*time.Second, 5*time.Millisecond)
	// Larger than the broker's message.max.bytes: every attempt is refused.
	big := make([]byte, 2<<20)
	require.True(t, r.TryAppend(kafka.Message{Key: []byte("k"), Value: big}))
	require.True(t, r.TryAppend(kafka.Message{Key: []byte("k"), Value: []byte("small")}))
	require.Eventually(t, func() bool { mu.Lock(); defer mu.Unlock(); return len(failed) == 1 }, 10*time.Second, 5*time.Millisecond)
	cancel()
	require.NoError(t, <-done)
	require.Len(t, failed, 1)
	require.Equal(t, big, failed[0].Value)
	require.Equal(t, topic, failed[0].Topic)
	require.InDelta(t, 1, testutil.ToFloat64(r.failed), 0)
	require.InDelta(t, 1, testutil.ToFloat64(r.sent), 0)
	msgs := kafkatest.ReadPartition(t, addr, topic, 0, 1)
	require.Equal(t, "small", string(msgs[0].Value))
}

// Records appended before Run has read the partitions are held in arrival
// order; when Run stops first (no broker) they are counted as failed and
// handed to OnFailed in that order, and later records are refused.
func TestRecordBatcherHandsHeldRecordsOnWhenStoppedBeforeThePartitions(t *testing.T) {
	var failed []kafka.Message
	reg := prometheus.NewRegistry()
	r := NewRecordBatcher(AsyncProducerConfig{Brokers: []string{kafkatest.DeadAddr(t)}, Topic: "held", BufferSize: 3,
		InitialBackoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond,
		OnFailed: func(m []kafka.Message) { failed = append(failed, m...) },
		Logger:   streamtest.Logger(t, slog.LevelError), Registerer: reg})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	value := make([]byte, 0, 8)
	for i := range 3 {
		value = strconv.AppendInt(value[:0], int64(i), 10) // reused: the batcher keeps a copy
		require.True(t, r.TryAppend(kafka.Message{Key: []byte("k"), Value: value}), "message %d", i)
	}
	require.False(t, r.TryAppend(kafka.Message{Key: []byte("k"), Value: []byte("over")}), "BufferSize held")
	require.False(t, r.Ready())
	cancel()
	require.ErrorIs(t, <-done, ErrUndelivered)
	require.Len(t, failed, 3)
	for i, m := range failed {
		require.Equal(t, strconv.Itoa(i), string(m.Value))
		require.Equal(t, "held", m.Topic)
		require.False(t, m.Time.IsZero())
	}
	require.False(t, r.TryAppend(kafka.Message{Key: []byte("k")}), "refused once stopped")
	require.InDelta(t, 3, testutil.ToFloat64(r.failed), 0)
	require.InDelta(t, 1, testutil.ToFloat64(r.droppedFull), 0)
	require.InDelta(t, 1, testutil.ToFloat64(r.droppedClosed), 0)
}
