package embedded_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/require"

	"github.com/floodgate-dev/floodgate/pkg/events"
	"github.com/floodgate-dev/floodgate/pkg/gateway"
	"github.com/floodgate-dev/floodgate/pkg/httpapi"
	"github.com/floodgate-dev/floodgate/pkg/journal"
	"github.com/floodgate-dev/floodgate/pkg/kafkatest"
	"github.com/floodgate-dev/floodgate/pkg/limiter/embedded"
	"github.com/floodgate-dev/floodgate/pkg/redisx"
	"github.com/floodgate-dev/floodgate/pkg/redisx/redistest"
	"github.com/floodgate-dev/floodgate/pkg/stacktest"
)

// A gateway outside this repository embeds the engine through the package's
// exported API only (this is an external test package): pkg/gateway's middleware
// over embedded.New, real Redis and a Kafka-protocol broker over TCP.
func TestEmbeddedEngineInAGoGateway(t *testing.T) {
	const topic = "embedded-decisions"
	broker := kafkatest.Start(t, map[string]int32{topic: 1})
	rdb := redistest.Client(t)
	route := "/" + redistest.Unique(t, "embedded") // the endpoint rule matches only this test's route
	rulesFile := filepath.Join(t.TempDir(), "rate-limits.yaml")
	writeRules := func(limit int) {
		require.NoError(t, os.WriteFile(rulesFile, fmt.Appendf(nil, `
version: 1
rules:
  - {id: embedded-endpoint, tier: endpoint, method: GET, route: %s, limit: %d, period: 1h}
`, route, limit), 0o600))
	}
	writeRules(3)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	lim, err := embedded.New(ctx, embedded.Config{
		Redis: rdb, RulesFile: rulesFile, RulesPoll: 20 * time.Millisecond,
		Brokers: []string{broker}, Topic: topic, Gateway: "embedded-test",
		Logger: slog.New(slog.DiscardHandler),
	})
	require.NoError(t, err)
	ran := make(chan error, 1)
	go func() { ran <- lim.Run(ctx) }()

	router, err := gateway.NewRouter([]gateway.Route{{Method: http.MethodGet, Template: route}}, "")
	require.NoError(t, err)
	mw, err := gateway.Middleware(gateway.Options{Checker: lim, Router: router, Timeout: time.Second,
		Principal: func(r *http.Request) (events.Principal, bool) {
			return events.Principal{Kind: events.PrincipalUser, ID: r.Header.Get("X-User")}, r.Header.Get("X-User") != ""
		}})
	require.NoError(t, err)
	upstream := 0
	srv := httptest.NewServer(mw(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		upstream++
		_, _ = io.WriteString(w, "ok")
	})))
	defer srv.Close()
	user := redistest.Unique(t, "u")
	get := func() *http.Response {
		req, _ := http.NewRequest(http.MethodGet, srv.URL+route, nil)
		req.Header.Set("X-User", user)
		resp, err := srv.Client().Do(req)
		require.NoError(t, err)
		t.Cleanup(func() { resp.Body.Close() })
		return resp
	}

	for i := 2; i >= 0; i-- {
		resp := get()
		require.Equal(t, http.StatusOK, resp.StatusCode)
		require.Equal(t, "3", resp.Header.Get("X-RateLimit-Limit"))
		require.Equal(t, strconv.Itoa(i), resp.Header.Get("X-RateLimit-Remaining"))
	}
	resp := get()
	require.Equal(t, http.StatusTooManyRequests, resp.StatusCode)
	require.Equal(t, "endpoint", resp.Header.Get("X-RateLimit-Scope"))
	retry, err := strconv.Atoi(resp.Header.Get("Retry-After"))
	require.NoError(t, err)
	require.Greater(t, retry, 1000, "one unit refills every 20 minutes")
	var problem httpapi.Problem
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&problem))
	require.Equal(t, httpapi.ProblemRateLimited, problem.Type)
	require.Equal(t, 3, upstream, "the denied request never reached the upstream")

	// Run polls the rules file: a raised limit applies without a restart, and
	// the over-limit cache does not keep answering with the old one.
	writeRules(100)
	require.Eventually(t, func() bool { return lim.Rules().Rules[0].Limit == 100 }, 5*time.Second, 10*time.Millisecond)
	require.Equal(t, "100", get().Header.Get("X-RateLimit-Limit"))

	// Every decision is on the topic, with this gateway's name, in order.
	r := kafka.NewReader(kafka.ReaderConfig{Brokers: []string{broker}, Topic: topic, MaxWait: 50 * time.Millisecond})
	defer r.Close()
	rctx, rcancel := context.WithTimeout(ctx, 10*time.Second)
	defer rcancel()
	var allowed []bool
	for len(allowed) < 5 {
		m, err := r.ReadMessage(rctx)
		require.NoError(t, err, "decision events read so far: %v", allowed)
		d, err := events.DecodeDecision(m.Value)
		require.NoError(t, err)
		require.Equal(t, "embedded-test", d.Gateway)
		require.Equal(t, user, d.Principal.ID)
		require.Equal(t, user, string(m.Key[len("user:"):]))
		allowed = append(allowed, d.Allowed)
	}
	require.Equal(t, []bool{true, true, true, false}, allowed[:4])

	cancel()
	stacktest.Returned(t, ran, 10*time.Second, "Run returns after its context ended")
}

func TestNewNamesBadFields(t *testing.T) {
	_, err := embedded.New(context.Background(), embedded.Config{RulesPoll: time.Millisecond})
	require.Error(t, err)
	for _, field := range []string{"Redis", "Rules", "Gateway", "Brokers", "RulesPoll"} {
		require.ErrorContains(t, err, field)
	}

	_, err = embedded.New(context.Background(), embedded.Config{
		Redis: redistest.Client(t), RulesFile: filepath.Join(t.TempDir(), "missing.yaml"),
		Brokers: []string{"127.0.0.1:1"}, Gateway: "g",
	})
	require.ErrorIs(t, err, embedded.ErrRulesFile)
}

// ExampleNew puts the limiter inside a Go gateway: decisions in-process,
// the 429 contract from pkg/gateway's middleware, decision events to Kafka.
func ExampleNew() {
	ctx := context.Background()
	rdb := redisx.NewClient(redisx.Options{Addrs: []string{"127.0.0.1:6379"}})
	defer rdb.Close()
	lim, err := embedded.New(ctx, embedded.Config{
		Redis: rdb, RulesFile: "rate-limits.yaml",
		Brokers: []string{"127.0.0.1:9092"}, Gateway: "edge-1",
		Journal: journal.Config{Dir: "/var/lib/edge/journal"},
	})
	if err != nil {
		panic(err)
	}
	go func() { _ = lim.Run(ctx) }() // events, journal, scales/overrides poll, rules reload

	mw, err := gateway.Middleware(gateway.Options{Checker: lim})
	if err != nil {
		panic(err)
	}
	api := http.NewServeMux() // the gateway's own routes
	_ = http.ListenAndServe(":8443", mw(api))
}
