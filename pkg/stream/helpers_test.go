package stream

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/require"
)

// testLogger logs through t.Log until the test ends (goroutines that outlive
// the test, like a writer still flushing, must not call t.Log).
func testLogger(t testing.TB, level slog.Level) *slog.Logger {
	w := &testWriter{t: t}
	t.Cleanup(w.stop)
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: level}))
}

type testWriter struct {
	mu      sync.Mutex
	t       testing.TB
	stopped bool
}

func (w *testWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.stopped {
		w.t.Log(string(bytes.TrimRight(p, "\n")))
	}
	return len(p), nil
}

func (w *testWriter) stop() {
	w.mu.Lock()
	w.stopped = true
	w.mu.Unlock()
}

// fastConsumerConfig is a consumer config with timings small enough for a
// fast suite against kfake (whose minimum session timeout kafkatest lowers).
func fastConsumerConfig(t testing.TB, addr, topic, group string, reg prometheus.Registerer) ConsumerConfig {
	return ConsumerConfig{
		Brokers:           []string{addr},
		Topic:             topic,
		GroupID:           group,
		Service:           "stream-test",
		MaxAttempts:       3,
		InitialBackoff:    5 * time.Millisecond,
		MaxBackoff:        20 * time.Millisecond,
		CommitInterval:    50 * time.Millisecond,
		DrainTimeout:      2 * time.Second,
		HeartbeatInterval: 100 * time.Millisecond,
		SessionTimeout:    time.Second,
		RebalanceTimeout:  time.Second,
		JoinGroupBackoff:  100 * time.Millisecond,
		MaxWait:           100 * time.Millisecond,
		Logger:            testLogger(t, slog.LevelInfo),
		Registerer:        reg,
	}
}

// runConsumer runs c in the background; the returned stop cancels it and
// returns Run's error.
func runConsumer(t testing.TB, c *Consumer) (stop func() error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	var once sync.Once
	var err error
	stop = func() error {
		once.Do(func() {
			cancel()
			select {
			case err = <-done:
			case <-time.After(30 * time.Second):
				err = fmt.Errorf("consumer did not stop within 30s")
			}
		})
		return err
	}
	t.Cleanup(func() { _ = stop() })
	return stop
}

func publish(t testing.TB, addr string, msgs ...kafka.Message) {
	t.Helper()
	p := NewProducer(ProducerConfig{Brokers: []string{addr}})
	defer p.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	require.NoError(t, p.Publish(ctx, msgs...))
}

// readPartition reads n messages from one partition from its start, without
// a consumer group.
func readPartition(t testing.TB, addr, topic string, partition, n int) []kafka.Message {
	t.Helper()
	r := kafka.NewReader(kafka.ReaderConfig{
		Brokers: []string{addr}, Topic: topic, Partition: partition, MaxWait: 100 * time.Millisecond,
	})
	defer r.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	out := make([]kafka.Message, 0, n)
	for len(out) < n {
		m, err := r.FetchMessage(ctx)
		require.NoError(t, err, "read %s/%d: got %d of %d messages", topic, partition, len(out), n)
		out = append(out, m)
	}
	return out
}

// endOffsets returns each partition's high watermark.
func endOffsets(t testing.TB, addr, topic string, partitions int) []int64 {
	t.Helper()
	out := make([]int64, partitions)
	for p := range partitions {
		conn, err := kafka.DialLeader(context.Background(), "tcp", addr, topic, p)
		require.NoError(t, err)
		last, err := conn.ReadLastOffset()
		conn.Close()
		require.NoError(t, err)
		out[p] = last
	}
	return out
}

// committedOffsets returns the group's committed offset (next to read) per
// partition, -1 where nothing is committed.
func committedOffsets(t testing.TB, addr, group, topic string, partitions int) []int64 {
	t.Helper()
	ids := make([]int, partitions)
	for i := range ids {
		ids[i] = i
	}
	client := &kafka.Client{Addr: kafka.TCP(addr), Timeout: 10 * time.Second}
	resp, err := client.OffsetFetch(context.Background(), &kafka.OffsetFetchRequest{
		GroupID: group, Topics: map[string][]int{topic: ids},
	})
	require.NoError(t, err)
	require.NoError(t, resp.Error)
	out := make([]int64, partitions)
	for i := range out {
		out[i] = -1
	}
	for _, p := range resp.Topics[topic] {
		require.NoError(t, p.Error)
		out[p.Partition] = p.CommittedOffset
	}
	return out
}

// metricValue sums the samples of a counter or gauge whose labels include
// the given ones.
func metricValue(t testing.TB, reg *prometheus.Registry, name string, labels map[string]string) float64 {
	t.Helper()
	families, err := reg.Gather()
	require.NoError(t, err)
	var sum float64
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			if !hasLabels(m, labels) {
				continue
			}
			switch {
			case m.Counter != nil:
				sum += m.Counter.GetValue()
			case m.Gauge != nil:
				sum += m.Gauge.GetValue()
			case m.Histogram != nil:
				sum += float64(m.Histogram.GetSampleCount())
			}
		}
	}
	return sum
}

func hasLabels(m *dto.Metric, want map[string]string) bool {
	have := map[string]string{}
	for _, l := range m.GetLabel() {
		have[l.GetName()] = l.GetValue()
	}
	for k, v := range want {
		if have[k] != v {
			return false
		}
	}
	return true
}

// deadAddr is a loopback address nothing listens on.
func deadAddr(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	a := ln.Addr().String()
	require.NoError(t, ln.Close())
	return a
}

func headerMap(hs []kafka.Header) map[string]string {
	m := make(map[string]string, len(hs))
	for _, h := range hs {
		m[h.Key] = string(h.Value)
	}
	return m
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
