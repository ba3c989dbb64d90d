package kafkatest

import (
	"context"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/require"
)

// CreateTopic makes a topic of the test's own, of partitions partitions, on
// the broker at addr (the local stack's, make up), and deletes it when the
// test ends. It fails the test when the broker cannot be reached or refuses.
func CreateTopic(t testing.TB, addr, topic string, partitions int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c := &kafka.Client{Addr: kafka.TCP(addr)}
	resp, err := c.CreateTopics(ctx, &kafka.CreateTopicsRequest{Topics: []kafka.TopicConfig{{Topic: topic, NumPartitions: partitions, ReplicationFactor: 1}}})
	require.NoError(t, err, "the local broker (make up) at %s", addr)
	require.NoError(t, resp.Errors[topic])
	t.Cleanup(func() {
		_, _ = c.DeleteTopics(context.Background(), &kafka.DeleteTopicsRequest{Topics: []string{topic}})
	})
}

// WaitEnd waits up to 20 s for partitions 0 .. partitions-1 of topic to hold
// want messages between them (the sum of their EndOffsets) and returns how
// many they hold.
func WaitEnd(t testing.TB, addr, topic string, partitions int, want int64) int64 {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		var sum int64
		for _, o := range EndOffsets(t, addr, topic, partitions) {
			sum += o
		}
		if sum >= want || time.Now().After(deadline) {
			return sum
		}
	}
}
