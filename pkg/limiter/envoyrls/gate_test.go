package envoyrls

import (
	"context"
	"log/slog"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/floodgate-dev/floodgate/pkg/kafkatest"
	"github.com/floodgate-dev/floodgate/pkg/limiter/admission"
	"github.com/floodgate-dev/floodgate/pkg/limiter/limitertest"
	"github.com/floodgate-dev/floodgate/pkg/limiter/server"
	"github.com/floodgate-dev/floodgate/pkg/promtest"
	"github.com/floodgate-dev/floodgate/pkg/redisx/redistest"
)

// oneAtATime is a gate that lets one call through, queues up to 8 for at
// most 20 ms (5 ms once the queue stands).
func oneAtATime() admission.Config {
	cfg := GateConfig(1)
	cfg.Queue = admission.QueueConfig{Target: 5 * time.Millisecond, Interval: 100 * time.Millisecond, MaxWait: 20 * time.Millisecond, MaxLen: 8}
	return cfg
}

// TestGateLeavesWhatItCannotServeToTheCaller: past the gate's limit a call
// waits its turn; one that does not get it in time is not answered until
// its caller gives up (nothing is decided or written for it), one without a
// deadline is answered Unavailable; a CRITICAL call is never queued.
func TestGateLeavesWhatItCannotServeToTheCaller(t *testing.T) {
	reg := prometheus.NewRegistry()
	g := newGate(oneAtATime(), reg)
	first, err := g.enter(context.Background(), time.Time{}, false)
	require.NoError(t, err)

	crit, err := g.enter(context.Background(), time.Time{}, true)
	require.NoError(t, err, "CRITICAL passes a full gate")
	g.exit(crit)

	// Queued, handed the permit when the first call leaves.
	admitted := make(chan error, 1)
	go func() {
		start, err := g.enter(context.Background(), time.Now().Add(time.Second), false)
		if err == nil {
			g.exit(start)
		}
		admitted <- err
	}()
	require.Eventually(t, func() bool { return g.lim.Waiting() == 1 }, time.Second, time.Millisecond)
	g.exit(first)
	require.NoError(t, <-admitted, "the waiter got the permit the first call gave back")

	// The gate full again: a waiter runs out of its 20 ms and is left to its caller.
	held, err := g.enter(context.Background(), time.Time{}, false)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	left := make(chan error, 1)
	began := time.Now()
	go func() { _, err := g.enter(ctx, time.Now().Add(10*time.Second), false); left <- err }()
	require.Eventually(t, func() bool {
		return promtest.Value(t, reg, "floodgate_limiter_grpc_gate_left_total", map[string]string{"outcome": "dropped"}) == 1
	}, time.Second, time.Millisecond)
	select {
	case err := <-left:
		t.Fatalf("answered %v while its caller still waits", err)
	case <-time.After(50 * time.Millisecond):
	}
	cancel() // the caller gives up (Envoy resets the stream)
	err = <-left
	require.Equal(t, codes.DeadlineExceeded, status.Code(err))
	require.GreaterOrEqual(t, time.Since(began), 70*time.Millisecond)

	_, err = g.enter(context.Background(), time.Time{}, false)
	require.Equal(t, codes.Unavailable, status.Code(err), "no deadline: nobody to leave it to")
	require.Equal(t, 2.0, promtest.Value(t, reg, "floodgate_limiter_grpc_gate_left_total", map[string]string{"outcome": "dropped"}))

	_, err = g.enter(context.Background(), time.Now().Add(5*time.Millisecond), false)
	require.Equal(t, codes.DeadlineExceeded, status.Code(err), "its deadline passed in the queue")
	require.Equal(t, server.DeadlineReason, status.Convert(err).Message())
	require.Equal(t, 1.0, promtest.Value(t, reg, "floodgate_limiter_grpc_gate_left_total", map[string]string{"outcome": "past_deadline"}))
	g.exit(held)
}

// TestShouldRateLimitPassesTheGate: a call the gate does not let through is
// never decided or published; a CRITICAL one is decided past a full gate.
func TestShouldRateLimitPassesTheGate(t *testing.T) {
	rdb := redistest.Client(t)
	e := limitertest.Engine(t, rdb, "version: 1\nrules:\n  - {id: bots, tier: principal, limit: 5, period: 1m}\n", nil)
	pub, reg := &kafkatest.Capture{}, prometheus.NewRegistry()
	s := server.New(server.Config{Engine: e, Publisher: pub, Topic: "decisions", Gateway: "envoy-test", Logger: slog.New(slog.DiscardHandler), Registry: reg})
	rls := NewEnvoyRLS(s)
	rls.gate = newGate(oneAtATime(), reg)
	held, err := rls.gate.enter(context.Background(), time.Time{}, false)
	require.NoError(t, err)

	id := redistest.Unique(t, "gated_bot")
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Millisecond)
	defer cancel()
	_, err = rls.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*rlcommon.RateLimitDescriptor{limitertest.BotDescriptor(id)}})
	require.Equal(t, codes.DeadlineExceeded, status.Code(err))
	require.Empty(t, pub.Messages(), "not decided")

	r, err := rls.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "edge",
		Descriptors: []*rlcommon.RateLimitDescriptor{limitertest.BotDescriptor(id, KeyPriority, "critical")}})
	require.NoError(t, err)
	require.Equal(t, rlsv3.RateLimitResponse_OK, r.GetOverallCode())
	require.EqualValues(t, 4, r.GetStatuses()[0].GetLimitRemaining(), "only the CRITICAL call counted")
	require.Len(t, pub.Messages(), 1)
	rls.gate.exit(held)
}
