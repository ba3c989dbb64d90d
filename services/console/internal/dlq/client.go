// Package dlq calls the dlq-auditor's API (docs/dlq.md): list, inspect and
// replay dead letters.
package dlq

import (
	"context"
	"errors"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/floodgate-dev/floodgate/pkg/dlqapi"
	"github.com/floodgate-dev/floodgate/pkg/httpapi"
	"github.com/floodgate-dev/floodgate/services/console/internal/remote"
)

// The auditor's documents, defined once in pkg/dlqapi: what the console
// decodes is what the auditor encodes.
type (
	Header     = dlqapi.Header
	Record     = dlqapi.Record
	AuditEntry = dlqapi.AuditEntry
	Inspection = dlqapi.Inspection
)

// Error is a refusal from the auditor (Service "dlq-auditor").
type Error = remote.Error

// ErrUnavailable wraps transport failures and 5xx answers.
var ErrUnavailable = errors.New("dlq-auditor unavailable")

// Client is an API client with one bearer token (remote.Client).
type Client struct{ api *remote.Client }

// New returns a client for the API at base.
func New(base, token string, hc *http.Client) (*Client, error) {
	// A replay waits for its canary to be consumed (FLOODGATE_DLQ_CANARY_TIMEOUT).
	c, err := remote.New(httpapi.ClientConfig{Name: "dlq-auditor", BaseURL: base, Token: token, HTTP: hc,
		Timeout: 2 * time.Minute, MaxBody: 16 << 20}, ErrUnavailable)
	if err != nil {
		return nil, err
	}
	return &Client{api: c}, nil
}

func (c *Client) do(ctx context.Context, method, path, corr string, body, out any) error {
	_, err := c.api.Do(ctx, corr, httpapi.Call{Method: method, Path: path, Body: body, Out: out})
	return err
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
		var page dlqapi.Page
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
func (c *Client) Replay(ctx context.Context, ids []string, reason, corr string) (dlqapi.ReplayResult, error) {
	var out dlqapi.ReplayResult
	err := c.do(ctx, http.MethodPost, "/v1/replays", corr, dlqapi.ReplayBody{IDs: ids, Reason: reason}, &out)
	return out, err
}

// Purge deletes the stored records (each audited by the auditor, role sre);
// the dead letters stay on their DLQ topic until retention removes them.
func (c *Client) Purge(ctx context.Context, ids []string, reason, corr string) (dlqapi.PurgeResult, error) {
	var out dlqapi.PurgeResult
	err := c.do(ctx, http.MethodPost, "/v1/purges", corr, dlqapi.PurgeBody{IDs: ids, Reason: reason}, &out)
	return out, err
}
