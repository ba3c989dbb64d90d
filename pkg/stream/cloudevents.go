package stream

import (
	"time"

	"github.com/segmentio/kafka-go"
)

// TimeFormat is how every timestamp in Floodgate's Kafka headers is written:
// RFC 3339 with millisecond precision, always in UTC ("2006-01-02T15:04:05.000Z").
const TimeFormat = "2006-01-02T15:04:05.000Z07:00"

// CloudEvents 1.0 Kafka protocol binding header names (binary content mode).
const (
	HeaderCEID          = "ce_id"
	HeaderCEType        = "ce_type"
	HeaderCESource      = "ce_source"
	HeaderCETime        = "ce_time"
	HeaderCESpecVersion = "ce_specversion"
	HeaderContentType   = "content-type"
)

// CloudEventHeaders returns the CloudEvents 1.0 binary-mode headers for a JSON
// event: ce_id, ce_type (e.g. "decision.v1"), ce_source, ce_time (t in
// TimeFormat), ce_specversion "1.0" and content-type "application/json". The
// caller owns the returned slice.
func CloudEventHeaders(ceType, id, source string, t time.Time) []kafka.Header {
	return []kafka.Header{
		{Key: HeaderCEID, Value: []byte(id)},
		{Key: HeaderCEType, Value: []byte(ceType)},
		{Key: HeaderCESource, Value: []byte(source)},
		{Key: HeaderCETime, Value: []byte(formatTime(t))},
		{Key: HeaderCESpecVersion, Value: []byte("1.0")},
		{Key: HeaderContentType, Value: []byte("application/json")},
	}
}

func formatTime(t time.Time) string { return t.UTC().Format(TimeFormat) }
