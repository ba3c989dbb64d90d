package httpapi

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// ErrUnavailable wraps transport failures and 5xx answers of another
// service: the call may succeed later. A 4xx answer is an *Error instead.
var ErrUnavailable = errors.New("service unavailable")

// Client calls another Floodgate service's API: JSON in and out, the bearer
// token, and the caller's request id (from ctx, or a new one) as
// X-Request-Id, so one id follows a request across services. Safe for
// concurrent use.
type Client struct {
	name  string
	base  string
	token string
	http  *http.Client
	limit int64
}

// ClientConfig configures NewClient.
type ClientConfig struct {
	Name    string        // the service called, for errors ("adjuster")
	BaseURL string        // http(s)://host:port
	Token   string        // bearer token; "" sends none
	Timeout time.Duration // per call (0: 10s); ignored when HTTP is given
	HTTP    *http.Client  // optional
	MaxBody int64         // largest answer read (0: 16 MiB)
}

// NewClient checks the base URL.
func NewClient(c ClientConfig) (*Client, error) {
	u, err := url.Parse(c.BaseURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("parse %s URL %q: want http(s)://host:port", c.Name, c.BaseURL)
	}
	hc := c.HTTP
	if hc == nil {
		t := c.Timeout
		if t <= 0 {
			t = 10 * time.Second
		}
		hc = &http.Client{Timeout: t}
	}
	if c.MaxBody <= 0 {
		c.MaxBody = 16 << 20
	}
	return &Client{name: c.Name, base: strings.TrimRight(c.BaseURL, "/"), token: c.Token, http: hc, limit: c.MaxBody}, nil
}

// Call is one API call.
type Call struct {
	Method string
	Path   string // with its query, already escaped
	Header http.Header
	Body   any // JSON-encoded when not nil
	Out    any // the 2xx answer is decoded into it when not nil
}

// Do makes the call. A 2xx answer returns its headers; a 4xx answer an
// *Error carrying the problem (and the answer's headers); a 5xx answer or a
// transport failure an error wrapping ErrUnavailable (and the *Error, if
// the service answered one).
func (c *Client) Do(ctx context.Context, call Call) (http.Header, error) {
	var rd io.Reader
	if call.Body != nil {
		b, err := json.Marshal(call.Body)
		if err != nil {
			return nil, fmt.Errorf("encode %s %s: %w", call.Method, call.Path, err)
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, call.Method, c.base+call.Path, rd)
	if err != nil {
		return nil, fmt.Errorf("build %s %s: %w", call.Method, call.Path, err)
	}
	for k, vs := range call.Header {
		req.Header[k] = vs
	}
	id := RequestID(ctx)
	if id == "" {
		id = NewRequestID()
	}
	req.Header.Set(HeaderRequestID, id)
	req.Header.Set("Accept", "application/json, "+ContentTypeProblem)
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	if call.Body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	res, err := c.http.Do(req)
	if err != nil {
		return nil, fmt.Errorf("%w: %s %s %s: %w", ErrUnavailable, c.name, call.Method, call.Path, err)
	}
	defer res.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(res.Body, c.limit))
	if err != nil {
		return nil, fmt.Errorf("%w: %s: read %s %s: %w", ErrUnavailable, c.name, call.Method, call.Path, err)
	}
	if res.StatusCode >= 300 {
		pe := &Error{Problem: decodeProblem(raw, res.StatusCode), Header: res.Header}
		if pe.CorrelationID == "" {
			pe.CorrelationID = res.Header.Get(HeaderRequestID)
		}
		if res.StatusCode >= 500 {
			return nil, fmt.Errorf("%w: %s: %w", ErrUnavailable, c.name, pe)
		}
		return nil, pe
	}
	if call.Out != nil {
		if err := json.Unmarshal(raw, call.Out); err != nil {
			return nil, fmt.Errorf("decode %s answer to %s %s: %w", c.name, call.Method, call.Path, err)
		}
	}
	return res.Header, nil
}

// decodeProblem reads a problem document, or makes one from any other body.
func decodeProblem(raw []byte, status int) Problem {
	var p Problem
	if json.Unmarshal(raw, &p) == nil && (p.Type != "" || p.Detail != "") {
		p.Status = status
		return p
	}
	detail := strings.TrimSpace(string(raw))
	if len(detail) > 512 {
		detail = detail[:512] + "…"
	}
	return Problem{Type: "about:blank", Title: http.StatusText(status), Status: status, Detail: detail}
}
