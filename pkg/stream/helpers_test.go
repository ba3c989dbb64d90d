package stream

import (
	"context"
	"log/slog"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/require"

	"github.com/floodgate-dev/floodgate/pkg/kafkatest"
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

// pos is a message's place: partition and offset.
type pos struct {
	partition int
	offset    int64
}

// seeded starts a broker with topic (partitions) and its dead-letter topic
// and publishes n messages to topic: message i keyed "k<i%keys>", its value i.
func seeded(t testing.TB, topic string, partitions int32, n, keys int) string {
	t.Helper()
	addr := kafkatest.Start(t, map[string]int32{topic: partitions, topic + ".dlq": 1})
	msgs := make([]kafka.Message, n)
	for i := range msgs {
		msgs[i] = kafka.Message{Topic: topic, Key: []byte("k" + strconv.Itoa(i%keys)), Value: []byte(strconv.Itoa(i))}
	}
	publish(t, addr, msgs...)
	return addr
}

// requireAllCommitted fails the test unless group committed every partition
// of topic up to its end.
func requireAllCommitted(t testing.TB, addr, group, topic string, partitions int, msgAndArgs ...any) {
	t.Helper()
	require.Equal(t, kafkatest.EndOffsets(t, addr, topic, partitions), kafkatest.CommittedOffsets(t, addr, group, topic, partitions), msgAndArgs...)
}

// collector is a per-message handler that records the values and offsets
// it handled.
type collector struct {
	mu      sync.Mutex
	seen    []string
	offsets []int64
}

func (c *collector) handle(_ context.Context, m kafka.Message) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.seen = append(c.seen, string(m.Value))
	c.offsets = append(c.offsets, m.Offset)
	return nil
}

func (c *collector) values() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]string(nil), c.seen...)
}

func (c *collector) handledOffsets() []int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]int64(nil), c.offsets...)
}

// reset forgets what was handled so far.
func (c *collector) reset() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.seen, c.offsets = nil, nil
}

func (c *collector) has(v string) bool {
	for _, s := range c.values() {
		if s == v {
			return true
		}
	}
	return false
}
