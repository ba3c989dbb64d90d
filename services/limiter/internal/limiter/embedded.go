package limiter

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/google/uuid"

	"github.com/floodgate-dev/floodgate/pkg/gateway"
)

// Embedded decides in-process — the same engine, metrics and decision events as
// POST /v1/check, without the HTTP hop — for pkg/gateway's middleware inside the
// limiter binary (its reverse-proxy mode). Safe for concurrent use.
type Embedded struct{ s *Server }

var _ gateway.Checker = (*Embedded)(nil)

// Embedded returns an in-process checker on s.
func (s *Server) Embedded() *Embedded { return &Embedded{s: s} }

// Check validates and decides one request exactly as the HTTP API does.
func (e *Embedded) Check(ctx context.Context, r gateway.Request) (gateway.Decision, error) {
	req := CheckRequest{Principal: r.Principal, IP: r.IP, Method: r.Method, Route: r.Route, Resource: r.Resource, Cost: r.Cost}
	if err := req.validate(); err != nil {
		return gateway.Decision{}, fmt.Errorf("check: %w", err)
	}
	resp := e.s.decide(ctx, uuid.Must(uuid.NewV7()).String(), &req)
	d := gateway.Decision{
		ID: resp.ID, Allowed: resp.Allowed, Tier: string(resp.Tier), Limit: resp.Limit, Remaining: resp.Remaining,
		ResetAfterMS: resp.ResetAfterMS, RetryAfterMS: resp.RetryAfterMS, PenaltyMultiplier: resp.PenaltyMultiplier,
		Headers: resp.Headers,
	}
	if resp.Problem != nil {
		p, err := json.Marshal(resp.Problem)
		if err != nil {
			return gateway.Decision{}, fmt.Errorf("encode problem: %w", err)
		}
		d.Problem = p
	}
	return d, nil
}
