package auditor

import (
	"context"
	"fmt"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/floodgate-dev/floodgate/pkg/kafkascan"
)

// ErrExpired means a message is no longer on its topic (retention deleted it).
var ErrExpired = kafkascan.ErrExpired

// bounds are a partition's log start offset and high watermark.
type bounds struct{ first, last int64 }

// topicBounds reads topic's partitions and their log bounds.
func topicBounds(ctx context.Context, client *kafka.Client, topic string) ([]int, map[int]bounds, error) {
	parts, err := kafkascan.Partitions(ctx, client, topic)
	if err != nil {
		return nil, nil, err
	}
	first, end, err := kafkascan.PartitionBounds(ctx, client, topic, parts)
	if err != nil {
		return nil, nil, err
	}
	b := make(map[int]bounds, len(parts))
	for p, f := range first {
		b[p] = bounds{first: f, last: end[p]}
	}
	return parts, b, nil
}

// startsAt reads topic's partitions, their log bounds and each one's first
// offset at or after t.
func startsAt(ctx context.Context, client *kafka.Client, topic string, t time.Time) ([]int, map[int]bounds, map[int]int64, error) {
	parts, b, err := topicBounds(ctx, client, topic)
	if err != nil {
		return nil, nil, nil, err
	}
	starts, err := offsetsAt(ctx, client, topic, parts, t, b)
	return parts, b, starts, err
}

// offsetsAt returns, per partition, the offset of the first message with a
// timestamp at or after t, or the high watermark when there is none.
func offsetsAt(ctx context.Context, client *kafka.Client, topic string, parts []int, t time.Time, hw map[int]bounds) (map[int]int64, error) {
	out, err := kafkascan.OffsetsAt(ctx, client, topic, parts, t)
	if err != nil {
		return nil, err
	}
	for p, off := range out {
		if off < 0 {
			out[p] = hw[p].last
		}
	}
	return out, nil
}

// committedOffsets returns group's committed offset per partition, -1 when none.
func committedOffsets(ctx context.Context, client *kafka.Client, group, topic string, parts []int) (map[int]int64, error) {
	res, err := client.OffsetFetch(ctx, &kafka.OffsetFetchRequest{GroupID: group, Topics: map[string][]int{topic: parts}})
	if err != nil {
		return nil, fmt.Errorf("committed offsets of %s on %s: %w", group, topic, err)
	}
	if res.Error != nil {
		return nil, fmt.Errorf("committed offsets of %s on %s: %w", group, topic, res.Error)
	}
	out := map[int]int64{}
	for _, p := range parts {
		out[p] = -1
	}
	for _, po := range res.Topics[topic] {
		if po.Error != nil {
			return nil, fmt.Errorf("committed offset of %s on %s/%d: %w", group, topic, po.Partition, po.Error)
		}
		out[po.Partition] = po.CommittedOffset
	}
	return out, nil
}

// fetchOne reads the message at topic/partition/offset; ErrExpired when it is gone.
func fetchOne(ctx context.Context, client *kafka.Client, topic string, partition int, offset int64) (kafka.Message, error) {
	var out kafka.Message
	found := false
	err := kafkascan.Scan(ctx, client, topic, partition, offset, offset+1, func(m kafka.Message) bool {
		out, found = m, m.Offset == offset
		return false
	})
	if err != nil {
		return kafka.Message{}, err
	}
	if !found {
		return kafka.Message{}, fmt.Errorf("read %s/%d at %d: %w", topic, partition, offset, ErrExpired)
	}
	return out, nil
}
