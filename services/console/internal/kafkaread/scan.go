// Package kafkaread reads ranges of a partition with kafka-go's low-level
// client, for pages that show what is on a topic (sample decisions around an
// alert, the adjuster's scale changes) without joining a consumer group.
package kafkaread

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/segmentio/kafka-go"
)

// Scan calls fn for every message of topic/partition with an offset in
// [from, to), in order. It stops early, without error, at the partition's end.
func Scan(ctx context.Context, c *kafka.Client, topic string, partition int, from, to int64, fn func(kafka.Message)) error {
	for off := from; off < to; {
		res, err := c.Fetch(ctx, &kafka.FetchRequest{Topic: topic, Partition: partition, Offset: off,
			MinBytes: 1, MaxBytes: 4 << 20, MaxWait: 100 * time.Millisecond})
		if err != nil {
			return fmt.Errorf("fetch %s/%d at %d: %w", topic, partition, off, err)
		}
		if res.Error != nil {
			return fmt.Errorf("fetch %s/%d at %d: %w", topic, partition, off, res.Error)
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
				continue // a batch may start before the requested offset
			}
			if rec.Offset >= to {
				return nil
			}
			m := kafka.Message{Topic: topic, Partition: partition, Offset: rec.Offset, Time: rec.Time}
			if rec.Key != nil {
				if m.Key, err = kafka.ReadAll(rec.Key); err != nil {
					return fmt.Errorf("read key of %s/%d@%d: %w", topic, partition, rec.Offset, err)
				}
			}
			if rec.Value != nil {
				if m.Value, err = kafka.ReadAll(rec.Value); err != nil {
					return fmt.Errorf("read value of %s/%d@%d: %w", topic, partition, rec.Offset, err)
				}
			}
			off, progressed = rec.Offset+1, true
			fn(m)
		}
		if !progressed {
			if off >= res.HighWatermark {
				return nil
			}
			if err := ctx.Err(); err != nil {
				return fmt.Errorf("fetch %s/%d at %d: %w", topic, partition, off, err)
			}
		}
	}
	return nil
}
