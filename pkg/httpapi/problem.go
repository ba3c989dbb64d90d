// Package httpapi is the one HTTP API layer every Floodgate service uses:
// RFC 9457 problem details, the X-Request-Id correlation id (in, out, in logs
// and on outgoing calls), bearer tokens with roles, body limits, hardened
// servers (timeouts, a connection limit) with an access log and metrics, the
// client that calls another service's API, a ServeMux that lists its routes
// (Mux) and the route every API serves its OpenAPI document on (OpenAPIPath).
package httpapi

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
)

// ContentTypeProblem is the media type of every error answer (RFC 9457).
const ContentTypeProblem = "application/problem+json"

// Problem types. Floodgate's own live under ProblemBase; the last path segment
// is the stable code programs branch on (ProblemCode).
const (
	ProblemBase = "https://floodgate.dev/problems/"

	ProblemInvalidRequest       = ProblemBase + "invalid-request"       // 400: a parameter or the body is wrong
	ProblemUnauthenticated      = ProblemBase + "unauthenticated"       // 401: no or an unknown credential
	ProblemForbidden            = ProblemBase + "forbidden"             // 403: the caller's role may not do this
	ProblemNotFound             = ProblemBase + "not-found"             // 404
	ProblemMethodNotAllowed     = ProblemBase + "method-not-allowed"    // 405: the route exists, not with this method (see Allow)
	ProblemConflict             = ProblemBase + "conflict"              // 409: the state does not allow it now
	ProblemPreconditionFailed   = ProblemBase + "precondition-failed"   // 412: If-Match does not match
	ProblemTooLarge             = ProblemBase + "too-large"             // 413: body over the limit
	ProblemUnprocessable        = ProblemBase + "unprocessable"         // 422: well-formed but invalid (rules, values)
	ProblemPreconditionRequired = ProblemBase + "precondition-required" // 428: send If-Match
	ProblemTooManyRequests      = ProblemBase + "too-many-requests"     // 429 from an API's own protection (not a limiter decision)
	ProblemInternal             = ProblemBase + "internal"              // 500: quote the correlation id
	ProblemUnavailable          = ProblemBase + "unavailable"           // 503: a dependency is down
	ProblemBadGateway           = ProblemBase + "upstream-unavailable"  // 502: another service failed

	// The limiter's refusals (pkg/limiter/server, docs/gateway.md), as it
	// sends them: a 429's (a shed request's 503) types are the ones
	// draft-ietf-httpapi-ratelimit-headers-11 registers with IANA, below;
	// gateways and their clients match on them.
	ProblemRateLimited = ProblemIANAQuotaExceeded
	ProblemPenalized   = ProblemIANAAbnormalUsageDetected
	ProblemQuota       = ProblemIANAQuotaExceeded
	// ProblemReducedCapacity: the adjuster scaled the deciding limit below 1
	// or shed the request's priority (the platform is short of capacity),
	// not the client's own excess.
	ProblemReducedCapacity = ProblemIANATemporaryReducedCapacity
	// ProblemCostOverLimit (400): a check's cost is over the max_cost of a
	// rule or quota it matches; nothing was counted.
	ProblemCostOverLimit = ProblemBase + "cost-over-limit"

	// The problem types draft-ietf-httpapi-ratelimit-headers-11 registers with
	// IANA. A problem of these types may carry ViolatedPolicies.
	ProblemIANAQuotaExceeded            = "https://iana.org/assignments/http-problem-types#quota-exceeded"
	ProblemIANATemporaryReducedCapacity = "https://iana.org/assignments/http-problem-types#temporary-reduced-capacity"
	ProblemIANAAbnormalUsageDetected    = "https://iana.org/assignments/http-problem-types#abnormal-usage-detected"
)

// Problem is an RFC 9457 problem document — every service's, the limiter's
// refusals included. CorrelationID is the request's X-Request-Id;
// ViolatedPolicies is the draft-11 extension member of the rate-limit
// problem types, UtilizationStatus the limiter's on a shed answer.
type Problem struct {
	Type             string   `json:"type"`
	Title            string   `json:"title"`
	Status           int      `json:"status"`
	Detail           string   `json:"detail,omitempty"`
	Instance         string   `json:"instance,omitempty"`
	CorrelationID    string   `json:"correlation_id,omitempty"`
	ViolatedPolicies []string `json:"violated-policies,omitempty"`
	// UtilizationStatus is set on a shed answer (admission.StatusDegraded,
	// admission.StatusCritical).
	UtilizationStatus string `json:"cluster_utilization_status,omitempty"`
}

// Code is the problem type's last path segment or fragment ("not-found").
func (p Problem) Code() string { return ProblemCode(p.Type) }

// ProblemCode is the stable code of a problem type URI: its last path segment
// or fragment; "about:blank" and "" give "".
func ProblemCode(typ string) string {
	if typ == "" || typ == "about:blank" {
		return ""
	}
	if i := strings.LastIndexAny(typ, "/#"); i >= 0 {
		return typ[i+1:]
	}
	return typ
}

// Error is an error that answers as a problem. Handlers return it (see
// Handle); clients get it back for a refusal (see Client).
type Error struct {
	Problem
	// Header holds response headers to send with it (e.g. ETag on a 412);
	// on the client side, the answer's headers.
	Header http.Header
}

func (e *Error) Error() string {
	code := e.Code()
	if code == "" {
		code = strings.ToLower(http.StatusText(e.Status))
	}
	msg := fmt.Sprintf("%d %s: %s", e.Status, code, e.Detail)
	if e.CorrelationID != "" {
		msg += " [request id " + e.CorrelationID + "]"
	}
	return msg
}

// Errorf returns a problem error of status and type with a formatted detail.
func Errorf(status int, typ, format string, args ...any) *Error {
	return &Error{Problem: Problem{Type: typ, Status: status, Detail: fmt.Sprintf(format, args...)}}
}

// BadRequest is Errorf(400, ProblemInvalidRequest, …).
func BadRequest(format string, args ...any) *Error {
	return Errorf(http.StatusBadRequest, ProblemInvalidRequest, format, args...)
}

// WriteProblem writes p as application/problem+json with r's correlation id
// (the X-Request-Id the Middleware put in its context). A zero Type becomes
// about:blank, a zero Title the status text.
func WriteProblem(w http.ResponseWriter, r *http.Request, p Problem) {
	if p.CorrelationID == "" && r != nil {
		p.CorrelationID = RequestID(r.Context())
	}
	status, body := problemBody(p)
	h := w.Header()
	h.Set("Content-Type", ContentTypeProblem)
	h.Set("Content-Length", strconv.Itoa(len(body)))
	h.Set("Cache-Control", "no-store")
	h.Del("Content-Encoding")
	w.WriteHeader(status)
	_, _ = w.Write(body)
}

// problemBody is p's status and JSON (a line), its defaults filled in.
func problemBody(p Problem) (int, []byte) {
	if p.Status == 0 {
		p.Status = http.StatusInternalServerError
	}
	if p.Type == "" {
		p.Type = "about:blank"
	}
	if p.Title == "" {
		p.Title = http.StatusText(p.Status)
	}
	body, err := json.Marshal(p)
	if err != nil { // a Problem always encodes; keep the answer well-formed anyway
		body = []byte(`{"type":"about:blank","title":"Internal Server Error","status":500}`)
		p.Status = http.StatusInternalServerError
	}
	return p.Status, append(body, '\n')
}

// WriteError answers err: an *Error (anywhere in its chain) as itself, with
// its headers; anything else as a 500 whose detail names only the correlation
// id, the error itself logged with it.
func WriteError(w http.ResponseWriter, r *http.Request, log *slog.Logger, err error) {
	var pe *Error
	if !errors.As(err, &pe) {
		id := RequestID(r.Context())
		if log != nil {
			log.ErrorContext(r.Context(), "request failed", "method", r.Method, "path", r.URL.Path, "err", err)
		}
		pe = Errorf(http.StatusInternalServerError, ProblemInternal, "internal error; quote request id %s to an operator", id)
	}
	for k, vs := range pe.Header {
		for _, v := range vs {
			w.Header().Add(k, v)
		}
	}
	if pe.Status == http.StatusUnauthorized && w.Header().Get("WWW-Authenticate") == "" {
		w.Header().Set("WWW-Authenticate", `Bearer`)
	}
	WriteProblem(w, r, pe.Problem)
}

// Handle adapts a handler that returns an error: a nil error means the
// handler answered; an error is answered by WriteError.
func Handle(log *slog.Logger, h func(http.ResponseWriter, *http.Request) error) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := h(w, r); err != nil {
			WriteError(w, r, log, err)
		}
	})
}

// WriteJSON answers v as indented JSON with status.
func WriteJSON(w http.ResponseWriter, status int, v any) {
	body, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		WriteProblem(w, nil, Problem{Status: http.StatusInternalServerError, Type: ProblemInternal, Detail: "encode answer"})
		return
	}
	body = append(body, '\n')
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(status)
	_, _ = w.Write(body)
}
