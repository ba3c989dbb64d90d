package gateway

import (
	"net/http"

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
	// and returns true; false when r is not one, having written nothing.
	ServeStatus(w http.ResponseWriter, r *http.Request, p events.Principal) bool
}
