package deferred

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"github.com/segmentio/kafka-go"

	"github.com/floodgate-dev/floodgate/pkg/config"
	"github.com/floodgate-dev/floodgate/pkg/events"
	"github.com/floodgate-dev/floodgate/pkg/gateway"
	"github.com/floodgate-dev/floodgate/pkg/httpapi"
	"github.com/floodgate-dev/floodgate/pkg/limiter"
	"github.com/floodgate-dev/floodgate/pkg/metric"
	"github.com/floodgate-dev/floodgate/pkg/stream"
	"github.com/floodgate-dev/floodgate/pkg/tick"
)

// DefaultTopic is where deferred requests go.
const DefaultTopic = "floodgate.deferred.v1"

// StatusPrefix is the path of a deferred request's status: StatusPrefix + id.
const StatusPrefix = gateway.DeferredStatusPrefix

// Publisher writes messages and returns once all in-sync replicas have them
// (acks=all), as *stream.Producer does. Must be safe for concurrent use.
type Publisher interface {
	Publish(ctx context.Context, msgs ...kafka.Message) error
}

var _ Publisher = (*stream.Producer)(nil)

// EdgeConfig configures an Edge.
type EdgeConfig struct {
	// Policy returns the deferral policy of a route (nil: not deferrable),
	// e.g. an embedded limiter's Rules().Deferral: rules reloads apply at once.
	Policy func(method, route string) *limiter.DeferPolicy
	// Redis keeps the queue bounds and the records clients poll. Required.
	Redis redis.UniversalClient
	// Producer writes to Topic (default DefaultTopic) with acks=all.
	// Required. Give it MaxAttempts 1 (stream.ProducerConfig): the edge
	// retries a failed write itself while its client waits, whereas
	// kafka-go's own retries go on after the client gave up and hold up the
	// partition's later writes.
	Producer Publisher
	Topic    string
	// Gateway names this edge in the events. Required, 1..64 characters.
	Gateway string
	// ResultTTL is how long a result is kept after the request ends (and a
	// record after its deadline); default 24h.
	ResultTTL time.Duration
	// WriteTimeout bounds the durable write of one deferral; past it the
	// client gets the plain 429. Default 5s.
	WriteTimeout time.Duration
	// StatusExpiryGrace: a record still queued this long after its deadline
	// is expired by the next status poll (a worker never first sends a
	// request past its deadline; the request may never have reached Kafka).
	// Default 1m; the worker normally expires it first, dead-lettering it.
	StatusExpiryGrace time.Duration
	Logger            *slog.Logger          // default discard
	Registerer        prometheus.Registerer // nil: metrics unregistered
	Now               func() time.Time      // default time.Now
}

// Validate checks the configuration.
func (c EdgeConfig) Validate() error {
	var v config.Check
	v.Require(c.Policy != nil, "Policy", "required")
	v.Require(c.Redis != nil, "Redis", "required")
	v.Require(c.Producer != nil, "Producer", "required")
	v.Require(len(c.Gateway) >= 1 && len(c.Gateway) <= events.MaxGatewayLen, "Gateway", "1 to 64 characters")
	v.Require(c.ResultTTL >= 0 && c.ResultTTL <= 30*24*time.Hour, "ResultTTL", "%s: must be in 0..720h (0 = 24h)", c.ResultTTL)
	v.Require(c.WriteTimeout >= 0 && c.WriteTimeout <= time.Minute, "WriteTimeout", "%s: must be in 0..1m (0 = 5s)", c.WriteTimeout)
	v.Require(c.StatusExpiryGrace >= 0 && c.StatusExpiryGrace <= time.Hour, "StatusExpiryGrace", "%s: must be in 0..1h (0 = 1m)", c.StatusExpiryGrace)
	return v.Err()
}

// Edge defers denied and shed requests at a gateway or the limiter's reverse
// proxy: a gateway.Deferrer. Safe for concurrent use.
type Edge struct {
	cfg     EdgeConfig
	store   *Store
	metrics *edgeMetrics

	gate *kafkaGate

	mu       sync.Mutex
	draining map[string]drainLook // route → the last look at its drain flag
}

// kafkaGate stops an edge from piling writes up while Kafka cannot take them.
// kafka-go's Writer keeps a batch whose caller gave up in its partition's
// queue and retries it (MaxAttempts, with backoff) ahead of every later batch
// of that partition (segmentio/kafka-go#1427). With the broker down and
// deferrals arriving at hundreds a second, abandoned batches queued up faster
// than they failed; once the broker was back, new writes waited behind them
// past their timeout, and the edge answered 429 for 4.4 s after the broker's
// return (chaos scenario deferred-kill). Now the edge's producer makes one
// attempt per write (the edge retries while its client waits: publish), and
// after a write fails deferrals are refused at once (429, reason kafka_down)
// while one deferral at a time goes through as a probe; the first write that
// succeeds opens the gate again — 0.4 s after the broker's return in the same
// scenario.
type kafkaGate struct {
	log      *slog.Logger
	writable prometheus.Gauge

	mu      sync.Mutex
	down    bool
	probing bool
}

// enter reports whether a deferral may write now, and whether it is the probe
// (which must call endProbe).
func (g *kafkaGate) enter() (ok, probe bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	switch {
	case !g.down:
		return true, false
	case !g.probing:
		g.probing = true
		return true, true
	default:
		return false, false
	}
}

func (g *kafkaGate) endProbe() {
	g.mu.Lock()
	g.probing = false
	g.mu.Unlock()
}

// result records a write's outcome.
func (g *kafkaGate) result(err error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	switch down := err != nil; {
	case down && !g.down:
		g.log.Warn("deferred writes to Kafka failing; deferrals answered 429 until one succeeds", "err", err)
	case !down && g.down:
		g.log.Info("deferred writes to Kafka succeed again")
	}
	g.down = err != nil
	if g.down {
		g.writable.Set(0)
	} else {
		g.writable.Set(1)
	}
}

type drainLook struct {
	on bool
	at time.Time
}

// isDraining reads a route's drain flag at most once a second; a Redis error
// counts as not draining (the reservation that follows fails on its own).
func (e *Edge) isDraining(ctx context.Context, route string) bool {
	now := time.Now()
	e.mu.Lock()
	l, ok := e.draining[route]
	e.mu.Unlock()
	if ok && now.Sub(l.at) < time.Second {
		return l.on
	}
	on, err := e.store.Draining(ctx, route)
	if err != nil {
		return false
	}
	e.mu.Lock()
	e.draining[route] = drainLook{on: on, at: now}
	e.mu.Unlock()
	return on
}

var _ gateway.Deferrer = (*Edge)(nil)

// NewEdge validates cfg and returns an Edge.
func NewEdge(cfg EdgeConfig) (*Edge, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("deferred edge: %w", err)
	}
	if cfg.Topic == "" {
		cfg.Topic = DefaultTopic
	}
	if cfg.ResultTTL == 0 {
		cfg.ResultTTL = 24 * time.Hour
	}
	if cfg.WriteTimeout == 0 {
		cfg.WriteTimeout = 5 * time.Second
	}
	if cfg.StatusExpiryGrace == 0 {
		cfg.StatusExpiryGrace = time.Minute
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	m := newEdgeMetrics(cfg.Registerer)
	m.writable.Set(1)
	return &Edge{cfg: cfg, store: NewStore(cfg.Redis), metrics: m, draining: map[string]drainLook{},
		gate: &kafkaGate{log: cfg.Logger, writable: m.writable}}, nil
}

type edgeMetrics struct {
	deferred *prometheus.CounterVec // route
	refused  *prometheus.CounterVec // route, reason
	write    prometheus.Histogram
	unknown  *prometheus.CounterVec // route
	writable prometheus.Gauge
}

func newEdgeMetrics(reg prometheus.Registerer) *edgeMetrics {
	f := metric.With(reg)
	return &edgeMetrics{
		deferred: f.CounterVec("floodgate_deferred_queued_total", "Requests deferred (202 Accepted) at this edge, by route.", "route"),
		refused:  f.CounterVec("floodgate_deferred_refused_total", "Deferrable requests answered with the plain 429 instead, by route and reason (queue_full, body_too_large, draining, store, kafka, kafka_down, invalid, body_read).", "route", "reason"),
		write:    f.Histogram("floodgate_deferred_write_seconds", "Time to make one deferral durable (Redis and the acks=all Kafka write).", prometheus.ExponentialBuckets(0.0005, 2, 14)),
		unknown:  f.CounterVec("floodgate_deferred_unknown_total", "Deferrals answered 202 with status unknown: the Kafka write failed without an answer and Redis could not record the cancel; the client's poll ends done or expired.", "route"),
		writable: f.Gauge("floodgate_deferred_kafka_writable", "1 while this edge's last deferred write to Kafka succeeded; 0 while deferrals are refused (reason kafka_down) and one write at a time probes Kafka."),
	}
}

// deferrableTier: a request denied by its principal's penalty or its daily
// quota is not deferred — waiting max_age would not make it acceptable.
func deferrableTier(d gateway.Decision) bool {
	return d.Shed || d.Tier != string(events.TierPenalty) && d.Tier != string(events.TierQuota)
}

// accepted is the body of a 202 and of a pending status.
type accepted struct {
	ID       string `json:"id"`
	Status   State  `json:"status"`
	Location string `json:"location"`
	Deadline string `json:"deadline"`
}

// Defer implements gateway.Deferrer.
func (e *Edge) Defer(w http.ResponseWriter, r *http.Request, req gateway.Request, d gateway.Decision) bool {
	pol := e.cfg.Policy(req.Method, req.Route)
	if pol == nil || !deferrableTier(d) {
		return false
	}
	route := RouteKey(req.Method, req.Route)
	refuse := func(reason string, err error) bool {
		e.metrics.refused.WithLabelValues(route, reason).Inc()
		if err != nil {
			e.cfg.Logger.Warn("deferral refused; answering 429", "route", route, "principal", req.Principal.Key(), "reason", reason, "err", err)
		}
		return false
	}
	if e.isDraining(r.Context(), route) {
		return refuse("draining", nil)
	}
	ok, probe := e.gate.enter()
	if !ok {
		return refuse("kafka_down", nil)
	}
	if probe {
		defer e.gate.endProbe()
	}
	var body []byte
	if r.Body != nil && r.Body != http.NoBody {
		var err error
		body, err = io.ReadAll(io.LimitReader(r.Body, int64(pol.MaxBody)+1))
		if err != nil {
			return refuse("body_read", err)
		}
		if len(body) > pol.MaxBody {
			return refuse("body_too_large", nil)
		}
	}
	start := e.cfg.Now()
	now := start.UTC().Truncate(time.Millisecond)
	ev := events.Deferred{
		ID: uuid.Must(uuid.NewV7()).String(), TS: now, Deadline: now.Add(pol.MaxAge),
		Principal: req.Principal, Method: req.Method, Route: req.Route, Resource: req.Resource,
		Path: r.URL.EscapedPath(), Query: r.URL.RawQuery, Headers: []events.Header{},
		DecisionID: d.ID, Rule: pol.RuleID, Shed: d.Shed, Gateway: e.cfg.Gateway,
	}
	ip, err := netip.ParseAddr(req.IP)
	if err != nil {
		return refuse("invalid", err)
	}
	ev.IP = ip
	if ev.DecisionID == "" {
		ev.DecisionID = ev.ID
	}
	if len(body) > 0 {
		ev.Body = base64.StdEncoding.EncodeToString(body)
	}
	for _, name := range pol.Headers {
		for _, v := range r.Header.Values(name) {
			if v != "" && len(ev.Headers) < events.MaxDeferredHeaders {
				ev.Headers = append(ev.Headers, events.Header{Name: name, Value: v})
			}
		}
	}
	value, err := events.EncodeDeferred(&ev)
	if err != nil { // a path or header the contract refuses: not deferrable
		return refuse("invalid", err)
	}
	principal := req.Principal.Key()

	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), e.cfg.WriteTimeout)
	defer cancel()
	if err := e.store.Reserve(ctx, ev.ID, principal, route, ev.Deadline, pol.MaxQueuedRoute, pol.MaxQueuedPrincipal); err != nil {
		if errors.Is(err, ErrQueueFull) {
			e.cfg.Logger.Debug("deferral refused: queue full", "route", route, "principal", principal, "err", err)
			return refuse("queue_full", nil)
		}
		return refuse("store", err)
	}
	rec := Record{State: StateQueued, Principal: principal, Method: req.Method, Route: req.Route, Deadline: ev.Deadline}
	if _, err := e.store.Transition(ctx, ev.ID, []State{StateNone}, rec, pol.MaxAge+e.cfg.ResultTTL); err != nil {
		_ = e.store.Release(context.WithoutCancel(ctx), ev.ID, principal, route)
		return refuse("store", err)
	}
	msg := kafka.Message{Topic: e.cfg.Topic, Key: []byte(principal), Value: value, Time: now,
		Headers: stream.CloudEventHeaders(events.CETypeDeferred, ev.ID, "floodgate/edge/"+e.cfg.Gateway, now)}
	err = e.publish(ctx, msg)
	if err != nil {
		// The write may have reached the broker without its acknowledgement
		// reaching us. Cancel the record: a worker finding it cancelled drops
		// it; one that already claimed it is sending it, so it is accepted.
		rec.State, rec.Reason, rec.Finished = StateCancelled, "the request could not be queued: "+err.Error(), e.cfg.Now().UTC()
		prev, cerr := e.cancel(r.Context(), ev.ID, rec)
		switch {
		case cerr == nil && (prev == StateQueued || prev == StateCancelled):
			// Cancelled: no worker will send it. (StateCancelled: an earlier try
			// of this cancel — or a go-redis retry of it — did it, its answer lost.)
			_ = e.store.Release(context.WithoutCancel(ctx), ev.ID, principal, route)
			return refuse("kafka", err)
		case cerr == nil && prev != StateNone:
			e.cfg.Logger.Info("deferral write unacknowledged but a worker already took it; accepted", "id", ev.ID, "state", prev)
		default:
			// Neither cancelled nor known to be taken: the request may be in
			// the log and will then be replayed, or it is not and its record
			// stays queued until a status poll past the deadline expires it.
			// A 429 would be false in the first case; the 202 tells the
			// client to look, and what it finds is the truth either way.
			e.cfg.Logger.Warn("deferral write unacknowledged and its cancel not recorded; answering 202 with status unknown",
				"id", ev.ID, "route", route, "principal", principal, "err", err, "cancel_err", cerr, "state", prev)
			e.metrics.unknown.WithLabelValues(route).Inc()
			w.Header().Set(HeaderDeferredStatus, string(StateUnknown))
			writeAccepted(w, ev.ID, StateUnknown, ev.Deadline, retryAfter(d))
			return true
		}
	}
	e.metrics.write.Observe(e.cfg.Now().Sub(start).Seconds())
	e.metrics.deferred.WithLabelValues(route).Inc()
	writeAccepted(w, ev.ID, StateQueued, ev.Deadline, retryAfter(d))
	return true
}

// publish writes msg, trying again after a failure until ctx ends: the
// retries are the waiting client's own (a Producer with MaxAttempts 1 keeps
// no batch of a client that gave up). A message written twice is one
// request: the worker handles one partition's messages in order and drops
// the second copy once the first is final.
func (e *Edge) publish(ctx context.Context, msg kafka.Message) error {
	wait := 25 * time.Millisecond
	for {
		err := e.cfg.Producer.Publish(ctx, msg)
		e.gate.result(err)
		var tooLarge kafka.MessageTooLargeError
		if err == nil || errors.As(err, &tooLarge) {
			return err
		}
		if dl, ok := ctx.Deadline(); ok && time.Until(dl) < wait {
			return err
		}
		if !tick.Sleep(ctx, wait) {
			return err
		}
		wait = min(2*wait, 200*time.Millisecond)
	}
}

// cancel moves id's record queued → cancelled, trying for up to a second
// and a half while Redis fails. It returns the state it found.
func (e *Edge) cancel(ctx context.Context, id string, rec Record) (State, error) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 1500*time.Millisecond)
	defer cancel()
	wait := 50 * time.Millisecond
	for {
		prev, err := e.store.Transition(ctx, id, []State{StateQueued}, rec, e.cfg.ResultTTL)
		if err == nil {
			return prev, nil
		}
		if !tick.Sleep(ctx, wait) {
			return "", err
		}
		wait *= 2
	}
}

// retryAfter is when the client should first look: the limiter's own retry
// time, at least a second.
func retryAfter(d gateway.Decision) int64 {
	s := (d.RetryAfterMS + 999) / 1000
	if s < 1 {
		s = 1
	}
	return s
}

func writeAccepted(w http.ResponseWriter, id string, st State, deadline time.Time, retry int64) {
	loc := StatusPrefix + id
	h := w.Header()
	h.Set("Location", loc)
	h.Set("Retry-After", strconv.FormatInt(retry, 10))
	h.Set("Content-Type", "application/json")
	h.Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusAccepted)
	_ = json.NewEncoder(w).Encode(accepted{ID: id, Status: st, Location: loc, Deadline: deadline.UTC().Format(stream.TimeFormat)})
}

// HeaderDeferredStatus tells a client polling its Location what the answer
// is: queued, sending, done, dead, expired or cancelled.
const HeaderDeferredStatus = "Floodgate-Deferred-Status"

// ServeStatus implements gateway.Deferrer: GET (or HEAD) /v1/deferred/{id},
// readable only by the principal that made the request.
func (e *Edge) ServeStatus(w http.ResponseWriter, r *http.Request, p events.Principal) bool {
	id, ok := strings.CutPrefix(r.URL.Path, StatusPrefix)
	if !ok || r.Method != http.MethodGet && r.Method != http.MethodHead {
		return false
	}
	w.Header().Set("Cache-Control", "no-store")
	if events.ValidID(id) != nil {
		problem(w, r, http.StatusNotFound, httpapi.ProblemNotFound, "no such deferred request")
		return true
	}
	ctx, cancel := context.WithTimeout(r.Context(), time.Second)
	defer cancel()
	rec, found, err := e.store.Get(ctx, id)
	switch {
	case err != nil:
		e.cfg.Logger.Warn("deferred status", "id", id, "err", err)
		problem(w, r, http.StatusServiceUnavailable, httpapi.ProblemUnavailable, "the status of deferred requests cannot be read now; retry")
		return true
	case !found || rec.Principal != p.Key(): // another principal's id looks like an unknown one
		problem(w, r, http.StatusNotFound, httpapi.ProblemNotFound, "no such deferred request (results are kept for a limited time)")
		return true
	}
	if rec.State == StateQueued && e.cfg.Now().After(rec.Deadline.Add(e.cfg.StatusExpiryGrace)) {
		// Never claimed by a worker and past its deadline: no worker will
		// send it now. Expire it (compare-and-set, so a worker's claim and
		// this cannot both win) and tell the client.
		exp := rec
		exp.State, exp.Finished = StateExpired, e.cfg.Now().UTC()
		exp.Reason = fmt.Sprintf("not processed: still queued at its deadline %s (the request may never have reached the queue)", rec.Deadline.UTC().Format(stream.TimeFormat))
		prev, err := e.store.Transition(ctx, id, []State{StateQueued}, exp, e.cfg.ResultTTL)
		switch {
		case err != nil:
			e.cfg.Logger.Warn("deferred status: expire", "id", id, "err", err)
		case prev == StateQueued:
			rec = exp
		default:
			if again, found, err := e.store.Get(ctx, id); err == nil && found {
				rec = again
			}
		}
	}
	w.Header().Set(HeaderDeferredStatus, string(rec.State))
	switch rec.State {
	case StateQueued, StateSending:
		writeAccepted(w, id, rec.State, rec.Deadline, 1)
	case StateDone, StateDead:
		for k, vs := range rec.Header {
			for _, v := range vs {
				w.Header().Add(k, v)
			}
		}
		w.WriteHeader(rec.Status)
		_, _ = w.Write(rec.Body)
	case StateExpired:
		problem(w, r, http.StatusGone, ProblemExpired, rec.Reason)
	default: // cancelled
		problem(w, r, http.StatusGone, ProblemNotAccepted, rec.Reason)
	}
	return true
}

func problem(w http.ResponseWriter, r *http.Request, status int, typ, detail string) {
	httpapi.WriteProblem(w, r, httpapi.Problem{Type: typ, Title: http.StatusText(status), Status: status, Detail: detail})
}

// Problem types of a deferred request's status.
const (
	ProblemExpired     = httpapi.ProblemBase + "deferred-expired"      // 410: max_age passed before it could be sent
	ProblemNotAccepted = httpapi.ProblemBase + "deferred-not-accepted" // 410: the edge could not queue it (the client got a 429)
)
