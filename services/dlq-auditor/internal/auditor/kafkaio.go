package auditor

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/floodgate-dev/floodgate/pkg/kafkascan"
)

// ErrExpired means a message is no longer on its topic (retention deleted it).
var ErrExpired = errors.New("message no longer on the topic (retention)")

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
	reqs := make([]kafka.OffsetRequest, 0, len(parts))
	for _, p := range parts {
		reqs = append(reqs, kafka.TimeOffsetOf(p, t))
	}
	res, err := client.ListOffsets(ctx, &kafka.ListOffsetsRequest{Topics: map[string][]kafka.OffsetRequest{topic: reqs}})
	if err != nil {
		return nil, fmt.Errorf("list offsets of %s at %s: %w", topic, t.Format(time.RFC3339), err)
	}
	out := map[int]int64{}
	for _, po := range res.Topics[topic] {
		if po.Error != nil {
			return nil, fmt.Errorf("list offsets of %s/%d at %s: %w", topic, po.Partition, t.Format(time.RFC3339), po.Error)
		}
		off := int64(-1)
		for o := range po.Offsets { // one entry: the request had one timestamp per partition
			off = o
		}
		if off < 0 {
			off = hw[po.Partition].last
		}
		out[po.Partition] = off
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

// scanPartition calls fn for every message of topic/partition with an offset
// in [from, to), in order; fn returning false stops the scan.
func scanPartition(ctx context.Context, client *kafka.Client, topic string, partition int, from, to int64, fn func(kafka.Message) bool) error {
	for off := from; off < to; {
		res, err := client.Fetch(ctx, &kafka.FetchRequest{
			Topic: topic, Partition: partition, Offset: off, MinBytes: 1, MaxBytes: 4 << 20, MaxWait: 100 * time.Millisecond,
		})
		if err != nil {
			return fmt.Errorf("fetch %s/%d at %d: %w", topic, partition, off, err)
		}
		if res.Error != nil {
			if errors.Is(res.Error, kafka.OffsetOutOfRange) {
				return fmt.Errorf("fetch %s/%d at %d: %w", topic, partition, off, ErrExpired)
			}
			return fmt.Errorf("fetch %s/%d at %d: %w", topic, partition, off, res.Error)
		}
		if res.LogStartOffset > off {
			return fmt.Errorf("fetch %s/%d at %d (log starts at %d): %w", topic, partition, off, res.LogStartOffset, ErrExpired)
		}
		progressed := false
		for {
			rec, err := res.Records.ReadRecord()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				return fmt.Errorf("read %s/%d at %d: %w", topic, partition, off, err)
			}
			if rec.Offset < off {
				continue // batches may start before the requested offset
			}
			if rec.Offset >= to {
				return nil
			}
			msg, err := toMessage(topic, partition, rec)
			if err != nil {
				return err
			}
			off = rec.Offset + 1
			progressed = true
			if !fn(msg) {
				return nil
			}
		}
		if !progressed {
			if off >= res.HighWatermark {
				return nil // nothing more to read
			}
			if ctx.Err() != nil {
				return ctx.Err()
			}
		}
	}
	return nil
}

func toMessage(topic string, partition int, rec *kafka.Record) (kafka.Message, error) {
	msg := kafka.Message{Topic: topic, Partition: partition, Offset: rec.Offset, Time: rec.Time, Headers: rec.Headers}
	var err error
	if rec.Key != nil {
		if msg.Key, err = kafka.ReadAll(rec.Key); err != nil {
			return msg, fmt.Errorf("read key of %s/%d@%d: %w", topic, partition, rec.Offset, err)
		}
	}
	if rec.Value != nil {
		if msg.Value, err = kafka.ReadAll(rec.Value); err != nil {
			return msg, fmt.Errorf("read value of %s/%d@%d: %w", topic, partition, rec.Offset, err)
		}
	}
	// The record's headers are only valid until the next read: copy them.
	hs := make([]kafka.Header, len(rec.Headers))
	for i, h := range rec.Headers {
		hs[i] = kafka.Header{Key: h.Key, Value: append([]byte(nil), h.Value...)}
	}
	msg.Headers = hs
	return msg, nil
}

// fetchOne reads the message at topic/partition/offset; ErrExpired when it is gone.
func fetchOne(ctx context.Context, client *kafka.Client, topic string, partition int, offset int64) (kafka.Message, error) {
	var out kafka.Message
	found := false
	err := scanPartition(ctx, client, topic, partition, offset, offset+1, func(m kafka.Message) bool {
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
