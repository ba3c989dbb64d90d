package app

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/require"

	"github.com/floodgate-dev/floodgate/pkg/events"
	"github.com/floodgate-dev/floodgate/pkg/kafkatest"
	"github.com/floodgate-dev/floodgate/pkg/redisx"
	"github.com/floodgate-dev/floodgate/pkg/redisx/redistest"
	"github.com/floodgate-dev/floodgate/pkg/stacktest"
)

// The local Kafka-protocol broker every service uses (make up).
const localBroker = "127.0.0.1:9092"

func envoyDescriptor(kv ...string) *rlcommon.RateLimitDescriptor {
	d := &rlcommon.RateLimitDescriptor{}
	for i := 0; i+1 < len(kv); i += 2 {
		d.Entries = append(d.Entries, &rlcommon.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	return d
}

// Issue 14 item 3, end to end on the real stack: the limiter binary's wiring
// serves an envoy ratelimit configuration; every call for its domain is a
// decision.v1 event a consumer reads off the local broker — principal from
// the first configured key present, client address, domain and entries,
// the matched configuration path as route — and a penalty the detector
// writes to Redis lowers that principal's envoy limit.
func TestEnvoyConfiguredCallsArePublishedAndPenalized(t *testing.T) {
	rdb := redistest.Client(t)
	run := redistest.Unique(t, "envoyev")
	domain, topic := "edge_"+run, "envoyev."+run
	kafkatest.CreateTopic(t, localBroker, topic, 1)
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "edge.yaml"), fmt.Appendf(nil, `domain: %s
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 4}
  - key: remote_address
    rate_limit: {unit: minute, requests_per_unit: 100}
`, domain), 0o644))
	httpAddr, grpcAddr := stacktest.FreeAddr(t), stacktest.FreeAddr(t)
	env := map[string]string{
		"FLOODGATE_LIMITER_ADDR": httpAddr, "FLOODGATE_LIMITER_GRPC_ADDR": grpcAddr, "FLOODGATE_GATEWAY": "envoy-events-test",
		"FLOODGATE_LIMITER_INFLUX_INTERVAL": "0", "FLOODGATE_LIMITER_ENVOY_CONFIG": dir,
		"FLOODGATE_KAFKA_BROKERS": localBroker, "FLOODGATE_DECISIONS_TOPIC": topic, "FLOODGATE_JOURNAL_DIR": t.TempDir(),
		// the default, spelled out
		"FLOODGATE_LIMITER_ENVOY_PRINCIPAL_KEYS": "user,api_key,remote_address",
	}
	startLimiter(t, env)
	ctx := t.Context()
	rls := rlsClient(t, ctx, grpcAddr, "")

	alice, bob := "alice_"+run, "bob_"+run
	// bob is penalized: the detector's multiplier in Redis, as it writes it.
	penKey := redisx.PenaltyKey("user", bob)
	require.NoError(t, rdb.HSet(ctx, penKey, redisx.PenaltyFieldMultiplier, "0.5").Err())
	require.NoError(t, rdb.Expire(ctx, penKey, time.Minute).Err())
	t.Cleanup(func() { rdb.Del(context.Background(), penKey) })

	call := func(descs ...*rlcommon.RateLimitDescriptor) *rlsv3.RateLimitResponse {
		t.Helper()
		r, err := rls.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: domain, Descriptors: descs})
		require.NoError(t, err)
		return r
	}
	codes := func(user string) (out []rlsv3.RateLimitResponse_Code, last *rlsv3.RateLimitResponse) {
		for range 5 {
			last = call(envoyDescriptor("user", user), envoyDescriptor("remote_address", "203.0.113.50"), envoyDescriptor("method", "POST"))
			out = append(out, last.GetStatuses()[0].GetCode())
		}
		return out, last
	}
	ok, over := rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT
	aliceCodes, aliceLast := codes(alice)
	require.Equal(t, []rlsv3.RateLimitResponse_Code{ok, ok, ok, ok, over}, aliceCodes, "no penalty: envoy ratelimit's answers")
	require.Equal(t, uint32(4), aliceLast.GetStatuses()[0].GetCurrentLimit().GetRequestsPerUnit())
	bobCodes, bobLast := codes(bob)
	require.Equal(t, []rlsv3.RateLimitResponse_Code{ok, ok, over, over, over}, bobCodes, "a penalty of 0.5 halves the limit")
	require.Equal(t, uint32(2), bobLast.GetStatuses()[0].GetCurrentLimit().GetRequestsPerUnit())
	require.Equal(t, uint32(100), bobLast.GetStatuses()[1].GetCurrentLimit().GetRequestsPerUnit(), "the address's counter is not the principal's: not penalized")

	// Without the user key the call still answers, and is the client address's.
	anon := call(envoyDescriptor("remote_address", "198.51.100.77"))
	require.Equal(t, ok, anon.GetOverallCode())
	// Without any identifying key: answered, not published, counted.
	none := call(envoyDescriptor("generic_key", "nothing"))
	require.Equal(t, ok, none.GetOverallCode())

	// A consumer reads the events off the broker.
	r := kafka.NewReader(kafka.ReaderConfig{Brokers: []string{localBroker}, Topic: topic, Partition: 0, MaxWait: 100 * time.Millisecond})
	defer r.Close()
	var got []events.Decision
	rctx, rcancel := context.WithTimeout(ctx, 20*time.Second)
	defer rcancel()
	for len(got) < 11 {
		m, err := r.ReadMessage(rctx)
		require.NoError(t, err, "read %d events of 11", len(got))
		ev, err := events.DecodeDecision(m.Value)
		require.NoError(t, err)
		require.Equal(t, ev.Principal.Key(), string(m.Key), "keyed by the principal")
		got = append(got, ev)
	}

	first := got[0]
	require.Equal(t, events.Principal{Kind: events.PrincipalUser, ID: alice}, first.Principal)
	require.Equal(t, "203.0.113.50", first.IP.String())
	require.Equal(t, "POST", first.Method, "from the method entry")
	require.Equal(t, "/"+domain+"/user", first.Route, "the matched configuration path")
	require.Equal(t, events.TierPrincipal, first.Tier)
	require.True(t, first.Allowed)
	require.Equal(t, int64(4), first.Limit)
	require.Equal(t, int64(3), first.Remaining)
	require.Equal(t, domain+".user", first.Rule)
	require.Equal(t, "envoy-events-test", first.Gateway)
	require.NotNil(t, first.Envoy)
	require.Equal(t, domain, first.Envoy.Domain)
	require.Equal(t, []events.EnvoyDescriptor{
		{Entries: []events.EnvoyEntry{{Key: "user", Value: alice}}},
		{Entries: []events.EnvoyEntry{{Key: "remote_address", Value: "203.0.113.50"}}},
		{Entries: []events.EnvoyEntry{{Key: "method", Value: "POST"}}},
	}, first.Envoy.Descriptors)
	require.False(t, first.Envoy.Truncated)
	require.Zero(t, first.PenaltyMultiplier)

	require.False(t, got[4].Allowed, "alice's fifth call")
	require.Equal(t, events.TierPrincipal, got[4].Tier)

	bobThird := got[7]
	require.Equal(t, bob, bobThird.Principal.ID)
	require.False(t, bobThird.Allowed)
	require.Equal(t, events.TierPenalty, bobThird.Tier, "denied while penalized: the penalty's doing")
	require.Equal(t, 0.5, bobThird.PenaltyMultiplier)
	require.Equal(t, int64(2), bobThird.Limit)

	last := got[10]
	require.Equal(t, events.Principal{Kind: events.PrincipalAnonymous, ID: "198.51.100.77"}, last.Principal)
	require.Equal(t, "198.51.100.77", last.IP.String())
	require.Equal(t, "GET", last.Method, "no method entry")
	require.Equal(t, "/"+domain+"/remote_address", last.Route)
	require.True(t, last.Allowed)

	resp, err := http.Get("http://" + httpAddr + "/metrics")
	require.NoError(t, err)
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.NoError(t, err)
	require.Contains(t, string(body), "floodgate_limiter_envoy_unattributed_total 1\n")
	require.True(t, strings.Contains(string(body), `floodgate_limiter_decisions_total{outcome="denied",tier="penalty"} 3`), "envoy decisions are counted as decisions")
}
