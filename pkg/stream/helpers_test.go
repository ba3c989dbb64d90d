package stream

import (
	"context"
	"log/slog"
	"sort"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/require"

	"github.com/floodgate-dev/floodgate/pkg/stream/streamtest"
)

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
		Logger:            streamtest.Logger(t, slog.LevelInfo),
		Registerer:        reg,
	}
}

// runConsumer runs c in the background; the returned stop cancels it and
// returns Run's error.
func runConsumer(t testing.TB, c *Consumer) (stop func() error) {
	t.Helper()
	return streamtest.Start(t, 30*time.Second, c.Run)
}

func publish(t testing.TB, addr string, msgs ...kafka.Message) {
	t.Helper()
	p := NewProducer(ProducerConfig{Brokers: []string{addr}})
	defer p.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	require.NoError(t, p.Publish(ctx, msgs...))
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
