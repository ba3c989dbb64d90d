package envoyrls

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/floodgate-dev/floodgate/pkg/envoyconf"
	"github.com/floodgate-dev/floodgate/pkg/events"
	"github.com/floodgate-dev/floodgate/pkg/httpapi"
	"github.com/floodgate-dev/floodgate/pkg/limiter"
	"github.com/floodgate-dev/floodgate/pkg/limiter/admission"
	"github.com/floodgate-dev/floodgate/pkg/limiter/callers"
	"github.com/floodgate-dev/floodgate/pkg/limiter/checkapi"
	"github.com/floodgate-dev/floodgate/pkg/limiter/server"
	"github.com/floodgate-dev/floodgate/pkg/metric"
)

// Descriptor entry keys the Envoy rate-limit service accepts. Each descriptor is
// one Floodgate check: put every key of a request in one descriptor (one
// rate_limits entry in Envoy) so all its tiers are decided in one round trip.
const (
	KeyPrincipalKind = "principal_kind" // user | bot | api_key | anonymous (required)
	KeyPrincipalID   = "principal_id"   // required
	KeyRemoteAddress = "remote_address" // client IP, Envoy's remote_address action (required)
	KeyMethod        = "method"         // HTTP method (required)
	KeyRoute         = "route"          // route template, e.g. /channels/{channel_id}/messages (required)
	KeyResource      = "resource"       // "type:id" (optional)
	KeyPlan          = "plan"           // optional
	KeyPriority      = "priority"       // critical | degraded | best_effort | bulk (optional; default the route's)
	KeyRequestID     = "request_id"     // optional correlation id (1-64 of [A-Za-z0-9._-]); default a UUIDv7
)

var envoyKeys = []string{KeyPrincipalKind, KeyPrincipalID, KeyRemoteAddress, KeyMethod, KeyRoute, KeyResource, KeyPlan, KeyPriority, KeyRequestID}

// EnvoyRLS serves envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit on
// top of a Server: the same engine, metrics, decision events and 429 contract.
type EnvoyRLS struct {
	rlsv3.UnimplementedRateLimitServiceServer
	s           *server.Server
	requests    *prometheus.CounterVec
	descriptors *envoyDescriptorMetrics
	unnamed     prometheus.Counter
	unknown     unknownDomains
	// envoy answers the domains of an envoy ratelimit configuration with its
	// semantics (see pkg/envoyconf); nil without one.
	envoy *EnvoyConfig
	// maxStreams bounds one connection's concurrent streams (WithMaxStreams);
	// inFlight counts the calls being answered (floodgate_limiter_grpc_calls_in_flight).
	maxStreams uint32
	inFlight   atomic.Int64
	// gate bounds the calls decided at once (gate.go, WithGate); nil: none.
	gateCfg admission.Config
	gate    *gate
	pace    bool // WithReadPacing
	// answered holds requests' series of the two answers nearly every call
	// gets (0 ok, 1 over_limit), resolved at first use (answeredSeries).
	answered [2]metric.Series
}

// countAnswer counts a call answered ok or over_limit: on the hot path a
// cached series instead of hashing the label value each call.
func (e *EnvoyRLS) countAnswer(overLimit bool) {
	i, result := 0, "ok"
	if overLimit {
		i, result = 1, "over_limit"
	}
	e.answered[i].Get(func() prometheus.Counter { return e.requests.WithLabelValues(result) }).Inc()
}

// EnvoyConfig is an envoy ratelimit configuration served beside Floodgate's
// own descriptor shape: calls for its domains are answered as envoy
// ratelimit answers them; a call for any other domain in Floodgate's shape
// (a principal_kind or principal_id entry) as before, in envoy ratelimit's
// shape OK without a limit, as envoy ratelimit answers a domain it has no
// configuration for.
type EnvoyConfig struct {
	Source    *envoyconf.Source
	Evaluator *envoyconf.Evaluator
	// Headers, when set, adds envoy ratelimit's LIMIT_RESPONSE_HEADERS_ENABLED
	// headers to every answer for these domains.
	Headers *EnvoyHeaders
	// Identity, when set, makes every call a decision.v1 event of the
	// principal its entries name, and applies that principal's penalty, the
	// adjuster's scales and the principal's daily quota to its limits; nil
	// answers exactly as envoy ratelimit does and publishes nothing.
	Identity *EnvoyIdentity
	// FailureModeDeny is Envoy's failure_mode_deny for these domains: what
	// Envoy does when a call fails (Redis unavailable, no fail policy), so
	// the call's degraded decision event says whether it was allowed.
	FailureModeDeny bool
	// NearLimitRatio is envoy ratelimit's NEAR_LIMIT_RATIO, in (0, 1]: the
	// share of a limit past which its hits count near_limit in
	// floodgate_limiter_envoy_descriptor_hits_total; 0 means
	// DefaultNearLimitRatio.
	NearLimitRatio float64
}

// GRPCOption configures NewGRPCServer.
type GRPCOption func(*EnvoyRLS)

// WithEnvoyConfig serves an envoy ratelimit configuration's domains.
func WithEnvoyConfig(c *EnvoyConfig) GRPCOption { return func(e *EnvoyRLS) { e.envoy = c } }

// WithMaxStreams bounds the concurrent streams of one connection (default
// MaxGRPCStreams); a client past it waits for a stream to end.
func WithMaxStreams(n uint32) GRPCOption { return func(e *EnvoyRLS) { e.maxStreams = n } }

var _ rlsv3.RateLimitServiceServer = (*EnvoyRLS)(nil)

// NewEnvoyRLS returns the rate-limit service of s with opts; its metrics go
// on s's registry. One serves the gRPC transport (NewTransportServer) and
// the HTTP API's /json (server.ServeEnvoyJSON).
func NewEnvoyRLS(s *server.Server, opts ...GRPCOption) *EnvoyRLS {
	e := &EnvoyRLS{s: s, requests: promauto.With(s.Registry()).NewCounterVec(prometheus.CounterOpts{
		Name: "floodgate_limiter_envoy_requests_total",
		Help: "Envoy ShouldRateLimit calls by result (ok, over_limit, invalid, unavailable: Redis failed and a counted limit has no fail policy; past_deadline: the caller's deadline passed before it was decided; overloaded: dropped by the entry gate; canceled: the caller went away while the call waited at the entry gate, or, on the floodgate transport, before the call was dispatched).",
	}, []string{"result"}), descriptors: newEnvoyDescriptorMetrics(s.Registry()),
		unnamed: promauto.With(s.Registry()).NewCounter(prometheus.CounterOpts{
			Name: "floodgate_limiter_envoy_unattributed_total",
			Help: "Envoy calls for a configured domain answered without a decision event: no entry named a principal (FLOODGATE_LIMITER_ENVOY_PRINCIPAL_KEYS).",
		}), unknown: unknownDomains{calls: promauto.With(s.Registry()).NewCounter(prometheus.CounterOpts{
			Name: "floodgate_limiter_envoy_unknown_domain_total",
			Help: "Envoy calls for a domain the envoy ratelimit configuration does not have, in envoy ratelimit's descriptor shape: answered OK without a limit, as envoy ratelimit does (its domain_not_found).",
		})}}
	if reg := s.Registry(); reg != nil {
		_ = reg.Register(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "floodgate_limiter_grpc_calls_in_flight",
			Help: "ShouldRateLimit calls being answered (streams are bounded per connection by FLOODGATE_LIMITER_GRPC_MAX_STREAMS)."},
			func() float64 { return float64(e.inFlight.Load()) })) // already there when a second service shares the registry
	}
	for _, o := range opts {
		o(e)
	}
	if reg := s.Registry(); reg != nil && e.envoy != nil && e.envoy.Evaluator.LocalCache != nil {
		lc := e.envoy.Evaluator.LocalCache
		_ = reg.Register(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "floodgate_limiter_envoy_local_cache_entries",
			Help: "Over-limit counters of envoy domains in the local cache (FLOODGATE_LIMITER_ENVOY_LOCAL_CACHE_ENTRIES), ended ones not yet swept out included."},
			func() float64 { return float64(lc.Len()) })) // already there when a second service shares the registry
	}
	if e.gateCfg.Max > 0 { // one gate for every transport's calls, /json's too
		var reg prometheus.Registerer
		if r := s.Registry(); r != nil {
			reg = r
		}
		e.gate = newGate(e.gateCfg, reg)
	}
	return e
}

// envoyTimeoutKey is Envoy's x-envoy-expected-rq-timeout-ms as gRPC metadata.
var envoyTimeoutKey = strings.ToLower(server.HeaderEnvoyTimeout)

// deadline is a call's deadline: its gRPC deadline (Envoy's rate-limit
// filter sends its timeout as grpc-timeout), else Envoy's
// x-envoy-expected-rq-timeout-ms metadata from now, else the limiter's
// default (server.SetCheckTimeout); zero: none.
func (e *EnvoyRLS) deadline(ctx context.Context) (time.Time, error) {
	if d, ok := ctx.Deadline(); ok {
		return d, nil
	}
	if v := metadata.ValueFromIncomingContext(ctx, envoyTimeoutKey); len(v) > 0 {
		t, err := server.ParseTimeout(server.HeaderEnvoyTimeout, v[0])
		if err != nil {
			return time.Time{}, err
		}
		return time.Now().Add(t), nil
	}
	return e.s.DeadlineOf(ctx), nil
}

// ShouldRateLimit decides every descriptor of the request as one Floodgate check
// (concurrently when there are several). The overall code is OVER_LIMIT when any
// descriptor is; the response headers (and on a denial the problem body) are the
// 429 contract of the deciding descriptor. A descriptor that does not map to a
// check fails the whole call with InvalidArgument, before anything is consumed.
func (e *EnvoyRLS) ShouldRateLimit(ctx context.Context, in *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	e.inFlight.Add(1)
	defer e.inFlight.Add(-1)
	deadline, err := e.deadline(ctx)
	if err != nil {
		e.requests.WithLabelValues("invalid").Inc()
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	if !deadline.IsZero() && !time.Now().Before(deadline) { // the caller has failed open already: spend nothing
		e.s.CountPastDeadline(server.ProtocolGRPC, "")
		e.requests.WithLabelValues("past_deadline").Inc()
		return nil, status.Error(codes.DeadlineExceeded, server.DeadlineReason)
	}
	if e.gate != nil {
		md, _ := metadata.FromIncomingContext(ctx)
		start, err := e.gate.enter(ctx.Done(), deadline, criticalMetadata(md) || critical(in.GetDescriptors()))
		if err != nil {
			e.requests.WithLabelValues(gateResult(err)).Inc()
			return nil, err
		}
		defer e.gate.exit(start)
	}
	if e.envoy != nil {
		if cfg := e.envoy.Source.Config(); cfg.Has(in.GetDomain()) {
			return e.envoyAnswer(ctx, cfg, in)
		}
		// A domain it does not have: envoy ratelimit answers OK without a
		// limit; a call in Floodgate's own shape keeps its mapping.
		if in.GetDomain() != "" && len(in.GetDescriptors()) > 0 && envoyShaped(in) {
			return e.unknown.answer(e, in), nil
		}
	}
	return e.floodgateAnswer(ctx, in, deadline)
}

// floodgateAnswer decides a call in Floodgate's own descriptor shape. It is
// a function of its own so that its locals are not in ShouldRateLimit's
// frame on the envoy-semantics path: a call beyond grpc-go's stream workers
// runs on a new goroutine, whose stack grew (copied) at every frame that did
// not fit (runtime.newstack, 9 % of the limiter's CPU at saturation).
func (e *EnvoyRLS) floodgateAnswer(ctx context.Context, in *rlsv3.RateLimitRequest, deadline time.Time) (*rlsv3.RateLimitResponse, error) {
	reqs, ids, err := envoyChecks(in)
	if err != nil {
		e.requests.WithLabelValues("invalid").Inc()
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	if cl, ok := callers.From(ctx); ok {
		for i := range reqs {
			if err := cl.Permit(&reqs[i]); err != nil {
				e.requests.WithLabelValues("invalid").Inc()
				return nil, status.Error(codes.PermissionDenied, err.Error())
			}
		}
	}
	for i := range reqs {
		if err := e.s.CheckCost(&reqs[i]); err != nil {
			// Refused, not failed: an error would make Envoy fail open and let
			// an over-cost request through; nothing is counted either way.
			e.requests.WithLabelValues("over_limit").Inc()
			return costRefusal(len(reqs), ids[i], fmt.Errorf("descriptor %d: %w", i, err))
		}
	}
	results := make([]limiter.Result, len(reqs))
	// Decision ids are minted here; a descriptor's request_id only correlates
	// (a caller who chose the id could make many checks count once).
	call := server.Call{Protocol: server.ProtocolGRPC, Deadline: deadline}
	if len(reqs) == 1 {
		results[0] = e.s.DecideCall(ctx, server.NewDecisionID(), &reqs[0], call)
	} else {
		var wg sync.WaitGroup
		for i := range reqs {
			wg.Go(func() { results[i] = e.s.DecideCall(ctx, server.NewDecisionID(), &reqs[i], call) })
		}
		wg.Wait()
	}
	for _, r := range results {
		if r.Error == server.DeadlineReason { // no one is waiting for the rest
			e.requests.WithLabelValues("past_deadline").Inc()
			return nil, status.Error(codes.DeadlineExceeded, server.DeadlineReason)
		}
	}
	out := &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK, Statuses: make([]*rlsv3.RateLimitResponse_DescriptorStatus, len(results))}
	decide := 0
	for i, r := range results {
		out.Statuses[i] = descriptorStatus(r)
		if !r.Allowed {
			out.OverallCode = rlsv3.RateLimitResponse_OVER_LIMIT
		}
		if moreDecisive(r, results[decide]) {
			decide = i
		}
	}
	d, id := results[decide], ids[decide]
	h := server.Headers(d, id)
	keys := make([]string, 0, len(h)+1)
	for k := range h {
		keys = append(keys, k)
	}
	if p := server.DenialProblem(d, id); p != nil {
		body, err := json.Marshal(p)
		if err != nil {
			return nil, status.Error(codes.Internal, fmt.Sprintf("encode problem: %v", err))
		}
		out.RawBody = body
		h["Content-Type"] = "application/problem+json"
		keys = append(keys, "Content-Type")
	}
	slices.Sort(keys)
	out.ResponseHeadersToAdd = make([]*corev3.HeaderValue, len(keys))
	for i, k := range keys {
		out.ResponseHeadersToAdd[i] = &corev3.HeaderValue{Key: k, Value: h[k]}
	}
	e.countAnswer(out.OverallCode == rlsv3.RateLimitResponse_OVER_LIMIT)
	return out, nil
}

// costRefusal answers a call with a descriptor over a max_cost: every
// descriptor OVER_LIMIT, nothing counted, and a cost-over-limit problem body.
func costRefusal(n int, corr string, err error) (*rlsv3.RateLimitResponse, error) {
	body, jerr := json.Marshal(httpapi.Problem{Type: httpapi.ProblemCostOverLimit, Title: "Cost Over Limit", Status: http.StatusTooManyRequests,
		Detail: err.Error() + "; nothing was counted", CorrelationID: corr})
	if jerr != nil {
		return nil, status.Error(codes.Internal, fmt.Sprintf("encode problem: %v", jerr))
	}
	out := &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OVER_LIMIT, RawBody: body,
		Statuses:             make([]*rlsv3.RateLimitResponse_DescriptorStatus, n),
		ResponseHeadersToAdd: []*corev3.HeaderValue{{Key: "Content-Type", Value: "application/problem+json"}, {Key: "X-Request-Id", Value: corr}}}
	for i := range out.Statuses {
		out.Statuses[i] = &rlsv3.RateLimitResponse_DescriptorStatus{Code: rlsv3.RateLimitResponse_OVER_LIMIT}
	}
	return out, nil
}

// moreDecisive reports whether a should set the response headers instead of b:
// a denial over an allow, the longer Retry-After among denials, the least room
// left among allows.
func moreDecisive(a, b limiter.Result) bool {
	switch {
	case a.Allowed != b.Allowed:
		return !a.Allowed
	case !a.Allowed:
		return a.RetryAfter > b.RetryAfter
	case a.Limit <= 0:
		return false
	case b.Limit <= 0:
		return true
	}
	return float64(a.Remaining)/float64(a.Limit) < float64(b.Remaining)/float64(b.Limit)
}

// envoyChecks maps every descriptor to a validated check and its correlation id.
func envoyChecks(in *rlsv3.RateLimitRequest) ([]checkapi.CheckRequest, []string, error) {
	if in.GetDomain() == "" {
		return nil, nil, fmt.Errorf("domain: must not be empty")
	}
	ds := in.GetDescriptors()
	if len(ds) == 0 || len(ds) > checkapi.MaxBatch {
		return nil, nil, fmt.Errorf("descriptors: %d, want 1..%d", len(ds), checkapi.MaxBatch)
	}
	reqs := make([]checkapi.CheckRequest, len(ds))
	ids := make([]string, len(ds))
	for i, d := range ds {
		id, err := envoyCheck(d, in.GetHitsAddend(), &reqs[i])
		if err != nil {
			return nil, nil, fmt.Errorf("descriptor %d: %w", i, err)
		}
		switch {
		case id == "":
			id = uuid.Must(uuid.NewV7()).String()
		case len(ds) > 1:
			if id += "-" + strconv.Itoa(i); len(id) > 64 {
				id = uuid.Must(uuid.NewV7()).String()
			}
		}
		ids[i] = id
	}
	return reqs, ids, nil
}

// envoyCheck fills req from one descriptor and returns its request_id ("" = none).
func envoyCheck(d *rlcommon.RateLimitDescriptor, requestHits uint32, req *checkapi.CheckRequest) (string, error) {
	if d.GetLimit() != nil {
		return "", fmt.Errorf("limit: per-descriptor limit overrides are not supported; use the rules file or fg:overrides")
	}
	if d.GetIsNegativeHits() {
		return "", fmt.Errorf("is_negative_hits: refunds are not supported")
	}
	var id string
	seen := make(map[string]bool, len(d.GetEntries()))
	for _, en := range d.GetEntries() {
		k, v := en.GetKey(), en.GetValue()
		if seen[k] {
			return "", fmt.Errorf("key %q appears twice", k)
		}
		seen[k] = true
		switch k {
		case KeyPrincipalKind:
			req.Principal.Kind = events.PrincipalKind(v)
		case KeyPrincipalID:
			req.Principal.ID = v
		case KeyRemoteAddress:
			req.IP = v
		case KeyMethod:
			req.Method = v
		case KeyRoute:
			req.Route = v
		case KeyResource:
			req.Resource = v
		case KeyPlan:
			req.Plan = v
		case KeyPriority:
			req.Priority = v
		case KeyRequestID:
			if !httpapi.ValidRequestID(v) {
				return "", fmt.Errorf("request_id: %q, want 1-64 of [A-Za-z0-9._-]", v)
			}
			id = v
		default:
			return "", fmt.Errorf("unknown key %q; accepted keys: %v", k, envoyKeys)
		}
	}
	for _, k := range []string{KeyPrincipalKind, KeyPrincipalID, KeyRemoteAddress, KeyMethod, KeyRoute} {
		if !seen[k] {
			return "", fmt.Errorf("missing key %q (required: principal_kind, principal_id, remote_address, method, route)", k)
		}
	}
	cost, err := envoyCost(d.GetHitsAddend(), requestHits)
	if err != nil {
		return "", err
	}
	req.Cost = cost
	if err := req.Validate(); err != nil {
		return "", err
	}
	return id, nil
}

// envoyCost is the descriptor's hits_addend, else the request's, else 1.
func envoyCost(descriptor *wrapperspb.UInt64Value, request uint32) (int, error) {
	if descriptor != nil {
		v := descriptor.GetValue()
		if v < 1 || v > 1_000_000 {
			return 0, fmt.Errorf("hits_addend: %d, must be in 1..1000000 (a zero-cost peek is not supported)", v)
		}
		return int(v), nil
	}
	if request == 0 { // unset: Envoy's default of one hit
		return 1, nil
	}
	if request > 1_000_000 {
		return 0, fmt.Errorf("hits_addend: %d, must be in 1..1000000", request)
	}
	return int(request), nil
}

func descriptorStatus(r limiter.Result) *rlsv3.RateLimitResponse_DescriptorStatus {
	st := &rlsv3.RateLimitResponse_DescriptorStatus{
		Code:               rlsv3.RateLimitResponse_OK,
		LimitRemaining:     uint32(min(max(r.Remaining, 0), 1<<32-1)),
		DurationUntilReset: durationpb.New(r.ResetAfter),
	}
	if !r.Allowed {
		st.Code = rlsv3.RateLimitResponse_OVER_LIMIT
	}
	if r.Limit > 0 {
		st.CurrentLimit = currentLimit(r)
	}
	return st
}

// currentLimit expresses the deciding rule's limit per period as Envoy's
// requests per (unit × multiplier): 5 per 5s is 5 per 5 SECOND.
func currentLimit(r limiter.Result) *rlsv3.RateLimitResponse_RateLimit {
	l := &rlsv3.RateLimitResponse_RateLimit{Name: string(r.Tier) + ":" + r.Rule, RequestsPerUnit: uint32(min(r.Limit, 1<<32-1))}
	for _, u := range []struct {
		d    time.Duration
		unit rlsv3.RateLimitResponse_RateLimit_Unit
	}{
		{24 * time.Hour, rlsv3.RateLimitResponse_RateLimit_DAY},
		{time.Hour, rlsv3.RateLimitResponse_RateLimit_HOUR},
		{time.Minute, rlsv3.RateLimitResponse_RateLimit_MINUTE},
		{time.Second, rlsv3.RateLimitResponse_RateLimit_SECOND},
	} {
		if r.Period >= u.d && r.Period%u.d == 0 {
			l.Unit = u.unit
			if n := r.Period / u.d; n > 1 {
				l.UnitMultiplier = wrapperspb.UInt32(uint32(min(n, 1<<32-1)))
			}
			return l
		}
	}
	// Sub-second or fractional periods have no Envoy unit; the name carries it.
	l.Name += " per " + r.Period.String()
	return l
}

// envoyAnswer answers a call for a domain of the envoy ratelimit
// configuration exactly as envoy ratelimit would — and, with Identity, with
// the principal's penalty, the adjuster's scales and the principal's daily
// quota, publishing the decision.
func (e *EnvoyRLS) envoyAnswer(ctx context.Context, cfg *envoyconf.Config, in *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	req := envoyconf.Request{Domain: in.GetDomain(), HitsAddend: in.GetHitsAddend(), Descriptors: make([]envoyconf.Descriptor, len(in.GetDescriptors()))}
	for i, d := range in.GetDescriptors() {
		ds := &req.Descriptors[i]
		ds.Entries = make([]envoyconf.Entry, len(d.GetEntries()))
		for j, en := range d.GetEntries() {
			ds.Entries[j] = envoyconf.Entry{Key: en.GetKey(), Value: en.GetValue()}
		}
		if h := d.GetHitsAddend(); h != nil {
			v := h.GetValue()
			ds.HitsAddend = &v
		}
		if l := d.GetLimit(); l != nil {
			ds.Override = &envoyconf.Override{RequestsPerUnit: l.GetRequestsPerUnit(), Unit: envoyconf.Unit(l.GetUnit())}
		}
	}
	var who envoyWho
	var tiers []events.Tier
	var quota *limiter.QuotaCall
	if id := e.envoy.Identity; id != nil {
		who = id.identify(req.Descriptors)
		if cl, ok := callers.From(ctx); ok && who.ok {
			if err := cl.PermitPrincipal(who.principal); err != nil { // kind and id (issue 37 T2)
				e.requests.WithLabelValues("invalid").Inc()
				return nil, status.Error(codes.PermissionDenied, err.Error())
			}
		}
		tiers = who.tiers(&req, id.IPKey)
		if eng := e.s.Engine(); eng != nil {
			if rt := eng.Runtime(); rt != nil {
				if scales := rt.Scales(); len(scales) > 0 {
					// The method and tiers by value: capturing who would move
					// it to the heap on every call, scales or none.
					method, tiers := who.method, tiers
					req.Scale = func(i int, l *envoyconf.Limit) float64 { return scales.For(tiers[i], method, l.Route) }
				}
			}
			if who.ok && len(req.Descriptors) > 0 {
				if quota = eng.QuotaCall(who.principal, envoyUnits(&req, tiers)); quota != nil {
					req.Also = quota.Queue
				}
			}
		}
	}
	resp, err := e.envoy.Evaluator.Evaluate(ctx, cfg, req)
	if errors.Is(err, envoyconf.ErrRedis) {
		// As envoy ratelimit: Envoy's failure_mode_deny decides. The
		// decision is published all the same, degraded, with what Envoy
		// does by its setting (FailureModeDeny).
		return nil, e.redisDown(ctx, &who, &req, tiers, err)
	}
	if err != nil {
		e.requests.WithLabelValues("invalid").Inc()
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	if resp.Degraded {
		e.s.CountDegraded()
	}
	var qa *limiter.QuotaAnswer
	if quota != nil && !resp.Degraded {
		a, qerr := quota.Read(ctx)
		if qerr != nil {
			e.s.Logger().Warn("envoy call: daily quota unreadable; its fail policy answers", "principal", who.principal.Key(), "err", qerr)
		}
		qa = &a
		if !a.Allowed {
			resp.Overall = envoyconf.CodeOverLimit
			if e.envoy.Evaluator.GlobalShadow {
				resp.Overall, resp.Shadowed = envoyconf.CodeOK, true
			}
		}
		if resp.Overall == envoyconf.CodeOverLimit && strings.Contains(a.Consumed, "1") {
			quota.Refund(ctx, a.Consumed) // denied by another limit: the quota keeps its units
		}
	}
	out := &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_Code(resp.Overall),
		Statuses: make([]*rlsv3.RateLimitResponse_DescriptorStatus, len(resp.Statuses))}
	quotaAt := -1
	if qa != nil && qa.WouldDeny {
		quotaAt = slices.Index(tiers, events.TierPrincipal)
	}
	for i, st := range resp.Statuses {
		ds := &rlsv3.RateLimitResponse_DescriptorStatus{Code: rlsv3.RateLimitResponse_Code(st.Code), LimitRemaining: st.LimitRemaining}
		if rpu, unit, ok := st.RequestsPerUnit(); ok {
			name := ""
			if st.Override == nil {
				name = st.Limit.Name
			}
			ds.CurrentLimit = &rlsv3.RateLimitResponse_RateLimit{Name: name, RequestsPerUnit: rpu, Unit: rlsv3.RateLimitResponse_RateLimit_Unit(unit)}
			if st.ResetAfter > 0 {
				ds.DurationUntilReset = durationpb.New(st.ResetAfter)
			}
		}
		if i == quotaAt && st.Code != envoyconf.CodeOverLimit {
			// The principal's own descriptor carries the exhausted daily
			// quota: its name, its limit per day, nothing left until the
			// UTC day ends.
			ds = &rlsv3.RateLimitResponse_DescriptorStatus{Code: rlsv3.RateLimitResponse_OVER_LIMIT,
				CurrentLimit: &rlsv3.RateLimitResponse_RateLimit{Name: qa.ID, RequestsPerUnit: uint32(min(max(qa.Limit, 0), math.MaxUint32)),
					Unit: rlsv3.RateLimitResponse_RateLimit_DAY},
				DurationUntilReset: durationpb.New(qa.ResetAfter)}
			if qa.Allowed { // a shadow quota reports, never denies
				ds.Code = rlsv3.RateLimitResponse_OK
			}
		}
		out.Statuses[i] = ds
		hits := uint64(max(req.HitsAddend, 1))
		if h := req.Descriptors[i].HitsAddend; h != nil {
			hits = *h
		}
		e.descriptors.observe(req.Domain, req.Descriptors[i], st, hits, cmp.Or(e.envoy.NearLimitRatio, DefaultNearLimitRatio))
	}
	if e.envoy.Headers != nil {
		e.envoy.Headers.add(out)
	}
	if resp.Degraded {
		out.ResponseHeadersToAdd = append(out.ResponseHeadersToAdd, &corev3.HeaderValue{Key: "X-RateLimit-Error", Value: "redis unavailable; answered by fail policy"})
	}
	if e.envoy.Identity != nil {
		if who.ok {
			e.emitDecision(ctx, &who, &req, &resp, tiers, qa)
		} else {
			e.unnamed.Inc()
		}
	}
	e.countAnswer(out.OverallCode == rlsv3.RateLimitResponse_OVER_LIMIT)
	return out, nil
}

// The decision event of an envoy-semantics call, and the answer when Redis
// failed, are functions of their own so that their events are not in
// envoyAnswer's frame (see floodgateAnswer: a frame that does not fit a new
// goroutine's stack copies it).

// emitDecision records and publishes the decision of a call whose principal
// is named.
func (e *EnvoyRLS) emitDecision(ctx context.Context, who *envoyWho, req *envoyconf.Request, resp *envoyconf.Response, tiers []events.Tier, qa *limiter.QuotaAnswer) {
	sc := newEnvoyScratch()
	ev := envoyDecision(sc.decisionID(), e.s.Gateway(), who, req, resp, tiers, sc)
	if qa != nil {
		decideQuota(qa, &ev)
	}
	e.s.Record(ev.Rule, ev.Tier, ev.Allowed, ev.Shadow)
	e.s.Emit(ctx, &ev)
	sc.release()
}

// redisDown counts a call Redis failed and publishes its degraded decision
// (with what Envoy does by its setting, FailureModeDeny); it returns the
// call's UNAVAILABLE.
func (e *EnvoyRLS) redisDown(ctx context.Context, who *envoyWho, req *envoyconf.Request, tiers []events.Tier, err error) error {
	e.s.CountError("envoy_redis")
	e.s.CountDegraded()
	e.requests.WithLabelValues("unavailable").Inc()
	if e.envoy.Identity != nil && who.ok {
		sc := newEnvoyScratch()
		ev := envoyUnavailable(sc.decisionID(), e.s.Gateway(), who, req, !e.envoy.FailureModeDeny, tiers, sc)
		e.s.Record(ev.Rule, ev.Tier, ev.Allowed, false)
		e.s.Emit(ctx, &ev)
		sc.release()
	}
	return status.Error(codes.Unavailable, err.Error())
}
