package kafkatest

import (
	"sync"

	"github.com/segmentio/kafka-go"
)

// Capture is a publisher that keeps every message it is given (TryPublish,
// the method of stream.DurableProducer's non-blocking send), for tests that
// check what a component published without a broker. Safe for concurrent
// use; the zero value is ready.
type Capture struct {
	mu   sync.Mutex
	msgs []kafka.Message
}

// TryPublish keeps m and reports it taken.
func (c *Capture) TryPublish(m kafka.Message) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.msgs = append(c.msgs, m)
	return true
}

// Messages returns the messages kept so far, oldest first; the caller owns
// the returned slice.
func (c *Capture) Messages() []kafka.Message {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]kafka.Message(nil), c.msgs...)
}
