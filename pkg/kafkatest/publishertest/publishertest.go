// Package publishertest is the exported contract suite of the broker
// producer port the limiter and its transports publish decision events
// through (TryPublish, never blocking), run against the real asynchronous
// producer on a Kafka-protocol broker and the in-memory double
// (kafkatest.Capture) alike.
package publishertest

import (
	"fmt"
	"testing"

	"github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/require"
)

// Publisher takes a message without blocking; false means it was not queued.
type Publisher interface {
	TryPublish(kafka.Message) bool
}

// UnderTest is a Publisher with a view of what reached its far end: Read
// returns the first n messages published to the topic, oldest first, waiting
// for them as long as the implementation needs.
type UnderTest struct {
	Publisher
	Read func(t *testing.T, n int) []kafka.Message
}

// Run is what every Publisher does; open returns one writing to a fresh
// topic of one partition (its default topic).
func Run(t *testing.T, open func(t *testing.T) UnderTest) {
	t.Run("every accepted message arrives with its key, value and headers, in order", func(t *testing.T) {
		p := open(t)
		const n = 50
		var want []kafka.Message
		for i := range n {
			m := kafka.Message{Key: []byte(fmt.Sprintf("bot:p%d", i%3)), Value: []byte(fmt.Sprintf(`{"id":"ev_%d"}`, i)),
				Headers: []kafka.Header{{Key: "ce_id", Value: []byte(fmt.Sprintf("ev_%d", i))}}}
			require.True(t, p.TryPublish(m), "message %d accepted", i)
			want = append(want, m)
		}
		got := p.Read(t, n)
		require.Len(t, got, n)
		for i := range want {
			require.Equal(t, string(want[i].Key), string(got[i].Key), "message %d", i)
			require.Equal(t, string(want[i].Value), string(got[i].Value), "message %d", i)
			require.Contains(t, got[i].Headers, want[i].Headers[0], "message %d", i)
		}
	})
}
