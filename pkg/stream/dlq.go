package stream

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/segmentio/kafka-go"
)

// Headers the consumer adds to a dead-lettered message. Every name starts with
// DLQHeaderPrefix; the original message's headers are kept beside them.
const (
	DLQHeaderPrefix = "dlq_"

	HeaderDLQSourceTopic   = "dlq_source_topic"
	HeaderDLQPartition     = "dlq_partition"
	HeaderDLQOffset        = "dlq_offset"
	HeaderDLQTimestamp     = "dlq_timestamp" // the original message's timestamp, TimeFormat
	HeaderDLQConsumerGroup = "dlq_consumer_group"
	HeaderDLQService       = "dlq_service"
	HeaderDLQErrorClass    = "dlq_error_class" // an ErrorClass
	HeaderDLQErrorMessage  = "dlq_error_message"
	HeaderDLQAttempts      = "dlq_attempts"      // handler invocations, decimal
	HeaderDLQFirstFailure  = "dlq_first_failure" // TimeFormat

	// On a reference (a dead letter too large to write whole) only: the key
	// is cut, the value and the original headers are empty.
	HeaderDLQReference      = "dlq_reference"       // "true"
	HeaderDLQOriginalSize   = "dlq_original_size"   // key + value + headers of the original, decimal bytes
	HeaderDLQOriginalSHA256 = "dlq_original_sha256" // hex SHA-256 of the original value; empty when it was never read
)

// DLQSuffix ends the name of every dead-letter topic: a topic's dead letters
// go to topic + DLQSuffix.
const DLQSuffix = ".dlq"

// AuditGroup is the consumer group with which the dlq-auditor reads one
// dead-letter topic: prefix + "." + dlqTopic. Each topic has a group of its
// own. With one group over every topic, each topic's consumer was a member of
// the others' group: one member leaving (a shutdown, a topic's consumer
// restarting) held every other topic in a rebalance, and a member closing
// during it could wait out the rebalance timeout.
func AuditGroup(prefix, dlqTopic string) string { return prefix + "." + dlqTopic }

// MaxDLQErrorMessageBytes bounds the dlq_error_message header; longer messages
// are cut at a UTF-8 boundary.
const MaxDLQErrorMessageBytes = 1024

// ErrNotDLQRecord is wrapped by ParseDLQRecord's errors.
var ErrNotDLQRecord = errors.New("not a dlq record")

// DLQRecord is a dead-lettered message: the original record and why it failed.
type DLQRecord struct {
	// Key, Value and Headers are the original message's, byte for byte
	// (Headers without any dlq_* header).
	Key     []byte
	Value   []byte
	Headers []kafka.Header

	SourceTopic   string
	Partition     int
	Offset        int64
	Timestamp     time.Time // the original message's timestamp (ms precision)
	ConsumerGroup string
	Service       string
	ErrorClass    ErrorClass
	ErrorMessage  string
	Attempts      int
	FirstFailure  time.Time // ms precision

	// Reference is set when the original was too large to dead-letter whole:
	// Value and Headers are empty, Key is cut to 256 bytes, and
	// OriginalSize and OriginalSHA256 describe what was at SourceTopic /
	// Partition / Offset. A reference cannot be replayed.
	Reference      bool
	OriginalSize   int64
	OriginalSHA256 string
}

// Message builds the Kafka message that dead-letters r on dlqTopic: the
// original key, value and headers, then the dlq_* headers. The error message
// is truncated to MaxDLQErrorMessageBytes.
func (r DLQRecord) Message(dlqTopic string) kafka.Message {
	headers := make([]kafka.Header, 0, len(r.Headers)+10)
	for _, h := range r.Headers {
		// A message replayed from a DLQ may still carry old dlq_* headers;
		// the new ones are authoritative.
		if !strings.HasPrefix(h.Key, DLQHeaderPrefix) {
			headers = append(headers, h)
		}
	}
	headers = append(headers,
		kafka.Header{Key: HeaderDLQSourceTopic, Value: []byte(r.SourceTopic)},
		kafka.Header{Key: HeaderDLQPartition, Value: []byte(strconv.Itoa(r.Partition))},
		kafka.Header{Key: HeaderDLQOffset, Value: []byte(strconv.FormatInt(r.Offset, 10))},
		kafka.Header{Key: HeaderDLQTimestamp, Value: []byte(formatTime(r.Timestamp))},
		kafka.Header{Key: HeaderDLQConsumerGroup, Value: []byte(r.ConsumerGroup)},
		kafka.Header{Key: HeaderDLQService, Value: []byte(r.Service)},
		kafka.Header{Key: HeaderDLQErrorClass, Value: []byte(r.ErrorClass)},
		kafka.Header{Key: HeaderDLQErrorMessage, Value: []byte(truncateUTF8(r.ErrorMessage, MaxDLQErrorMessageBytes))},
		kafka.Header{Key: HeaderDLQAttempts, Value: []byte(strconv.Itoa(r.Attempts))},
		kafka.Header{Key: HeaderDLQFirstFailure, Value: []byte(formatTime(r.FirstFailure))},
	)
	if r.Reference {
		headers = append(headers,
			kafka.Header{Key: HeaderDLQReference, Value: []byte("true")},
			kafka.Header{Key: HeaderDLQOriginalSize, Value: []byte(strconv.FormatInt(r.OriginalSize, 10))},
			kafka.Header{Key: HeaderDLQOriginalSHA256, Value: []byte(r.OriginalSHA256)},
		)
	}
	return kafka.Message{Topic: dlqTopic, Key: r.Key, Value: r.Value, Headers: headers}
}

// Replay builds the message that puts r back on its source topic: the original
// key, value and headers, plus r's dlq_* headers. Those headers address the replay
// to the consumer group that failed it — every Consumer of another group skips it,
// since that group already handled the original — and let an idempotent sink fence
// it by its original partition and offset. (The message's timestamp is left for the
// producer to set.)
func (r DLQRecord) Replay() kafka.Message { return r.Message(r.SourceTopic) }

// replayedFor reports the consumer group a message read from topic is addressed
// to, when it is a dead letter replayed onto its source topic. A message on a DLQ
// topic carries the same headers but names another source topic: it is a dead
// letter, not a replay.
func replayedFor(msg kafka.Message, topic string) (string, bool) {
	var source, group string
	var haveGroup bool
	for _, h := range msg.Headers {
		switch h.Key {
		case HeaderDLQSourceTopic:
			source = string(h.Value)
		case HeaderDLQConsumerGroup:
			group, haveGroup = string(h.Value), true
		}
	}
	return group, haveGroup && source == topic
}

// ParseDLQRecord reads a dead-lettered message back. Every dlq_* header must be
// present and well formed; errors wrap ErrNotDLQRecord and name the header.
// Returned slices alias msg's.
func ParseDLQRecord(msg kafka.Message) (DLQRecord, error) {
	rec := DLQRecord{Key: msg.Key, Value: msg.Value}
	dlq := make(map[string]string, 10)
	for _, h := range msg.Headers {
		if strings.HasPrefix(h.Key, DLQHeaderPrefix) {
			dlq[h.Key] = string(h.Value) // the last one wins
			continue
		}
		rec.Headers = append(rec.Headers, h)
	}
	get := func(name string) (string, error) {
		v, ok := dlq[name]
		if !ok {
			return "", fmt.Errorf("%w: header %s missing", ErrNotDLQRecord, name)
		}
		return v, nil
	}
	var errs []error
	str := func(name string, dst *string) {
		v, err := get(name)
		if err != nil {
			errs = append(errs, err)
			return
		}
		*dst = v
	}
	integer := func(name string, dst *int64) {
		v, err := get(name)
		if err != nil {
			errs = append(errs, err)
			return
		}
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			errs = append(errs, fmt.Errorf("%w: header %s: %q is not an integer", ErrNotDLQRecord, name, v))
			return
		}
		*dst = n
	}
	timestamp := func(name string, dst *time.Time) {
		v, err := get(name)
		if err != nil {
			errs = append(errs, err)
			return
		}
		t, err := time.Parse(TimeFormat, v)
		if err != nil {
			errs = append(errs, fmt.Errorf("%w: header %s: %q is not an RFC 3339 time", ErrNotDLQRecord, name, v))
			return
		}
		*dst = t.UTC()
	}

	var partition, attempts int64
	var class string
	str(HeaderDLQSourceTopic, &rec.SourceTopic)
	integer(HeaderDLQPartition, &partition)
	integer(HeaderDLQOffset, &rec.Offset)
	timestamp(HeaderDLQTimestamp, &rec.Timestamp)
	str(HeaderDLQConsumerGroup, &rec.ConsumerGroup)
	str(HeaderDLQService, &rec.Service)
	str(HeaderDLQErrorClass, &class)
	str(HeaderDLQErrorMessage, &rec.ErrorMessage)
	integer(HeaderDLQAttempts, &attempts)
	timestamp(HeaderDLQFirstFailure, &rec.FirstFailure)
	rec.Partition = int(partition)
	rec.Attempts = int(attempts)
	rec.ErrorClass = ErrorClass(class)
	if _, ok := dlq[HeaderDLQErrorClass]; ok && !rec.ErrorClass.Valid() {
		errs = append(errs, fmt.Errorf("%w: header %s: unknown class %q (want %s, %s, %s, %s or %s)",
			ErrNotDLQRecord, HeaderDLQErrorClass, class, ClassPoison, ClassTransientExhausted, ClassHandlerPanic,
			ClassOversize, ClassEventTime))
	}
	if v, ok := dlq[HeaderDLQReference]; ok {
		if v != "true" {
			errs = append(errs, fmt.Errorf("%w: header %s: %q (want true)", ErrNotDLQRecord, HeaderDLQReference, v))
		}
		rec.Reference = true
		integer(HeaderDLQOriginalSize, &rec.OriginalSize)
		str(HeaderDLQOriginalSHA256, &rec.OriginalSHA256)
	}
	if rec.SourceTopic == "" && len(errs) == 0 {
		errs = append(errs, fmt.Errorf("%w: header %s empty", ErrNotDLQRecord, HeaderDLQSourceTopic))
	}
	if len(errs) > 0 {
		return DLQRecord{}, errors.Join(errs...)
	}
	return rec, nil
}

// truncateUTF8 cuts s to at most n bytes without splitting a rune.
func truncateUTF8(s string, n int) string {
	if len(s) <= n {
		return s
	}
	cut := n
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut]
}
