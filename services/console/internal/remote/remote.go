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

// Do makes call through api, with corr as its X-Request-Id when set (else
// the context's). A refusal is an *Error naming service; a 5xx answer and a
// transport failure also wrap unavailable.
func Do(ctx context.Context, api *httpapi.Client, service string, unavailable error, corr string, call httpapi.Call) (http.Header, error) {
	if corr != "" {
		ctx = httpapi.WithRequestID(ctx, corr)
	}
	h, err := api.Do(ctx, call)
	var pe *httpapi.Error
	if errors.As(err, &pe) {
		re := &Error{Service: service, Status: pe.Status, Code: pe.Code(), Message: pe.Detail, ETag: pe.Header.Get("ETag")}
		if pe.Status >= 500 {
			return nil, fmt.Errorf("%w: %w", unavailable, re)
		}
		return nil, re
	}
	if err != nil {
		return nil, fmt.Errorf("%w: %w", unavailable, err)
	}
	return h, nil
}
