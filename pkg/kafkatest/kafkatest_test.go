package kafkatest

import (
	"context"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/require"
)

func TestStartCreatesTopicsAndNothingElse(t *testing.T) {
	addr := Start(t, map[string]int32{"a": 3, "a.dlq": 1})
	require.Equal(t, map[string]int{"a": 3, "a.dlq": 1}, Partitions(t, addr))

	// Round trip over TCP with acks=all.
	w := &kafka.Writer{Addr: kafka.TCP(addr), RequiredAcks: kafka.RequireAll, BatchTimeout: time.Millisecond}
	defer w.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, w.WriteMessages(ctx, kafka.Message{Topic: "a", Value: []byte("v")}))

	// Automatic topic creation is off.
	require.Error(t, w.WriteMessages(ctx, kafka.Message{Topic: "nope", Value: []byte("v")}))
	require.Equal(t, map[string]int{"a": 3, "a.dlq": 1}, Partitions(t, addr))
}

func TestStartClusterIsolated(t *testing.T) {
	c1, a1 := StartCluster(t, map[string]int32{"x": 1})
	_, a2 := StartCluster(t, nil)
	require.NotEqual(t, a1, a2, "each call gets its own broker")
	require.NotNil(t, c1)
}

// TestGroupMemberKilledInJoinIsExpired: the test cluster expires a member
// killed while its JoinGroup waited in a rebalance, as the local broker
// program does (kfake alone never does; see ExpectKilledJoinerExpired).
func TestGroupMemberKilledInJoinIsExpired(t *testing.T) {
	ExpectKilledJoinerExpired(t, Start(t, nil))
}
