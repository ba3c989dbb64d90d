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
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/floodgate-dev/floodgate/pkg/events"
	"github.com/floodgate-dev/floodgate/pkg/httpapi"
	"github.com/floodgate-dev/floodgate/pkg/kafkatest"
	"github.com/floodgate-dev/floodgate/pkg/limiter/callers"
	"github.com/floodgate-dev/floodgate/pkg/limiter/checkapi"
	"github.com/floodgate-dev/floodgate/pkg/limiter/envoyrls"
	"github.com/floodgate-dev/floodgate/pkg/limiter/limitertest"
	"github.com/floodgate-dev/floodgate/pkg/limiter/server"
	"github.com/floodgate-dev/floodgate/pkg/redisx/redistest"
)

var sum = limitertest.TokenHash

func TestParseCallers(t *testing.T) {
	c, err := callers.ParseCallers("edge:gateway:" + sum("t1") + ":10:user+anonymous, partner:gateway:" + sum("t2"))
	require.NoError(t, err)
	cl, err := c.Authenticate("Bearer t1")
	require.NoError(t, err)
	require.Equal(t, "edge", cl.Name)
	require.Equal(t, 10, cl.MaxCost)
	_, err = c.Authenticate("Bearer nope")
	require.ErrorIs(t, err, callers.ErrUnauthenticated)
	_, err = c.Authenticate("t1")
	require.ErrorIs(t, err, callers.ErrUnauthenticated, "the scheme is required")
	require.False(t, c.Legacy())
	for _, bad := range []string{"", "edge", "edge:abc", "edge:gateway:" + sum("x") + ":0", "edge:gateway:" + sum("x") + ":5:robot",
		"a:gateway:" + sum("x") + ",a:gateway:" + sum("y"), "edge:admin:" + sum("x"), "edge:" + sum("x") + ":0"} {
		_, err := callers.ParseCallers(bad)
		require.Error(t, err, bad)
	}
}

// callersServer is a ready limiter server, one bucket on the local Redis,
// whose callers are spec, publishing to pub and counting on reg, and an HTTP
// server of its handler.
func callersServer(t *testing.T, spec, gateway string, pub *kafkatest.Capture, reg *prometheus.Registry) (*server.Server, *httptest.Server) {
	t.Helper()
	e := limitertest.Engine(t, redistest.Client(t), limitertest.OneBucket, nil)
	cs, err := callers.ParseCallers(spec)
	require.NoError(t, err)
	s := server.New(server.Config{Callers: cs, Engine: e, Publisher: pub, Topic: "decisions", Gateway: gateway,
		Logger: slog.New(slog.DiscardHandler), Registry: reg})
	s.SetReady(true)
	srv := httptest.NewServer(s.Handler())
	t.Cleanup(srv.Close)
	return s, srv
}

// TestParseCallersLegacyForm: the former entries without a role,
// name:sha256hex[:…], are read as role gateway for one release, and reported.
func TestParseCallersLegacyForm(t *testing.T) {
	old, err := callers.ParseCallers("edge:" + sum("t1") + ":10:user+anonymous, partner:" + sum("t2") + "::api_key:acme-*")
	require.NoError(t, err)
	require.True(t, old.Legacy())
	cl, err := old.Authenticate("Bearer t1")
	require.NoError(t, err)
	require.Equal(t, 10, cl.MaxCost)
	require.Equal(t, []events.PrincipalKind{events.PrincipalUser, events.PrincipalAnonymous}, cl.Kinds)
	cl, err = old.Authenticate("Bearer t2")
	require.NoError(t, err)
	require.Equal(t, []string{"acme-*"}, cl.IDs)
}

// TestSecurityUnauthenticatedChecksS2 replays finding S2 of issue 22: anyone
// who could reach the limiter could name a victim principal (with any cost)
// and get it penalized. With callers configured, a check without a valid
// token is refused over HTTP (the batch form too) and gRPC, and a gateway
// cannot claim a cost or a principal kind beyond its grant.
func TestSecurityUnauthenticatedChecksS2(t *testing.T) {
	s, srv := callersServer(t, "edge:gateway:"+sum("edge-token")+":10:user", "auth-test", &kafkatest.Capture{}, prometheus.NewRegistry())
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

func TestCallerScope(t *testing.T) {
	c, err := callers.ParseCallers("partner:gateway:" + sum("t") + ":100:api_key+bot:acme-*+solo%2Bid:/v1/*+/users/@me")
	require.NoError(t, err)
	cl, err := c.Authenticate("Bearer t")
	require.NoError(t, err)
	require.Equal(t, []string{"acme-*", "solo+id"}, cl.IDs)
	require.Equal(t, []string{"/v1/*", "/users/@me"}, cl.Routes)
	req := func(id, route string) *checkapi.CheckRequest {
		return &checkapi.CheckRequest{Principal: events.Principal{Kind: events.PrincipalAPIKey, ID: id}, Route: route, Cost: 1}
	}
	for _, tc := range []struct {
		id, route, reason string
	}{
		{"acme-key1", "/v1/things", ""},
		{"acme-", "/users/@me", ""},
		{"solo+id", "/v1/", ""},
		{"globex-key1", "/v1/things", "principal"},
		{"acmex", "/v1/things", "principal"},
		{"solo+id2", "/v1/things", "principal"},
		{"acme-key1", "/v2/things", "route"},
		{"acme-key1", "/users/@me/x", "route"},
	} {
		err := cl.Permit(req(tc.id, tc.route))
		if tc.reason == "" {
			require.NoError(t, err, "%s %s", tc.id, tc.route)
			continue
		}
		var se *callers.ScopeError
		require.ErrorAs(t, err, &se, "%s %s", tc.id, tc.route)
		require.Equal(t, tc.reason, se.Reason)
	}
	for _, bad := range []string{
		"p:gateway:" + sum("x") + ":1:api_key:a*b",
		"p:gateway:" + sum("x") + ":1:api_key:%zz",
		"p:gateway:" + sum("x") + ":1:api_key:a++b",
		"p:gateway:" + sum("x") + ":1:api_key:a:/x:extra",
	} {
		_, err := callers.ParseCallers(bad)
		require.Error(t, err, bad)
	}
}

// TestSecurityTokenNamesOnlyItsPrincipalsT2 replays row 2 of issue 37: a
// leaked partner token (kind api_key, max cost 100) named another tenant's
// api_key 600 times from many addresses; every call was accepted, the
// detector raised distributed_ip on the victim and penalized it. Now a
// token is bound to the ids it may name (here the partner's own namespace,
// "acme-*") and routes: a call naming anyone else is refused — 403 over HTTP
// and in the batch form, PermissionDenied over gRPC — counted in
// floodgate_limiter_forbidden_total, and publishes no decision event.
func TestSecurityTokenNamesOnlyItsPrincipalsT2(t *testing.T) {
	pub := &kafkatest.Capture{}
	reg := prometheus.NewRegistry()
	s, srv := callersServer(t, "partner:gateway:"+sum("partner-token")+":100:api_key:acme-*:/v1/*", "scope-test", pub, reg)
	hdr := map[string]string{"Authorization": "Bearer partner-token"}
	check := func(id, ip, route string) string {
		return `{"principal":{"kind":"api_key","id":"` + id + `"},"ip":"` + ip + `","method":"GET","route":"` + route + `","cost":1}`
	}
	victim := redistest.Unique(t, "globex-key")

	const tries = 60
	for i := range tries { // from many addresses, as the attacker did
		resp, b := limitertest.Post(t, srv.URL, check(victim, fmt.Sprintf("198.51.100.%d", i+1), "/v1/things"), hdr)
		require.Equal(t, http.StatusForbidden, resp.StatusCode, "%s", b)
		var p httpapi.Problem
		require.NoError(t, json.Unmarshal(b, &p))
		require.Equal(t, httpapi.ProblemForbidden, p.Type)
	}
	resp, b := limitertest.Post(t, srv.URL, check("acme-"+victim, "198.51.100.1", "/admin/things"), hdr)
	require.Equal(t, http.StatusForbidden, resp.StatusCode, "a route outside the grant: %s", b)
	// The batch form refuses the item, 403.
	req, err := http.NewRequest(http.MethodPost, srv.URL+"/v1/check/batch", strings.NewReader(`{"checks":[`+check(victim, "198.51.100.9", "/v1/things")+`]}`))
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer partner-token")
	bresp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	var batch struct {
		Results []struct {
			Status int              `json:"status"`
			Error  *httpapi.Problem `json:"error"`
		} `json:"results"`
	}
	require.NoError(t, json.NewDecoder(bresp.Body).Decode(&batch))
	bresp.Body.Close()
	require.Len(t, batch.Results, 1)
	require.Equal(t, http.StatusForbidden, batch.Results[0].Status)
	require.NotNil(t, batch.Results[0].Error)
	require.Equal(t, httpapi.ProblemForbidden, batch.Results[0].Error.Type)
	// gRPC.
	g, _ := envoyrls.NewGRPCServer(s)
	rls := rlsv3.NewRateLimitServiceClient(limitertest.DialGRPC(t, g))
	ctx := metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer partner-token")
	_, err = rls.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "d", Descriptors: []*rlcommon.RateLimitDescriptor{limitertest.Descriptor(
		"principal_kind", "api_key", "principal_id", victim, "remote_address", "203.0.113.7", "method", "GET", "route", "/v1/things")}})
	require.Equal(t, codes.PermissionDenied, status.Code(err))

	require.Empty(t, pub.Messages(), "no decision event names the victim")
	require.Equal(t, float64(tries+2), forbidden(t, reg, "principal"))
	require.Equal(t, float64(1), forbidden(t, reg, "route"))
	n, err := testutil.GatherAndCount(reg, "floodgate_limiter_forbidden_total")
	require.NoError(t, err)
	require.Equal(t, 2, n, "the counter is served on the limiter's registry")

	// The partner's own api_key is served, and its decision published.
	resp, b = limitertest.Post(t, srv.URL, check("acme-"+victim, "198.51.100.1", "/v1/things"), hdr)
	require.Equal(t, http.StatusOK, resp.StatusCode, "%s", b)
	require.Len(t, pub.Messages(), 1)
}

// forbidden reads floodgate_limiter_forbidden_total{caller="partner",reason} from reg.
func forbidden(t *testing.T, reg *prometheus.Registry, reason string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() != "floodgate_limiter_forbidden_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["caller"] == "partner" && labels["reason"] == reason {
				return m.GetCounter().GetValue()
			}
		}
	}
	return 0
}
