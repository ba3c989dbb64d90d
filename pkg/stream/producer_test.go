package stream

import (
	"context"
	"errors"
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

func TestProducerRoundTrip(t *testing.T) {
	const partitions = 4
	tests := []struct {
		name          string
		producerTopic string
		msgTopic      string
		readTopic     string
	}{
		{name: "producer topic", producerTopic: "decisions", readTopic: "decisions"},
		{name: "per-message topic", msgTopic: "abuse", readTopic: "abuse"},
		{name: "message topic overrides producer topic", producerTopic: "decisions", msgTopic: "abuse", readTopic: "abuse"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			addr := kafkatest.Start(t, map[string]int32{"decisions": partitions, "abuse": partitions})
			reg := prometheus.NewRegistry()
			p := NewProducer(ProducerConfig{Brokers: []string{addr}, Topic: tt.producerTopic, Registerer: reg})
			ts := time.Date(2026, 7, 1, 0, 0, 0, 0, time.UTC)
			var msgs []kafka.Message
			for i := range 20 {
				msgs = append(msgs, kafka.Message{
					Topic:   tt.msgTopic,
					Key:     []byte("user:" + strconv.Itoa(i%3)),
					Value:   []byte(`{"id":"` + strconv.Itoa(i) + `"}`),
					Headers: CloudEventHeaders("decision.v1", strconv.Itoa(i), "floodgate/test", ts),
				})
			}
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			require.NoError(t, p.Publish(ctx, msgs...))
			require.NoError(t, p.Close())
			for _, m := range msgs {
				require.Equal(t, tt.msgTopic, m.Topic, "Publish leaves the caller's messages alone")
			}

			ends := kafkatest.EndOffsets(t, addr, tt.readTopic, partitions)
			keyPartition := map[string]int{}
			total := 0
			for part, end := range ends {
				for _, m := range kafkatest.ReadPartition(t, addr, tt.readTopic, part, int(end)) {
					total++
					if prev, ok := keyPartition[string(m.Key)]; ok {
						require.Equal(t, prev, part, "one key, one partition")
					}
					keyPartition[string(m.Key)] = part
					h := kafkatest.Headers(m.Headers)
					id := h[HeaderCEID]
					require.Equal(t, `{"id":"`+id+`"}`, string(m.Value))
					require.Equal(t, "decision.v1", h[HeaderCEType])
					require.Equal(t, "2026-07-01T00:00:00.000Z", h[HeaderCETime])
					require.Equal(t, "1.0", h[HeaderCESpecVersion])
					require.Equal(t, "application/json", h[HeaderContentType])
				}
			}
			require.Equal(t, len(msgs), total)
			require.Len(t, keyPartition, 3)
			require.Equal(t, float64(len(msgs)), streamtest.MetricValue(t, reg, "floodgate_stream_produced_total",
				map[string]string{"topic": tt.readTopic, "outcome": "ok"}))
		})
	}
}

func TestProducerErrors(t *testing.T) {
	addr := kafkatest.Start(t, map[string]int32{"exists": 1})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	p := NewProducer(ProducerConfig{Brokers: []string{addr}, MaxAttempts: 2})
	defer p.Close()
	require.ErrorIs(t, p.Publish(ctx, kafka.Message{Value: []byte("x")}), ErrNoTopic)
	require.NoError(t, p.Publish(ctx), "nothing to publish")

	// Topics are never auto-created.
	err := p.Publish(ctx, kafka.Message{Topic: "missing", Value: []byte("x")})
	require.Error(t, err)
	require.Equal(t, map[string]int{"exists": 1}, kafkatest.Partitions(t, addr))
}

func TestAsyncProducerDeliversEverythingWhenHealthy(t *testing.T) {
	const (
		topic      = "async"
		partitions = 3
		n          = 5000
	)
	addr := kafkatest.Start(t, map[string]int32{topic: partitions})
	reg := prometheus.NewRegistry()
	a := NewAsyncProducer(AsyncProducerConfig{
		Brokers: []string{addr}, Topic: topic, BatchSize: 500,
		Logger: streamtest.Logger(t, slog.LevelInfo), Registerer: reg,
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()

	for i := range n {
		require.True(t, a.TryPublish(kafka.Message{Key: []byte("p" + strconv.Itoa(i%50)), Value: []byte(strconv.Itoa(i))}))
	}
	// Half are still buffered when Run is told to stop: the drain sends them.
	require.Eventually(t, func() bool {
		return streamtest.MetricValue(t, reg, "floodgate_stream_async_sent_total", nil) >= n/2
	}, waitFor, time.Millisecond)
	cancel()
	require.NoError(t, <-done)

	require.False(t, a.TryPublish(kafka.Message{Value: []byte("late")}), "refused after Run stopped")
	require.Equal(t, 1.0, streamtest.MetricValue(t, reg, "floodgate_stream_async_dropped_total", map[string]string{"reason": "closed"}))
	require.Equal(t, float64(n), streamtest.MetricValue(t, reg, "floodgate_stream_async_sent_total", nil))
	require.Zero(t, streamtest.MetricValue(t, reg, "floodgate_stream_async_failed_total", nil))

	var total int64
	for _, end := range kafkatest.EndOffsets(t, addr, topic, partitions) {
		total += end
	}
	require.EqualValues(t, n, total, "every accepted message is on the topic")
	// Per key, order is kept.
	last := map[string]int{}
	for p := range partitions {
		ends := kafkatest.EndOffsets(t, addr, topic, partitions)
		for _, m := range kafkatest.ReadPartition(t, addr, topic, p, int(ends[p])) {
			v, err := strconv.Atoi(string(m.Value))
			require.NoError(t, err)
			if prev, ok := last[string(m.Key)]; ok {
				require.Greater(t, v, prev, "key %s out of order", m.Key)
			}
			last[string(m.Key)] = v
		}
	}
}

func TestAsyncProducerDropsWhenFull(t *testing.T) {
	tests := []struct {
		name   string
		runIt  bool // start Run against an unreachable broker (a blocked writer)
		buffer int
	}{
		{name: "Run not started", runIt: false, buffer: 8},
		{name: "broker unavailable", runIt: true, buffer: 8},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			reg := prometheus.NewRegistry()
			var failedMu sync.Mutex
			var failed []kafka.Message
			a := NewAsyncProducer(AsyncProducerConfig{
				Brokers:        []string{kafkatest.DeadAddr(t)},
				Topic:          "t",
				BufferSize:     tt.buffer,
				BatchSize:      4,
				WriteAttempts:  2,
				InitialBackoff: 5 * time.Millisecond,
				MaxBackoff:     10 * time.Millisecond,
				DrainTimeout:   200 * time.Millisecond,
				OnFailed: func(msgs []kafka.Message) {
					failedMu.Lock()
					failed = append(failed, msgs...)
					failedMu.Unlock()
				},
				Logger:     streamtest.Logger(t, slog.LevelError+1),
				Registerer: reg,
			})
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			done := make(chan error, 1)
			if tt.runIt {
				go func() { done <- a.Run(ctx) }()
			}

			var accepted, refused atomic.Int64
			start := time.Now()
			for i := range 200 {
				if a.TryPublish(kafka.Message{Value: []byte(strconv.Itoa(i))}) {
					accepted.Add(1)
				} else {
					refused.Add(1)
				}
			}
			require.Less(t, time.Since(start), 5*time.Second, "TryPublish never blocks") // generous: only catches a hang
			require.Positive(t, refused.Load())
			require.LessOrEqual(t, accepted.Load(), int64(tt.buffer+4), "at most the buffer plus one batch in the writer")
			require.Equal(t, float64(refused.Load()), streamtest.MetricValue(t, reg, "floodgate_stream_async_dropped_total",
				map[string]string{"producer": "t", "reason": "full"}))

			if !tt.runIt {
				go func() { done <- a.Run(ctx) }()
			}
			cancel()
			err := <-done
			require.ErrorIs(t, err, ErrUndelivered, "what was never sent is reported")

			// Nothing accepted vanishes: each message is sent or handed to OnFailed.
			failedMu.Lock()
			defer failedMu.Unlock()
			require.Len(t, failed, int(accepted.Load()))
			require.Equal(t, float64(accepted.Load()), streamtest.MetricValue(t, reg, "floodgate_stream_async_failed_total", nil))
			require.Zero(t, streamtest.MetricValue(t, reg, "floodgate_stream_async_sent_total", nil))
		})
	}
}

func TestAsyncProducerRetriesThenFails(t *testing.T) {
	// The topic does not exist and is never auto-created: every write fails,
	// the batch is retried WriteAttempts times, then reported failed.
	addr := kafkatest.Start(t, map[string]int32{"other": 1})
	reg := prometheus.NewRegistry()
	got := make(chan []kafka.Message, 10)
	a := NewAsyncProducer(AsyncProducerConfig{
		Brokers: []string{addr}, Topic: "missing", WriteAttempts: 2,
		InitialBackoff: 5 * time.Millisecond, MaxBackoff: 10 * time.Millisecond,
		OnFailed: func(m []kafka.Message) { got <- m },
		Logger:   streamtest.Logger(t, slog.LevelError+1), Registerer: reg,
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	require.True(t, a.TryPublish(kafka.Message{Value: []byte("x")}))
	select {
	case m := <-got:
		require.Len(t, m, 1)
		require.Equal(t, "x", string(m[0].Value))
	case <-time.After(waitFor):
		t.Fatal("OnFailed not called")
	}
	cancel()
	require.NoError(t, <-done, "failures during operation went to OnFailed; nothing was left at the drain")
	require.Equal(t, 1.0, streamtest.MetricValue(t, reg, "floodgate_stream_async_failed_total", nil))
	require.False(t, errors.Is(nil, ErrUndelivered))
}

func TestCloudEventHeaders(t *testing.T) {
	ts := time.Date(2026, 1, 2, 3, 4, 5, 6_000_000, time.FixedZone("y", -5*3600))
	hs := CloudEventHeaders("decision.v1", "01J0ID", "floodgate/limiter", ts)
	var keys []string
	for _, h := range hs {
		keys = append(keys, h.Key)
	}
	require.Equal(t, []string{"ce_id", "ce_type", "ce_source", "ce_time", "ce_specversion", "content-type"}, keys)
	require.Equal(t, map[string]string{
		"ce_id": "01J0ID", "ce_type": "decision.v1", "ce_source": "floodgate/limiter",
		"ce_time": "2026-01-02T08:04:05.006Z", "ce_specversion": "1.0", "content-type": "application/json",
	}, kafkatest.Headers(hs))
}

func TestProducerConfigValidate(t *testing.T) {
	require.NoError(t, ProducerConfig{Brokers: []string{"a:1"}}.Validate())
	err := ProducerConfig{BatchSize: -1}.Validate()
	require.ErrorIs(t, err, ErrInvalidConfig)
	require.ErrorContains(t, err, "ProducerConfig.Brokers:")
	require.ErrorContains(t, err, "ProducerConfig.BatchSize:")
	require.ErrorContains(t, ProducerConfig{Brokers: []string{"a:1"}, MetadataTTL: -time.Second}.Validate(), "ProducerConfig.MetadataTTL:")
	p := NewProducer(ProducerConfig{Brokers: []string{"a:1"}, MetadataTTL: time.Second})
	require.Equal(t, time.Second, p.transport.MetadataTTL, "the writer's transport trusts its metadata for MetadataTTL")
	require.NoError(t, p.Close())

	require.NoError(t, AsyncProducerConfig{Brokers: []string{"a:1"}}.Validate())
	err = AsyncProducerConfig{Brokers: []string{"a:1"}, BufferSize: -1, InitialBackoff: time.Minute, MaxBackoff: time.Second}.Validate()
	require.ErrorContains(t, err, "AsyncProducerConfig.BufferSize:")
	require.ErrorContains(t, err, "AsyncProducerConfig.MaxBackoff:")
}
