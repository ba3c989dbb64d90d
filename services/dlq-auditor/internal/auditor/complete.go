package auditor

import (
	"context"
	"fmt"
	"sort"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/floodgate-dev/floodgate/pkg/kafkascan"
	"github.com/floodgate-dev/floodgate/pkg/stream"
)

// Checker accounts for every event of a topic in a time range for one
// consumer group: produced (the topic's offsets by timestamp), consumed (the
// group's committed offsets), dead-lettered (the DLQ topic itself, cross-checked
// against the auditor's records) and what is left.
type Checker struct {
	Store *Store
	Kafka *kafka.Client
}

// PartitionReport accounts for one partition. Offsets [Start, End) are the
// events produced in the range.
type PartitionReport struct {
	Partition int   `json:"partition"`
	Start     int64 `json:"start_offset"`
	End       int64 `json:"end_offset"`
	LogStart  int64 `json:"log_start_offset"`
	LogEnd    int64 `json:"log_end_offset"`
	Committed int64 `json:"committed_offset"` // -1: the group has none

	Produced int64 `json:"produced"`
	// Processed: below the committed offset and not dead-lettered. The
	// consumer commits an offset only after its message was handled or
	// dead-lettered, so these were handled.
	Processed    int64 `json:"processed"`
	DeadLettered int64 `json:"dead_lettered"` // distinct source offsets, below the committed offset
	Pending      int64 `json:"pending"`       // at or after the committed offset: not consumed yet
	// DeadLetteredPending: dead-lettered but not committed yet (the commit
	// follows within the commit interval); counted in Pending.
	DeadLetteredPending int64 `json:"dead_lettered_pending"`
	Purged              int64 `json:"purged"` // dead letters whose stored record was purged (audited)

	// Unaccounted for:
	Unaudited int64 `json:"unaudited"` // on the DLQ topic, but neither stored by the auditor nor purged
	Lost      int64 `json:"lost"`      // deleted by retention before the group committed them
	Truncated int64 `json:"truncated"` // the group committed past the log end: the log lost messages

	Issues []string `json:"issues,omitempty"`
}

// CompletenessReport accounts for a topic, a group and a time range.
type CompletenessReport struct {
	Topic        string            `json:"topic"`
	Group        string            `json:"group"`
	From         time.Time         `json:"from"`
	To           time.Time         `json:"to"`
	Produced     int64             `json:"produced"`
	Processed    int64             `json:"processed"`
	DeadLettered int64             `json:"dead_lettered"`
	Pending      int64             `json:"pending"`
	Purged       int64             `json:"purged"`
	Unaccounted  int64             `json:"unaccounted"`
	Complete     bool              `json:"complete"` // nothing unaccounted for and nothing pending
	Partitions   []PartitionReport `json:"partitions"`
}

// Check builds the report. From and To bound the events' Kafka timestamps,
// [From, To).
func (c *Checker) Check(ctx context.Context, topic, group string, from, to time.Time) (CompletenessReport, error) {
	if topic == "" || group == "" || !from.Before(to) {
		return CompletenessReport{}, fmt.Errorf("%w: topic, group and a time range with from before to are required", ErrBadRequest)
	}
	if IsDLQTopic(topic) {
		return CompletenessReport{}, fmt.Errorf("%w: %s is a dead-letter topic; name its source topic", ErrBadRequest, topic)
	}
	rep := CompletenessReport{Topic: topic, Group: group, From: from.UTC(), To: to.UTC()}
	parts, b, starts, err := startsAt(ctx, c.Kafka, topic, from)
	if err != nil {
		return rep, err
	}
	ends, err := offsetsAt(ctx, c.Kafka, topic, parts, to, b)
	if err != nil {
		return rep, err
	}
	committed, err := committedOffsets(ctx, c.Kafka, group, topic, parts)
	if err != nil {
		return rep, err
	}
	inTopic, err := c.deadLettersOnTopic(ctx, topic, group, from)
	if err != nil {
		return rep, err
	}

	for _, p := range parts {
		pr := PartitionReport{
			Partition: p, Start: starts[p], End: max(ends[p], starts[p]),
			LogStart: b[p].first, LogEnd: b[p].last, Committed: committed[p],
		}
		pr.Produced = pr.End - pr.Start
		consumedEnd := pr.Start
		switch {
		case pr.Committed < 0:
			if pr.Produced > 0 {
				pr.Issues = append(pr.Issues, "the group has no committed offset: nothing consumed yet")
			}
		default:
			consumedEnd = min(max(pr.Committed, pr.Start), pr.End)
			if pr.Committed < pr.LogStart {
				pr.Lost = pr.LogStart - pr.Committed
				pr.Issues = append(pr.Issues, fmt.Sprintf("%d events deleted by retention before the group committed them (committed %d, log starts at %d)",
					pr.Lost, pr.Committed, pr.LogStart))
			}
			if pr.Committed > pr.LogEnd {
				pr.Truncated = pr.Committed - pr.LogEnd
				pr.Issues = append(pr.Issues, fmt.Sprintf("the group committed %d, past the log end %d: the log lost %d events",
					pr.Committed, pr.LogEnd, pr.Truncated))
			}
		}
		stored, err := c.Store.BySource(ctx, group, topic, p, pr.Start, pr.End)
		if err != nil {
			return rep, err
		}
		dead := map[int64]bool{}
		storedAt := map[int64]bool{}
		for _, r := range stored {
			dead[r.SourceOffset] = true
			storedAt[r.SourceOffset] = true
		}
		for _, m := range inTopic[p] {
			if m.offset < pr.Start || m.offset >= pr.End || storedAt[m.offset] {
				continue
			}
			// On the DLQ topic but not stored: purged (audited), or not audited.
			entries, err := c.Store.AuditOf(ctx, SubjectOf(m.id))
			if err != nil {
				return rep, err
			}
			purged := false
			for _, e := range entries {
				purged = purged || e.Action == ActionPurge
			}
			if purged {
				pr.Purged++
			} else {
				pr.Unaudited++
				if pr.Unaudited <= 5 {
					pr.Issues = append(pr.Issues, fmt.Sprintf("dead letter %s (source offset %d) is not in the auditor's records", m.id, m.offset))
				}
			}
			dead[m.offset] = true
		}
		for off := range dead {
			if off < consumedEnd {
				pr.DeadLettered++
			} else {
				pr.DeadLetteredPending++
			}
		}
		pr.Processed = consumedEnd - pr.Start - pr.DeadLettered
		pr.Pending = pr.End - consumedEnd
		rep.Produced += pr.Produced
		rep.Processed += pr.Processed
		rep.DeadLettered += pr.DeadLettered
		rep.Pending += pr.Pending
		rep.Purged += pr.Purged
		rep.Unaccounted += pr.Unaudited + pr.Lost + pr.Truncated
		rep.Partitions = append(rep.Partitions, pr)
	}
	rep.Complete = rep.Unaccounted == 0 && rep.Pending == 0
	return rep, nil
}

type dlqRef struct {
	id     string
	offset int64 // source offset
}

// deadLettersOnTopic reads the DLQ topic of topic from the first message at
// or after from (a dead letter is always written after its original) and
// returns the group's dead letters per source partition.
func (c *Checker) deadLettersOnTopic(ctx context.Context, topic, group string, from time.Time) (map[int][]dlqRef, error) {
	dlq := topic + DLQSuffix
	parts, b, starts, err := startsAt(ctx, c.Kafka, dlq, from)
	if err != nil {
		return nil, err
	}
	out := map[int][]dlqRef{}
	for _, p := range parts {
		err := kafkascan.Scan(ctx, c.Kafka, dlq, p, max(starts[p], b[p].first), b[p].last, func(m kafka.Message) bool {
			rec, err := stream.ParseDLQRecord(m)
			if err == nil && rec.ConsumerGroup == group && rec.SourceTopic == topic {
				out[rec.Partition] = append(out[rec.Partition], dlqRef{id: RecordID(dlq, p, m.Offset), offset: rec.Offset})
			}
			return true
		})
		if err != nil {
			return nil, err
		}
	}
	for p := range out {
		sort.Slice(out[p], func(i, j int) bool { return out[p][i].offset < out[p][j].offset })
	}
	return out, nil
}
