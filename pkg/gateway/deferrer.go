package gateway

import (
	"net/http"
	"strings"

	"github.com/floodgate-dev/floodgate/pkg/events"
)

// Deferrer takes requests the limiter denied or shed on routes whose rule says
// on_limit: defer, and answers their clients' status polls (pkg/deferred).
// Implementations must be safe for concurrent use.
type Deferrer interface {
	// Defer is called for a denied (or shed) request before the 429 (503)
	// contract is sent. It returns true when it took the request and wrote
	// the answer (202 Accepted); false when the request is not deferrable or
	// could not be queued, having written nothing — the middleware then sends
	// the denial as usual.
	Defer(w http.ResponseWriter, r *http.Request, req Request, d Decision) bool
	// ServeStatus answers a status poll (GET /v1/deferred/{id}) of principal p
	// and returns true; false when r is not one, having written nothing. The
	// middleware calls it once the poll passed the limiter's check.
	ServeStatus(w http.ResponseWriter, r *http.Request, p events.Principal) bool
}

// A deferred request's status: GET (or HEAD) DeferredStatusPrefix + id. The
// middleware checks each poll with the limiter as route DeferredStatusRoute
// (its method, cost 1) before the Deferrer answers it, so polls are limited
// by the rules like any request — give the route a rule of its own — and a
// denied poll gets the standard 429 contract.
const (
	DeferredStatusPrefix = "/v1/deferred/"
	DeferredStatusRoute  = "/v1/deferred/{id}"
)

// IsDeferredStatus reports whether r is a poll of a deferred request's status.
func IsDeferredStatus(r *http.Request) bool {
	return (r.Method == http.MethodGet || r.Method == http.MethodHead) && strings.HasPrefix(r.URL.Path, DeferredStatusPrefix)
}
