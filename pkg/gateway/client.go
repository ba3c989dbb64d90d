// Package gateway is what an API gateway written in Go needs to use Floodgate: a
// client for the limiter's check API, a net/http middleware that enforces its
// decisions and sends the 429 contract, client-IP extraction that trusts
// X-Forwarded-For only through configured proxies, route templating, and a
// reverse proxy built from those parts.
package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/floodgate-dev/floodgate/pkg/limiter/checkapi"
	"github.com/floodgate-dev/floodgate/pkg/tracing"
)

// Request is one check: who, from where, doing what — the limiter's
// POST /v1/check body (checkapi.CheckRequest), one wire type for both sides.
type Request = checkapi.CheckRequest

// Decision is the limiter's answer and the exact contract to send to the client.
type Decision struct {
	ID                string  `json:"id"`
	Allowed           bool    `json:"allowed"`
	Tier              string  `json:"tier"`
	Limit             int     `json:"limit"`
	Remaining         int     `json:"remaining"`
	ResetAfterMS      int64   `json:"reset_after_ms"`
	RetryAfterMS      int64   `json:"retry_after_ms"`
	PenaltyMultiplier float64 `json:"penalty_multiplier"`
	// Shed: refused by priority shedding — the platform is short of
	// capacity, not the client over a limit: the answer is a 503, not a 429.
	Shed    bool              `json:"shed,omitempty"`
	Headers map[string]string `json:"headers"`
	Problem json.RawMessage   `json:"problem,omitempty"`
}

// Checker decides one request. Implementations must be safe for concurrent use.
type Checker interface {
	Check(ctx context.Context, req Request) (Decision, error)
}

// Client calls a limiter's HTTP API.
type Client struct {
	base string
	http *http.Client
}

var _ Checker = (*Client)(nil)

// ClientOption configures a Client.
type ClientOption func(*clientOptions)

type clientOptions struct{ tracing tracing.Tracing }

// WithTracing makes every check an HTTP client span whose context goes to
// the limiter in the traceparent header, so the limiter's spans (and the
// decision event's consumers') join the gateway's trace.
func WithTracing(t tracing.Tracing) ClientOption {
	return func(o *clientOptions) { o.tracing = t }
}

// NewClient returns a client for the limiter at base (e.g. http://127.0.0.1:8080).
// timeout bounds one check; keep it short, the middleware fails open past it.
func NewClient(base string, timeout time.Duration, opts ...ClientOption) *Client {
	var o clientOptions
	for _, f := range opts {
		f(&o)
	}
	return &Client{
		base: strings.TrimRight(base, "/"),
		http: &http.Client{Timeout: timeout, Transport: o.tracing.Transport(&http.Transport{
			MaxIdleConns: 512, MaxIdleConnsPerHost: 512, IdleConnTimeout: 90 * time.Second,
		})},
	}
}

// Check sends one check. Errors are transport errors or a non-200 answer (the
// limiter answers 400 with a problem document for an invalid request).
func (c *Client) Check(ctx context.Context, req Request) (Decision, error) {
	body, err := json.Marshal(req)
	if err != nil {
		return Decision{}, fmt.Errorf("encode check: %w", err)
	}
	hreq, err := http.NewRequestWithContext(ctx, http.MethodPost, c.base+"/v1/check", bytes.NewReader(body))
	if err != nil {
		return Decision{}, err
	}
	hreq.Header.Set("Content-Type", "application/json")
	resp, err := c.http.Do(hreq)
	if err != nil {
		return Decision{}, fmt.Errorf("check %s: %w", req.Principal.Key(), err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if err != nil {
		return Decision{}, fmt.Errorf("check %s: read answer: %w", req.Principal.Key(), err)
	}
	if resp.StatusCode != http.StatusOK {
		return Decision{}, fmt.Errorf("check %s: limiter answered %d: %s", req.Principal.Key(), resp.StatusCode, bytes.TrimSpace(raw))
	}
	var d Decision
	if err := json.Unmarshal(raw, &d); err != nil {
		return Decision{}, fmt.Errorf("check %s: decode answer: %w", req.Principal.Key(), err)
	}
	return d, nil
}
