package limiter

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/netip"
	"regexp"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/segmentio/kafka-go"

	"github.com/floodgate-dev/floodgate/pkg/events"
	"github.com/floodgate-dev/floodgate/pkg/stream"
)

// Publisher takes decision events without ever blocking; false means the event was
// not queued, which the publisher counts itself. Must be safe for concurrent use.
type Publisher interface {
	TryPublish(kafka.Message) bool
}

// Server answers POST /v1/check and the health endpoints.
type Server struct {
	engine  *Engine
	period  map[events.Tier]time.Duration
	pub     Publisher
	topic   string
	gateway string
	timeout time.Duration
	log     *slog.Logger
	metrics *metrics
	ready   atomic.Bool
	reg     *prometheus.Registry
}

type metrics struct {
	decisions *prometheus.CounterVec
	duration  prometheus.Histogram
	errors    *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) *metrics {
	f := promauto.With(reg)
	return &metrics{
		decisions: f.NewCounterVec(prometheus.CounterOpts{Name: "floodgate_limiter_decisions_total", Help: "Decisions by deciding tier and outcome."}, []string{"tier", "outcome"}),
		duration: f.NewHistogram(prometheus.HistogramOpts{Name: "floodgate_limiter_check_seconds", Help: "Time to decide one check, Redis round trip included.",
			Buckets: []float64{.0001, .00025, .0005, .001, .002, .005, .01, .025, .05, .1}}),
		errors: f.NewCounterVec(prometheus.CounterOpts{Name: "floodgate_limiter_errors_total", Help: "Checks that could not be decided normally, by kind."}, []string{"kind"}),
	}
}

// ServerConfig wires a Server.
type ServerConfig struct {
	Engine       *Engine
	Rules        []Rule
	Publisher    Publisher
	Topic        string
	Gateway      string
	RedisTimeout time.Duration
	Logger       *slog.Logger
	Registry     *prometheus.Registry
}

// NewServer returns a server; it reports ready once SetReady(true) is called.
func NewServer(c ServerConfig) *Server {
	s := &Server{
		engine: c.Engine, pub: c.Publisher, topic: c.Topic, gateway: c.Gateway,
		timeout: c.RedisTimeout, log: c.Logger, reg: c.Registry,
		metrics: newMetrics(c.Registry), period: map[events.Tier]time.Duration{},
	}
	for _, r := range c.Rules {
		s.period[r.Tier] = r.Period
	}
	return s
}

// SetReady flips /readyz; main marks the server not ready first thing on SIGTERM.
func (s *Server) SetReady(ok bool) { s.ready.Store(ok) }

// Handler routes the limiter's HTTP API.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/check", s.handleCheck)
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) })
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		if !s.ready.Load() {
			http.Error(w, "not ready", http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusOK)
	})
	mux.Handle("GET /metrics", promhttp.HandlerFor(s.reg, promhttp.HandlerOpts{Registry: s.reg}))
	return mux
}

// CheckRequest is the body of POST /v1/check.
type CheckRequest struct {
	Principal events.Principal `json:"principal"`
	IP        string           `json:"ip"`
	Method    string           `json:"method"`
	Route     string           `json:"route"`
	Resource  string           `json:"resource,omitempty"`
	Cost      int              `json:"cost,omitempty"`

	addr netip.Addr // IP, parsed by validate
}

// CheckResponse is the decision and the contract the gateway must send.
type CheckResponse struct {
	ID                string            `json:"id"`
	Allowed           bool              `json:"allowed"`
	Tier              events.Tier       `json:"tier"`
	Limit             int               `json:"limit"`
	Remaining         int               `json:"remaining"`
	ResetAfterMS      int64             `json:"reset_after_ms"`
	RetryAfterMS      int64             `json:"retry_after_ms"`
	PenaltyMultiplier float64           `json:"penalty_multiplier"`
	Headers           map[string]string `json:"headers"`
	Problem           *Problem          `json:"problem,omitempty"`
}

const maxCheckBody = 8 << 10

var correlationIDPattern = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)

func (s *Server) handleCheck(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	id := r.Header.Get("X-Request-Id")
	if !correlationIDPattern.MatchString(id) {
		id = uuid.Must(uuid.NewV7()).String()
	}
	var req CheckRequest
	dec := json.NewDecoder(io.LimitReader(r.Body, maxCheckBody))
	if err := dec.Decode(&req); err != nil {
		s.problem(w, id, http.StatusBadRequest, ProblemBadRequest, "body: "+err.Error())
		return
	}
	if req.Cost == 0 {
		req.Cost = 1
	}
	if err := req.validate(); err != nil {
		s.problem(w, id, http.StatusBadRequest, ProblemBadRequest, err.Error())
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), s.timeout)
	res, err := s.engine.Check(ctx, Request{Principal: req.Principal, Cost: req.Cost})
	cancel()
	if err != nil {
		// Fail closed would turn a Redis outage into an outage of every API behind
		// the gateway; this first limiter fails open and says so in the header.
		s.metrics.errors.WithLabelValues("redis").Inc()
		s.log.Warn("check failed, failing open", "principal", req.Principal.Key(), "err", err)
		s.writeJSON(w, http.StatusOK, CheckResponse{
			ID: id, Allowed: true, Tier: events.TierPrincipal, PenaltyMultiplier: 1,
			Headers: map[string]string{"X-RateLimit-Error": "redis unavailable; failing open", "X-Request-Id": id},
		})
		return
	}
	s.metrics.duration.Observe(time.Since(start).Seconds())
	outcome := "allowed"
	if !res.Allowed {
		outcome = "denied"
	}
	s.metrics.decisions.WithLabelValues(string(res.Tier), outcome).Inc()
	s.publish(id, req, res)

	s.writeJSON(w, http.StatusOK, CheckResponse{
		ID: id, Allowed: res.Allowed, Tier: res.Tier, Limit: res.Limit, Remaining: res.Remaining,
		ResetAfterMS: res.ResetAfter.Milliseconds(), RetryAfterMS: res.RetryAfter.Milliseconds(),
		PenaltyMultiplier: res.Penalty,
		Headers:           Headers(res, s.periodOf(res.Tier), id),
		Problem:           DenialProblem(res, id),
	})
}

func (s *Server) periodOf(t events.Tier) time.Duration {
	if p, ok := s.period[t]; ok {
		return p
	}
	for _, p := range s.period { // penalty and quota decisions describe the bucket's window
		return p
	}
	return time.Second
}

func (s *Server) publish(id string, req CheckRequest, res Result) {
	ev := events.Decision{
		ID: id, TS: res.Now, Principal: req.Principal, IP: req.addr,
		Method: req.Method, Route: req.Route, Resource: req.Resource, Allowed: res.Allowed,
		Tier: res.Tier, Cost: int64(req.Cost), Limit: int64(res.Limit), Remaining: int64(res.Remaining), Gateway: s.gateway,
		NearLimit: res.Allowed && res.Limit > 0 && float64(res.Limit-res.Remaining) >= 0.8*float64(res.Limit),
	}
	if res.Penalty < 1 {
		ev.PenaltyMultiplier = res.Penalty
	}
	value, err := events.EncodeDecision(&ev)
	if err != nil { // the request was validated; this is a bug, not bad input
		s.metrics.errors.WithLabelValues("encode").Inc()
		s.log.Error("encode decision", "id", id, "err", err)
		return
	}
	msg := kafka.Message{
		Topic:   s.topic,
		Key:     []byte(req.Principal.Key()),
		Value:   value,
		Headers: stream.CloudEventHeaders(events.CETypeDecision, id, "floodgate/limiter/"+s.gateway, res.Now),
	}
	s.pub.TryPublish(msg) // never blocks; a full buffer is counted by the publisher
}

func (req *CheckRequest) validate() error {
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
	if req.Cost < 1 || req.Cost > 1_000_000 {
		return errors.New("cost: must be in 1..1000000")
	}
	return nil
}

func (s *Server) problem(w http.ResponseWriter, id string, status int, typ, detail string) {
	w.Header().Set("Content-Type", "application/problem+json")
	w.Header().Set("X-Request-Id", id)
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(Problem{Type: typ, Title: http.StatusText(status), Status: status, Detail: detail, CorrelationID: id})
}

func (s *Server) writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	if err := json.NewEncoder(w).Encode(v); err != nil {
		s.log.Debug("write response", "err", err)
	}
}
