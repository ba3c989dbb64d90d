// Package kafkascan reads ranges of a topic with kafka-go's low-level client,
// without joining a consumer group: it commits nothing and moves no
// consumer's offsets. It is how the what-if replay reads a time range of
// decisions, how the console reads the decisions around an alert and the
// adjuster's scale changes, and how the dlq-auditor reads dead letters and
// the offsets of a time range.
package kafkascan

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sort"
	"time"

	"github.com/segmentio/kafka-go"
)

// ErrExpired means a scan asked for messages the partition no longer holds:
// retention deleted them (the log starts after the offset asked for).
var ErrExpired = errors.New("message no longer on the topic (retention)")

// Scan calls fn for every message of topic/partition with an offset in
// [from, to), in order (key, value, headers, offset and produce time), until
// fn returns false. It stops early, without error, at the partition's end.
// Asking for an offset retention already deleted fails with ErrExpired (the
// broker's OffsetOutOfRange: scans ask only for offsets below the end) rather
// than silently skipping to the log start.
func Scan(ctx context.Context, c *kafka.Client, topic string, partition int, from, to int64, fn func(kafka.Message) bool) error {
	for off := from; off < to; {
		res, err := c.Fetch(ctx, &kafka.FetchRequest{Topic: topic, Partition: partition, Offset: off,
			MinBytes: 1, MaxBytes: 4 << 20, MaxWait: 100 * time.Millisecond})
		if err != nil {
			return fmt.Errorf("fetch %s/%d at %d: %w", topic, partition, off, err)
		}
		if res.Error != nil {
			if errors.Is(res.Error, kafka.OffsetOutOfRange) {
				return fmt.Errorf("fetch %s/%d at %d: %w (%w)", topic, partition, off, ErrExpired, res.Error)
			}
			return fmt.Errorf("fetch %s/%d at %d: %w", topic, partition, off, res.Error)
		}
		if res.LogStartOffset > off {
			return fmt.Errorf("fetch %s/%d at %d (log starts at %d): %w", topic, partition, off, res.LogStartOffset, ErrExpired)
		}
		progressed, done := false, false
		err = Records(res, off, func(rec *kafka.Record) (bool, error) {
			if rec.Offset >= to {
				done = true
				return false, nil
			}
			m, err := message(topic, partition, rec)
			if err != nil {
				return false, err
			}
			off, progressed, done = rec.Offset+1, true, !fn(m)
			return !done, nil
		})
		switch {
		case err != nil:
			return fmt.Errorf("read %s/%d at %d: %w", topic, partition, off, err)
		case done:
			return nil
		case !progressed:
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

// All calls fn for every message of topic, partition by partition in order,
// each from its first offset up to the end it had when All began, until fn
// returns false. Messages produced meanwhile are not read.
func All(ctx context.Context, c *kafka.Client, topic string, fn func(kafka.Message) bool) error {
	parts, err := Partitions(ctx, c, topic)
	if err != nil {
		return err
	}
	first, end, err := PartitionBounds(ctx, c, topic, parts)
	if err != nil {
		return err
	}
	more := true
	for _, p := range parts {
		err := Scan(ctx, c, topic, p, first[p], end[p], func(m kafka.Message) bool {
			more = fn(m)
			return more
		})
		if err != nil || !more {
			return err
		}
	}
	return nil
}

// Records calls fn with each record of a fetch's answer at offset from or
// later, in order — a batch may start before the offset asked for — until
// fn returns false or an error. It returns fn's error, or the error reading
// a record; nil at the end of the answer.
func Records(res *kafka.FetchResponse, from int64, fn func(*kafka.Record) (more bool, err error)) error {
	for {
		rec, err := res.Records.ReadRecord()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		if rec.Offset < from {
			continue
		}
		if more, err := fn(rec); err != nil || !more {
			return err
		}
	}
}

// message reads rec into a kafka.Message. The record's headers are only valid
// until the next read, so their values are copied.
func message(topic string, partition int, rec *kafka.Record) (kafka.Message, error) {
	m := kafka.Message{Topic: topic, Partition: partition, Offset: rec.Offset, Time: rec.Time}
	var err error
	if rec.Key != nil {
		if m.Key, err = kafka.ReadAll(rec.Key); err != nil {
			return m, fmt.Errorf("read key of %s/%d@%d: %w", topic, partition, rec.Offset, err)
		}
	}
	if rec.Value != nil {
		if m.Value, err = kafka.ReadAll(rec.Value); err != nil {
			return m, fmt.Errorf("read value of %s/%d@%d: %w", topic, partition, rec.Offset, err)
		}
	}
	if len(rec.Headers) > 0 {
		m.Headers = make([]kafka.Header, len(rec.Headers))
		for i, h := range rec.Headers {
			m.Headers[i] = kafka.Header{Key: h.Key, Value: append([]byte(nil), h.Value...)}
		}
	}
	return m, nil
}

// Partitions returns the topic's partition ids in order.
func Partitions(ctx context.Context, c *kafka.Client, topic string) ([]int, error) {
	meta, err := c.Metadata(ctx, &kafka.MetadataRequest{Topics: []string{topic}})
	if err != nil {
		return nil, fmt.Errorf("metadata of %s: %w", topic, err)
	}
	for _, t := range meta.Topics {
		if t.Name != topic {
			continue
		}
		if t.Error != nil {
			return nil, fmt.Errorf("metadata of %s: %w", topic, t.Error)
		}
		ids := make([]int, 0, len(t.Partitions))
		for _, p := range t.Partitions {
			ids = append(ids, p.ID)
		}
		sort.Ints(ids)
		return ids, nil
	}
	return nil, fmt.Errorf("metadata of %s: topic not found", topic)
}

// Range is what one partition holds from a point in time on.
type Range struct {
	Partition int
	First     int64 // the partition's first offset (older messages are deleted)
	Start     int64 // the first message produced at or after the time; End when there is none
	End       int64 // the partition's end: the next offset to be written
}

// Since returns, for every partition of topic in order, the range of the
// messages produced at or after t (ListOffsets by timestamp), within the
// partition's first offset and end.
func Since(ctx context.Context, c *kafka.Client, topic string, t time.Time) ([]Range, error) {
	parts, err := Partitions(ctx, c, topic)
	if err != nil {
		return nil, err
	}
	first, end, err := PartitionBounds(ctx, c, topic, parts)
	if err != nil {
		return nil, err
	}
	at, err := OffsetsAt(ctx, c, topic, parts, t)
	if err != nil {
		return nil, err
	}
	out := make([]Range, 0, len(parts))
	for _, p := range parts {
		r := Range{Partition: p, First: first[p], Start: end[p], End: end[p]}
		if o, ok := at[p]; ok && o >= 0 {
			r.Start = o
		}
		r.Start = max(r.Start, r.First)
		out = append(out, r)
	}
	return out, nil
}

// OffsetsAt returns, for each of parts, the offset of the first message
// produced at or after t (ListOffsets by timestamp), or -1 when there is none.
func OffsetsAt(ctx context.Context, c *kafka.Client, topic string, parts []int, t time.Time) (map[int]int64, error) {
	reqs := make([]kafka.OffsetRequest, 0, len(parts))
	for _, p := range parts {
		reqs = append(reqs, kafka.TimeOffsetOf(p, t))
	}
	res, err := c.ListOffsets(ctx, &kafka.ListOffsetsRequest{Topics: map[string][]kafka.OffsetRequest{topic: reqs}})
	if err != nil {
		return nil, fmt.Errorf("list offsets of %s at %s: %w", topic, t.Format(time.RFC3339), err)
	}
	out := make(map[int]int64, len(parts))
	for _, po := range res.Topics[topic] {
		if po.Error != nil {
			return nil, fmt.Errorf("list offsets of %s/%d at %s: %w", topic, po.Partition, t.Format(time.RFC3339), po.Error)
		}
		out[po.Partition] = -1
		for o := range po.Offsets { // one entry: one timestamp per partition; -1 when none (kfake answers so)
			if o >= 0 {
				out[po.Partition] = o
			}
		}
	}
	return out, nil
}

// Bounds returns one partition's first offset and its end (the next offset).
func Bounds(ctx context.Context, c *kafka.Client, topic string, partition int) (first, end int64, err error) {
	f, e, err := PartitionBounds(ctx, c, topic, []int{partition})
	if err != nil {
		return 0, 0, err
	}
	first, ok := f[partition]
	if !ok {
		return 0, 0, fmt.Errorf("list offsets of %s/%d: partition missing from the answer", topic, partition)
	}
	return first, e[partition], nil
}

// PartitionBounds returns the first offset and the end (the next offset to be
// written) of each of parts, in one ListOffsets request.
func PartitionBounds(ctx context.Context, c *kafka.Client, topic string, parts []int) (first, end map[int]int64, err error) {
	reqs := make([]kafka.OffsetRequest, 0, 2*len(parts))
	for _, p := range parts {
		reqs = append(reqs, kafka.FirstOffsetOf(p), kafka.LastOffsetOf(p))
	}
	res, err := c.ListOffsets(ctx, &kafka.ListOffsetsRequest{Topics: map[string][]kafka.OffsetRequest{topic: reqs}})
	if err != nil {
		return nil, nil, fmt.Errorf("list offsets of %s: %w", topic, err)
	}
	first, end = map[int]int64{}, map[int]int64{}
	for _, po := range res.Topics[topic] {
		if po.Error != nil {
			return nil, nil, fmt.Errorf("list offsets of %s/%d: %w", topic, po.Partition, po.Error)
		}
		first[po.Partition], end[po.Partition] = po.FirstOffset, po.LastOffset
	}
	return first, end, nil
}
