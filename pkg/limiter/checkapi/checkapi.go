// Package checkapi is the limiter's check contract on the wire: the body of
// POST /v1/check and its batch form and the decision a gateway gets back
// (refusals are httpapi.Problem) — one definition for the server, its
// in-process form (pkg/limiter/embedded) and the gateways' client (pkg/gateway).
package checkapi

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"

	"github.com/floodgate-dev/floodgate/pkg/events"
	"github.com/floodgate-dev/floodgate/pkg/httpapi"
	"github.com/floodgate-dev/floodgate/pkg/limiter/admission"
)

// CheckRequest is the body of POST /v1/check.
type CheckRequest struct {
	Principal events.Principal `json:"principal"`
	IP        string           `json:"ip"`
	Method    string           `json:"method"`
	Route     string           `json:"route"`
	Resource  string           `json:"resource,omitempty"`
	Cost      int              `json:"cost,omitempty"`
	Plan      string           `json:"plan,omitempty"`
	// Priority is critical, degraded, best_effort or bulk; "" takes the
	// route's default from the rules (admission.Priority).
	Priority string `json:"priority,omitempty"`

	addr netip.Addr         // IP, parsed by Validate
	prio admission.Priority // Priority, parsed by Validate
}

// CheckResponse is the decision and the contract the gateway must send.
type CheckResponse struct {
	ID                string            `json:"id"`
	Allowed           bool              `json:"allowed"`
	Tier              events.Tier       `json:"tier"`
	Rule              string            `json:"rule,omitempty"`
	Limit             int               `json:"limit"`
	Remaining         int               `json:"remaining"`
	ResetAfterMS      int64             `json:"reset_after_ms"`
	RetryAfterMS      int64             `json:"retry_after_ms"`
	PenaltyMultiplier float64           `json:"penalty_multiplier"`
	Scale             float64           `json:"scale"`
	Shadow            bool              `json:"shadow,omitempty"`
	NearLimit         bool              `json:"near_limit,omitempty"`
	Degraded          bool              `json:"degraded,omitempty"`
	Priority          string            `json:"priority"`
	Shed              bool              `json:"shed,omitempty"`
	Utilization       string            `json:"cluster_utilization_status,omitempty"`
	Headers           map[string]string `json:"headers"`
	Problem           *httpapi.Problem  `json:"problem,omitempty"`
}

// BatchRequest is the body of POST /v1/check/batch: up to MaxBatch checks,
// each decided independently (one may be denied while the next is allowed).
type BatchRequest struct {
	Checks []json.RawMessage `json:"checks"`
}

// BatchResponse answers a batch in order: each result is a CheckResponse, or a
// problem (status 400) for a check that did not validate.
type BatchResponse struct {
	Results []BatchResult `json:"results"`
}

// BatchResult is one check's answer within a batch.
type BatchResult struct {
	Status int `json:"status"` // 200 decided, 400 invalid
	*CheckResponse
	Error *httpapi.Problem `json:"error,omitempty"`
}

// MaxBatch bounds a batch.
const MaxBatch = 100

// Validate checks a decoded request and completes it: a cost of 0 is 1, and
// the IP and priority are parsed (Addr, ParsedPriority).
func (req *CheckRequest) Validate() error {
	if req.Cost == 0 {
		req.Cost = 1
	}
	if err := req.Principal.Validate(); err != nil {
		return err
	}
	addr, err := events.ParseIP(req.IP)
	if err != nil {
		return fmt.Errorf("ip: %w", err)
	}
	req.addr = addr
	if err := events.ValidMethod(req.Method); err != nil {
		return fmt.Errorf("method: %w", err)
	}
	if err := events.ValidRoute(req.Route); err != nil {
		return fmt.Errorf("route: %w", err)
	}
	if req.Resource != "" {
		if err := events.ValidResource(req.Resource); err != nil {
			return fmt.Errorf("resource: %w", err)
		}
	}
	if req.Plan != "" && !events.ValidPlan(req.Plan) {
		return errors.New("plan: want [a-z0-9][a-z0-9_-]{0,31}")
	}
	if req.Cost < 1 || req.Cost > 1_000_000 {
		return errors.New("cost: must be in 1..1000000")
	}
	p, err := admission.ParsePriority(req.Priority)
	if err != nil {
		return fmt.Errorf("priority: %w", err)
	}
	req.prio = p
	return nil
}

// Addr is the request's IP, parsed by Validate.
func (req *CheckRequest) Addr() netip.Addr { return req.addr }

// ParsedPriority is the request's priority, parsed by Validate
// (admission.PriorityUnset: the route's default).
func (req *CheckRequest) ParsedPriority() admission.Priority { return req.prio }
