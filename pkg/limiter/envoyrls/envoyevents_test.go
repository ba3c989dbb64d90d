package envoyrls

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/floodgate-dev/floodgate/pkg/envoyconf"
	"github.com/floodgate-dev/floodgate/pkg/events"
	"github.com/floodgate-dev/floodgate/pkg/kafkatest"
	"github.com/floodgate-dev/floodgate/pkg/limiter"
	"github.com/floodgate-dev/floodgate/pkg/limiter/callers"
	"github.com/floodgate-dev/floodgate/pkg/limiter/limitertest"
	"github.com/floodgate-dev/floodgate/pkg/limiter/server"
	"github.com/floodgate-dev/floodgate/pkg/promtest"
	"github.com/floodgate-dev/floodgate/pkg/redisx/redistest"
	"github.com/floodgate-dev/floodgate/pkg/stream"
)

func TestParseEnvoyPrincipalKeys(t *testing.T) {
	cases := []struct {
		spec string
		want []EnvoyPrincipalKey
		err  string
	}{
		{spec: DefaultEnvoyPrincipalKeys, want: []EnvoyPrincipalKey{{"user", events.PrincipalUser}, {"api_key", events.PrincipalAPIKey}, {"remote_address", events.PrincipalAnonymous}}},
		{spec: " bot , session=anonymous,sub=user", want: []EnvoyPrincipalKey{{"bot", events.PrincipalBot}, {"session", events.PrincipalAnonymous}, {"sub", events.PrincipalUser}}},
		{spec: "remote_address=anonymous", want: []EnvoyPrincipalKey{{"remote_address", events.PrincipalAnonymous}}},
		{spec: "customer", err: `say which kind`},
		{spec: "anonymous", err: `say which kind`},
		{spec: "sub=robot", err: `kind "robot"`},
		{spec: "remote_address=user", err: `anonymous principals only`},
		{spec: "user,user", err: `appears twice`},
		{spec: "=user", err: `a key is 1-64 bytes`},
		{spec: " , ", err: `no keys`},
	}
	for _, c := range cases {
		t.Run(c.spec, func(t *testing.T) {
			got, err := ParseEnvoyPrincipalKeys(c.spec, "remote_address")
			if c.err != "" {
				require.ErrorContains(t, err, c.err)
				return
			}
			require.NoError(t, err)
			require.Equal(t, c.want, got)
		})
	}
}

func TestEventText(t *testing.T) {
	cases := []struct {
		in, want string
		changed  bool
	}{
		{"alice", "alice", false},
		{"", "\uFFFD", true},
		{"a\tb\x7f", "a\uFFFDb\uFFFD", true},
		{"caf\xe9", "caf\uFFFD", true},
		{"ünï", "ünï", false},
		{strings.Repeat("x", 70), strings.Repeat("x", 64), true},
		{strings.Repeat("é", 64), strings.Repeat("é", 64), false},
	}
	for _, c := range cases {
		got, changed := eventText(c.in, 64)
		require.Equal(t, c.want, got, "%q", c.in)
		require.Equal(t, c.changed, changed, "%q", c.in)
	}
}

// A call past decision.v1's bounds is published within them, truncated set.
func TestEnvoyCallIsBounded(t *testing.T) {
	req := envoyconf.Request{Domain: strings.Repeat("d", 200)}
	for i := range 10 {
		var d envoyconf.Descriptor
		for j := range 12 {
			d.Entries = append(d.Entries, envoyconf.Entry{Key: fmt.Sprint("k", j), Value: strings.Repeat("v", 10*i+j)})
		}
		req.Descriptors = append(req.Descriptors, d)
	}
	c := envoyCall(&req, nil)
	require.True(t, c.Truncated)
	require.Len(t, c.Descriptors, events.MaxEnvoyDescriptors)
	require.Len(t, c.Descriptors[0].Entries, events.MaxEnvoyEntries)
	require.Equal(t, "\uFFFD", c.Descriptors[0].Entries[0].Value, "an empty value")
	require.Len(t, c.Domain, events.MaxEnvoyDomainLen)
	ev := events.Decision{ID: "x", TS: time.Now(), Principal: events.Principal{Kind: events.PrincipalUser, ID: "u"}, IP: UnknownIP,
		Method: "GET", Route: "/d", Tier: events.TierEndpoint, Cost: 1, Gateway: "g", Envoy: c}
	_, err := events.EncodeDecision(&ev)
	require.NoError(t, err, "a valid decision.v1")

	small := envoyCall(&envoyconf.Request{Domain: "d", Descriptors: []envoyconf.Descriptor{{Entries: []envoyconf.Entry{{Key: "user", Value: "alice"}}}}}, nil)
	require.False(t, small.Truncated)
}

type envoyEventsFixture struct {
	rls    rlsv3.RateLimitServiceClient
	pub    *kafkatest.Capture
	reg    *prometheus.Registry
	eng    *limiter.Engine
	domain string
}

func newEnvoyEventsFixture(t *testing.T, cs *callers.Callers) envoyEventsFixture {
	t.Helper()
	rdb := redistest.Client(t)
	src, domain, _ := envoySource(t, "envoyev", `domain: DOMAIN
descriptors:
  - key: api_key
    rate_limit: {unit: hour, requests_per_unit: 10}
  - key: remote_address
    rate_limit: {unit: hour, requests_per_unit: 10}
  - key: route
    value: /search
    rate_limit: {unit: hour, requests_per_unit: 10}
`)
	e := limitertest.Engine(t, rdb, limitertest.OneBucket, nil)
	reg := prometheus.NewRegistry()
	pub := &kafkatest.Capture{}
	s := server.New(server.Config{Engine: e, Publisher: pub, Topic: "decisions", Gateway: "envoy-test",
		Logger: slog.New(slog.DiscardHandler), Registry: reg, Callers: cs})
	keys, err := ParseEnvoyPrincipalKeys(DefaultEnvoyPrincipalKeys, "remote_address")
	require.NoError(t, err)
	conn, _ := dialService(t, s, WithEnvoyConfig(&EnvoyConfig{Source: src,
		Evaluator: &envoyconf.Evaluator{Redis: rdb, Prefix: "fg:envoytest:" + domain + ":"},
		Identity:  &EnvoyIdentity{Keys: keys, IPKey: "remote_address", MethodKey: "method"}}))
	return envoyEventsFixture{rls: rlsv3.NewRateLimitServiceClient(conn), pub: pub, reg: reg, eng: e, domain: domain}
}

func (f envoyEventsFixture) last(t *testing.T) events.Decision {
	t.Helper()
	return limitertest.LastDecision(t, f.pub)
}

// The adjuster's scales apply to envoy limits by the descriptor's tier and
// route, as to the own path's rules; calls naming no principal answer and
// are counted, not published; a principal without a client address is
// published with the unspecified address.
func TestEnvoyScalesAndAttribution(t *testing.T) {
	f := newEnvoyEventsFixture(t, nil)
	ctx := context.Background()
	key := redistest.Unique(t, "key")
	// tier:principal halves the api key's own counter; the route scale
	// doubles the shared /search counter (an endpoint limit, method POST).
	rt, rdb := f.eng.Runtime(), redistest.Client(t)
	require.NoError(t, rdb.HSet(ctx, rt.ScalesKey, "tier:principal", "0.5", "route:POST /"+f.domain+"/route_%2Fsearch", "2").Err())
	t.Cleanup(func() { rdb.Del(context.Background(), rt.ScalesKey) })
	require.NoError(t, rt.Refresh(ctx))

	r, err := f.rls.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: f.domain, Descriptors: []*rlcommon.RateLimitDescriptor{
		limitertest.Descriptor("api_key", key), limitertest.Descriptor("route", "/search"), limitertest.Descriptor("method", "POST")}})
	require.NoError(t, err)
	require.Equal(t, uint32(5), r.GetStatuses()[0].GetCurrentLimit().GetRequestsPerUnit(), "10 × tier:principal 0.5")
	require.Equal(t, uint32(20), r.GetStatuses()[1].GetCurrentLimit().GetRequestsPerUnit(), "10 × the route's 2")
	ev := f.last(t)
	require.Equal(t, events.Principal{Kind: events.PrincipalAPIKey, ID: key}, ev.Principal)
	require.Equal(t, UnknownIP, ev.IP, "no remote_address entry")
	require.Equal(t, "POST", ev.Method)
	require.Equal(t, events.TierPrincipal, ev.Tier, "4 of 5 left is less room than 19 of 20")
	require.Equal(t, int64(5), ev.Limit)

	before := promtest.Counter(t, f.reg, "floodgate_limiter_envoy_unattributed_total")
	n := len(f.pub.Messages())
	r, err = f.rls.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: f.domain, Descriptors: []*rlcommon.RateLimitDescriptor{limitertest.Descriptor("route", "/search")}})
	require.NoError(t, err)
	require.Equal(t, rlsv3.RateLimitResponse_OK, r.GetOverallCode())
	require.Equal(t, before+1, promtest.Counter(t, f.reg, "floodgate_limiter_envoy_unattributed_total"))
	require.Len(t, f.pub.Messages(), n, "nothing published without a principal")
}

// A caller bound to some principal kinds may not name others through envoy
// entries either.
func TestEnvoyEventsRespectCallerKinds(t *testing.T) {
	const token = "envoy-events-token"
	cs, err := callers.ParseCallers("edge:gateway:" + limitertest.TokenHash(token) + "::anonymous")
	require.NoError(t, err)
	f := newEnvoyEventsFixture(t, cs)
	ctx := metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer "+token)
	_, err = f.rls.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: f.domain, Descriptors: []*rlcommon.RateLimitDescriptor{limitertest.Descriptor("api_key", "k1")}})
	require.Equal(t, codes.PermissionDenied, status.Code(err), "%v", err)
	_, err = f.rls.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: f.domain, Descriptors: []*rlcommon.RateLimitDescriptor{limitertest.Descriptor("remote_address", "192.0.2.1")}})
	require.NoError(t, err)
	require.Equal(t, events.Principal{Kind: events.PrincipalAnonymous, ID: "192.0.2.1"}, f.last(t).Principal)
	// An IPv6 client is keyed by its /64, as pkg/gateway keys anonymous
	// principals; the event keeps the whole address.
	_, err = f.rls.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: f.domain, Descriptors: []*rlcommon.RateLimitDescriptor{limitertest.Descriptor("remote_address", "2001:db8:1:2:3:4:5:6")}})
	require.NoError(t, err)
	ev := f.last(t)
	require.Equal(t, events.Principal{Kind: events.PrincipalAnonymous, ID: "2001:db8:1:2::/64"}, ev.Principal)
	require.Equal(t, "2001:db8:1:2:3:4:5:6", ev.IP.String())
}

// A caller bound to an id namespace may not name principals outside it
// through envoy entries either (issue 37 T2): PermissionDenied, counted,
// nothing published.
func TestEnvoyEventsRespectCallerIDs(t *testing.T) {
	const token = "envoy-ids-token"
	cs, err := callers.ParseCallers("partner:gateway:" + limitertest.TokenHash(token) + "::api_key:acme-*")
	require.NoError(t, err)
	reg := prometheus.NewRegistry()
	reg.MustRegister(cs)
	f := newEnvoyEventsFixture(t, cs)
	ctx := metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer "+token)
	n := len(f.pub.Messages())
	_, err = f.rls.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: f.domain, Descriptors: []*rlcommon.RateLimitDescriptor{limitertest.Descriptor("api_key", "globex-k1")}})
	require.Equal(t, codes.PermissionDenied, status.Code(err), "%v", err)
	require.Len(t, f.pub.Messages(), n, "nothing published")
	n2, err := testutil.GatherAndCount(reg, "floodgate_limiter_forbidden_total")
	require.NoError(t, err)
	require.Equal(t, 1, n2, "one refusal series")
	require.Equal(t, 1.0, promtest.Counter(t, reg, "floodgate_limiter_forbidden_total"), "counted, reason principal")
	_, err = f.rls.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: f.domain, Descriptors: []*rlcommon.RateLimitDescriptor{limitertest.Descriptor("api_key", "acme-k1")}})
	require.NoError(t, err)
	require.Equal(t, events.Principal{Kind: events.PrincipalAPIKey, ID: "acme-k1"}, f.last(t).Principal)
}

// A scratch reused for a smaller call after a larger one (as the pool
// hands them out) builds the same envoy object as a fresh one, and
// release forgets the call's strings.
func TestEnvoyCallInAReusedScratch(t *testing.T) {
	big := envoyconf.Request{Domain: "big"}
	for i := range 3 {
		big.Descriptors = append(big.Descriptors, envoyconf.Descriptor{Entries: []envoyconf.Entry{{Key: "k", Value: fmt.Sprint("v", i)}, {Key: "user", Value: "bob"}}})
	}
	small := envoyconf.Request{Domain: "d", Descriptors: []envoyconf.Descriptor{{Entries: []envoyconf.Entry{{Key: "user", Value: "alice"}}}}}
	sc := new(envoyScratch)
	require.Equal(t, envoyCall(&big, nil), envoyCall(&big, sc))
	require.Equal(t, 6, sc.used)
	got := envoyCall(&small, sc)
	require.Equal(t, envoyCall(&small, nil), got)
	require.Len(t, got.Descriptors, 1)
	require.Equal(t, 1, cap(got.Descriptors[0].Entries), "a descriptor's entries cannot grow into the next one's")
	sc.used = 6 // as after the big call: release clears every entry it used
	sc.release()
	require.Equal(t, envoyScratch{}, *sc)
}

// A call's decision id is minted into its scratch, which the next call
// reuses: every published event keeps its own id, in its value and in its
// ce_id header alike.
func TestEnvoyEventIDsOutliveTheirScratch(t *testing.T) {
	f := newEnvoyEventsFixture(t, nil)
	ctx := context.Background()
	key := redistest.Unique(t, "key")
	for range 5 {
		_, err := f.rls.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: f.domain, Descriptors: []*rlcommon.RateLimitDescriptor{limitertest.Descriptor("api_key", key)}})
		require.NoError(t, err)
	}
	msgs := f.pub.Messages()
	require.Len(t, msgs, 5)
	seen := map[string]bool{}
	for _, m := range msgs {
		ev, err := events.DecodeDecision(m.Value)
		require.NoError(t, err)
		require.False(t, seen[ev.ID], "id %s published twice", ev.ID)
		seen[ev.ID] = true
		var ceID string
		for _, h := range m.Headers {
			if h.Key == stream.HeaderCEID {
				ceID = string(h.Value)
			}
		}
		require.Equal(t, ev.ID, ceID)
	}
}
