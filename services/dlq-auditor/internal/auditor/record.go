// Package auditor is the dead-letter auditor: it consumes every <topic>.dlq
// topic, stores a redacted copy of each dead letter in DynamoDB, counts them in
// InfluxDB, pages when they come too fast, and replays, purges and accounts for
// them on request.
package auditor

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/segmentio/kafka-go"

	"github.com/floodgate-dev/floodgate/pkg/dlqapi"
	"github.com/floodgate-dev/floodgate/pkg/stream"
)

// ClassInvalidRecord classifies a message on a DLQ topic that is not a
// well-formed dead-letter record (dlqapi.ClassInvalidRecord).
const ClassInvalidRecord = dlqapi.ClassInvalidRecord

// ServiceUnknown is the service of an invalid record.
const ServiceUnknown = "unknown"

// ErrNotFound is returned for a record id that is not stored.
var ErrNotFound = errors.New("dlq record not found")

// ErrBadID is wrapped by ParseID's errors.
var ErrBadID = errors.New("bad dlq record id")

// Header, Record and ClassInvalidRecord are the API's (pkg/dlqapi): the
// console decodes what the auditor stores and serves.
type (
	Header = dlqapi.Header
	Record = dlqapi.Record
)

// RecordID builds a record id from a dead letter's coordinates.
func RecordID(dlqTopic string, partition int, offset int64) string {
	return dlqTopic + ":" + strconv.Itoa(partition) + ":" + strconv.FormatInt(offset, 10)
}

// ParseID splits a record id into its coordinates. Topic names cannot contain
// ':', so the last two fields are the partition and offset.
func ParseID(id string) (topic string, partition int, offset int64, err error) {
	i := strings.LastIndexByte(id, ':')
	if i < 0 {
		return "", 0, 0, fmt.Errorf("%w %q: want <dlq topic>:<partition>:<offset>", ErrBadID, id)
	}
	j := strings.LastIndexByte(id[:i], ':')
	if j <= 0 {
		return "", 0, 0, fmt.Errorf("%w %q: want <dlq topic>:<partition>:<offset>", ErrBadID, id)
	}
	topic = id[:j]
	p, perr := strconv.Atoi(id[j+1 : i])
	o, oerr := strconv.ParseInt(id[i+1:], 10, 64)
	if perr != nil || oerr != nil || p < 0 || o < 0 || !strings.HasSuffix(topic, DLQSuffix) {
		return "", 0, 0, fmt.Errorf("%w %q: want <dlq topic>:<partition>:<offset> with a *.dlq topic and non-negative numbers", ErrBadID, id)
	}
	return topic, p, o, nil
}

// fromMessage builds the redacted record of a message read from a DLQ topic.
// It never fails: a message that is not a valid dead-letter record becomes a
// ClassInvalidRecord record with the parse error as its message.
func fromMessage(msg kafka.Message, now time.Time, ttl time.Duration) Record {
	r := Record{
		ID:             RecordID(msg.Topic, msg.Partition, msg.Offset),
		DLQTopic:       msg.Topic,
		DLQPartition:   msg.Partition,
		DLQOffset:      msg.Offset,
		DeadLetteredAt: msg.Time.UTC().Truncate(time.Millisecond),
		StoredAt:       now.UTC().Truncate(time.Millisecond),
	}
	if r.DeadLetteredAt.IsZero() {
		r.DeadLetteredAt = r.StoredAt
	}
	r.ExpiresAt = r.DeadLetteredAt.Add(ttl)
	dl, err := stream.ParseDLQRecord(msg)
	var headers []kafka.Header
	if err != nil {
		r.SourceTopic = strings.TrimSuffix(msg.Topic, DLQSuffix)
		r.SourcePartition, r.SourceOffset = -1, -1
		r.Service = ServiceUnknown
		r.Class = ClassInvalidRecord
		r.ErrorMessage = err.Error()
		headers = msg.Headers
	} else {
		r.SourceTopic = dl.SourceTopic
		r.SourcePartition = dl.Partition
		r.SourceOffset = dl.Offset
		r.SourceTime = dl.Timestamp
		r.ConsumerGroup = dl.ConsumerGroup
		r.Service = dl.Service
		r.Class = string(dl.ErrorClass)
		r.ErrorMessage = dl.ErrorMessage
		r.Attempts = dl.Attempts
		r.FirstFailure = dl.FirstFailure
		headers = dl.Headers
	}
	if r.Service == "" {
		r.Service = ServiceUnknown
	}
	red := redactValue(msg.Value)
	r.Value, r.Redaction, r.EventType, r.EventID = red.value, red.how, red.eventType, red.eventID
	r.Key = scrubBytes(msg.Key)
	r.ErrorMessage = scrubText(validUTF8(r.ErrorMessage))
	for _, h := range headers {
		r.Headers = append(r.Headers, Header{Key: validUTF8(h.Key), Value: scrubText(validUTF8(string(h.Value)))})
	}
	return r
}

// validUTF8 replaces invalid UTF-8 so the text can be stored and shown as a string.
func validUTF8(s string) string {
	if utf8.ValidString(s) {
		return s
	}
	return strings.ToValidUTF8(s, "\uFFFD")
}
