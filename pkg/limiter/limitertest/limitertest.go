// Package limitertest builds engines for the tests of the packages on top of
// pkg/limiter (server, envoyrls, embedded, callers, candidate): each over the
// local Redis, with scale, override and shed keys of the test's own.
package limitertest

import (
	"context"
	"crypto/sha256"
	_ "embed"
	"encoding/hex"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/floodgate-dev/floodgate/pkg/events"
	"github.com/floodgate-dev/floodgate/pkg/kafkatest"
	"github.com/floodgate-dev/floodgate/pkg/limiter"
	"github.com/floodgate-dev/floodgate/pkg/redisx/redistest"
)

// OneBucket is one principal rule of 5 an hour.
const OneBucket = `
version: 1
rules:
  - {id: p, tier: principal, limit: 5, period: 1h}
`

//go:embed testdata/cost-rules.yaml
var costRules string

// CostRules: a bot rule at the default cap, a route whose rule allows large
// costs (exports weigh their rows), a user quota with its own cap
// (testdata/cost-rules.yaml, which pkg/limiter's own tests read too).
func CostRules() string { return costRules }

//go:embed testdata/prio-rules.yaml
var prioRules string

// PrioRules give two routes priorities and the rest best_effort
// (testdata/prio-rules.yaml, which pkg/limiter's own tests read too).
func PrioRules() string { return prioRules }

//go:embed testdata/fail-rules.yaml
var failRules string

// FailRules: one rule per fail policy (open, closed, local), and one in shadow
// (testdata/fail-rules.yaml, which pkg/limiter's own tests read too).
func FailRules() string { return failRules }

// Principal is a bot of the test's own.
func Principal(t testing.TB) events.Principal {
	return events.Principal{Kind: events.PrincipalBot, ID: redistest.Unique(t, "lim")}
}

// Engine builds an engine over rules (YAML) with a runtime whose scale,
// override and shed keys are the test's own (Engine.Runtime); opt, when set,
// changes the config first.
func Engine(t testing.TB, rdb redis.UniversalClient, rules string, opt func(*limiter.EngineConfig)) *limiter.Engine {
	t.Helper()
	rs, err := limiter.ParseRules("test.yaml", []byte(rules))
	require.NoError(t, err)
	rt := limiter.NewRuntime(rdb, slog.New(slog.DiscardHandler), prometheus.NewRegistry())
	rt.ScalesKey, rt.OverridesKey = redistest.Unique(t, "fg:test:scales"), redistest.Unique(t, "fg:test:overrides")
	rt.ShedKey = redistest.Unique(t, "fg:test:shed")
	c := limiter.EngineConfig{Redis: rdb, Rules: limiter.NewRuleStore(rs), Runtime: rt, Budget: 2 * time.Second}
	if opt != nil {
		opt(&c)
	}
	e, err := limiter.NewEngine(c)
	require.NoError(t, err)
	return e
}

// Check decides req (GET /x unless it names a route) and fails the test on an error.
func Check(t testing.TB, e *limiter.Engine, req limiter.Request) limiter.Result {
	t.Helper()
	if req.Method == "" {
		req.Method, req.Route = "GET", "/x"
	}
	r, err := e.Check(context.Background(), req)
	require.NoError(t, err)
	return r
}

// LastDecision decodes the last decision event pub was given.
func LastDecision(t testing.TB, pub *kafkatest.Capture) events.Decision {
	t.Helper()
	msgs := pub.Messages()
	require.NotEmpty(t, msgs, "a decision event was published")
	d, err := events.DecodeDecision(msgs[len(msgs)-1].Value)
	require.NoError(t, err)
	return d
}

// DropPublisher takes every decision event and keeps none.
type DropPublisher struct{}

// TryPublish implements the server's Publisher.
func (DropPublisher) TryPublish(kafka.Message) bool { return true }

// CleanKeys deletes the keys matching pattern.
func CleanKeys(rdb redis.UniversalClient, pattern string) {
	ctx := context.Background()
	it := rdb.Scan(ctx, 0, pattern, 1000).Iterator()
	for it.Next(ctx) {
		rdb.Del(ctx, it.Val())
	}
}

// Post sends body to url's POST /v1/check with the headers hdr and returns
// the answer and its body.
func Post(t testing.TB, url, body string, hdr map[string]string) (*http.Response, []byte) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url+"/v1/check", strings.NewReader(body))
	require.NoError(t, err)
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp, b
}

// DialGRPC serves g on a loopback port for the test and dials it.
func DialGRPC(t testing.TB, g *grpc.Server) *grpc.ClientConn {
	t.Helper()
	_, conn := ServeGRPC(t, g.Serve, g.Stop)
	return conn
}

// ServeGRPC runs serve on a loopback port until the test ends (then stop is
// called, after the connection is closed) and dials that port with grpc-go's
// client: for a server of either transport (grpc-go's, pkg/grpcfast's). It
// returns the address and the connection.
func ServeGRPC(t testing.TB, serve func(net.Listener) error, stop func()) (string, *grpc.ClientConn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	go func() { _ = serve(ln) }()
	t.Cleanup(stop)
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	return ln.Addr().String(), conn
}

// Descriptor is an Envoy rate-limit descriptor of the key-value pairs kv.
func Descriptor(kv ...string) *rlcommon.RateLimitDescriptor {
	d := &rlcommon.RateLimitDescriptor{}
	for i := 0; i+1 < len(kv); i += 2 {
		d.Entries = append(d.Entries, &rlcommon.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	return d
}

// BotDescriptor is the descriptor of a bot's check (POST
// /channels/{channel_id}/messages from 203.0.113.7), with extra pairs.
func BotDescriptor(id string, extra ...string) *rlcommon.RateLimitDescriptor {
	return Descriptor(append([]string{"principal_kind", "bot", "principal_id", id, "remote_address", "203.0.113.7",
		"method", "POST", "route", "/channels/{channel_id}/messages"}, extra...)...)
}

// TokenHash is the SHA-256 of a bearer token, in hex: how a callers spec
// (FLOODGATE_LIMITER_CALLERS) names it.
func TokenHash(tok string) string { s := sha256.Sum256([]byte(tok)); return hex.EncodeToString(s[:]) }
