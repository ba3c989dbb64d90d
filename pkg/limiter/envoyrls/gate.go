package envoyrls

// The entry gate: how many ShouldRateLimit calls are decided at once, and
// which of the others wait. Past saturation the calls queue somewhere; left
// to themselves they queue first in, first out in the runtime's run queue,
// every call waits for all the others, and the limiter decides calls whose
// callers have given up (a gRPC deadline is relative: a call that waited in
// the socket still looks on time). Behind the gate the queue is the gate's:
// served newest first while it stands (adaptive LIFO with CoDel), its
// oldest answered UNAVAILABLE at once, and the transport keeps reading the
// sockets dry — so the calls that are decided are the fresh ones. With
// WithReadPacing the transport reads only while the queue has room
// (pace.go).

import (
	"context"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/tap"

	"github.com/floodgate-dev/floodgate/pkg/events"
	"github.com/floodgate-dev/floodgate/pkg/limiter/admission"
	"github.com/floodgate-dev/floodgate/pkg/limiter/server"
)

// GateConfig is the entry gate of at most max calls decided at once: the
// engine's adaptive concurrency limit (admission.DefaultConfig) between 8
// and max, steered to keep a call's time from the gate to its answer near
// target (0: GateTarget) above the time Redis takes — twice redisFloor
// (nil: none), the shortest round trip of late (redisx.RoundTripFloor): a
// call waits for at most one pipeline's round trip before its own goes out
// (redisx.GroupCommit), and behind a slow link the pipelines bunch so that
// many do; that part capped at GateTargetMax — shrinking when it is longer
// and growing while it is shorter, with its adaptive LIFO/CoDel queue. So
// the target is one of the limiter's own queueing: a Redis 20 ms slower
// moves the floor, not the limit, while calls queueing for the limiter's
// CPU lengthen the time without lengthening the floor.
func GateConfig(max int, target time.Duration, redisFloor func() time.Duration) admission.Config {
	if target <= 0 {
		target = GateTarget
	}
	cfg := admission.DefaultConfig()
	cfg.Max = int64(max)
	cfg.Min = min(GateMin, cfg.Max)
	cfg.Initial = min(64, cfg.Max)
	cfg.Baseline, cfg.Tolerance, cfg.Slack = target, 1, 0
	if redisFloor != nil {
		cfg.DependencyWait = func() time.Duration { return min(2*redisFloor(), GateTargetMax) }
	}
	return cfg
}

// GateTarget is the default time from the gate to the answer the entry
// gate's limit aims at: short beside a gateway's 20–50 ms, long beside a
// call's own cost (tens of µs of CPU and a Redis round trip). A shorter
// target keeps fewer calls runnable at once: with 2 ms, CRITICAL calls were
// answered in half the time under overload, and a closed loop of 64 callers
// got about a quarter fewer answers (docs/chaos.md, 2026-12-01 07:50–08:00).
const GateTarget = 5 * time.Millisecond

// GateTargetMin and GateTargetMax bound a configured target.
const (
	GateTargetMin = time.Millisecond
	GateTargetMax = 50 * time.Millisecond
)

// GateMin is the fewest calls the entry gate lets through at once.
const GateMin = 8

// WithGate puts an entry gate of at most max calls decided at once, aiming
// at target (0: GateTarget) above redisFloor, in front of the service
// (GateConfig); max 0: none (the default).
func WithGate(max int, target time.Duration, redisFloor func() time.Duration) GRPCOption {
	return func(e *EnvoyRLS) {
		if max > 0 {
			e.gateCfg = GateConfig(max, target, redisFloor)
		}
	}
}

// gate is the entry gate of one EnvoyRLS.
type gate struct {
	lim     *admission.ConcurrencyLimit
	left    *prometheus.CounterVec
	refused prometheus.Counter // left{outcome="refused"}: at the door (tap)
	pacer   *pacer             // its read side (WithReadPacing), or nil
}

func newGate(cfg admission.Config, reg prometheus.Registerer) *gate {
	limit := promauto.With(reg).NewGauge(prometheus.GaugeOpts{Name: "floodgate_limiter_grpc_gate_limit",
		Help: "ShouldRateLimit calls the entry gate lets be decided at once (adaptive; CRITICAL calls pass it regardless)."})
	g := &gate{lim: admission.NewConcurrencyLimit(cfg, func(v int64) { limit.Set(float64(v)) }),
		left: promauto.With(reg).NewCounterVec(prometheus.CounterOpts{Name: "floodgate_limiter_grpc_gate_left_total",
			Help: "ShouldRateLimit calls the entry gate did not let through, by outcome (refused: at the door, before the call was read, while a full round waited; dropped: queued too long; both answered UNAVAILABLE; past_deadline: the deadline passed in the queue; canceled: the caller went away while queued)."},
			[]string{"outcome"})}
	g.refused = g.left.WithLabelValues("refused")
	if reg != nil {
		_ = reg.Register(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "floodgate_limiter_grpc_gate_waiting",
			Help: "ShouldRateLimit calls waiting at the entry gate."}, func() float64 { return float64(g.lim.Waiting()) }))
		_ = reg.Register(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "floodgate_limiter_grpc_gate_target_seconds",
			Help: "The average time from the entry gate to the answer its limit aims at: FLOODGATE_LIMITER_GRPC_GATE_TARGET above twice the shortest Redis round trip of late."},
			func() float64 { return g.lim.Target().Seconds() }))
	}
	return g
}

// enter lets a call through the gate, or waits for its turn; it returns
// the time it went through (for exit) or the error the call ends with. A
// CRITICAL call is never queued. A call that waited its longest (while the
// queue stands, twice its CoDel target) is answered UNAVAILABLE at once, as
// Envoy's adaptive concurrency answers 503: its caller applies its failure
// mode now rather than at its timeout, and nothing more is spent on it.
func (g *gate) enter(done <-chan struct{}, deadline time.Time, critical bool) (time.Time, error) {
	if critical {
		g.lim.Take()
		return time.Now(), nil
	}
	outcome := g.lim.AcquireWait(done, deadline)
	if outcome != admission.Admitted && g.pacer != nil { // it left the queue without a permit (exit's kick counts a permit handed on)
		g.pacer.kick()
	}
	switch outcome {
	case admission.Admitted:
		return time.Now(), nil
	case admission.PastDeadline:
		g.left.WithLabelValues("past_deadline").Inc()
		return time.Time{}, status.Error(codes.DeadlineExceeded, server.DeadlineReason)
	case admission.Canceled:
		g.left.WithLabelValues("canceled").Inc()
		return time.Time{}, errCanceled
	}
	g.left.WithLabelValues("dropped").Inc()
	return time.Time{}, errRefused
}

// Overloaded is the message of the UNAVAILABLE answer to a call the entry
// gate dropped.
const Overloaded = "overloaded: not decided (the limiter's entry gate dropped the call)"

// tap is the gate's door (grpc.InTapHandle): it runs in the connection's
// reader as a ShouldRateLimit stream opens, before grpc-go gives the stream
// a goroutine or reads its message, and refuses it — UNAVAILABLE, written
// by the transport at once — while the queue already holds a full round of
// waiting calls (as many as the limit lets through at once). A refusal
// there skips the stream's goroutine, its message and its decision (not
// the reading of its frames nor the writing of its trailers), so a limiter
// past saturation keeps reading its sockets and what it queues is fresh. The door
// cannot see a call's priority (it is in the message): CRITICAL calls are
// refused there unless the stream's metadata says so (MetadataPriority).
// Other methods (health) pass.
func (g *gate) tap(ctx context.Context, info *tap.Info) (context.Context, error) {
	if info.FullMethodName == rlsv3.RateLimitService_ShouldRateLimit_FullMethodName && g.lim.Waiting() >= g.lim.Limit() &&
		!criticalMetadata(info.Header) {
		g.refused.Inc()
		return nil, errRefused
	}
	return ctx, nil
}

// errRefused is the door's answer, made once.
var errRefused = status.Error(codes.Unavailable, Overloaded)

// errCanceled ends a call whose caller went away while it waited at the
// gate; no one reads the answer.
var errCanceled = status.Error(codes.Canceled, "canceled: the caller went away while the call waited at the entry gate")

// exit lets the next call through.
func (g *gate) exit(start time.Time) {
	g.lim.Release(start)
	if g.pacer != nil { // a queued call may have gone through, or the limit grown
		g.pacer.kick()
	}
}

// MetadataPriority is the gRPC metadata a gateway names a call's priority
// in for the entry gate's door, which cannot read the descriptors: Envoy
// sets it for every call of a rate-limit cluster (its grpc_service's
// initial_metadata), so a gateway sends its CRITICAL routes' calls through
// a cluster of their own that carries `x-floodgate-priority: critical`.
const MetadataPriority = "x-floodgate-priority"

// criticalMetadata reports whether md names the CRITICAL priority.
func criticalMetadata(md metadata.MD) bool {
	v := md[MetadataPriority]
	return len(v) > 0 && v[0] == string(events.PriorityCritical)
}

// critical reports whether a call names the CRITICAL priority in its
// descriptors (a route's default priority is not looked up before the gate).
func critical(descs []*rlcommon.RateLimitDescriptor) bool {
	for _, d := range descs {
		for _, en := range d.GetEntries() {
			if en.GetKey() == KeyPriority && en.GetValue() == string(events.PriorityCritical) {
				return true
			}
		}
	}
	return false
}

// gateResult is the requests result of a call the gate did not let through.
func gateResult(err error) string {
	switch status.Code(err) {
	case codes.DeadlineExceeded:
		return "past_deadline"
	case codes.Canceled:
		return "canceled"
	}
	return "overloaded"
}
