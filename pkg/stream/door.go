package stream

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/floodgate-dev/floodgate/pkg/config"
)

// Door defaults: what every consumer checks before a handler sees a message.
const (
	// DefaultMaxMessageBytes bounds one message (key + value + headers). It
	// is also the largest dead letter written whole: larger ones become
	// references, so a DLQ record always fits a DynamoDB item (400 KB) in the
	// dlq-auditor and a consumer of the DLQ with the same limit.
	DefaultMaxMessageBytes = 256 << 10
	// DefaultMaxDecompressedBytes bounds what one fetched record batch may
	// decompress to; the memory a gzip bomb can take per partition.
	DefaultMaxDecompressedBytes = 16 << 20
	// DefaultMaxEventFuture and DefaultMaxEventAge bound event times when
	// ConsumerConfig.EventTime is set (or a handler checks with
	// ConsumerConfig.EventTimeWindow): two minutes of clock skew, and the
	// 14 days a dead letter may wait in a DLQ before it is replayed, plus one.
	DefaultMaxEventFuture = 2 * time.Minute
	DefaultMaxEventAge    = 15 * 24 * time.Hour
)

// referenceKeyBytes is how much of the original key a reference keeps.
const referenceKeyBytes = 256

// EventTimeWindow bounds the event times a consumer accepts: an event dated
// more than MaxFuture after Now, or more than MaxAge before it, is refused.
// Event times are claims made by whoever produced the message; checked
// against this window they never move a clock on their own.
type EventTimeWindow struct {
	MaxFuture time.Duration
	MaxAge    time.Duration
	Now       func() time.Time
}

// Check returns nil when t is inside the window, and an *EventTimeError
// (permanent: the consumer dead-letters the message with class event_time)
// when it is not.
func (w EventTimeWindow) Check(t time.Time) error {
	now := w.Now()
	switch {
	case t.After(now.Add(w.MaxFuture)):
		return &EventTimeError{Time: t, Now: now, Reason: fmt.Sprintf("more than %s in the future", w.MaxFuture)}
	case t.Before(now.Add(-w.MaxAge)):
		return &EventTimeError{Time: t, Now: now, Reason: fmt.Sprintf("older than %s", w.MaxAge)}
	}
	return nil
}

// EventTimeError says an event's time is outside the consumer's window. It is
// permanent; the consumer dead-letters the message with ClassEventTime.
type EventTimeError struct {
	Time, Now time.Time
	Reason    string
}

func (e *EventTimeError) Error() string {
	return fmt.Sprintf("event time %s is %s (now %s)", e.Time.UTC().Format(TimeFormat), e.Reason, e.Now.UTC().Format(TimeFormat))
}

// Permanent marks the error permanent.
func (e *EventTimeError) Permanent() bool { return true }

// messageBytes is what a message weighs against MaxMessageBytes.
func messageBytes(m kafka.Message) int {
	n := len(m.Key) + len(m.Value)
	for _, h := range m.Headers {
		n += len(h.Key) + len(h.Value)
	}
	return n
}

// doorVerdict says what the door does with a message.
type doorVerdict int

const (
	doorPass       doorVerdict = iota // to the handler
	doorSkipReplay                    // a replay for another group: done, not handled
	doorReject                        // dead-lettered, never handled
)

// door checks msg before any handler sees it: replays addressed to another
// group are skipped; a message over MaxMessageBytes is refused (and
// dead-lettered as a reference); with an EventTime hook, an event outside the
// window (or whose time cannot be read) is refused.
func (c *Consumer) door(msg kafka.Message) (doorVerdict, ErrorClass, error) {
	if g, ok := replayedFor(msg, c.cfg.Topic); ok && g != c.cfg.GroupID {
		// A dead letter put back on the topic for the group that failed it: every
		// other group already handled the original, so handling it again here would
		// count it twice.
		return doorSkipReplay, "", nil
	}
	if n := messageBytes(msg); n > c.cfg.MaxMessageBytes {
		return doorReject, ClassOversize, fmt.Errorf("message of %d bytes is over the limit of %d (MaxMessageBytes)", n, c.cfg.MaxMessageBytes)
	}
	if c.cfg.EventTime != nil {
		t, err := c.cfg.EventTime(msg)
		if err != nil {
			return doorReject, ClassPoison, fmt.Errorf("read event time: %w", err)
		}
		if err := c.window.Check(t); err != nil {
			return doorReject, ClassEventTime, err
		}
	}
	return doorPass, "", nil
}

// classify names the dead-letter class of a handler's permanent error.
func classify(err error) ErrorClass {
	var perr *panicError
	var terr *EventTimeError
	switch {
	case errors.As(err, &perr):
		return ClassHandlerPanic
	case errors.As(err, &terr):
		return ClassEventTime
	}
	return ClassPoison
}

// asReference turns r into a reference to the original: the value and the
// original headers are dropped, the key cut to referenceKeyBytes, and the
// original's size (key + value + headers) and the SHA-256 of its value are
// kept, so the record stays small whatever the original weighed. The
// original can still be read from SourceTopic at Partition/Offset while the
// topic retains it.
func (r DLQRecord) asReference() DLQRecord {
	if r.Reference {
		return r
	}
	size := len(r.Key) + len(r.Value)
	for _, h := range r.Headers {
		size += len(h.Key) + len(h.Value)
	}
	sum := sha256.Sum256(r.Value)
	r.OriginalSize = int64(size)
	r.OriginalSHA256 = hex.EncodeToString(sum[:])
	r.Reference = true
	if len(r.Key) > referenceKeyBytes {
		r.Key = r.Key[:referenceKeyBytes]
	}
	r.Value, r.Headers = nil, nil
	return r
}

// DoorLimits are the door's limits as every service reads them from the
// environment, under the same variable names.
type DoorLimits struct {
	MaxMessageBytes      int           // FLOODGATE_STREAM_MAX_MESSAGE_BYTES
	MaxDecompressedBytes int           // FLOODGATE_STREAM_MAX_DECOMPRESSED_BYTES
	MaxEventFuture       time.Duration // FLOODGATE_EVENT_MAX_FUTURE
	MaxEventAge          time.Duration // FLOODGATE_EVENT_MAX_AGE
}

// ReadDoorLimits reads the door's limits (defaults when unset) into e, as
// config.ReadKafkaSecurity reads the transport; the service's Validate calls
// their Validate.
func ReadDoorLimits(e *config.Env) DoorLimits {
	return DoorLimits{
		MaxMessageBytes:      e.Int("FLOODGATE_STREAM_MAX_MESSAGE_BYTES", DefaultMaxMessageBytes),
		MaxDecompressedBytes: e.Int("FLOODGATE_STREAM_MAX_DECOMPRESSED_BYTES", DefaultMaxDecompressedBytes),
		MaxEventFuture:       e.Duration("FLOODGATE_EVENT_MAX_FUTURE", DefaultMaxEventFuture),
		MaxEventAge:          e.Duration("FLOODGATE_EVENT_MAX_AGE", DefaultMaxEventAge),
	}
}

// Validate checks the limits and how they relate; errors name the variable.
func (l DoorLimits) Validate() error {
	var v config.Check
	v.Require(l.MaxMessageBytes >= 1024 && l.MaxMessageBytes <= 64<<20, "FLOODGATE_STREAM_MAX_MESSAGE_BYTES",
		"%d: must be in 1024..%d", l.MaxMessageBytes, 64<<20)
	v.Require(l.MaxDecompressedBytes >= l.MaxMessageBytes && l.MaxDecompressedBytes <= 1<<30, "FLOODGATE_STREAM_MAX_DECOMPRESSED_BYTES",
		"%d: must be in FLOODGATE_STREAM_MAX_MESSAGE_BYTES (%d)..%d", l.MaxDecompressedBytes, l.MaxMessageBytes, 1<<30)
	v.Require(l.MaxEventFuture > 0 && l.MaxEventFuture <= 24*time.Hour, "FLOODGATE_EVENT_MAX_FUTURE",
		"%s: must be in (0, 24h]", l.MaxEventFuture)
	v.Require(l.MaxEventAge >= time.Hour, "FLOODGATE_EVENT_MAX_AGE", "%s: must be at least 1h", l.MaxEventAge)
	return v.Err()
}

// Apply sets the limits on cfg.
func (l DoorLimits) Apply(cfg *ConsumerConfig) {
	cfg.MaxMessageBytes = l.MaxMessageBytes
	cfg.MaxDecompressedBytes = l.MaxDecompressedBytes
	cfg.MaxEventFuture = l.MaxEventFuture
	cfg.MaxEventAge = l.MaxEventAge
}
