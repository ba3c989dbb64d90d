package envoyrls

import (
	"context"
	"encoding/json"
	"log/slog"
	"testing"

	commonrl "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/floodgate-dev/floodgate/pkg/httpapi"
	"github.com/floodgate-dev/floodgate/pkg/kafkatest"
	"github.com/floodgate-dev/floodgate/pkg/limiter/limitertest"
	"github.com/floodgate-dev/floodgate/pkg/limiter/server"
	"github.com/floodgate-dev/floodgate/pkg/redisx"
	"github.com/floodgate-dev/floodgate/pkg/redisx/redistest"
)

// TestSecurityEnvoyCostOverTheCapS3: over Envoy's API an over-cost descriptor
// is answered OVER_LIMIT with a cost-over-limit problem and nothing counted —
// an error would make Envoy fail open and let the request through.
func TestSecurityEnvoyCostOverTheCapS3(t *testing.T) {
	rdb := redistest.Client(t)
	e := limitertest.Engine(t, rdb, limitertest.CostRules(), nil)
	pub := &kafkatest.Capture{}
	s := server.New(server.Config{Engine: e, Publisher: pub, Topic: "decisions", Gateway: "test",
		Logger: slog.New(slog.DiscardHandler), Registry: prometheus.NewRegistry()})
	rls := NewEnvoyRLS(s)
	victim := redistest.Unique(t, "victim")
	entries := []*commonrl.RateLimitDescriptor_Entry{
		{Key: KeyPrincipalKind, Value: "bot"}, {Key: KeyPrincipalID, Value: victim}, {Key: KeyRemoteAddress, Value: "203.0.113.7"},
		{Key: KeyMethod, Value: "GET"}, {Key: KeyRoute, Value: "/messages"},
	}
	out, err := rls.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "floodgate", HitsAddend: 1_000_000,
		Descriptors: []*commonrl.RateLimitDescriptor{{Entries: entries}}})
	require.NoError(t, err)
	require.Equal(t, rlsv3.RateLimitResponse_OVER_LIMIT, out.OverallCode)
	var p httpapi.Problem
	require.NoError(t, json.Unmarshal(out.RawBody, &p))
	require.Equal(t, httpapi.ProblemCostOverLimit, p.Type)
	require.Contains(t, p.Detail, "over the max_cost 500 of rule bots")
	require.Empty(t, pub.Messages())
	n, err := rdb.Exists(context.Background(), redisx.BucketKey("bot", victim, "bots|tb")).Result()
	require.NoError(t, err)
	require.Zero(t, n)
}
