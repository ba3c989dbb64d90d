package envoyrls

import (
	"context"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/tap"

	"github.com/floodgate-dev/floodgate/pkg/limiter/admission"
	"github.com/floodgate-dev/floodgate/pkg/limiter/limitertest"
	"github.com/floodgate-dev/floodgate/pkg/limiter/server"
	"github.com/floodgate-dev/floodgate/pkg/promtest"
	"github.com/floodgate-dev/floodgate/pkg/redisx/redistest"
)

// oneAtATime is a gate that lets one call through, queues up to 8 for at
// most 20 ms (10 ms once the queue stands).
func oneAtATime() admission.Config {
	cfg := GateConfig(1, 0, nil)
	cfg.Queue = admission.QueueConfig{Target: 5 * time.Millisecond, Interval: 100 * time.Millisecond, MaxWait: 20 * time.Millisecond, MaxLen: 8}
	return cfg
}

// queued starts a call (a second to its deadline) that waits in g's queue
// and leaves as soon as it is let through; its outcome comes on the channel.
func queued(t *testing.T, g *gate) <-chan error {
	out := make(chan error, 1)
	go func() {
		start, err := g.enter(nil, time.Now().Add(time.Second), false)
		if err == nil {
			g.exit(start)
		}
		out <- err
	}()
	require.Eventually(t, func() bool { return g.lim.Waiting() == 1 }, time.Second, time.Millisecond)
	return out
}

// TestGateAnswersWhatItCannotServe: past the gate's limit a call waits its
// turn and is handed the permit a call gives back; one that does not get it
// in time is answered UNAVAILABLE, one whose deadline passes in the queue
// DEADLINE_EXCEEDED, one whose caller goes away there CANCELED at once; a
// CRITICAL call is never queued.
func TestGateAnswersWhatItCannotServe(t *testing.T) {
	reg := prometheus.NewRegistry()
	g := newGate(oneAtATime(), reg)
	first, err := g.enter(nil, time.Time{}, false)
	require.NoError(t, err)

	crit, err := g.enter(nil, time.Time{}, true)
	require.NoError(t, err, "CRITICAL passes a full gate")
	g.exit(crit)

	admitted := queued(t, g)
	g.exit(first)
	require.NoError(t, <-admitted, "the waiter got the permit the first call gave back")

	held, err := g.enter(nil, time.Time{}, false)
	require.NoError(t, err)
	began := time.Now()
	_, err = g.enter(nil, time.Now().Add(10*time.Second), false)
	require.Equal(t, codes.Unavailable, status.Code(err), "waited its 20 ms")
	require.Equal(t, Overloaded, status.Convert(err).Message())
	require.GreaterOrEqual(t, time.Since(began), 20*time.Millisecond)
	require.Equal(t, "overloaded", gateResult(err))
	require.Equal(t, 1.0, promtest.Value(t, reg, "floodgate_limiter_grpc_gate_left_total", map[string]string{"outcome": "dropped"}))

	_, err = g.enter(nil, time.Now().Add(5*time.Millisecond), false)
	require.Equal(t, codes.DeadlineExceeded, status.Code(err), "its deadline passed in the queue")
	require.Equal(t, server.DeadlineReason, status.Convert(err).Message())
	require.Equal(t, "past_deadline", gateResult(err))
	require.Equal(t, 1.0, promtest.Value(t, reg, "floodgate_limiter_grpc_gate_left_total", map[string]string{"outcome": "past_deadline"}))

	gone := make(chan struct{})
	left := make(chan error, 1)
	go func() {
		_, err := g.enter(gone, time.Now().Add(10*time.Second), false)
		left <- err
	}()
	require.Eventually(t, func() bool { return g.lim.Waiting() == 1 }, time.Second, time.Millisecond)
	close(gone) // the caller resets the call while it waits
	err = <-left
	require.Equal(t, codes.Canceled, status.Code(err), "its caller went away in the queue")
	require.Equal(t, "canceled", gateResult(err))
	require.Equal(t, 1.0, promtest.Value(t, reg, "floodgate_limiter_grpc_gate_left_total", map[string]string{"outcome": "canceled"}))
	g.exit(held)
}

// TestShouldRateLimitPassesTheGate: a call the gate does not let through is
// never decided or published, and counted; a CRITICAL one is decided past a
// full gate.
func TestShouldRateLimitPassesTheGate(t *testing.T) {
	rls, pub, reg := fiveABot(t)
	rls.gate = newGate(oneAtATime(), reg)
	held, err := rls.gate.enter(nil, time.Time{}, false)
	require.NoError(t, err)

	id := redistest.Unique(t, "gated_bot")
	_, err = rls.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*rlcommon.RateLimitDescriptor{limitertest.BotDescriptor(id)}})
	require.Equal(t, codes.Unavailable, status.Code(err))
	require.Empty(t, pub.Messages(), "not decided")
	require.Equal(t, 1.0, promtest.Value(t, reg, "floodgate_limiter_envoy_requests_total", map[string]string{"result": "overloaded"}))

	r, err := rls.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "edge",
		Descriptors: []*rlcommon.RateLimitDescriptor{limitertest.BotDescriptor(id, KeyPriority, "critical")}})
	require.NoError(t, err)
	require.Equal(t, rlsv3.RateLimitResponse_OK, r.GetOverallCode())
	require.EqualValues(t, 4, r.GetStatuses()[0].GetLimitRemaining(), "only the CRITICAL call counted")
	require.Len(t, pub.Messages(), 1)

	byMetadata := metadata.NewIncomingContext(context.Background(), metadata.Pairs(MetadataPriority, "critical"))
	r, err = rls.ShouldRateLimit(byMetadata, &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*rlcommon.RateLimitDescriptor{limitertest.BotDescriptor(id)}})
	require.NoError(t, err, "CRITICAL by its metadata passes too")
	require.EqualValues(t, 3, r.GetStatuses()[0].GetLimitRemaining())
	rls.gate.exit(held)
}

// TestGateDoorRefusesWhileARoundWaits: the door refuses a ShouldRateLimit
// stream while as many calls wait as the limit lets through, and lets it
// in again once they have gone; other methods always pass.
func TestGateDoorRefusesWhileARoundWaits(t *testing.T) {
	reg := prometheus.NewRegistry()
	g := newGate(oneAtATime(), reg)
	rls := &tap.Info{FullMethodName: rlsv3.RateLimitService_ShouldRateLimit_FullMethodName}
	health := &tap.Info{FullMethodName: "/grpc.health.v1.Health/Check"}
	_, err := g.tap(context.Background(), rls)
	require.NoError(t, err, "nobody waits")

	held, err := g.enter(nil, time.Time{}, false)
	require.NoError(t, err)
	_, err = g.tap(context.Background(), rls)
	require.NoError(t, err, "the limit is reached but nobody waits yet")
	waited := queued(t, g)
	_, err = g.tap(context.Background(), rls)
	require.Equal(t, codes.Unavailable, status.Code(err))
	require.Equal(t, Overloaded, status.Convert(err).Message())
	_, err = g.tap(context.Background(), health)
	require.NoError(t, err, "health checks pass the door")
	_, err = g.tap(context.Background(), &tap.Info{FullMethodName: rls.FullMethodName, Header: metadata.Pairs(MetadataPriority, "critical")})
	require.NoError(t, err, "a call its metadata names CRITICAL passes the door")
	require.Equal(t, 1.0, promtest.Value(t, reg, "floodgate_limiter_grpc_gate_left_total", map[string]string{"outcome": "refused"}))

	g.exit(held)
	require.NoError(t, <-waited)
	_, err = g.tap(context.Background(), rls)
	require.NoError(t, err, "open again")
}

// TestGateConfigTarget: the gate's limit aims at the configured target, and
// at GateTarget when none is given, above Redis's floor and the wait for a
// pipeline (as long again), the two capped at GateTargetMax.
func TestGateConfigTarget(t *testing.T) {
	require.Equal(t, 2*time.Millisecond, GateConfig(64, 2*time.Millisecond, nil).Baseline)
	require.Equal(t, GateTarget, GateConfig(64, 0, nil).Baseline)
	require.Equal(t, int64(64), GateConfig(64, 0, nil).Max)
	require.Nil(t, GateConfig(64, 0, nil).DependencyWait)

	floor := 20 * time.Millisecond
	cfg := GateConfig(64, 0, func() time.Duration { return floor })
	require.Equal(t, 40*time.Millisecond, cfg.DependencyWait())
	lim := admission.NewConcurrencyLimit(cfg, nil)
	require.Equal(t, GateTarget+40*time.Millisecond, lim.Target(), "the limit aims above it")
	floor = 0
	require.Equal(t, GateTarget, lim.Target(), "no round trip of late: the target alone")
	floor = time.Second
	require.Equal(t, GateTargetMax, cfg.DependencyWait())
}
