package dlqapi

import (
	"encoding/json"
	"time"
)

// ClassInvalidRecord classifies a message on a DLQ topic that is not a
// well-formed dead-letter record (a dlq_* header missing or malformed). It is
// stored like any other, so nothing is lost, but cannot be replayed.
const ClassInvalidRecord = "invalid_record"

// Header is a Kafka header with a UTF-8 value (redacted in stored copies).
type Header struct {
	Key   string `json:"key"`
	Value string `json:"value"`
}

// Record is the stored, redacted copy of one dead letter. Its id is the dead
// letter's own Kafka coordinates, where the original bytes can still be read.
type Record struct {
	ID             string    `json:"id"` // "<dlq topic>:<partition>:<offset>"
	DLQTopic       string    `json:"dlq_topic"`
	DLQPartition   int       `json:"dlq_partition"`
	DLQOffset      int64     `json:"dlq_offset"`
	DeadLetteredAt time.Time `json:"dead_lettered_at"` // the DLQ message's timestamp

	SourceTopic     string    `json:"source_topic"`
	SourcePartition int       `json:"source_partition"`
	SourceOffset    int64     `json:"source_offset"`
	SourceTime      time.Time `json:"source_time"`
	ConsumerGroup   string    `json:"consumer_group"`
	Service         string    `json:"service"`
	Class           string    `json:"class"` // a stream.ErrorClass or ClassInvalidRecord
	ErrorMessage    string    `json:"error_message"`
	Attempts        int       `json:"attempts"`
	FirstFailure    time.Time `json:"first_failure"`

	Key       []byte   `json:"key"`   // redacted
	Value     []byte   `json:"value"` // redacted
	Headers   []Header `json:"headers"`
	Redaction string   `json:"redaction"`            // the auditor's RedactedDecision, RedactedAbuse or RedactedScrubbed
	EventType string   `json:"event_type,omitempty"` // when the value decoded
	EventID   string   `json:"event_id,omitempty"`

	StoredAt       time.Time `json:"stored_at"`
	ExpiresAt      time.Time `json:"expires_at"`
	Replays        int       `json:"replays"`
	LastReplayID   string    `json:"last_replay_id,omitempty"`
	LastReplayedAt time.Time `json:"last_replayed_at,omitzero"`
}

// Replayable reports whether r names a source it can be replayed to.
func (r *Record) Replayable() bool { return r.Class != ClassInvalidRecord && r.SourceTopic != "" }

// AuditEntry is one audited change on a record (replay, purge).
type AuditEntry struct {
	ID            string            `json:"id"`
	At            time.Time         `json:"at"`
	Actor         string            `json:"actor"`
	Role          string            `json:"role"`
	Action        string            `json:"action"` // "dlq.replay", "dlq.purge"
	Subject       string            `json:"subject"`
	Reason        string            `json:"reason"`
	CorrelationID string            `json:"correlation_id"`
	Details       map[string]string `json:"details,omitempty"`
}

// Page is GET /v1/records' answer: one page of records, oldest first; Cursor is empty on the last.
type Page struct {
	Records []Record `json:"records"`
	Cursor  string   `json:"cursor,omitempty"`
}

// Inspection is GET /v1/records/{id}'s answer: one record with its payload
// decoded for reading and its audit trail.
type Inspection struct {
	Record Record `json:"record"`
	// KeyText and ValueText are the (redacted) key and value as text when they
	// are UTF-8; Payload is the value as JSON when it is JSON.
	KeyText   string          `json:"key_text,omitempty"`
	ValueText string          `json:"value_text,omitempty"`
	Payload   json.RawMessage `json:"payload,omitempty"`
	Audit     []AuditEntry    `json:"audit"`
}

// ReplayBody is the body of POST /v1/replays.
type ReplayBody struct {
	IDs    []string `json:"ids"`
	Canary int      `json:"canary"` // default 1
	Rate   float64  `json:"rate"`   // messages per second; default and maximum: the server's
	Reason string   `json:"reason"`
}

// PurgeBody is the body of POST /v1/purges.
type PurgeBody struct {
	IDs    []string `json:"ids"`
	Reason string   `json:"reason"`
}
