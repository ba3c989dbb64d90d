// Package remote is how the console's clients of the other services' admin
// APIs (adjuster, dlq-auditor) make a call on pkg/httpapi's client and what
// a refusal looks like to the pages.
package remote

import (
	"context"
	"errors"
	"fmt"
	"net/http"

	"github.com/floodgate-dev/floodgate/pkg/httpapi"
)

// Error is a refusal from a service: its status code and problem.
type Error struct {
	Service string // who answered: "adjuster", "dlq-auditor"
	Status  int
	Code    string // the problem type's code, e.g. "precondition-failed"
	Message string // the problem's detail
	ETag    string // the current ETag, on a 412
}

func (e *Error) Error() string {
	return fmt.Sprintf("%s answered %d %s: %s", e.Service, e.Status, e.Code, e.Message)
}

// Client is a client of one service's API with one bearer token (pkg/httpapi's
// client: the caller's X-Request-Id goes along).
type Client struct {
	api         *httpapi.Client
	service     string
	unavailable error
}

// New returns a client for the API cfg names (cfg.Name is the service);
// failures to reach it, and its 5xx answers, wrap unavailable.
func New(cfg httpapi.ClientConfig, unavailable error) (*Client, error) {
	api, err := httpapi.NewClient(cfg)
	if err != nil {
		return nil, err
	}
	return &Client{api: api, service: cfg.Name, unavailable: unavailable}, nil
}

// Do makes one call, with corr as its X-Request-Id when set (else the
// context's). A refusal is an *Error naming the service; a 5xx answer and a
// transport failure also wrap the client's unavailable error.
func (c *Client) Do(ctx context.Context, corr string, call httpapi.Call) (http.Header, error) {
	if corr != "" {
		ctx = httpapi.WithRequestID(ctx, corr)
	}
	h, err := c.api.Do(ctx, call)
	var pe *httpapi.Error
	if errors.As(err, &pe) {
		re := &Error{Service: c.service, Status: pe.Status, Code: pe.Code(), Message: pe.Detail, ETag: pe.Header.Get("ETag")}
		if pe.Status >= 500 {
			return nil, fmt.Errorf("%w: %w", c.unavailable, re)
		}
		return nil, re
	}
	if err != nil {
		return nil, fmt.Errorf("%w: %w", c.unavailable, err)
	}
	return h, nil
}
