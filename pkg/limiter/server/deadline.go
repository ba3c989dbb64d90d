package server

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/floodgate-dev/floodgate/pkg/events"
	"github.com/floodgate-dev/floodgate/pkg/httpapi"
	"github.com/floodgate-dev/floodgate/pkg/limiter"
	"github.com/floodgate-dev/floodgate/pkg/limiter/checkapi"
)

// The caller's deadline on the HTTP API: how long, from the moment the
// limiter reads the request, the caller waits for the answer before it fails
// open by itself. A check still undecided then is not decided at all
// (limiter.ErrPastDeadline): the caller no longer listens.
const (
	// HeaderTimeout is Floodgate's own: milliseconds, 1..60000.
	HeaderTimeout = "X-Floodgate-Timeout-Ms"
	// HeaderEnvoyTimeout is what Envoy sends an upstream (and, as gRPC
	// metadata, its rate-limit service): the route's timeout in ms. Read
	// when HeaderTimeout is absent.
	HeaderEnvoyTimeout = "X-Envoy-Expected-Rq-Timeout-Ms"
	// MaxTimeout bounds a caller's timeout.
	MaxTimeout = time.Minute
)

// Protocols, the label of floodgate_limiter_calls_dropped_past_deadline_total.
const (
	ProtocolHTTP      = "http"
	ProtocolGRPC      = "grpc"
	ProtocolInProcess = "in_process"
)

// DeadlineReason is the X-RateLimit-Error of an answer to a check whose
// caller's deadline passed before it was decided: it fails open, as the
// caller has by then (nothing was counted and no decision event sent).
const DeadlineReason = "deadline exceeded before the check was decided"

// Call is how a check reached the limiter: its protocol (a metrics label)
// and its caller's deadline (zero: none).
type Call struct {
	Protocol string
	Deadline time.Time
}

// SetCheckTimeout sets the deadline of a check whose caller names none (no
// HeaderTimeout, HeaderEnvoyTimeout or gRPC deadline), from when the limiter
// reads it; 0: none. Set before serving.
func (s *Server) SetCheckTimeout(d time.Duration) { s.checkTimeout = d }

// ParseTimeout reads a timeout header's value: whole milliseconds,
// 1..MaxTimeout.
func ParseTimeout(name, v string) (time.Duration, error) {
	ms, err := strconv.ParseInt(v, 10, 64)
	if err != nil || ms < 1 || ms > MaxTimeout.Milliseconds() {
		return 0, fmt.Errorf("%s %q: want whole milliseconds, 1..%d", name, v, MaxTimeout.Milliseconds())
	}
	return time.Duration(ms) * time.Millisecond, nil
}

// httpDeadline is an HTTP check's deadline: HeaderTimeout, else
// HeaderEnvoyTimeout, else the configured default, from now.
func (s *Server) httpDeadline(r *http.Request) (time.Time, error) {
	return s.headerDeadline(time.Now(), r.Header.Get(HeaderTimeout), r.Header.Get(HeaderEnvoyTimeout))
}

// headerDeadline is httpDeadline of the two headers' values ("": absent).
func (s *Server) headerDeadline(now time.Time, timeout, envoy string) (time.Time, error) {
	d := s.checkTimeout
	switch {
	case timeout != "":
		t, err := ParseTimeout(HeaderTimeout, timeout)
		if err != nil {
			return time.Time{}, err
		}
		d = t
	case envoy != "":
		t, err := ParseTimeout(HeaderEnvoyTimeout, envoy)
		if err != nil {
			return time.Time{}, err
		}
		d = t
	}
	if d <= 0 {
		return time.Time{}, nil
	}
	return now.Add(d), nil
}

// DeadlineOf is a call's deadline from its context (gRPC's deadline, an
// in-process caller's), else the configured default from now; zero: none.
func (s *Server) DeadlineOf(ctx context.Context) time.Time {
	if d, ok := ctx.Deadline(); ok {
		return d
	}
	if s.checkTimeout > 0 {
		return time.Now().Add(s.checkTimeout)
	}
	return time.Time{}
}

// CountPastDeadline counts a call not decided because its caller's deadline
// had passed, by protocol and priority ("none" for a call with none).
func (s *Server) CountPastDeadline(protocol, priority string) {
	if priority == "" {
		priority = "none"
	}
	s.metrics.pastDeadline.WithLabelValues(protocol, priority).Inc()
}

// callerGone drops an HTTP check whose caller has already closed its
// connection (httpapi.CallerGone): it gave up on its deadline while the
// request waited to be read — in the kernel's or the runtime's queues, which
// a relative timeout counted from the read cannot see — and failed open by
// itself. Nothing is decoded, decided or written: the connection is taken
// from net/http and closed (panicking with http.ErrAbortHandler does the
// same at about the cost of deciding the check: the overload profile had it
// at 12 % of the limiter's CPU), and the check is counted in
// floodgate_limiter_calls_dropped_past_deadline_total (priority "none": it
// was not read). Under overload these are most of the queue; answering them
// is the CPU the callers still waiting need. True: the handler must return.
//
// The peek is a system call (≈ 3.4 µs a check of 73 in the pinned peerbench,
// docs/benchmarks.md), spent for nothing while callers wait for their
// answers, so it is sampled (goneGate): every check while callers have been
// found gone in the last goneWatch, one in goneSample otherwise — under
// overload, where most of the queue has left, the first sample finds one
// within a few dozen checks.
func (s *Server) callerGone(w http.ResponseWriter, r *http.Request) bool {
	now := time.Now()
	if !s.gone.peek(now) || !httpapi.CallerGone(r) {
		return false
	}
	s.gone.found(now)
	s.CountPastDeadline(ProtocolHTTP, "")
	c, _, err := http.NewResponseController(w).Hijack()
	if err != nil {
		panic(http.ErrAbortHandler)
	}
	_ = c.Close()
	return true
}

// pastDeadline is the answer to a check the engine did not decide because
// its caller's deadline had passed (limiter.ErrPastDeadline), or that was
// still waiting for a permit or for Redis when it passed or when its caller
// left (ctx cancelled: net/http cancels a request's context when its client
// closes the connection): allowed and degraded, as the caller fails open by
// itself. Not "check failed": under overload callers leave by the thousand,
// and each would otherwise be a warning line.
func (s *Server) pastDeadline(ctx context.Context, call Call, req *checkapi.CheckRequest, res limiter.Result, err error) (limiter.Result, bool) {
	switch {
	case errors.Is(err, limiter.ErrPastDeadline):
		s.CountPastDeadline(call.Protocol, res.Priority.String())
	case (errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled)) &&
		(ctx.Err() != nil || !call.Deadline.IsZero() && !time.Now().Before(call.Deadline)):
		s.metrics.errors.WithLabelValues("deadline").Inc() // in flight when it passed: Redis may have counted it
	default:
		return res, false
	}
	return limiter.Result{Allowed: true, Tier: events.TierPrincipal, Penalty: 1, Scale: 1, Degraded: true, Priority: res.Priority,
		Error: DeadlineReason, Now: time.Now().UTC(), Cost: max(req.Cost, 1)}, true
}

// goneSample and goneWatch: callerGone peeks at one check in goneSample
// until it finds a caller gone, then at every check for goneWatch after the
// last one found.
const (
	goneSample = 64
	goneWatch  = time.Second
)

// goneGate decides which checks callerGone peeks at. Safe for concurrent use.
type goneGate struct {
	n     atomic.Uint64
	until atomic.Int64 // unix nanoseconds: peek at every check before it
}

// peek reports whether the check arriving at now is peeked at: every one
// while callers are leaving, else the first of every goneSample.
func (g *goneGate) peek(now time.Time) bool {
	return now.UnixNano() < g.until.Load() || g.n.Add(1)%goneSample == 1
}

// found records a caller found gone at now.
func (g *goneGate) found(now time.Time) { g.until.Store(now.Add(goneWatch).UnixNano()) }
