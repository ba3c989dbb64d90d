package envoyrls

import (
	"context"
	"encoding/json"
	"log/slog"
	"math"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/floodgate-dev/floodgate/pkg/events"
	"github.com/floodgate-dev/floodgate/pkg/httpapi"
	"github.com/floodgate-dev/floodgate/pkg/kafkatest"
	"github.com/floodgate-dev/floodgate/pkg/limiter"
	"github.com/floodgate-dev/floodgate/pkg/limiter/admission"
	"github.com/floodgate-dev/floodgate/pkg/limiter/checkapi"
	"github.com/floodgate-dev/floodgate/pkg/limiter/limitertest"
	"github.com/floodgate-dev/floodgate/pkg/limiter/server"
	"github.com/floodgate-dev/floodgate/pkg/promtest"
	"github.com/floodgate-dev/floodgate/pkg/redisx/redistest"
)

type rlsFixture struct {
	rls    rlsv3.RateLimitServiceClient
	health healthpb.HealthClient
	pub    *kafkatest.Capture
	reg    *prometheus.Registry
	eng    *limiter.Engine
}

// newRLS serves the Envoy rate-limit service over TCP on the real engine and
// Redis, and dials it with a real gRPC client.
func newRLS(t testing.TB, rules string, opts ...GRPCOption) rlsFixture {
	t.Helper()
	rdb := redistest.Client(t)
	e := limitertest.Engine(t, rdb, rules, func(c *limiter.EngineConfig) { c.OverLimitEntries = 1000 })
	require.NoError(t, e.Load(context.Background()))
	pub := &kafkatest.Capture{}
	reg := prometheus.NewRegistry()
	s := server.New(server.Config{Engine: e, Publisher: pub, Topic: "decisions", Gateway: "envoy-test",
		Logger: slog.New(slog.DiscardHandler), Registry: reg})
	conn, hs := dialService(t, s, opts...)
	SetServing(hs, true)
	return rlsFixture{rls: rlsv3.NewRateLimitServiceClient(conn), health: healthpb.NewHealthClient(conn), pub: pub, reg: reg, eng: e}
}

func headerMap(r *rlsv3.RateLimitResponse) map[string]string {
	h := map[string]string{}
	for _, v := range r.GetResponseHeadersToAdd() {
		h[v.GetKey()] = v.GetValue()
	}
	return h
}

func TestEnvoyShouldRateLimitDecidesWithContractAndPublishes(t *testing.T) {
	f := newRLS(t, "version: 1\nrules:\n  - {id: bot-global, tier: principal, limit: 2, period: 1m}\n")
	ctx := context.Background()
	id := redistest.Unique(t, "envoy_bot")

	var resps []*rlsv3.RateLimitResponse
	for i := range 3 {
		r, err := f.rls.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "edge",
			Descriptors: []*rlcommon.RateLimitDescriptor{limitertest.BotDescriptor(id, "request_id", "envoy-req-"+string(rune('a'+i)))}})
		require.NoError(t, err)
		resps = append(resps, r)
	}

	t.Run("allowed answers OK with the limit and what is left", func(t *testing.T) {
		r := resps[0]
		require.Equal(t, rlsv3.RateLimitResponse_OK, r.GetOverallCode())
		require.Len(t, r.GetStatuses(), 1)
		st := r.GetStatuses()[0]
		require.Equal(t, rlsv3.RateLimitResponse_OK, st.GetCode())
		require.Equal(t, uint32(2), st.GetCurrentLimit().GetRequestsPerUnit())
		require.Equal(t, rlsv3.RateLimitResponse_RateLimit_MINUTE, st.GetCurrentLimit().GetUnit())
		require.Equal(t, "principal:bot-global", st.GetCurrentLimit().GetName())
		require.Equal(t, uint32(1), st.GetLimitRemaining())
		h := headerMap(r)
		require.Equal(t, "2", h["X-RateLimit-Limit"])
		require.Equal(t, "1", h["X-RateLimit-Remaining"])
		require.Equal(t, "envoy-req-a", h["X-Request-Id"])
		require.NotContains(t, h, "Retry-After")
		require.Empty(t, r.GetRawBody())
	})
	t.Run("over the limit answers OVER_LIMIT with the 429 contract and problem body", func(t *testing.T) {
		r := resps[2]
		require.Equal(t, rlsv3.RateLimitResponse_OVER_LIMIT, r.GetOverallCode())
		st := r.GetStatuses()[0]
		require.Equal(t, rlsv3.RateLimitResponse_OVER_LIMIT, st.GetCode())
		require.Equal(t, uint32(0), st.GetLimitRemaining())
		require.Positive(t, st.GetDurationUntilReset().AsDuration())
		h := headerMap(r)
		require.Equal(t, "0", h["X-RateLimit-Remaining"])
		require.Equal(t, "principal", h["X-RateLimit-Scope"])
		require.NotEmpty(t, h["Retry-After"])
		require.Contains(t, h["RateLimit-Policy"], `"bot-global";q=2;w=60`, "the policy is the rule")
		require.Equal(t, "application/problem+json", h["Content-Type"])
		var p httpapi.Problem
		require.NoError(t, json.Unmarshal(r.GetRawBody(), &p))
		require.Equal(t, httpapi.ProblemRateLimited, p.Type)
		require.Equal(t, 429, p.Status)
		require.Equal(t, "envoy-req-c", p.CorrelationID)
	})
	t.Run("every decision is published as decision.v1", func(t *testing.T) {
		require.Len(t, f.pub.Messages(), 3)
		for i, m := range f.pub.Messages() {
			ev, err := events.DecodeDecision(m.Value)
			require.NoError(t, err)
			require.NotEqual(t, "envoy-req-"+string(rune('a'+i)), ev.ID, "decision ids are the server's; request_id only correlates")
			require.Equal(t, id, ev.Principal.ID)
			require.Equal(t, "/channels/{channel_id}/messages", ev.Route)
			require.Equal(t, "envoy-test", ev.Gateway)
			require.Equal(t, i < 2, ev.Allowed)
		}
	})
	t.Run("counted by result", func(t *testing.T) {
		require.Equal(t, 2.0, promtest.Value(t, f.reg, "floodgate_limiter_envoy_requests_total", map[string]string{"result": "ok"}))
		require.Equal(t, 1.0, promtest.Value(t, f.reg, "floodgate_limiter_envoy_requests_total", map[string]string{"result": "over_limit"}))
	})
}

func TestEnvoyHitsAddendIsTheCost(t *testing.T) {
	f := newRLS(t, "version: 1\nrules:\n  - {id: p, tier: principal, limit: 10, period: 1s}\n")
	cases := []struct {
		name          string
		requestHits   uint32
		descriptorHit *wrapperspb.UInt64Value
		wantRemaining uint32
		wantCost      int64
	}{
		{"unset means one hit", 0, nil, 9, 1},
		{"request hits_addend", 3, nil, 7, 3},
		{"descriptor hits_addend overrides the request's", 3, wrapperspb.UInt64(5), 5, 5},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			d := limitertest.BotDescriptor(redistest.Unique(t, "envoy_hits"))
			d.HitsAddend = tc.descriptorHit
			r, err := f.rls.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "edge", HitsAddend: tc.requestHits,
				Descriptors: []*rlcommon.RateLimitDescriptor{d}})
			require.NoError(t, err)
			require.Equal(t, tc.wantRemaining, r.GetStatuses()[0].GetLimitRemaining())
			require.Equal(t, rlsv3.RateLimitResponse_RateLimit_SECOND, r.GetStatuses()[0].GetCurrentLimit().GetUnit())
			require.Equal(t, tc.wantCost, limitertest.LastDecision(t, f.pub).Cost)
		})
	}
}

func TestEnvoyDescriptorsAreIndependentChecks(t *testing.T) {
	f := newRLS(t, "version: 1\nrules:\n  - {id: p, tier: principal, limit: 1, period: 1h}\n")
	ctx := context.Background()
	spent, fresh := redistest.Unique(t, "envoy_spent"), redistest.Unique(t, "envoy_fresh")
	_, err := f.rls.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*rlcommon.RateLimitDescriptor{limitertest.BotDescriptor(spent)}})
	require.NoError(t, err)

	r, err := f.rls.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "edge",
		Descriptors: []*rlcommon.RateLimitDescriptor{limitertest.BotDescriptor(fresh, "request_id", "multi"), limitertest.BotDescriptor(spent, "request_id", "multi")}})
	require.NoError(t, err)
	require.Equal(t, rlsv3.RateLimitResponse_OVER_LIMIT, r.GetOverallCode())
	require.Equal(t, rlsv3.RateLimitResponse_OK, r.GetStatuses()[0].GetCode())
	require.Equal(t, rlsv3.RateLimitResponse_OVER_LIMIT, r.GetStatuses()[1].GetCode())
	h := headerMap(r)
	require.Equal(t, "multi-1", h["X-Request-Id"], "the denying descriptor sets the contract")
	require.Equal(t, "0", h["X-RateLimit-Remaining"])
	require.Equal(t, rlsv3.RateLimitResponse_RateLimit_HOUR, r.GetStatuses()[1].GetCurrentLimit().GetUnit())
}

func TestEnvoyMappingErrorsAreInvalidArgument(t *testing.T) {
	f := newRLS(t, "version: 1\nrules:\n  - {id: p, tier: principal, limit: 10, period: 1s}\n")
	id := redistest.Unique(t, "envoy_bad")
	ok := func() *rlcommon.RateLimitDescriptor { return limitertest.BotDescriptor(id) }
	many := make([]*rlcommon.RateLimitDescriptor, checkapi.MaxBatch+1)
	for i := range many {
		many[i] = ok()
	}
	cases := []struct {
		name string
		req  *rlsv3.RateLimitRequest
		want string
	}{
		{"no domain", &rlsv3.RateLimitRequest{Descriptors: []*rlcommon.RateLimitDescriptor{ok()}}, "domain"},
		{"no descriptors", &rlsv3.RateLimitRequest{Domain: "edge"}, "descriptors: 0"},
		{"too many descriptors", &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: many}, "descriptors: 101"},
		{"unknown key", &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*rlcommon.RateLimitDescriptor{limitertest.BotDescriptor(id, "generic_key", "x")}}, `unknown key "generic_key"`},
		{"duplicate key", &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*rlcommon.RateLimitDescriptor{limitertest.BotDescriptor(id, "method", "GET")}}, `"method" appears twice`},
		{"missing principal", &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*rlcommon.RateLimitDescriptor{limitertest.Descriptor("remote_address", "203.0.113.7", "method", "GET", "route", "/x")}}, `missing key "principal_kind"`},
		{"missing remote address", &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*rlcommon.RateLimitDescriptor{limitertest.Descriptor("principal_kind", "bot", "principal_id", id, "method", "GET", "route", "/x")}}, `missing key "remote_address"`},
		{"bad kind", &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*rlcommon.RateLimitDescriptor{limitertest.Descriptor("principal_kind", "robot", "principal_id", id, "remote_address", "203.0.113.7", "method", "GET", "route", "/x")}}, "kind"},
		{"bad ip", &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*rlcommon.RateLimitDescriptor{limitertest.Descriptor("principal_kind", "bot", "principal_id", id, "remote_address", "not-an-ip", "method", "GET", "route", "/x")}}, "ip:"},
		{"bad method", &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*rlcommon.RateLimitDescriptor{limitertest.Descriptor("principal_kind", "bot", "principal_id", id, "remote_address", "203.0.113.7", "method", "FETCH", "route", "/x")}}, "method:"},
		{"bad route", &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*rlcommon.RateLimitDescriptor{limitertest.Descriptor("principal_kind", "bot", "principal_id", id, "remote_address", "203.0.113.7", "method", "GET", "route", "x")}}, "route:"},
		{"bad resource", &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*rlcommon.RateLimitDescriptor{limitertest.BotDescriptor(id, "resource", "no-colon")}}, "resource:"},
		{"bad request id", &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*rlcommon.RateLimitDescriptor{limitertest.BotDescriptor(id, "request_id", "a b")}}, "request_id"},
		{"zero descriptor hits", &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*rlcommon.RateLimitDescriptor{func() *rlcommon.RateLimitDescriptor {
			d := ok()
			d.HitsAddend = wrapperspb.UInt64(0)
			return d
		}()}}, "hits_addend: 0"},
		{"huge request hits", &rlsv3.RateLimitRequest{Domain: "edge", HitsAddend: 2_000_000, Descriptors: []*rlcommon.RateLimitDescriptor{ok()}}, "hits_addend: 2000000"},
		{"limit override", &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*rlcommon.RateLimitDescriptor{func() *rlcommon.RateLimitDescriptor {
			d := ok()
			d.Limit = &rlcommon.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 5, Unit: typev3.RateLimitUnit_SECOND}
			return d
		}()}}, "limit overrides are not supported"},
		{"negative hits", &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*rlcommon.RateLimitDescriptor{func() *rlcommon.RateLimitDescriptor {
			d := ok()
			d.IsNegativeHits = true
			return d
		}()}}, "is_negative_hits"},
		{"one bad descriptor fails the call", &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*rlcommon.RateLimitDescriptor{ok(), limitertest.Descriptor("principal_kind", "bot")}}, "descriptor 1: missing key"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := f.rls.ShouldRateLimit(context.Background(), tc.req)
			require.Error(t, err)
			st, isStatus := status.FromError(err)
			require.True(t, isStatus)
			require.Equal(t, codes.InvalidArgument, st.Code())
			require.Contains(t, st.Message(), tc.want)
		})
	}
	require.Empty(t, f.pub.Messages(), "nothing decided, nothing published")
	require.Equal(t, float64(len(cases)), promtest.Value(t, f.reg, "floodgate_limiter_envoy_requests_total", map[string]string{"result": "invalid"}))
}

func TestEnvoyHealth(t *testing.T) {
	f := newRLS(t, "version: 1\nrules:\n  - {id: p, tier: principal, limit: 10, period: 1s}\n")
	for _, svc := range []string{"", "envoy.service.ratelimit.v3.RateLimitService"} {
		t.Run("service "+svc, func(t *testing.T) {
			r, err := f.health.Check(context.Background(), &healthpb.HealthCheckRequest{Service: svc})
			require.NoError(t, err)
			require.Equal(t, healthpb.HealthCheckResponse_SERVING, r.GetStatus())
		})
	}
}

func TestEnvoyCurrentLimitUnits(t *testing.T) {
	cases := []struct {
		name   string
		period time.Duration
		unit   rlsv3.RateLimitResponse_RateLimit_Unit
		mult   uint32 // 0: no multiplier
	}{
		{"one second", time.Second, rlsv3.RateLimitResponse_RateLimit_SECOND, 0},
		{"five seconds", 5 * time.Second, rlsv3.RateLimitResponse_RateLimit_SECOND, 5},
		{"ninety seconds", 90 * time.Second, rlsv3.RateLimitResponse_RateLimit_SECOND, 90},
		{"one minute", time.Minute, rlsv3.RateLimitResponse_RateLimit_MINUTE, 0},
		{"one hour", time.Hour, rlsv3.RateLimitResponse_RateLimit_HOUR, 0},
		{"one day", 24 * time.Hour, rlsv3.RateLimitResponse_RateLimit_DAY, 0},
		{"a week in days", 168 * time.Hour, rlsv3.RateLimitResponse_RateLimit_DAY, 7},
		{"sub-second has no unit", 250 * time.Millisecond, rlsv3.RateLimitResponse_RateLimit_UNKNOWN, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			l := currentLimit(limiter.Result{Tier: events.TierPrincipal, Rule: "r", Limit: 7, Period: tc.period})
			require.Equal(t, uint32(7), l.GetRequestsPerUnit())
			require.Equal(t, tc.unit, l.GetUnit())
			require.Equal(t, tc.mult, l.GetUnitMultiplier().GetValue())
		})
	}
}

// FuzzEnvoyCheck: any descriptor either maps to a check that validates or is refused.
func FuzzEnvoyCheck(f *testing.F) {
	f.Add("principal_kind", "bot", "principal_id", "b1", "remote_address", "203.0.113.7", "route", "/x", uint64(1))
	f.Add("principal_kind", "anonymous", "resource", "channel:1", "remote_address", "::1", "plan", "pro", uint64(0))
	f.Fuzz(func(t *testing.T, k1, v1, k2, v2, k3, v3, k4, v4 string, hits uint64) {
		d := limitertest.Descriptor(k1, v1, k2, v2, k3, v3, k4, v4, "method", "GET")
		if hits > 0 {
			d.HitsAddend = wrapperspb.UInt64(hits)
		}
		var req checkapi.CheckRequest
		if _, err := envoyCheck(d, 0, &req); err != nil {
			return
		}
		again := req
		require.NoError(t, again.Validate())
		require.GreaterOrEqual(t, req.Cost, 1)
	})
}

// BenchmarkEnvoyShouldRateLimit: Envoy RLS calls over gRPC on loopback TCP, one
// descriptor each, against the real engine and Redis, without and with an
// entry gate (go test -run '^$' -bench EnvoyShouldRateLimit). A gate of 8
// under 16 callers a processor sheds some calls, as it should: those are
// counted (shed/op), not failures; any other error fails the benchmark.
func BenchmarkEnvoyShouldRateLimit(b *testing.B) {
	for _, bc := range []struct {
		name string
		gate int
	}{{"no_gate", 0}, {"gate_8", 8}, {"gate_1024", 1024}} {
		b.Run(bc.name, func(b *testing.B) {
			f := newRLS(b, "version: 1\nrules:\n  - {id: p, tier: principal, limit: 1000000000, period: 1s}\n", WithGate(bc.gate, 0, nil))
			base := redistest.Unique(b, "envoy_bench")
			var worker, shed atomic.Int64
			b.SetParallelism(16)
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				w := worker.Add(1)
				for i := 0; pb.Next(); i++ {
					r, err := f.rls.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "bench",
						Descriptors: []*rlcommon.RateLimitDescriptor{limitertest.BotDescriptor(base + "_" + strconv.FormatInt(w, 10) + "_" + strconv.Itoa(i%1000))}})
					if bc.gate > 0 && status.Code(err) == codes.Unavailable && status.Convert(err).Message() == Overloaded {
						shed.Add(1) // the gate's answer to more callers than its limit
						continue
					}
					if err != nil || r.GetOverallCode() != rlsv3.RateLimitResponse_OK {
						b.Errorf("should rate limit: %v %v", err, r.GetOverallCode())
						return
					}
				}
			})
			b.ReportMetric(float64(int64(b.N)-shed.Load())/b.Elapsed().Seconds(), "checks/s")
			b.ReportMetric(float64(shed.Load())/float64(b.N), "shed/op")
		})
	}
}

// TestEnvoyHeadersPickTheClosestDescriptor: LIMIT_RESPONSE_HEADERS_ENABLED's
// choice — the fewest remaining among descriptors with a limit (the first
// of equals), an over-limit descriptor always (the last one), nothing when
// no descriptor has a limit — and the reset as seconds to the end of the
// unit's window.
func TestEnvoyHeadersPickTheClosestDescriptor(t *testing.T) {
	at := time.Date(2030, 1, 1, 12, 0, 45, 0, time.UTC) // 45 s into a minute
	h := &EnvoyHeaders{Limit: "X-Limit", Remaining: "X-Remaining", Reset: "X-Reset", Clock: func() time.Time { return at }}
	lim := func(rpu uint32, unit rlsv3.RateLimitResponse_RateLimit_Unit) *rlsv3.RateLimitResponse_RateLimit {
		return &rlsv3.RateLimitResponse_RateLimit{RequestsPerUnit: rpu, Unit: unit}
	}
	ok := rlsv3.RateLimitResponse_OK
	over := rlsv3.RateLimitResponse_OVER_LIMIT
	for _, tc := range []struct {
		name     string
		statuses []*rlsv3.RateLimitResponse_DescriptorStatus
		want     map[string]string
	}{
		{"fewest remaining", []*rlsv3.RateLimitResponse_DescriptorStatus{
			{Code: ok, CurrentLimit: lim(100, rlsv3.RateLimitResponse_RateLimit_HOUR), LimitRemaining: 40},
			{Code: ok, CurrentLimit: lim(10, rlsv3.RateLimitResponse_RateLimit_MINUTE), LimitRemaining: 3},
			{Code: ok, CurrentLimit: lim(5, rlsv3.RateLimitResponse_RateLimit_SECOND), LimitRemaining: 3},
		}, map[string]string{"X-Limit": "10", "X-Remaining": "3", "X-Reset": "15"}},
		{"over limit wins, the last one", []*rlsv3.RateLimitResponse_DescriptorStatus{
			{Code: over, CurrentLimit: lim(1, rlsv3.RateLimitResponse_RateLimit_SECOND)},
			{Code: ok, CurrentLimit: lim(9, rlsv3.RateLimitResponse_RateLimit_MINUTE), LimitRemaining: 0},
			{Code: over, CurrentLimit: lim(2, rlsv3.RateLimitResponse_RateLimit_HOUR)},
		}, map[string]string{"X-Limit": "2", "X-Remaining": "0", "X-Reset": "3555"}},
		{"unlimited and unmatched add nothing", []*rlsv3.RateLimitResponse_DescriptorStatus{
			{Code: ok, LimitRemaining: math.MaxUint32}, {Code: ok},
		}, map[string]string{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out := &rlsv3.RateLimitResponse{Statuses: tc.statuses}
			h.add(out)
			require.Equal(t, tc.want, headerMap(out))
		})
	}
}

// TestEnvoyPriorityDescriptorKey: the priority descriptor key sets a check's
// bucket; while shedding, a shed descriptor is OVER_LIMIT with the shed
// headers and the 503 problem body (Envoy answers its rate_limited_status);
// critical is served; an unknown priority is InvalidArgument.
func TestEnvoyPriorityDescriptorKey(t *testing.T) {
	f := newRLS(t, "version: 1\nrules:\n  - {id: bot-global, tier: principal, limit: 100, period: 1m}\n")
	ctx := context.Background()
	rt := f.eng.Runtime()
	require.NoError(t, redistest.Client(t).HSet(ctx, rt.ShedKey, "level", 1).Err())
	require.NoError(t, rt.Refresh(ctx))
	id := redistest.Unique(t, "envoy_prio")
	ask := func(prio string) (*rlsv3.RateLimitResponse, error) {
		return f.rls.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "edge",
			Descriptors: []*rlcommon.RateLimitDescriptor{limitertest.BotDescriptor(id, "priority", prio)}})
	}
	r, err := ask("bulk")
	require.NoError(t, err)
	require.Equal(t, rlsv3.RateLimitResponse_OVER_LIMIT, r.GetOverallCode())
	h := headerMap(r)
	require.Equal(t, admission.StatusDegraded, h["X-Floodgate-Utilization"])
	require.Equal(t, "bulk", h["X-Floodgate-Priority"])
	require.Contains(t, string(r.GetRawBody()), `"status":503`)
	r, err = ask("critical")
	require.NoError(t, err)
	require.Equal(t, rlsv3.RateLimitResponse_OK, r.GetOverallCode())
	_, err = ask("urgent")
	require.Equal(t, codes.InvalidArgument, status.Code(err))
}

// dialGRPC serves g on a loopback port and returns a client connection to it;
// both stop when the test ends.
