package kafkatest

import (
	"context"
	"sort"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/require"
)

func TestStartCreatesTopicsAndNothingElse(t *testing.T) {
	addr := Start(t, map[string]int32{"a": 3, "a.dlq": 1})

	conn, err := kafka.Dial("tcp", addr)
	require.NoError(t, err)
	defer conn.Close()
	parts, err := conn.ReadPartitions()
	require.NoError(t, err)
	counts := map[string]int{}
	for _, p := range parts {
		counts[p.Topic]++
	}
	require.Equal(t, map[string]int{"a": 3, "a.dlq": 1}, counts)

	// Round trip over TCP with acks=all.
	w := &kafka.Writer{Addr: kafka.TCP(addr), RequiredAcks: kafka.RequireAll, BatchTimeout: time.Millisecond}
	defer w.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, w.WriteMessages(ctx, kafka.Message{Topic: "a", Value: []byte("v")}))

	// Automatic topic creation is off.
	err = w.WriteMessages(ctx, kafka.Message{Topic: "nope", Value: []byte("v")})
	require.Error(t, err)
	parts, err = conn.ReadPartitions()
	require.NoError(t, err)
	var topics []string
	seen := map[string]bool{}
	for _, p := range parts {
		if !seen[p.Topic] {
			seen[p.Topic] = true
			topics = append(topics, p.Topic)
		}
	}
	sort.Strings(topics)
	require.Equal(t, []string{"a", "a.dlq"}, topics)
}

func TestStartClusterIsolated(t *testing.T) {
	c1, a1 := StartCluster(t, map[string]int32{"x": 1})
	_, a2 := StartCluster(t, nil)
	require.NotEqual(t, a1, a2, "each call gets its own broker")
	require.NotNil(t, c1)
}
