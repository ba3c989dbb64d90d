// Package dlq calls the dlq-auditor's API (docs/dlq.md): list, inspect and
// replay dead letters.
package dlq

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// Header is one Kafka header of a stored dead letter.
type Header struct {
	Key   string `json:"key"`
	Value string `json:"value"`
}

// Record is one stored (redacted) dead letter.
type Record struct {
	ID              string    `json:"id"`
	DLQTopic        string    `json:"dlq_topic"`
	DLQPartition    int       `json:"dlq_partition"`
	DLQOffset       int64     `json:"dlq_offset"`
	DeadLetteredAt  time.Time `json:"dead_lettered_at"`
	SourceTopic     string    `json:"source_topic"`
	SourcePartition int       `json:"source_partition"`
	SourceOffset    int64     `json:"source_offset"`
	ConsumerGroup   string    `json:"consumer_group"`
	Service         string    `json:"service"`
	Class           string    `json:"class"`
	ErrorMessage    string    `json:"error_message"`
	Attempts        int       `json:"attempts"`
	Headers         []Header  `json:"headers"`
	Redaction       string    `json:"redaction"`
	EventType       string    `json:"event_type"`
	EventID         string    `json:"event_id"`
	Replays         int       `json:"replays"`
	LastReplayID    string    `json:"last_replay_id"`
}

// AuditEntry is one audited action on a record.
type AuditEntry struct {
	At     time.Time `json:"at"`
	Actor  string    `json:"actor"`
	Role   string    `json:"role"`
	Action string    `json:"action"`
	Reason string    `json:"reason"`
}

// Inspection is GET /v1/records/{id}.
type Inspection struct {
	Record    Record          `json:"record"`
	KeyText   string          `json:"key_text"`
	ValueText string          `json:"value_text"`
	Payload   json.RawMessage `json:"payload"`
	Audit     []AuditEntry    `json:"audit"`
}

// ReplayItem is one record's outcome in a replay.
type ReplayItem struct {
	ID        string `json:"id"`
	Status    string `json:"status"`
	Canary    bool   `json:"canary"`
	NewOffset int64  `json:"new_offset"`
	Error     string `json:"error"`
}

// ReplayResult is POST /v1/replays' answer.
type ReplayResult struct {
	ReplayID    string       `json:"replay_id"`
	Published   int          `json:"published"`
	Failed      int          `json:"failed"`
	Aborted     bool         `json:"aborted"`
	AbortReason string       `json:"abort_reason"`
	Items       []ReplayItem `json:"items"`
}

// Error is a refusal from the auditor.
type Error struct {
	Status        int
	Code, Message string
}

func (e *Error) Error() string {
	return fmt.Sprintf("dlq-auditor answered %d %s: %s", e.Status, e.Code, e.Message)
}

// ErrUnavailable wraps transport failures and 5xx answers.
var ErrUnavailable = errors.New("dlq-auditor unavailable")

// Client is an API client with one bearer token.
type Client struct {
	base, token string
	http        *http.Client
}

// New returns a client for the API at base.
func New(base, token string, hc *http.Client) (*Client, error) {
	u, err := url.Parse(base)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("parse dlq-auditor URL %q: want http(s)://host:port", base)
	}
	if hc == nil {
		// A replay waits for its canary to be consumed (FLOODGATE_DLQ_CANARY_TIMEOUT).
		hc = &http.Client{Timeout: 2 * time.Minute}
	}
	return &Client{base: strings.TrimRight(base, "/"), token: token, http: hc}, nil
}

func (c *Client) do(ctx context.Context, method, path, corr string, body, out any) error {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return fmt.Errorf("encode %s %s: %w", method, path, err)
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, rd)
	if err != nil {
		return fmt.Errorf("build %s %s: %w", method, path, err)
	}
	req.Header.Set("Authorization", "Bearer "+c.token)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if corr != "" {
		req.Header.Set("X-Request-Id", corr)
	}
	res, err := c.http.Do(req)
	if err != nil {
		return fmt.Errorf("%w: %s %s: %w", ErrUnavailable, method, path, err)
	}
	defer res.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(res.Body, 16<<20))
	if err != nil {
		return fmt.Errorf("%w: read %s %s: %w", ErrUnavailable, method, path, err)
	}
	if res.StatusCode >= 300 {
		var e struct {
			Error struct{ Code, Message string } `json:"error"`
		}
		_ = json.Unmarshal(raw, &e)
		de := &Error{Status: res.StatusCode, Code: e.Error.Code, Message: e.Error.Message}
		if res.StatusCode >= 500 {
			return fmt.Errorf("%w: %w", ErrUnavailable, de)
		}
		return de
	}
	if err := json.Unmarshal(raw, out); err != nil {
		return fmt.Errorf("decode %s %s: %w", method, path, err)
	}
	return nil
}

// List reads up to max records of one source topic dead-lettered in [from, to),
// oldest first; more reports that there were more.
func (c *Client) List(ctx context.Context, topic, class string, from, to time.Time, max int) (recs []Record, more bool, err error) {
	cursor := ""
	for {
		q := url.Values{"topic": {topic}, "from": {from.UTC().Format(time.RFC3339Nano)}, "to": {to.UTC().Format(time.RFC3339Nano)},
			"limit": {strconv.Itoa(min(1000, max-len(recs)))}}
		if class != "" {
			q.Set("class", class)
		}
		if cursor != "" {
			q.Set("cursor", cursor)
		}
		var page struct {
			Records []Record `json:"records"`
			Cursor  string   `json:"cursor"`
		}
		if err := c.do(ctx, http.MethodGet, "/v1/records?"+q.Encode(), "", nil, &page); err != nil {
			return nil, false, err
		}
		recs = append(recs, page.Records...)
		if page.Cursor == "" {
			return recs, false, nil
		}
		if len(recs) >= max {
			return recs, true, nil
		}
		cursor = page.Cursor
	}
}

// Inspect reads one record with its decoded payload and audit trail.
func (c *Client) Inspect(ctx context.Context, id string) (Inspection, error) {
	var out Inspection
	err := c.do(ctx, http.MethodGet, "/v1/records/"+url.PathEscape(id), "", nil, &out)
	return out, err
}

// Replay replays the records (canary first) with a reason.
func (c *Client) Replay(ctx context.Context, ids []string, reason, corr string) (ReplayResult, error) {
	var out ReplayResult
	err := c.do(ctx, http.MethodPost, "/v1/replays", corr, map[string]any{"ids": ids, "reason": reason}, &out)
	return out, err
}

// PurgeItem is one record's outcome in a purge: "purged" or "not_found".
type PurgeItem struct {
	ID     string `json:"id"`
	Status string `json:"status"`
}

// PurgeResult is POST /v1/purges' answer.
type PurgeResult struct {
	Purged int         `json:"purged"`
	Items  []PurgeItem `json:"items"`
}

// Purge deletes the stored records (each audited by the auditor, role sre);
// the dead letters stay on their DLQ topic until retention removes them.
func (c *Client) Purge(ctx context.Context, ids []string, reason, corr string) (PurgeResult, error) {
	var out PurgeResult
	err := c.do(ctx, http.MethodPost, "/v1/purges", corr, map[string]any{"ids": ids, "reason": reason}, &out)
	return out, err
}
