package whatif

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/floodgate-dev/floodgate/pkg/events"
	"github.com/floodgate-dev/floodgate/pkg/kafkascan"
)

// Recorded is one decision read back from the decisions topic.
type Recorded struct {
	events.Decision
	Partition int
	Offset    int64
}

// Source reads the recorded decisions of a time range from a decisions topic
// with pkg/kafkascan, without joining a consumer group (it commits nothing
// and moves no consumer's offsets).
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
	ranges, err := kafkascan.Since(ctx, s.Client, s.Topic, from.Add(-slack))
	if err != nil {
		return nil, st, err
	}
	st.Partitions = len(ranges)
	stopAt := to.Add(slack)
	var out []Recorded
	for _, pr := range ranges {
		err := kafkascan.Scan(ctx, s.Client, s.Topic, pr.Partition, pr.Start, pr.End, func(m kafka.Message) bool {
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
