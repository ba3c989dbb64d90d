package server

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
	"github.com/segmentio/kafka-go"
	"go.opentelemetry.io/otel/attribute"

	"github.com/floodgate-dev/floodgate/pkg/events"
	"github.com/floodgate-dev/floodgate/pkg/httpapi"
	"github.com/floodgate-dev/floodgate/pkg/limiter"
	"github.com/floodgate-dev/floodgate/pkg/limiter/callers"
	"github.com/floodgate-dev/floodgate/pkg/limiter/checkapi"
	"github.com/floodgate-dev/floodgate/pkg/metric"
	"github.com/floodgate-dev/floodgate/pkg/stream"
	"github.com/floodgate-dev/floodgate/pkg/tracing"
)

// Publisher takes decision events without ever blocking; false means the event was
// not queued, which the publisher counts itself. Must be safe for concurrent use.
type Publisher interface {
	TryPublish(kafka.Message) bool
}

// Observer receives every decision's per-scope outcome (the InfluxDB counts).
// Must be safe for concurrent use and must not block.
type Observer interface {
	Observe(scope string, tier events.Tier, allowed, shadow bool)
}

// Server answers POST /v1/check, POST /v1/check/batch and the health endpoints.
type Server struct {
	gone    goneGate // which HTTP checks callerGone peeks at
	callers *callers.Callers
	engine  *limiter.Engine
	pub     Publisher
	obs     Observer
	topic   string
	gateway string
	// trusted: the gateway is a valid event member (events.ValidGateway),
	// so Emit's events are valid by construction and are not validated
	// again (emitAppend).
	trusted bool
	log     *slog.Logger
	metrics *metrics
	ready   atomic.Bool
	reg     *prometheus.Registry
	tracing tracing.Tracing
	tracer  *stream.Tracer // nil: tracing off
	scratch sync.Pool      // *eventScratch (emit.go)
	// checkTimeout is a check's deadline when its caller names none (SetCheckTimeout).
	checkTimeout time.Duration
	// envoyJSON answers envoy ratelimit's /json (ServeEnvoyJSON; nil: 404).
	envoyJSON rlsv3.RateLimitServiceServer
}

type metrics struct {
	decisions *prometheus.CounterVec
	shadow    *prometheus.CounterVec
	nearLimit *prometheus.CounterVec
	degraded  prometheus.Counter
	duration  prometheus.Histogram
	errors    *prometheus.CounterVec
	batch     prometheus.Histogram

	unauthenticated prometheus.Counter
	pastDeadline    *prometheus.CounterVec

	// decisionSeries holds decisions' series of the known tiers (by
	// tierIndex, then allowed 0 / denied 1), resolved at their first
	// decision: a decision then costs no hashing of label values (a
	// series still appears on /metrics only once counted).
	decisionSeries [6][2]metric.Series
}

// decision is floodgate_limiter_decisions_total's series of a decision.
func (m *metrics) decision(tier events.Tier, allowed bool) prometheus.Counter {
	o, outcome := 0, "allowed"
	if !allowed {
		o, outcome = 1, "denied"
	}
	i := tierIndex(tier)
	if i < 0 {
		return m.decisions.WithLabelValues(string(tier), outcome)
	}
	return m.decisionSeries[i][o].Get(func() prometheus.Counter { return m.decisions.WithLabelValues(string(tier), outcome) })
}

// tierIndex numbers decision.v1's tiers; -1 for any other.
func tierIndex(t events.Tier) int {
	switch t {
	case events.TierIP:
		return 0
	case events.TierPrincipal:
		return 1
	case events.TierEndpoint:
		return 2
	case events.TierResource:
		return 3
	case events.TierQuota:
		return 4
	case events.TierPenalty:
		return 5
	}
	return -1
}

func newMetrics(reg prometheus.Registerer) *metrics {
	f := promauto.With(reg)
	return &metrics{
		decisions: f.NewCounterVec(prometheus.CounterOpts{Name: "floodgate_limiter_decisions_total", Help: "Decisions by deciding tier and outcome."}, []string{"tier", "outcome"}),
		shadow:    f.NewCounterVec(prometheus.CounterOpts{Name: "floodgate_limiter_shadow_total", Help: "Requests a shadow rule would have denied, by rule (scope)."}, []string{"scope"}),
		nearLimit: f.NewCounterVec(prometheus.CounterOpts{Name: "floodgate_limiter_near_limit_total", Help: "Allowed decisions at or over the near-limit ratio of their deciding rule, by rule (scope)."}, []string{"scope"}),
		degraded:  f.NewCounter(prometheus.CounterOpts{Name: "floodgate_limiter_degraded_decisions_total", Help: "Decisions answered by fail policies because Redis was not asked in time."}),
		duration: f.NewHistogram(prometheus.HistogramOpts{Name: "floodgate_limiter_check_seconds", Help: "Time to decide one check, Redis round trip included.",
			Buckets: []float64{.0001, .00025, .0005, .001, .002, .005, .01, .025, .05, .1}}),
		errors: f.NewCounterVec(prometheus.CounterOpts{Name: "floodgate_limiter_errors_total", Help: "Checks that could not be decided normally, by kind."}, []string{"kind"}),
		batch: f.NewHistogram(prometheus.HistogramOpts{Name: "floodgate_limiter_batch_size", Help: "Checks per batch request.",
			Buckets: []float64{1, 2, 5, 10, 20, 50, 100}}),
		unauthenticated: f.NewCounter(prometheus.CounterOpts{Name: "floodgate_limiter_unauthenticated_total", Help: "Check requests refused for a missing or unknown bearer token."}),
		pastDeadline: f.NewCounterVec(prometheus.CounterOpts{Name: "floodgate_limiter_calls_dropped_past_deadline_total",
			Help: "Checks not decided because their caller's deadline had passed (on arrival at the engine, waiting for a permit or a pipeline), by protocol and priority."}, []string{"protocol", "priority"}),
	}
}

// Config wires a Server.
type Config struct {
	// Callers, when set, is who may ask for checks (bearer tokens and what
	// each may claim); nil serves anyone — meant for a limiter on loopback
	// beside its gateway.
	Callers   *callers.Callers
	Engine    *limiter.Engine
	Publisher Publisher
	Observer  Observer // nil = none
	Topic     string
	Gateway   string
	Logger    *slog.Logger
	Registry  *prometheus.Registry
	// Tracing, when on, makes every decision a "create <topic>" producer
	// span (the child of the request's span: HTTP, batch, Envoy gRPC or the
	// embedded Check) whose context its event carries in the traceparent
	// header, and NewGRPCServer's RPCs server spans. Off costs nothing.
	Tracing tracing.Tracing
}

// New returns a server; it reports ready once SetReady(true) is called.
func New(c Config) *Server {
	if c.Callers != nil && c.Registry != nil {
		_ = c.Registry.Register(c.Callers) // floodgate_limiter_forbidden_total; already there when a second server shares the registry
	}
	return &Server{
		callers: c.Callers, engine: c.Engine, pub: c.Publisher, obs: c.Observer, topic: c.Topic, gateway: c.Gateway,
		trusted: events.ValidGateway(c.Gateway) == nil, log: c.Logger, reg: c.Registry, metrics: newMetrics(c.Registry),
		tracing: c.Tracing, tracer: stream.NewTracer(c.Tracing),
	}
}

// Engine is the engine the server decides with.
func (s *Server) Engine() *limiter.Engine { return s.engine }

// Registry is where the server's metrics (and its transports') are registered.
func (s *Server) Registry() *prometheus.Registry { return s.reg }

// Callers are who may ask for checks; nil serves anyone.
func (s *Server) Callers() *callers.Callers { return s.callers }

// Tracing is the server's tracing setup.
func (s *Server) Tracing() tracing.Tracing { return s.tracing }

// Gateway names this limiter in its decision events.
func (s *Server) Gateway() string { return s.gateway }

// Logger is the server's logger.
func (s *Server) Logger() *slog.Logger { return s.log }

// CountError counts a check that could not be decided normally, by kind.
func (s *Server) CountError(kind string) { s.metrics.errors.WithLabelValues(kind).Inc() }

// CountDegraded counts a decision answered by fail policies.
func (s *Server) CountDegraded() { s.metrics.degraded.Inc() }

// SetReady flips /readyz; main marks the server not ready first thing on SIGTERM.
func (s *Server) SetReady(ok bool) { s.ready.Store(ok) }

// Handler routes the limiter's check API: POST /v1/check and its batch
// form, and envoy ratelimit's POST /json and GET /healthcheck (envoyjson.go).
// /healthz, /readyz and /metrics are not its: the service's runner
// (pkg/service) serves one of each in front of it, /readyz answered by
// ServeReady (the limiter's readiness: Redis shards, journal, drain).
func (s *Server) Handler() http.Handler {
	mux := httpapi.NewMux() // lists its routes for the OpenAPI drift test
	mux.HandleFunc("POST /v1/check", s.handleCheck)
	mux.HandleFunc("POST /v1/check/batch", s.handleBatch)
	mux.HandleFunc("POST /json", s.handleEnvoyJSON)
	mux.HandleFunc("GET /healthcheck", s.handleHealthcheck)
	return mux
}

const maxCheckBody = 8 << 10

// requestID is the request's correlation id (pkg/httpapi): the one its
// middleware put in the context, else the caller's X-Request-Id when it is
// well formed, or a new one. It is echoed and logged, never used as a
// decision's id: consumers deduplicate by decision id, so a caller who could
// choose it could make twenty checks count once (issue 22 S7).
func requestID(r *http.Request) string {
	if id := httpapi.RequestID(r.Context()); id != "" {
		return id
	}
	if id := r.Header.Get(httpapi.HeaderRequestID); httpapi.ValidRequestID(id) {
		return id
	}
	return NewDecisionID()
}

// ids are a check's decision id (always minted here) and its correlation id
// (the request's, pkg/httpapi, or the decision id when there is none).
func ids(r *http.Request) (decision, corr string) {
	decision, corr = NewDecisionID(), httpapi.RequestID(r.Context())
	if corr == "" {
		if corr = r.Header.Get(httpapi.HeaderRequestID); !httpapi.ValidRequestID(corr) {
			corr = decision
		}
	}
	return decision, corr
}

func (s *Server) handleCheck(w http.ResponseWriter, r *http.Request) {
	did, id := ids(r)
	var req checkapi.CheckRequest
	cl, deadline, ok := s.begin(w, r, id, &req, maxCheckBody)
	if !ok {
		return
	}
	if status, typ, err := s.vet(cl, &req); err != nil {
		s.problem(w, id, status, typ, err.Error())
		return
	}
	res := s.DecideCall(r.Context(), did, &req, Call{Protocol: ProtocolHTTP, Deadline: deadline})
	bp := respBufs.Get().(*[]byte)
	s.answer(w, id, bp, appendCheckResponse((*bp)[:0], did, id, res))
}

// vet checks a decoded check before it is decided — its fields, the
// caller's right to name its principal (when callers are configured), its
// cost — and on a refusal returns the problem's status and type with why.
func (s *Server) vet(cl callers.Caller, req *checkapi.CheckRequest) (int, string, error) {
	if err := req.Validate(); err != nil {
		return http.StatusBadRequest, httpapi.ProblemInvalidRequest, err
	}
	if s.callers != nil {
		if err := cl.Permit(req); err != nil {
			return http.StatusForbidden, httpapi.ProblemForbidden, err
		}
	}
	if err := s.CheckCost(req); err != nil {
		return http.StatusBadRequest, httpapi.ProblemCostOverLimit, err
	}
	return 0, "", nil
}

// answer writes body (JSON built in *bp) with 200 and puts *bp back in the
// pool, grown to body's capacity.
func (s *Server) answer(w http.ResponseWriter, id string, bp *[]byte, body []byte) {
	h := w.Header()
	if v := h[httpapi.HeaderRequestID]; len(v) != 1 || v[0] != id { // httpapi.Middleware has set it already
		h[httpapi.HeaderRequestID] = []string{id}
	}
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(http.StatusOK)
	if _, err := w.Write(body); err != nil {
		s.log.Debug("write response", "err", err)
	}
	*bp = body
	respBufs.Put(bp)
}

// begin authenticates the caller, reads the call's deadline and decodes the
// JSON body, at most limit bytes of it, into v. When one fails it has
// answered with the problem and returns false.
func (s *Server) begin(w http.ResponseWriter, r *http.Request, id string, v any, limit int64) (callers.Caller, time.Time, bool) {
	cl, ok := s.authenticate(w, r, id)
	if !ok {
		return cl, time.Time{}, false
	}
	deadline, err := s.httpDeadline(r)
	if err != nil {
		s.problem(w, id, http.StatusBadRequest, httpapi.ProblemInvalidRequest, err.Error())
		return cl, deadline, false
	}
	if s.callerGone(w, r) {
		return cl, deadline, false
	}
	if err := decodeBody(r.Body, limit, v); err != nil {
		s.problem(w, id, http.StatusBadRequest, httpapi.ProblemInvalidRequest, "body: "+err.Error())
		return cl, deadline, false
	}
	return cl, deadline, true
}

// decodeBody decodes into v (a pointer to a struct) the first JSON value of
// at most limit bytes of body, with the result and the error of
// json.NewDecoder(io.LimitReader(body, limit)).Decode(v), at less cost: the
// bytes are read into a pooled buffer, and when they are one JSON value
// (every well-formed check) json.Unmarshal decodes them, which is what
// Decode does once it has read the value, without a Decoder's allocations.
// A check in the plain form gateways send is decoded by decodeCheck, with
// json.Unmarshal's result, for less still. Anything else (an empty or
// malformed body, a value with more after it, a read error) is decoded as
// before, by a Decoder over the same bytes, into a v set back to zero.
func decodeBody(body io.Reader, limit int64, v any) error {
	bp := respBufs.Get().(*[]byte)
	defer respBufs.Put(bp)
	buf, rerr := readUpTo(body, (*bp)[:0], limit)
	*bp = buf[:0]
	return decodeBytes(buf, rerr, v)
}

// decodeBytes is decodeBody of the body's first bytes, buf, read up to its
// limit; rerr is the error that ended the read (nil: the body's end or the
// limit).
func decodeBytes(buf []byte, rerr error, v any) error {
	if rerr == nil {
		if req, ok := v.(*checkapi.CheckRequest); ok && decodeCheck(buf, req) {
			return nil
		}
		if err := json.Unmarshal(buf, v); err == nil {
			return nil
		}
		reflect.ValueOf(v).Elem().SetZero()
	}
	var src io.Reader = bytes.NewReader(buf)
	if rerr != nil {
		src = io.MultiReader(src, errReader{rerr})
	}
	return json.NewDecoder(src).Decode(v)
}

// readUpTo appends r's bytes to buf until r ends or buf holds limit bytes;
// the error is r's other than io.EOF.
func readUpTo(r io.Reader, buf []byte, limit int64) ([]byte, error) {
	for int64(len(buf)) < limit {
		if len(buf) == cap(buf) {
			buf = slices.Grow(buf, int(min(int64(max(cap(buf), 512)), limit-int64(len(buf)))))
		}
		n, err := r.Read(buf[len(buf):int(min(int64(cap(buf)), limit))])
		buf = buf[:len(buf)+n]
		if err == io.EOF {
			return buf, nil
		}
		if err != nil {
			return buf, err
		}
	}
	return buf, nil
}

// errReader fails every read with err.
type errReader struct{ err error }

func (e errReader) Read([]byte) (int, error) { return 0, e.err }

func (s *Server) handleBatch(w http.ResponseWriter, r *http.Request) {
	id := requestID(r)
	var br checkapi.BatchRequest
	cl, deadline, ok := s.begin(w, r, id, &br, checkapi.MaxBatch*maxCheckBody)
	if !ok {
		return
	}
	if len(br.Checks) == 0 || len(br.Checks) > checkapi.MaxBatch {
		s.problem(w, id, http.StatusBadRequest, httpapi.ProblemInvalidRequest, fmt.Sprintf("checks: %d items, want 1..%d", len(br.Checks), checkapi.MaxBatch))
		return
	}
	s.metrics.batch.Observe(float64(len(br.Checks)))
	answers := make([]batchAnswer, len(br.Checks))
	var wg sync.WaitGroup
	for i, raw := range br.Checks {
		cid := fmt.Sprintf("%s-%d", id, i)
		if len(cid) > 64 {
			cid = uuid.Must(uuid.NewV7()).String()
		}
		var req checkapi.CheckRequest
		code, typ := http.StatusBadRequest, httpapi.ProblemInvalidRequest
		err := json.Unmarshal(raw, &req)
		if err == nil {
			code, typ, err = s.vet(cl, &req)
		}
		if err != nil {
			answers[i] = batchAnswer{id: cid, corr: cid, invalid: &httpapi.Problem{Type: typ,
				Title: http.StatusText(code), Status: code, Detail: err.Error(), CorrelationID: cid}}
			continue
		}
		wg.Add(1)
		go func() { // independent principals live on independent keys: decide them concurrently
			defer wg.Done()
			did := NewDecisionID()
			answers[i] = batchAnswer{id: did, corr: cid, res: s.DecideCall(r.Context(), did, &req, Call{Protocol: ProtocolHTTP, Deadline: deadline})}
		}()
	}
	wg.Wait()
	bp := respBufs.Get().(*[]byte)
	s.answer(w, id, bp, appendBatchResponse((*bp)[:0], answers))
}

// Decide runs one validated check, records and publishes it, and builds the answer.
func (s *Server) Decide(ctx context.Context, id string, req *checkapi.CheckRequest) checkapi.CheckResponse {
	return checkResponse(id, id, s.DecideResult(ctx, id, req))
}

// engineRequest is the engine's form of a validated check.
func engineRequest(req *checkapi.CheckRequest) limiter.Request {
	return limiter.Request{Principal: req.Principal, IP: req.Addr(), Method: req.Method,
		Route: req.Route, Resource: req.Resource, Plan: req.Plan, Cost: req.Cost, Priority: req.ParsedPriority()}
}

// CheckCost refuses a validated check whose cost is over the max_cost of a
// rule or quota it matches (a *CostError), before anything is counted or
// published; every interface asks it before deciding.
func (s *Server) CheckCost(req *checkapi.CheckRequest) error {
	if err := s.engine.CheckCost(engineRequest(req)); err != nil {
		s.metrics.errors.WithLabelValues("cost").Inc()
		return err
	}
	return nil
}

// DecideResult runs one validated check of an in-process caller (its
// deadline is ctx's): DecideCall.
func (s *Server) DecideResult(ctx context.Context, id string, req *checkapi.CheckRequest) limiter.Result {
	return s.DecideCall(ctx, id, req, Call{Protocol: ProtocolInProcess, Deadline: s.DeadlineOf(ctx)})
}

// DecideCall runs one validated check, counts it and publishes its decision
// event; every interface (HTTP, batch, Envoy gRPC, in-process) goes through
// it. A check whose caller's deadline passes before it is decided is
// answered as the caller fails open (DeadlineReason), counted apart and not
// published.
func (s *Server) DecideCall(ctx context.Context, id string, req *checkapi.CheckRequest, call Call) limiter.Result {
	start := time.Now()
	ereq := engineRequest(req)
	ereq.Deadline = call.Deadline
	res, err := s.engine.Check(ctx, ereq)
	if late, ok := s.pastDeadline(ctx, call, req, res, err); ok {
		return late
	}
	if err != nil {
		// Only a caller gone away or a malformed script answer end here; fail open
		// and say so, like every degraded answer.
		s.metrics.errors.WithLabelValues("check").Inc()
		s.log.Warn("check failed, failing open", "principal", req.Principal.Key(), "err", err)
		res = limiter.Result{Allowed: true, Tier: events.TierPrincipal, Penalty: 1, Scale: 1, Degraded: true,
			Error: "check failed", Now: time.Now().UTC(), Cost: max(req.Cost, 1)}
	}
	s.metrics.duration.Observe(time.Since(start).Seconds())
	s.metrics.decision(res.Tier, res.Allowed).Inc()
	scope := res.Rule
	switch {
	case res.Shed:
		// Shed requests are counted apart, by priority: "shed:bulk", ….
		scope = "shed:" + res.Priority.String()
	case scope == "":
		scope = "none"
	}
	if res.Shadow {
		s.metrics.shadow.WithLabelValues(res.ShadowRule).Inc()
	}
	if res.NearLimit {
		s.metrics.nearLimit.WithLabelValues(scope).Inc()
	}
	if res.Degraded {
		s.metrics.degraded.Inc()
	}
	if s.obs != nil {
		s.obs.Observe(scope, res.Tier, res.Allowed, false)
		if res.Shadow {
			s.obs.Observe(res.ShadowRule, res.Tier, res.Allowed, true)
		}
	}
	s.publish(ctx, id, req, res)
	return res
}

func checkResponse(id, corr string, res limiter.Result) checkapi.CheckResponse {
	return checkapi.CheckResponse{
		ID: id, Allowed: res.Allowed, Tier: res.Tier, Rule: res.Rule, Limit: res.Limit, Remaining: res.Remaining,
		ResetAfterMS: res.ResetAfter.Milliseconds(), RetryAfterMS: res.RetryAfter.Milliseconds(),
		PenaltyMultiplier: res.Penalty, Scale: res.Scale, Shadow: res.Shadow, NearLimit: res.NearLimit, Degraded: res.Degraded,
		Priority: res.Priority.String(), Shed: res.Shed, Utilization: res.Utilization,
		Headers: Headers(res, corr),
		Problem: DenialProblem(res, corr),
	}
}

func (s *Server) publish(ctx context.Context, id string, req *checkapi.CheckRequest, res limiter.Result) {
	ev := DecisionEvent(id, s.gateway, limiter.Request{Principal: req.Principal, IP: req.Addr(), Method: req.Method, Route: req.Route,
		Resource: req.Resource}, res)
	s.Emit(ctx, &ev)
}

// DecisionEvent is the decision.v1 event of res, the answer to req, by
// gateway: what every interface of the limiter publishes (the what-if's
// fidelity test records its traffic with it too). It is valid when req was
// (checkapi.CheckRequest.Validate), the id is a decision id and the gateway
// a valid one (events.ValidGateway): the engine's numbers are kept within
// the contract here, so Emit encodes it without validating it again
// (FuzzDecisionEventIsValid).
func DecisionEvent(id, gateway string, req limiter.Request, res limiter.Result) events.Decision {
	ev := events.Decision{
		ID: id, TS: res.Now, Principal: req.Principal, IP: req.IP,
		Method: req.Method, Route: req.Route, Resource: req.Resource, Allowed: res.Allowed,
		Tier: res.Tier, Shadow: res.Shadow, Cost: int64(min(max(res.Cost, 1), 1_000_000)),
		Limit: int64(min(max(res.Limit, 0), events.MaxSafeInteger)), Remaining: int64(min(max(res.Remaining, 0), events.MaxSafeInteger)),
		Gateway: gateway, NearLimit: res.NearLimit, Degraded: res.Degraded, Rule: res.Rule,
		Priority: res.Priority.Event(), Shed: res.Shed, Plan: res.Plan,
		RulesVersion: res.RulesVersion, CandidateVersion: res.CandidateVersion, CandidateBlocked: res.CandidateBlocked,
	}
	if ev.Rule == "" && res.Shadow {
		ev.Rule = res.ShadowRule
	}
	if res.Penalty > 0 && res.Penalty < 1 {
		ev.PenaltyMultiplier = res.Penalty
	}
	return ev
}

// Emit encodes a decision event and hands it to the publisher, keyed by its
// principal; every decision of every interface leaves through it. Through
// an Appender (journal.DurableProducer: the record batcher, batches formed
// here) every event, traced or not, takes TryAppend, and an untraced one is
// encoded into reused buffers (emit.go) and allocates nothing; one path for
// all of them keeps a principal's events in order on its partition.
// Emit keeps nothing of ev once it returns (a span keeps a copy of its id),
// so the caller may build ev in memory it reuses (envoyrls mints the id
// into its scratch).
func (s *Server) Emit(ctx context.Context, ev *events.Decision) {
	if !Publishing { // a benchmark build without events (publishing.go)
		return
	}
	a, appender := s.pub.(Appender)
	if appender && s.tracer == nil {
		s.emitAppend(a, ev)
		return
	}
	value, err := events.EncodeDecision(ev)
	if err != nil { // the request was validated; this is a bug, not bad input
		s.metrics.errors.WithLabelValues("encode").Inc()
		s.log.Error("encode decision", "id", ev.ID, "err", err)
		return
	}
	msg := kafka.Message{
		Topic:   s.topic,
		Key:     []byte(ev.Principal.Key()),
		Value:   value,
		Headers: stream.CloudEventHeaders(events.CETypeDecision, ev.ID, "floodgate/limiter/"+s.gateway, ev.TS),
	}
	if s.tracer != nil {
		id := strings.Clone(ev.ID) // the span outlives ev
		msg.Headers = s.tracer.Create(ctx, s.topic, id, msg.Headers,
			attribute.String(tracing.AttrDecisionID, id), attribute.Bool(tracing.AttrAllowed, ev.Allowed),
			attribute.String(tracing.AttrTier, string(ev.Tier)), attribute.String(tracing.AttrPrincipalKind, string(ev.Principal.Kind)),
			attribute.Bool(tracing.AttrDegraded, ev.Degraded))
	}
	if appender {
		a.TryAppend(msg)
		return
	}
	s.pub.TryPublish(msg) // never blocks; a full buffer is counted by the publisher
}

func (s *Server) problem(w http.ResponseWriter, id string, status int, typ, detail string) {
	w.Header().Set(httpapi.HeaderRequestID, id)
	httpapi.WriteProblem(w, nil, httpapi.Problem{Type: typ, Status: status, Detail: detail, CorrelationID: id})
}

// authenticate checks the caller's bearer token when callers are configured;
// it answers 401 and reports false when it is missing or unknown.
func (s *Server) authenticate(w http.ResponseWriter, r *http.Request, id string) (callers.Caller, bool) {
	if s.callers == nil {
		return callers.Caller{}, true
	}
	cl, err := s.authorize(r.Header.Get("Authorization"))
	if err != nil {
		w.Header().Set("WWW-Authenticate", authChallenge)
		s.problem(w, id, http.StatusUnauthorized, httpapi.ProblemUnauthenticated, err.Error())
		return callers.Caller{}, false
	}
	return cl, true
}

// authChallenge is the WWW-Authenticate of a 401.
const authChallenge = `Bearer realm="floodgate-limiter"`

// authorize is the caller of an Authorization header's bearer token (s.callers
// set); a refusal is counted.
func (s *Server) authorize(header string) (callers.Caller, error) {
	cl, err := s.callers.Authenticate(header)
	if err != nil {
		s.metrics.unauthenticated.Inc()
	}
	return cl, err
}

// Record counts an envoy-configured call's decision as every decision is
// counted: by deciding tier and outcome, and per scope for the observer.
func (s *Server) Record(rule string, tier events.Tier, allowed, shadow bool) {
	s.metrics.decision(tier, allowed).Inc()
	if s.obs != nil {
		scope := rule
		if scope == "" {
			scope = "none"
		}
		s.obs.Observe(scope, tier, allowed, false)
		if shadow {
			s.obs.Observe(scope, tier, allowed, true)
		}
	}
}
