package events

import "time"

// Topics of the event streams; each has a dead-letter topic DLQTopic(topic).
const (
	TopicDecisions   = "floodgate.decisions.v1"
	TopicAbuse       = "floodgate.abuse.v1"
	TopicAdjustments = "floodgate.adjustments.v1"
)

// DLQTopic returns the dead-letter topic of topic: topic + ".dlq".
func DLQTopic(topic string) string { return topic + ".dlq" }

// Kafka header names and values of the CloudEvents 1.0 Kafka protocol binding in
// binary mode: the message value is the event itself, the attributes ride in
// headers.
const (
	HeaderCEID          = "ce_id"
	HeaderCEType        = "ce_type"
	HeaderCESource      = "ce_source"
	HeaderCETime        = "ce_time"
	HeaderCESpecVersion = "ce_specversion"
	HeaderContentType   = "content-type"

	CESpecVersion = "1.0"
	ContentType   = "application/json"
)

// Header is one Kafka message header; convert it to your Kafka client's type.
type Header struct {
	Key   string
	Value string
}

// CloudEventHeaders returns the binary-mode CloudEvents headers of an event:
// ce_specversion, ce_id (the event id), ce_type (CEType*), ce_source (the
// producing service instance, a URI reference such as "/floodgate/limiter/host-1"),
// ce_time (the event's own timestamp in TimeLayout) and content-type.
func CloudEventHeaders(ceType, id, source string, t time.Time) []Header {
	return []Header{
		{HeaderCESpecVersion, CESpecVersion},
		{HeaderCEID, id},
		{HeaderCEType, ceType},
		{HeaderCESource, source},
		{HeaderCETime, FormatTime(t)},
		{HeaderContentType, ContentType},
	}
}

// Key returns the Kafka message key: the principal's Key.
func (d *Decision) Key() string { return d.Principal.Key() }

// Headers returns the CloudEvents headers of d, produced by source.
func (d *Decision) Headers(source string) []Header {
	return CloudEventHeaders(CETypeDecision, d.ID, source, d.TS)
}

// Key returns the Kafka message key: the principal's Key.
func (a *Abuse) Key() string { return a.Principal.Key() }

// Headers returns the CloudEvents headers of a, produced by source.
func (a *Abuse) Headers(source string) []Header {
	return CloudEventHeaders(CETypeAbuse, a.ID, source, a.DetectedAt)
}

// Key returns the Kafka message key: adjustments have no principal, so the key
// is the scope, which keeps one scope's changes in order.
func (a *Adjustment) Key() string { return a.Scope }

// Headers returns the CloudEvents headers of a, produced by source.
func (a *Adjustment) Headers(source string) []Header {
	return CloudEventHeaders(CETypeAdjustment, a.ID, source, a.TS)
}

// Headers that a dead-letter record adds to the original message (whose key,
// value and headers are kept untouched); see schemas/dlq.md.
const (
	DLQHeaderSourceTopic   = "dlq_source_topic"
	DLQHeaderPartition     = "dlq_partition"
	DLQHeaderOffset        = "dlq_offset"
	DLQHeaderTimestamp     = "dlq_timestamp"
	DLQHeaderConsumerGroup = "dlq_consumer_group"
	DLQHeaderService       = "dlq_service"
	DLQHeaderErrorClass    = "dlq_error_class"
	DLQHeaderErrorMessage  = "dlq_error_message"
	DLQHeaderAttempts      = "dlq_attempts"
	DLQHeaderFirstFailure  = "dlq_first_failure"
)

// DLQErrorClass is the value of the dlq_error_class header.
type DLQErrorClass string

// DLQ error classes.
const (
	// DLQPoison: the message can never succeed (errors.Is(err, ErrInvalid)); it
	// is dead-lettered on the first attempt.
	DLQPoison DLQErrorClass = "poison"
	// DLQTransientExhausted: a retryable error persisted through every attempt.
	DLQTransientExhausted DLQErrorClass = "transient_exhausted"
	// DLQHandlerPanic: the handler panicked on the message.
	DLQHandlerPanic DLQErrorClass = "handler_panic"
)

// MaxDLQErrorMessage bounds the dlq_error_message header in bytes.
const MaxDLQErrorMessage = 1024
