// Package adjuster calls the adjuster's admin API (docs/adjuster.md): settings
// with their ETag, status, audit, and the version-checked changes.
package adjuster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/floodgate-dev/floodgate/pkg/adjusterapi"
	"github.com/floodgate-dev/floodgate/pkg/httpapi"
	"github.com/floodgate-dev/floodgate/services/console/internal/remote"
)

// Settings is GET /v1/settings; Rules stays raw JSON (the console shows and
// forwards it, the adjuster validates it).
type Settings struct {
	Version   int64                      `json:"version"`
	Rules     json.RawMessage            `json:"rules"`
	DryRun    bool                       `json:"dry_run"`
	Frozen    bool                       `json:"frozen"`
	Overrides map[string]json.RawMessage `json:"overrides"`
	UpdatedAt time.Time                  `json:"updated_at"`
	UpdatedBy string                     `json:"updated_by"`
}

// Status is GET /v1/status: the last tick.
type Status = adjusterapi.Status

// Change is one scale change of the last tick, with its cause.
type Change = adjusterapi.Change

// ShedStatus is the priority shed level the last tick decided.
type ShedStatus = adjusterapi.ShedStep

// AuditRecord is one settings change the adjuster audited.
type AuditRecord = adjusterapi.AuditRecord

// Error is a refusal from the adjuster (Service "adjuster"; ETag on a 412).
type Error = remote.Error

// ErrUnavailable wraps transport failures and 5xx answers.
var ErrUnavailable = errors.New("adjuster unavailable")

// Client is an admin-API client with one bearer token (remote.Client).
type Client struct{ api *remote.Client }

// New returns a client for the admin API at base.
func New(base, token string, hc *http.Client) (*Client, error) {
	c, err := remote.New(httpapi.ClientConfig{Name: "adjuster", BaseURL: base, Token: token, HTTP: hc,
		Timeout: 5 * time.Second, MaxBody: 4 << 20}, ErrUnavailable)
	if err != nil {
		return nil, err
	}
	return &Client{api: c}, nil
}

func (c *Client) do(ctx context.Context, method, path, ifMatch, corr string, body, out any) (http.Header, error) {
	call := httpapi.Call{Method: method, Path: path, Body: body, Out: out}
	if ifMatch != "" {
		call.Header = http.Header{"If-Match": {ifMatch}}
	}
	return c.api.Do(ctx, corr, call)
}

// Settings reads the settings and their ETag.
func (c *Client) Settings(ctx context.Context) (Settings, string, error) {
	var s Settings
	h, err := c.do(ctx, http.MethodGet, "/v1/settings", "", "", nil, &s)
	if err != nil {
		return Settings{}, "", err
	}
	return s, h.Get("ETag"), nil
}

// Status reads the last tick.
func (c *Client) Status(ctx context.Context) (Status, error) {
	var s Status
	_, err := c.do(ctx, http.MethodGet, "/v1/status", "", "", nil, &s)
	return s, err
}

// Audit reads the newest settings changes.
func (c *Client) Audit(ctx context.Context, limit int) ([]AuditRecord, error) {
	var out struct {
		Records []AuditRecord `json:"records"`
	}
	_, err := c.do(ctx, http.MethodGet, fmt.Sprintf("/v1/audit?limit=%d", limit), "", "", nil, &out)
	return out.Records, err
}

// Result is a change's answer: the new settings, their ETag and the adjuster's audit id.
type Result struct {
	Settings Settings `json:"settings"`
	AuditID  string   `json:"audit_id"`
	ETag     string   `json:"-"`
}

func (c *Client) put(ctx context.Context, path, etag, corr string, body any) (Result, error) {
	var r Result
	h, err := c.do(ctx, http.MethodPut, path, etag, corr, body, &r)
	if err != nil {
		return Result{}, err
	}
	r.ETag = h.Get("ETag")
	return r, nil
}

// PutRules merges the rule fields in rules (a JSON object) into the settings at etag.
func (c *Client) PutRules(ctx context.Context, etag, corr string, rules json.RawMessage, reason string) (Result, error) {
	return c.put(ctx, "/v1/settings/rules", etag, corr, map[string]any{"rules": rules, "reason": reason})
}

// PutMode sets dry run and the kill switch at etag.
func (c *Client) PutMode(ctx context.Context, etag, corr string, dryRun, frozen bool, reason string) (Result, error) {
	return c.put(ctx, "/v1/settings/mode", etag, corr, map[string]any{"dry_run": dryRun, "frozen": frozen, "reason": reason})
}
