package auditor

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/floodgate-dev/floodgate/pkg/dlqapi"
	"github.com/floodgate-dev/floodgate/pkg/httpapi"
	"github.com/floodgate-dev/floodgate/pkg/kafkascan"
	"github.com/floodgate-dev/floodgate/pkg/stream"
	"github.com/floodgate-dev/floodgate/pkg/tick"
)

// Headers a replay adds to the original message. They do not start with
// "dlq_", so when a replayed message fails again its new dead letter still
// carries them (pkg/stream replaces every dlq_* header) and can be traced to
// the replay.
const (
	HeaderReplayID   = "replay_id"   // the replay's id
	HeaderReplayedAt = "replayed_at" // RFC 3339 UTC, ms
	HeaderReplayOf   = "replay_of"   // the record id (DLQ coordinates) replayed
)

// ErrReplayRunning is returned when a replay is already in progress: replays
// run one at a time so their rates never add up.
var ErrReplayRunning = errors.New("a replay is already running")

// ErrBadRequest is wrapped by errors about a request's content.
var ErrBadRequest = errors.New("bad request")

// Replay item statuses.
const (
	StatusPublished     = "published"
	StatusNotFound      = "not_found"
	StatusNotReplayable = "not_replayable"
	StatusExpired       = "expired"
	StatusFailed        = "failed"
	StatusNotAttempted  = "not_attempted" // the canary failed, or the request ended first
)

// ReplayRequest selects records to replay.
type ReplayRequest struct {
	IDs    []string
	Canary int     // records replayed first and watched; default 1, at most len(IDs)
	Rate   float64 // messages per second; 0 or above the configured rate = the configured rate
	Actor  string
	Role   string
	Reason string
	// CorrelationID ties the audit entries to the API request.
	CorrelationID string
}

// Replayer publishes dead letters back to their source topics: the original
// key, value and headers read byte for byte from the DLQ topic (the stored
// copy is redacted), plus the replay headers, to the original partition so
// per-key order holds. A canary goes first: the rest follow only once the
// consumer group that failed has committed past every canary and none of them
// was dead-lettered again.
type Replayer struct {
	Store         *Store
	Kafka         *kafka.Client
	Rate          float64       // the most messages per second, for any request
	Max           int           // the most records per request
	CanaryTimeout time.Duration // how long a canary may take to be consumed
	PollInterval  time.Duration // how often the canary's progress is checked; default 200ms
	Now           func() time.Time
	NewID         func() string
	Logger        *slog.Logger
	Metrics       *Metrics
	// Topics a dead letter may be replayed to besides its own: by default
	// only to the topic its DLQ serves (<topic>.dlq → <topic>). A record's
	// source topic is a header anyone who can write to the DLQ can set, so it
	// is never trusted alone (FLOODGATE_DLQ_REPLAY_TOPICS).
	ReplayTopics []string

	running sync.Mutex
}

// replayTarget reports why rec may not be replayed to its source topic, or "".
func (rp *Replayer) replayTarget(rec Record) string {
	if rec.SourceTopic != "" && rec.SourceTopic+DLQSuffix == rec.DLQTopic {
		return ""
	}
	for _, t := range rp.ReplayTopics {
		if t == rec.SourceTopic {
			return ""
		}
	}
	return fmt.Sprintf("source topic %q is not the topic %s serves, nor in FLOODGATE_DLQ_REPLAY_TOPICS: not replayed", rec.SourceTopic, rec.DLQTopic)
}

type replayCandidate struct {
	rec  Record
	orig stream.DLQRecord
	item *dlqapi.ReplayItem
}

// Replay runs req. It returns an error only when the replay could not start
// (bad request, one already running, Kafka unreachable); per-record problems
// and an aborted canary are in the result.
func (rp *Replayer) Replay(ctx context.Context, req ReplayRequest) (dlqapi.ReplayResult, error) {
	if err := checkSelection(req.IDs, rp.Max, req.Reason); err != nil {
		return dlqapi.ReplayResult{}, err
	}
	if req.Rate < 0 || req.Canary < 0 {
		return dlqapi.ReplayResult{}, fmt.Errorf("%w: rate and canary must not be negative", ErrBadRequest)
	}
	seen := map[string]bool{}
	for _, id := range req.IDs {
		if _, _, _, err := ParseID(id); err != nil {
			return dlqapi.ReplayResult{}, fmt.Errorf("%w: %w", ErrBadRequest, err)
		}
		if seen[id] {
			return dlqapi.ReplayResult{}, fmt.Errorf("%w: record %s selected twice", ErrBadRequest, id)
		}
		seen[id] = true
	}
	if !rp.running.TryLock() {
		return dlqapi.ReplayResult{}, ErrReplayRunning
	}
	defer rp.running.Unlock()

	rate := rp.Rate
	if req.Rate > 0 && req.Rate < rate {
		rate = req.Rate
	}
	canary := req.Canary
	if canary == 0 {
		canary = 1
	}
	res := dlqapi.ReplayResult{ReplayID: rp.NewID(), Items: make([]dlqapi.ReplayItem, len(req.IDs))}
	log := rp.Logger.With("replay_id", res.ReplayID)

	// Resolve every record and read its original before publishing anything.
	var todo []replayCandidate
	for i, id := range req.IDs {
		item := &res.Items[i]
		item.ID, item.Status = id, StatusNotAttempted
		rec, err := rp.Store.Get(ctx, id)
		switch {
		case errors.Is(err, ErrNotFound):
			item.Status = StatusNotFound
			continue
		case err != nil:
			return dlqapi.ReplayResult{}, err
		case !rec.Replayable():
			item.Status, item.Error = StatusNotReplayable, "not a valid dead-letter record: "+rec.ErrorMessage
			continue
		}
		item.SourceTopic, item.SourcePartition = rec.SourceTopic, rec.SourcePartition
		if why := rp.replayTarget(rec); why != "" {
			item.Status, item.Error = StatusNotReplayable, why
			continue
		}
		msg, err := fetchOne(ctx, rp.Kafka, rec.DLQTopic, rec.DLQPartition, rec.DLQOffset)
		if errors.Is(err, ErrExpired) {
			item.Status, item.Error = StatusExpired, err.Error()
			continue
		}
		if err != nil {
			return dlqapi.ReplayResult{}, err
		}
		orig, err := stream.ParseDLQRecord(msg)
		if err != nil {
			item.Status, item.Error = StatusNotReplayable, err.Error()
			continue
		}
		todo = append(todo, replayCandidate{rec: rec, orig: orig, item: item})
	}
	canary = min(canary, len(todo))
	log.Info("replay started", "records", len(req.IDs), "replayable", len(todo), "canary", canary, "rate", rate, "actor", req.Actor)

	pace := newPacer(rate, rp.Now)
	publish := func(c replayCandidate, isCanary bool) error {
		if err := pace.wait(ctx); err != nil {
			return err
		}
		c.item.Canary = isCanary
		off, err := rp.publish(ctx, res.ReplayID, req.CorrelationID, c)
		if err != nil {
			c.item.Status, c.item.Error = StatusFailed, err.Error()
			res.Failed++
			rp.Metrics.replayed.WithLabelValues(c.rec.SourceTopic, StatusFailed).Inc()
			log.Warn("replay publish failed", "id", c.rec.ID, "err", err)
			return nil
		}
		c.item.Status, c.item.NewOffset = StatusPublished, off
		res.Published++
		rp.Metrics.replayed.WithLabelValues(c.rec.SourceTopic, StatusPublished).Inc()
		now := rp.Now()
		if err := rp.Store.MarkReplayed(ctx, c.rec.ID, res.ReplayID, now); err != nil {
			log.Warn("count replay on the record", "id", c.rec.ID, "err", err)
		}
		audit := AuditEntry{
			ID: rp.NewID(), At: now, Actor: req.Actor, Role: req.Role, Action: ActionReplay,
			Subject: SubjectOf(c.rec.ID), Reason: req.Reason, CorrelationID: req.CorrelationID,
			Details: map[string]string{
				"replay_id": res.ReplayID, "source_topic": c.rec.SourceTopic,
				"source_partition": strconv.Itoa(c.rec.SourcePartition), "new_offset": strconv.FormatInt(off, 10),
				"canary": strconv.FormatBool(isCanary),
			},
		}
		if err := rp.Store.Audit(ctx, audit); err != nil {
			// Published already: say so loudly, the replay itself stands.
			c.item.Error = "published, but the audit entry was not written: " + err.Error()
			log.Error("replay audit entry not written", "id", c.rec.ID, "err", err)
		}
		return nil
	}

	// Canary: publish, then wait for the failed group to move past it.
	dlqMarks := map[string]map[int]int64{} // dlq topic -> partition -> high watermark before the canary
	for _, c := range todo[:canary] {
		if _, ok := dlqMarks[c.rec.DLQTopic]; !ok {
			marks, err := rp.highWatermarks(ctx, c.rec.DLQTopic)
			if err != nil {
				return dlqapi.ReplayResult{}, err
			}
			dlqMarks[c.rec.DLQTopic] = marks
		}
	}
	for _, c := range todo[:canary] {
		if err := publish(c, true); err != nil {
			return rp.abort(res, log, "stopped during the canary: "+err.Error()), nil
		}
	}
	for _, c := range todo[:canary] {
		if c.item.Status != StatusPublished {
			return rp.abort(res, log, fmt.Sprintf("canary %s was not published: %s", c.rec.ID, c.item.Error)), nil
		}
		if reason := rp.watchCanary(ctx, res.ReplayID, c, dlqMarks[c.rec.DLQTopic]); reason != "" {
			return rp.abort(res, log, reason), nil
		}
	}
	for _, c := range todo[canary:] {
		if err := publish(c, false); err != nil {
			return rp.abort(res, log, "stopped: "+err.Error()), nil
		}
	}
	log.Info("replay finished", "published", res.Published, "failed", res.Failed)
	return res, nil
}

func (rp *Replayer) abort(res dlqapi.ReplayResult, log *slog.Logger, reason string) dlqapi.ReplayResult {
	res.Aborted, res.AbortReason = true, reason
	log.Warn("replay aborted", "reason", reason, "published", res.Published)
	return res
}

// publish writes the original message, with its dlq_* provenance (so only the
// group that failed it handles it again — see stream.DLQRecord.Replay) and the
// replay headers, to its source partition and returns the offset it got. The
// replay request's correlation id, when there is one, goes in the
// httpapi.KafkaHeaderRequestID header: the API call that caused the record.
func (rp *Replayer) publish(ctx context.Context, replayID, corr string, c replayCandidate) (int64, error) {
	orig := c.orig.Replay()
	headers := make([]kafka.Header, 0, len(orig.Headers)+4)
	for _, h := range orig.Headers {
		switch h.Key {
		case HeaderReplayID, HeaderReplayedAt, HeaderReplayOf, httpapi.KafkaHeaderRequestID: // from an earlier replay
		default:
			headers = append(headers, h)
		}
	}
	headers = append(headers,
		kafka.Header{Key: HeaderReplayID, Value: []byte(replayID)},
		kafka.Header{Key: HeaderReplayedAt, Value: []byte(rp.Now().UTC().Format(tsLayout))},
		kafka.Header{Key: HeaderReplayOf, Value: []byte(c.rec.ID)},
	)
	if corr != "" {
		headers = append(headers, kafka.Header{Key: httpapi.KafkaHeaderRequestID, Value: []byte(corr)})
	}
	res, err := rp.Kafka.Produce(ctx, &kafka.ProduceRequest{
		Topic:        c.orig.SourceTopic,
		Partition:    c.orig.Partition,
		RequiredAcks: kafka.RequireAll,
		Records: kafka.NewRecordReader(kafka.Record{
			Time: rp.Now(), Key: bytesOrNil(orig.Key), Value: bytesOrNil(orig.Value), Headers: headers,
		}),
	})
	if err != nil {
		return 0, fmt.Errorf("produce to %s/%d: %w", c.orig.SourceTopic, c.orig.Partition, err)
	}
	if res.Error != nil {
		return 0, fmt.Errorf("produce to %s/%d: %w", c.orig.SourceTopic, c.orig.Partition, res.Error)
	}
	return res.BaseOffset, nil
}

func bytesOrNil(b []byte) kafka.Bytes {
	if b == nil {
		return nil
	}
	return kafka.NewBytes(b)
}

func (rp *Replayer) highWatermarks(ctx context.Context, topic string) (map[int]int64, error) {
	_, b, err := topicBounds(ctx, rp.Kafka, topic)
	if err != nil {
		return nil, err
	}
	out := make(map[int]int64, len(b))
	for p, v := range b {
		out[p] = v.last
	}
	return out, nil
}

// watchCanary waits until the canary's consumer group has committed past it,
// then looks for it on the DLQ topic; it returns why the replay must stop, or
// "" when the canary went through.
func (rp *Replayer) watchCanary(ctx context.Context, replayID string, c replayCandidate, marks map[int]int64) string {
	poll := rp.PollInterval
	if poll <= 0 {
		poll = 200 * time.Millisecond
	}
	deadline := rp.Now().Add(rp.CanaryTimeout)
	for {
		committed, err := committedOffsets(ctx, rp.Kafka, c.rec.ConsumerGroup, c.orig.SourceTopic, []int{c.orig.Partition})
		if err == nil && committed[c.orig.Partition] > c.item.NewOffset {
			break
		}
		if !rp.Now().Before(deadline) {
			return fmt.Sprintf("canary %s (now %s/%d@%d) not consumed by group %s within %s; is the consumer running?",
				c.rec.ID, c.orig.SourceTopic, c.orig.Partition, c.item.NewOffset, c.rec.ConsumerGroup, rp.CanaryTimeout)
		}
		select {
		case <-ctx.Done():
			return "stopped while waiting for the canary: " + ctx.Err().Error()
		case <-time.After(poll):
		}
	}
	// The group commits a message only after handling or dead-lettering it,
	// so a canary that failed again is on the DLQ topic by now.
	hw, err := rp.highWatermarks(ctx, c.rec.DLQTopic)
	if err != nil {
		return "cannot check the canary on " + c.rec.DLQTopic + ": " + err.Error()
	}
	var again string
	for p, end := range hw {
		err := kafkascan.Scan(ctx, rp.Kafka, c.rec.DLQTopic, p, marks[p], end, func(m kafka.Message) bool {
			if header(m, HeaderReplayID) == replayID && header(m, HeaderReplayOf) == c.rec.ID {
				again = RecordID(m.Topic, m.Partition, m.Offset) + ": " + header(m, stream.HeaderDLQErrorMessage)
				return false
			}
			return true
		})
		if err != nil {
			return "cannot check the canary on " + c.rec.DLQTopic + ": " + err.Error()
		}
		if again != "" {
			return fmt.Sprintf("canary %s was dead-lettered again as %s", c.rec.ID, again)
		}
	}
	return ""
}

func header(m kafka.Message, key string) string {
	v := ""
	for _, h := range m.Headers {
		if h.Key == key {
			v = string(h.Value)
		}
	}
	return v
}

// pacer spaces publishes at rate per second.
type pacer struct {
	interval time.Duration
	now      func() time.Time
	next     time.Time
}

func newPacer(rate float64, now func() time.Time) *pacer {
	return &pacer{interval: time.Duration(float64(time.Second) / rate), now: now}
}

func (p *pacer) wait(ctx context.Context) error {
	now := p.now()
	if p.next.IsZero() || p.next.Before(now) {
		p.next = now
	}
	if !tick.Sleep(ctx, p.next.Sub(now)) {
		return ctx.Err()
	}
	p.next = p.next.Add(p.interval)
	return nil
}
