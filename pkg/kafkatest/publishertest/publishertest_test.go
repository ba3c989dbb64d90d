package publishertest_test

import (
	"context"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/floodgate-dev/floodgate/pkg/kafkatest"
	"github.com/floodgate-dev/floodgate/pkg/kafkatest/publishertest"
	"github.com/floodgate-dev/floodgate/pkg/stream"
)

// TestPublisherContract runs the contract against the asynchronous producer
// on an in-process Kafka-protocol broker (kfake) and kafkatest.Capture.
func TestPublisherContract(t *testing.T) {
	t.Run("async producer on a broker", func(t *testing.T) {
		publishertest.Run(t, func(t *testing.T) publishertest.UnderTest {
			const topic = "contract"
			addr := kafkatest.Start(t, map[string]int32{topic: 1})
			p := stream.NewAsyncProducer(stream.AsyncProducerConfig{Brokers: []string{addr}, Topic: topic, BatchTimeout: time.Millisecond})
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- p.Run(ctx) }()
			t.Cleanup(func() { cancel(); <-done })
			return publishertest.UnderTest{Publisher: p, Read: func(t *testing.T, n int) []kafka.Message {
				return kafkatest.ReadPartition(t, addr, topic, 0, n)
			}}
		})
	})
	t.Run("capture", func(t *testing.T) {
		publishertest.Run(t, func(*testing.T) publishertest.UnderTest {
			c := &kafkatest.Capture{}
			return publishertest.UnderTest{Publisher: c, Read: func(_ *testing.T, n int) []kafka.Message {
				ms := c.Messages()
				return ms[:min(n, len(ms))]
			}}
		})
	})
}
