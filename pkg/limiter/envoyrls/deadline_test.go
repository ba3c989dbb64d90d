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
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/floodgate-dev/floodgate/pkg/kafkatest"
	"github.com/floodgate-dev/floodgate/pkg/limiter/limitertest"
	"github.com/floodgate-dev/floodgate/pkg/limiter/server"
	"github.com/floodgate-dev/floodgate/pkg/promtest"
	"github.com/floodgate-dev/floodgate/pkg/redisx/redistest"
)

// TestEnvoyCallPastItsDeadlineCostsNothing: a call that reaches the service
// after its gRPC deadline is answered DEADLINE_EXCEEDED at once — counted,
// never decided or published; Envoy's x-envoy-expected-rq-timeout-ms
// metadata is read when the call has no gRPC deadline and must be whole
// milliseconds.
func TestEnvoyCallPastItsDeadlineCostsNothing(t *testing.T) {
	rls, pub, reg := fiveABot(t)
	id := redistest.Unique(t, "late_bot")
	in := &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*rlcommon.RateLimitDescriptor{limitertest.BotDescriptor(id)}}

	late, cancel := context.WithDeadline(context.Background(), time.Now().Add(-time.Millisecond))
	defer cancel()
	_, err := rls.ShouldRateLimit(late, in)
	require.Equal(t, codes.DeadlineExceeded, status.Code(err))
	require.Empty(t, pub.Messages())
	require.Equal(t, 1.0, promtest.Value(t, reg, "floodgate_limiter_calls_dropped_past_deadline_total", map[string]string{"protocol": "grpc", "priority": "none"}))

	bad := metadata.NewIncomingContext(context.Background(), metadata.Pairs("x-envoy-expected-rq-timeout-ms", "soon"))
	_, err = rls.ShouldRateLimit(bad, in)
	require.Equal(t, codes.InvalidArgument, status.Code(err))
	require.Contains(t, status.Convert(err).Message(), server.HeaderEnvoyTimeout)

	ok := metadata.NewIncomingContext(context.Background(), metadata.Pairs("x-envoy-expected-rq-timeout-ms", "5000"))
	r, err := rls.ShouldRateLimit(ok, in)
	require.NoError(t, err)
	require.Equal(t, rlsv3.RateLimitResponse_OK, r.GetOverallCode())
	require.Len(t, pub.Messages(), 1, "decided and published")
	require.EqualValues(t, 4, r.GetStatuses()[0].GetLimitRemaining(), "the late call took nothing")
}

// fiveABot is the service on the real engine and Redis with one rule (5 a
// minute per principal), called directly; its decision events and metrics.
func fiveABot(t *testing.T) (*EnvoyRLS, *kafkatest.Capture, *prometheus.Registry) {
	rdb := redistest.Client(t)
	e := limitertest.Engine(t, rdb, "version: 1\nrules:\n  - {id: bots, tier: principal, limit: 5, period: 1m}\n", nil)
	pub, reg := &kafkatest.Capture{}, prometheus.NewRegistry()
	s := server.New(server.Config{Engine: e, Publisher: pub, Topic: "decisions", Gateway: "envoy-test", Logger: slog.New(slog.DiscardHandler), Registry: reg})
	return NewEnvoyRLS(s), pub, reg
}
