package whatif

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sort"
	"strings"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/floodgate-dev/floodgate/pkg/events"
)

// Recorded is one decision read back from the decisions topic.
type Recorded struct {
	events.Decision
	Partition int
	Offset    int64
}

// Source reads the recorded decisions of a time range from a decisions topic
// with kafka-go's low-level client, without joining a consumer group (it
// commits nothing and moves no consumer's offsets).
type Source struct {
	Client *kafka.Client
	Topic  string // floodgate.decisions.v1
	// Slack bounds how far a message's Kafka timestamp (its produce time) may
	// be from its decision's ts: each partition is read from the first
	// message produced at from−Slack (ListOffsets by timestamp) and stops at
	// the first one produced at to+Slack or later. Decisions that reached the
	// topic later than that (a journal replayed after a long broker outage)
	// are not read. Default 2m.
	Slack time.Duration
	// MaxEvents bounds the decisions kept in memory (default 2,000,000); a
	// range holding more is refused with ErrTooMany.
	MaxEvents int
}

// ErrTooMany is returned when the range holds more decisions than MaxEvents.
var ErrTooMany = errors.New("too many decisions in the range")

// ReadStats says what reading the range saw besides the decisions kept.
type ReadStats struct {
	Partitions int `json:"partitions"`
	Scanned    int `json:"scanned"`      // messages read
	Undecoded  int `json:"undecoded"`    // messages that are not valid decision.v1 (skipped)
	OutOfRange int `json:"out_of_range"` // valid decisions whose ts is outside [from, to)
}

// Read returns the decisions with a ts in [from, to), ordered by ts, then
// partition and offset (a stable order: the replay's).
func (s *Source) Read(ctx context.Context, from, to time.Time) ([]Recorded, ReadStats, error) {
	var st ReadStats
	if !from.Before(to) {
		return nil, st, fmt.Errorf("read decisions: from %s is not before to %s", from.Format(time.RFC3339), to.Format(time.RFC3339))
	}
	slack, maxN := s.Slack, s.MaxEvents
	if slack <= 0 {
		slack = 2 * time.Minute
	}
	if maxN <= 0 {
		maxN = 2_000_000
	}
	parts, err := s.partitions(ctx)
	if err != nil {
		return nil, st, err
	}
	st.Partitions = len(parts)
	reqs := make([]kafka.OffsetRequest, 0, 2*len(parts))
	for _, p := range parts {
		reqs = append(reqs, kafka.FirstOffsetOf(p), kafka.LastOffsetOf(p))
	}
	bounds, err := s.Client.ListOffsets(ctx, &kafka.ListOffsetsRequest{Topics: map[string][]kafka.OffsetRequest{s.Topic: reqs}})
	if err != nil {
		return nil, st, fmt.Errorf("list offsets of %s: %w", s.Topic, err)
	}
	first, end := map[int]int64{}, map[int]int64{}
	for _, po := range bounds.Topics[s.Topic] {
		if po.Error != nil {
			return nil, st, fmt.Errorf("list offsets of %s/%d: %w", s.Topic, po.Partition, po.Error)
		}
		first[po.Partition], end[po.Partition] = po.FirstOffset, po.LastOffset
	}
	reqs = reqs[:0]
	for _, p := range parts {
		reqs = append(reqs, kafka.TimeOffsetOf(p, from.Add(-slack)))
	}
	at, err := s.Client.ListOffsets(ctx, &kafka.ListOffsetsRequest{Topics: map[string][]kafka.OffsetRequest{s.Topic: reqs}})
	if err != nil {
		return nil, st, fmt.Errorf("list offsets of %s at %s: %w", s.Topic, from.Add(-slack).Format(time.RFC3339), err)
	}
	stopAt := to.Add(slack)
	var out []Recorded
	for _, po := range at.Topics[s.Topic] {
		if po.Error != nil {
			return nil, st, fmt.Errorf("list offsets of %s/%d by time: %w", s.Topic, po.Partition, po.Error)
		}
		start := end[po.Partition] // no message produced at or after the time
		for o := range po.Offsets {
			start = o
		}
		start = max(start, first[po.Partition])
		err := scan(ctx, s.Client, s.Topic, po.Partition, start, end[po.Partition], func(m kafka.Message) bool {
			if !m.Time.IsZero() && !m.Time.Before(stopAt) {
				return false
			}
			st.Scanned++
			d, err := events.DecodeDecision(m.Value)
			if err != nil {
				st.Undecoded++
				return true
			}
			if d.TS.Before(from) || !d.TS.Before(to) {
				st.OutOfRange++
				return true
			}
			out = append(out, Recorded{Decision: d, Partition: m.Partition, Offset: m.Offset})
			return len(out) <= maxN
		})
		if err != nil {
			return nil, st, err
		}
		if len(out) > maxN {
			return nil, st, fmt.Errorf("read decisions of %s in [%s, %s): %w (more than %d); narrow the range",
				s.Topic, from.Format(time.RFC3339), to.Format(time.RFC3339), ErrTooMany, maxN)
		}
	}
	Sort(out)
	return out, st, nil
}

// Sort puts decisions in replay order: by ts, then partition and offset.
func Sort(recs []Recorded) {
	sort.SliceStable(recs, func(i, j int) bool {
		a, b := &recs[i], &recs[j]
		if !a.TS.Equal(b.TS) {
			return a.TS.Before(b.TS)
		}
		if a.Partition != b.Partition {
			return a.Partition < b.Partition
		}
		return a.Offset < b.Offset
	})
}

func (s *Source) partitions(ctx context.Context) ([]int, error) {
	meta, err := s.Client.Metadata(ctx, &kafka.MetadataRequest{Topics: []string{s.Topic}})
	if err != nil {
		return nil, fmt.Errorf("metadata of %s: %w", s.Topic, err)
	}
	for _, t := range meta.Topics {
		if t.Name != s.Topic {
			continue
		}
		if t.Error != nil {
			return nil, fmt.Errorf("metadata of %s: %w", s.Topic, t.Error)
		}
		ids := make([]int, 0, len(t.Partitions))
		for _, p := range t.Partitions {
			ids = append(ids, p.ID)
		}
		sort.Ints(ids)
		return ids, nil
	}
	return nil, fmt.Errorf("metadata of %s: topic not found", s.Topic)
}

// scan calls fn for the messages of topic/partition with an offset in
// [from, to), in order, until fn returns false or the partition ends.
func scan(ctx context.Context, c *kafka.Client, topic string, partition int, from, to int64, fn func(kafka.Message) bool) error {
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
			if rec.Value != nil {
				if m.Value, err = kafka.ReadAll(rec.Value); err != nil {
					return fmt.Errorf("read value of %s/%d@%d: %w", topic, partition, rec.Offset, err)
				}
			}
			off, progressed = rec.Offset+1, true
			if !fn(m) {
				return nil
			}
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

// ParseTime reads a range bound: RFC 3339, "now", or a duration before now
// ("90m", "-90m").
func ParseTime(s string, now time.Time) (time.Time, error) {
	switch s = strings.TrimSpace(s); {
	case s == "":
		return time.Time{}, errors.New("required")
	case s == "now":
		return now.UTC(), nil
	}
	if t, err := time.Parse(time.RFC3339Nano, s); err == nil {
		return t.UTC(), nil
	}
	d, err := time.ParseDuration(strings.TrimPrefix(s, "-"))
	if err != nil || d <= 0 {
		return time.Time{}, fmt.Errorf("%q: want RFC 3339, \"now\" or a duration before now such as 1h", s)
	}
	return now.Add(-d).UTC(), nil
}
