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
	"github.com/prometheus/client_golang/prometheus/promauto"
	"github.com/redis/go-redis/v9"
	"github.com/segmentio/kafka-go"

	"github.com/floodgate-dev/floodgate/pkg/config"
	"github.com/floodgate-dev/floodgate/pkg/events"
	"github.com/floodgate-dev/floodgate/pkg/gateway"
	"github.com/floodgate-dev/floodgate/pkg/httpapi"
	"github.com/floodgate-dev/floodgate/pkg/limiter"
	"github.com/floodgate-dev/floodgate/pkg/stream"
)

// DefaultTopic is where deferred requests go.
const DefaultTopic = "floodgate.deferred.v1"

// StatusPrefix is the path of a deferred request's status: StatusPrefix + id.
const StatusPrefix = "/v1/deferred/"

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
	// Producer writes to Topic (default DefaultTopic) with acks=all. Required.
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
	Logger       *slog.Logger          // default discard
	Registerer   prometheus.Registerer // nil: metrics unregistered
	Now          func() time.Time      // default time.Now
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
	return v.Err()
}

// Edge defers denied and shed requests at a gateway or the limiter's reverse
// proxy: a gateway.Deferrer. Safe for concurrent use.
type Edge struct {
	cfg     EdgeConfig
	store   *Store
	metrics *edgeMetrics

	mu       sync.Mutex
	draining map[string]drainLook // route → the last look at its drain flag
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
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &Edge{cfg: cfg, store: NewStore(cfg.Redis), metrics: newEdgeMetrics(cfg.Registerer), draining: map[string]drainLook{}}, nil
}

type edgeMetrics struct {
	deferred *prometheus.CounterVec // route
	refused  *prometheus.CounterVec // route, reason
	write    prometheus.Histogram
}

func newEdgeMetrics(reg prometheus.Registerer) *edgeMetrics {
	f := promauto.With(reg)
	return &edgeMetrics{
		deferred: f.NewCounterVec(prometheus.CounterOpts{Name: "floodgate_deferred_queued_total",
			Help: "Requests deferred (202 Accepted) at this edge, by route."}, []string{"route"}),
		refused: f.NewCounterVec(prometheus.CounterOpts{Name: "floodgate_deferred_refused_total",
			Help: "Deferrable requests answered with the plain 429 instead, by route and reason (queue_full, body_too_large, draining, store, kafka)."}, []string{"route", "reason"}),
		write: f.NewHistogram(prometheus.HistogramOpts{Name: "floodgate_deferred_write_seconds",
			Help: "Time to make one deferral durable (Redis and the acks=all Kafka write).", Buckets: prometheus.ExponentialBuckets(0.0005, 2, 14)}),
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
	if err := e.cfg.Producer.Publish(ctx, msg); err != nil {
		// The write may have reached the broker without its acknowledgement
		// reaching us. Cancel the record: a worker finding it cancelled drops
		// it; one that already claimed it is sending it, so it is accepted.
		cctx, ccancel := context.WithTimeout(context.WithoutCancel(r.Context()), time.Second)
		defer ccancel()
		rec.State, rec.Reason, rec.Finished = StateCancelled, "the request could not be queued: "+err.Error(), e.cfg.Now().UTC()
		prev, cerr := e.store.Transition(cctx, ev.ID, []State{StateQueued}, rec, e.cfg.ResultTTL)
		if cerr != nil || prev == StateQueued {
			_ = e.store.Release(cctx, ev.ID, principal, route)
			return refuse("kafka", err)
		}
		e.cfg.Logger.Info("deferral write unacknowledged but a worker already took it; accepted", "id", ev.ID, "state", prev)
	}
	e.metrics.write.Observe(e.cfg.Now().Sub(start).Seconds())
	e.metrics.deferred.WithLabelValues(route).Inc()
	writeAccepted(w, ev.ID, StateQueued, ev.Deadline, retryAfter(d))
	return true
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
