package stream

import (
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/floodgate-dev/floodgate/pkg/kafkatest"
)

// failingSetOffset fails its reader's first SetOffset calls, as
// kgoPartitionReader's does when its client cannot be created.
type failingSetOffset struct {
	partitionReader
	fails *atomic.Int32 // SetOffset calls still to fail, shared by the readers
	calls *atomic.Int32
}

func (r failingSetOffset) SetOffset(offset int64) error {
	r.calls.Add(1)
	if r.fails.Add(-1) >= 0 {
		return errors.New("partition reader: no client")
	}
	return r.partitionReader.SetOffset(offset)
}

// TestConsumerSetOffsetFailureStillConsumes: a partition whose reader cannot
// be positioned at first is retried within the generation and read, not left
// unread until a rebalance that a lone member never gets.
func TestConsumerSetOffsetFailureStillConsumes(t *testing.T) {
	const topic, group = "setoffset-fails", "g-setoffset-fails"
	addr := seeded(t, topic, 1, 3, 3)
	var handled collector
	cfg := fastConsumerConfig(t, addr, topic, group, prometheus.NewRegistry())
	c, err := NewConsumer(cfg, handled.handle)
	require.NoError(t, err)
	var fails, calls atomic.Int32
	fails.Store(2)
	newReader := c.newPartitionReader
	c.newPartitionReader = func(partition int) partitionReader {
		return failingSetOffset{partitionReader: newReader(partition), fails: &fails, calls: &calls}
	}
	stop := runConsumer(t, c)
	require.Eventually(t, func() bool { return len(handled.handledOffsets()) == 3 }, waitFor, 10*time.Millisecond,
		"the partition is consumed although its reader could not be positioned at first")
	require.NoError(t, stop())
	require.Equal(t, []int64{0, 1, 2}, handled.handledOffsets())
	require.Equal(t, int32(3), calls.Load(), "two failed SetOffset calls, then one that worked")
	require.Equal(t, int64(3), kafkatest.CommittedOffsets(t, addr, group, topic, 1)[0])
}
