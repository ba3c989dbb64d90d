package callers_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/floodgate-dev/floodgate/pkg/httpapi"
	"github.com/floodgate-dev/floodgate/pkg/kafkatest"
	"github.com/floodgate-dev/floodgate/pkg/limiter/callers"
	"github.com/floodgate-dev/floodgate/pkg/limiter/envoyrls"
	"github.com/floodgate-dev/floodgate/pkg/limiter/limitertest"
	"github.com/floodgate-dev/floodgate/pkg/limiter/server"
	"github.com/floodgate-dev/floodgate/pkg/redisx/redistest"
)

var sum = limitertest.TokenHash

func TestParseCallers(t *testing.T) {
	c, err := callers.ParseCallers("edge:" + sum("t1") + ":10:user+anonymous, partner:" + sum("t2"))
	require.NoError(t, err)
	cl, err := c.Authenticate("Bearer t1")
	require.NoError(t, err)
	require.Equal(t, "edge", cl.Name)
	require.Equal(t, 10, cl.MaxCost)
	_, err = c.Authenticate("Bearer nope")
	require.ErrorIs(t, err, callers.ErrUnauthenticated)
	_, err = c.Authenticate("t1")
	require.ErrorIs(t, err, callers.ErrUnauthenticated, "the scheme is required")
	for _, bad := range []string{"", "edge", "edge:abc", "edge:" + sum("x") + ":0", "edge:" + sum("x") + ":5:robot",
		"a:" + sum("x") + ",a:" + sum("y")} {
		_, err := callers.ParseCallers(bad)
		require.Error(t, err, bad)
	}
}

// TestSecurityUnauthenticatedChecksS2 replays finding S2 of issue 22: anyone
// who could reach the limiter could name a victim principal (with any cost)
// and get it penalized. With callers configured, a check without a valid
// token is refused over HTTP (the batch form too) and gRPC, and a gateway
// cannot claim a cost or a principal kind beyond its grant.
func TestSecurityUnauthenticatedChecksS2(t *testing.T) {
	rdb := redistest.Client(t)
	e := limitertest.Engine(t, rdb, limitertest.OneBucket, nil)
	cs, err := callers.ParseCallers("edge:" + sum("edge-token") + ":10:user")
	require.NoError(t, err)
	s := server.New(server.Config{Callers: cs, Engine: e, Publisher: &kafkatest.Capture{}, Topic: "decisions", Gateway: "auth-test",
		Logger: slog.New(slog.DiscardHandler), Registry: prometheus.NewRegistry()})
	s.SetReady(true)
	srv := httptest.NewServer(s.Handler())
	t.Cleanup(srv.Close)
	victim := `{"principal":{"kind":"user","id":"` + redistest.Unique(t, "victim") + `"},"ip":"203.0.113.7","method":"GET","route":"/users/@me","cost":%d}`
	body := func(cost int) string { return fmt.Sprintf(victim, cost) }

	cases := []struct {
		name, auth, body string
		status           int
		problem          string
	}{
		{"no token", "", body(1), http.StatusUnauthorized, httpapi.ProblemUnauthenticated},
		{"unknown token", "Bearer guess", body(1), http.StatusUnauthorized, httpapi.ProblemUnauthenticated},
		{"cost beyond the grant", "Bearer edge-token", body(1000000), http.StatusForbidden, httpapi.ProblemForbidden},
		{"a kind beyond the grant", "Bearer edge-token", `{"principal":{"kind":"bot","id":"b"},"ip":"203.0.113.7","method":"GET","route":"/x"}`, http.StatusForbidden, httpapi.ProblemForbidden},
		{"the gateway's own check", "Bearer edge-token", body(1), http.StatusOK, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			hdr := map[string]string{}
			if tc.auth != "" {
				hdr["Authorization"] = tc.auth
			}
			resp, b := limitertest.Post(t, srv.URL, tc.body, hdr)
			require.Equal(t, tc.status, resp.StatusCode, "%s", b)
			if tc.problem != "" {
				var p httpapi.Problem
				require.NoError(t, json.Unmarshal(b, &p))
				require.Equal(t, tc.problem, p.Type)
			}
		})
	}
	resp, err := http.Post(srv.URL+"/v1/check/batch", "application/json", strings.NewReader(`{"checks":[`+body(1)+`]}`))
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusUnauthorized, resp.StatusCode, "the batch form too")

	// gRPC (Envoy's API): the token travels as "authorization" metadata.
	g, _ := envoyrls.NewGRPCServer(s)
	conn := limitertest.DialGRPC(t, g)
	rls := rlsv3.NewRateLimitServiceClient(conn)
	req := &rlsv3.RateLimitRequest{Domain: "d", Descriptors: []*rlcommon.RateLimitDescriptor{limitertest.Descriptor("principal_kind", "user", "principal_id", redistest.Unique(t, "s2grpc"),
		"remote_address", "203.0.113.7", "method", "GET", "route", "/x")}}
	_, err = rls.ShouldRateLimit(context.Background(), req)
	require.Equal(t, codes.Unauthenticated, status.Code(err))
	ctx := metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer edge-token")
	out, err := rls.ShouldRateLimit(ctx, req)
	require.NoError(t, err)
	require.Equal(t, rlsv3.RateLimitResponse_OK, out.GetOverallCode())
	bot := &rlsv3.RateLimitRequest{Domain: "d", Descriptors: []*rlcommon.RateLimitDescriptor{limitertest.BotDescriptor("b1")}}
	_, err = rls.ShouldRateLimit(ctx, bot)
	require.Equal(t, codes.PermissionDenied, status.Code(err), "a kind beyond the grant")
}
