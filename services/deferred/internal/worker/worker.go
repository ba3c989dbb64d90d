// Package worker replays deferred requests (floodgate.deferred.v1) to their
// upstream: paced by the limiter at the lowest priority, exactly once (the
// Idempotency-Key is the deferred id; the offset is committed only after the
// upstream answered and the result is stored), never after the deadline.
package worker

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/floodgate-dev/floodgate/pkg/deferred"
	"github.com/floodgate-dev/floodgate/pkg/events"
	"github.com/floodgate-dev/floodgate/pkg/gateway"
	"github.com/floodgate-dev/floodgate/pkg/limiter"
	"github.com/floodgate-dev/floodgate/pkg/stream"
	"github.com/floodgate-dev/floodgate/pkg/tick"
)

// ErrExpired is wrapped by the error of a request whose deadline passed: the
// consumer dead-letters it (poison) with that reason.
var ErrExpired = errors.New("deferred request expired")

// ErrRefused is wrapped by the error of a request the upstream refused (4xx).
var ErrRefused = errors.New("upstream refused the deferred request")

// Options are the worker's parts and settings.
type Options struct {
	Store    *deferred.Store
	Limiter  gateway.Checker // asked before every send, at priority bulk
	Upstream string          // base URL the path is appended to
	HTTP     *http.Client    // to the upstream; its Timeout bounds one attempt
	// ServiceToken authenticates the worker to the upstream (Authorization:
	// Bearer); SigningKey signs the principal (deferred.Sign).
	ServiceToken string
	SigningKey   []byte
	// ResultTTL keeps a result for the client; ResultMaxBody caps its body;
	// ResultHeaders are the upstream response headers kept.
	ResultTTL     time.Duration
	ResultMaxBody int
	ResultHeaders []string
	// MinBackoff and MaxBackoff bound the wait between attempts after a 5xx
	// or a timeout, and between failed limiter checks.
	MinBackoff, MaxBackoff time.Duration
	PausePoll              time.Duration // how often a paused route is looked at again
	Metrics                *Metrics
	Logger                 *slog.Logger
	Now                    func() time.Time
}

// Worker handles one deferred request per call. Safe for concurrent use (one
// call per partition at a time, as pkg/stream's consumer makes them).
type Worker struct {
	o Options

	mu     sync.Mutex
	paused map[string]pausedAt // route → last look, so a busy route costs one Redis read a PausePoll
}

type pausedAt struct {
	paused bool
	at     time.Time
}

// New returns a Worker.
func New(o Options) *Worker {
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.PausePoll == 0 {
		o.PausePoll = time.Second
	}
	return &Worker{o: o, paused: map[string]pausedAt{}}
}

// Handle is the stream.Handler: it returns nil once the request's outcome is
// stored (done, or already final), a Permanent error (dead-lettered with the
// reason) for an expired, refused or undecodable request, and any other error
// to have the message handled again (nothing committed).
func (w *Worker) Handle(ctx context.Context, msg kafka.Message) error {
	ev, err := events.DecodeDeferred(msg.Value)
	if err != nil {
		return stream.Permanent(fmt.Errorf("decode deferred.v1: %w", err))
	}
	route := deferred.RouteKey(ev.Method, ev.Route)
	principal := ev.Principal.Key()
	m := w.o.Metrics.route(route)
	rec, found, err := w.o.Store.Get(ctx, ev.ID)
	if err != nil {
		return err
	}
	if found && rec.State.Final() {
		_ = w.o.Store.Release(ctx, ev.ID, principal, route)
		if rec.State == deferred.StateCancelled {
			m.cancelled.Inc()
		}
		return nil // handled before (a redelivery after a crash or a rebalance)
	}
	// A request already sent once may have been processed: it gets one more
	// send, even past its deadline, to learn the outcome (the upstream dedupes
	// by Idempotency-Key and must not start new work past X-Floodgate-Deadline).
	sentBefore := found && rec.State == deferred.StateSending
	base := deferred.Record{State: deferred.StateSending, Principal: principal, Method: ev.Method, Route: ev.Route, Deadline: ev.Deadline}
	if found {
		base.Attempts = rec.Attempts
	}
	backoff := w.o.MinBackoff
	var last string
	for attempt := 0; ; attempt++ {
		if !sentBefore && !w.o.Now().Before(ev.Deadline) {
			return w.expire(ctx, ev, base, m, "waited past its max_age"+last)
		}
		if err := w.waitPaused(ctx, route, ev.Deadline); err != nil {
			return err
		}
		if err := w.pace(ctx, ev, sentBefore); err != nil {
			if errors.Is(err, ErrExpired) {
				return w.expire(ctx, ev, base, m, "waited past its max_age for the limiter"+last)
			}
			return err
		}
		// Claim: queued (or unknown to a Redis that forgot it) → sending.
		base.Attempts++
		prev, err := w.o.Store.Transition(ctx, ev.ID, []deferred.State{deferred.StateQueued, deferred.StateSending, deferred.StateNone}, base, w.o.ResultTTL+max(time.Until(ev.Deadline), 0))
		if err != nil {
			return err
		}
		if prev.Final() {
			_ = w.o.Store.Release(ctx, ev.ID, principal, route)
			return nil
		}
		sentAt := w.o.Now()
		if attempt == 0 {
			m.age.Observe(sentAt.Sub(ev.TS).Seconds())
		}
		status, header, body, truncated, sendErr := w.send(ctx, &ev)
		m.sends.Inc()
		retryable := sendErr != nil || status >= 500 || status == http.StatusRequestTimeout || status == http.StatusTooManyRequests
		if !retryable {
			st := deferred.StateDone
			if status >= 400 {
				st = deferred.StateDead
			}
			res := base
			res.State, res.Status, res.Header, res.Body, res.Truncated, res.Finished = st, status, header, body, truncated, w.o.Now().UTC()
			if st == deferred.StateDead {
				res.Reason = fmt.Sprintf("the upstream refused it: %d %s", status, http.StatusText(status))
			}
			if _, err := w.o.Store.Transition(ctx, ev.ID, []deferred.State{deferred.StateSending, deferred.StateNone}, res, w.o.ResultTTL); err != nil {
				return err // handled again: resent under the same Idempotency-Key, stored then
			}
			_ = w.o.Store.Release(ctx, ev.ID, principal, route)
			if st == deferred.StateDead {
				m.dead.Inc()
				return stream.Permanent(fmt.Errorf("%w: %s %s answered %d", ErrRefused, ev.Method, ev.Path, status))
			}
			m.replayed.Inc()
			return nil
		}
		sentBefore = false // it failed visibly or timed out; from here on the deadline rules
		if sendErr != nil {
			last = fmt.Sprintf("; the last attempt failed (%v) and may have been processed under Idempotency-Key %s", sendErr, ev.ID)
		} else {
			last = fmt.Sprintf("; the upstream last answered %d", status)
		}
		w.o.Logger.Debug("deferred send failed; retrying", "id", ev.ID, "route", route, "status", status, "err", sendErr)
		m.retries.Inc()
		wait := backoff/2 + rand.N(backoff/2+1)
		if backoff *= 2; backoff > w.o.MaxBackoff {
			backoff = w.o.MaxBackoff
		}
		if until := time.Until(ev.Deadline); wait > until {
			wait = max(until, 0)
		}
		if !tick.Sleep(ctx, wait) {
			return ctx.Err()
		}
	}
}

// expire records that a request's deadline passed, and dead-letters it.
func (w *Worker) expire(ctx context.Context, ev events.Deferred, base deferred.Record, m *routeMetrics, why string) error {
	res := base
	res.State, res.Finished = deferred.StateExpired, w.o.Now().UTC()
	res.Reason = fmt.Sprintf("not processed: it %s (deadline %s)", why, ev.Deadline.Format(stream.TimeFormat))
	prev, err := w.o.Store.Transition(ctx, ev.ID, []deferred.State{deferred.StateQueued, deferred.StateSending, deferred.StateNone}, res, w.o.ResultTTL)
	if err != nil {
		return err
	}
	_ = w.o.Store.Release(ctx, ev.ID, ev.Principal.Key(), deferred.RouteKey(ev.Method, ev.Route))
	if prev.Final() {
		return nil
	}
	m.expired.Inc()
	return stream.Permanent(fmt.Errorf("%w: %s", ErrExpired, res.Reason))
}

// pace asks the limiter, at the lowest priority, until it allows the send.
// Past the deadline (unless the request was sent before) it returns ErrExpired.
func (w *Worker) pace(ctx context.Context, ev events.Deferred, sentBefore bool) error {
	req := gateway.Request{Principal: ev.Principal, IP: ev.IP.String(), Method: ev.Method, Route: ev.Route,
		Resource: ev.Resource, Cost: 1, Priority: string(events.PriorityBulk)}
	backoff := w.o.MinBackoff
	for {
		if !sentBefore && !w.o.Now().Before(ev.Deadline) {
			return ErrExpired
		}
		d, err := w.o.Limiter.Check(ctx, req)
		var wait time.Duration
		switch {
		case err != nil:
			w.o.Logger.Warn("limiter check for a deferred request", "id", ev.ID, "err", err)
			wait = backoff
			if backoff *= 2; backoff > w.o.MaxBackoff {
				backoff = w.o.MaxBackoff
			}
		case d.Allowed:
			return nil
		default:
			wait = time.Duration(max(d.RetryAfterMS, 1)) * time.Millisecond
		}
		if !sentBefore {
			if until := time.Until(ev.Deadline); wait > until {
				wait = max(until, 0)
			}
		}
		if !tick.Sleep(ctx, wait) {
			return ctx.Err()
		}
	}
}

func (w *Worker) isPaused(ctx context.Context, route string) (bool, error) {
	now := time.Now()
	w.mu.Lock()
	p, ok := w.paused[route]
	w.mu.Unlock()
	if ok && now.Sub(p.at) < w.o.PausePoll {
		return p.paused, nil
	}
	paused, err := w.o.Store.Paused(ctx, route)
	if err != nil {
		return false, err
	}
	w.mu.Lock()
	w.paused[route] = pausedAt{paused: paused, at: now}
	w.mu.Unlock()
	return paused, nil
}

func (w *Worker) waitPaused(ctx context.Context, route string, deadline time.Time) error {
	for {
		paused, err := w.isPaused(ctx, route)
		if err != nil || !paused || !w.o.Now().Before(deadline) {
			return err
		}
		if !tick.Sleep(ctx, min(w.o.PausePoll, time.Until(deadline))) {
			return ctx.Err()
		}
	}
}

// send replays ev once. An error is a transport error or a timeout.
func (w *Worker) send(ctx context.Context, ev *events.Deferred) (status int, header http.Header, body []byte, truncated bool, err error) {
	var in io.Reader = http.NoBody
	if ev.Body != "" {
		raw, err := base64.StdEncoding.DecodeString(ev.Body)
		if err != nil { // the codec checked the alphabet and padding; cannot happen
			return 0, nil, nil, false, err
		}
		in = bytes.NewReader(raw)
	}
	url := strings.TrimRight(w.o.Upstream, "/") + ev.Path
	if ev.Query != "" {
		url += "?" + ev.Query
	}
	req, err := http.NewRequestWithContext(ctx, ev.Method, url, in)
	if err != nil {
		return 0, nil, nil, false, err
	}
	for _, h := range ev.Headers {
		if !limiter.CredentialHeader(h.Name) { // the edge never stores them; never forward one either
			req.Header.Add(h.Name, h.Value)
		}
	}
	principal := ev.Principal.Key()
	req.Header.Set(deferred.HeaderIdempotency, ev.ID)
	req.Header.Set(deferred.HeaderPrincipal, principal)
	req.Header.Set(deferred.HeaderSignature, deferred.Sign(w.o.SigningKey, w.o.Now(), ev.ID, principal, ev.Method, req.URL.EscapedPath()))
	req.Header.Set(deferred.HeaderDeadline, ev.Deadline.UTC().Format(stream.TimeFormat))
	if w.o.ServiceToken != "" {
		req.Header.Set("Authorization", "Bearer "+w.o.ServiceToken)
	}
	resp, err := w.o.HTTP.Do(req)
	if err != nil {
		return 0, nil, nil, false, err
	}
	defer resp.Body.Close()
	body, err = io.ReadAll(io.LimitReader(resp.Body, int64(w.o.ResultMaxBody)+1))
	if err != nil {
		return 0, nil, nil, false, fmt.Errorf("read the upstream's answer: %w", err)
	}
	if len(body) > w.o.ResultMaxBody {
		body, truncated = body[:w.o.ResultMaxBody], true
	}
	header = http.Header{}
	for _, name := range w.o.ResultHeaders {
		if vs := resp.Header.Values(name); len(vs) > 0 {
			header[http.CanonicalHeaderKey(name)] = vs
		}
	}
	return resp.StatusCode, header, body, truncated, nil
}

// LimiterClient asks a limiter's HTTP API (POST /v1/check) with a bearer token
// (FLOODGATE_DEFERRED_LIMITER_TOKEN; a limiter with FLOODGATE_LIMITER_CALLERS
// needs one). Safe for concurrent use.
type LimiterClient struct {
	URL   string
	Token string
	HTTP  *http.Client
}

var _ gateway.Checker = (*LimiterClient)(nil)

// Check implements gateway.Checker.
func (c *LimiterClient) Check(ctx context.Context, r gateway.Request) (gateway.Decision, error) {
	body, err := json.Marshal(r)
	if err != nil {
		return gateway.Decision{}, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, strings.TrimRight(c.URL, "/")+"/v1/check", bytes.NewReader(body))
	if err != nil {
		return gateway.Decision{}, err
	}
	req.Header.Set("Content-Type", "application/json")
	if c.Token != "" {
		req.Header.Set("Authorization", "Bearer "+c.Token)
	}
	resp, err := c.HTTP.Do(req)
	if err != nil {
		return gateway.Decision{}, fmt.Errorf("check: %w", err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if err != nil {
		return gateway.Decision{}, fmt.Errorf("check: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		return gateway.Decision{}, fmt.Errorf("check: limiter answered %d: %s", resp.StatusCode, bytes.TrimSpace(raw))
	}
	var d gateway.Decision
	if err := json.Unmarshal(raw, &d); err != nil {
		return gateway.Decision{}, fmt.Errorf("check: %w", err)
	}
	return d, nil
}
