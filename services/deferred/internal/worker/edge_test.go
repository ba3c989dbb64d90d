package worker_test

import (
	"context"
	"encoding/base64"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/require"

	"github.com/floodgate-dev/floodgate/pkg/deferred"
	"github.com/floodgate-dev/floodgate/pkg/events"
	"github.com/floodgate-dev/floodgate/pkg/gateway"
	"github.com/floodgate-dev/floodgate/pkg/kafkatest"
	"github.com/floodgate-dev/floodgate/pkg/limiter"
	"github.com/floodgate-dev/floodgate/pkg/stream"
	"github.com/floodgate-dev/floodgate/services/deferred/internal/worker"
)

// denyAll is the limiter's answer to every request over its limit; status
// polls pass.
type denyAll struct{}

func (denyAll) Check(_ context.Context, r gateway.Request) (gateway.Decision, error) {
	if r.Route == gateway.DeferredStatusRoute {
		return gateway.Decision{ID: "dec-poll", Allowed: true}, nil
	}
	return gateway.Decision{ID: "dec-1", Allowed: false, Tier: "endpoint", RetryAfterMS: 1500,
		Headers: map[string]string{"Retry-After": "2"}, Problem: []byte(`{"type":"https://floodgate.dev/problems/rate-limited","status":429}`)}, nil
}

var edgeRules = ordersRules(1, "1m", `      max_age: 2s
      max_queued: {principal: 2, route: 100}
      max_body: 64
      headers: [Content-Type, X-Request-Id]
`)

func edgeServer(t testing.TB, edge *deferred.Edge) *httptest.Server {
	t.Helper()
	router, err := gateway.NewRouter([]gateway.Route{{Method: "POST", Template: "/orders"}}, "")
	require.NoError(t, err)
	loop := gateway.TrustedProxies{netip.MustParsePrefix("127.0.0.0/8")}
	mw, err := gateway.Middleware(gateway.Options{Checker: denyAll{}, Router: router, TrustedProxies: loop,
		Principal: gateway.PrincipalFromHeaders("X-Kind", "X-User", loop), Deferrer: edge})
	require.NoError(t, err)
	srv := httptest.NewServer(mw(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {
		t.Error("a denied request reached the application")
	})))
	t.Cleanup(srv.Close)
	return srv
}

func post(t *testing.T, url, user, body string) *http.Response {
	t.Helper()
	req, _ := http.NewRequest("POST", url+"/orders?x=1", strings.NewReader(body))
	req.Header.Set("X-Kind", "user")
	req.Header.Set("X-User", user)
	req.Header.Set("Authorization", "Bearer client-secret")
	req.Header.Set("Cookie", "session=abc")
	req.Header.Set("X-Api-Key", "k")
	req.Header.Set("X-Request-Id", "r1")
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp
}

// TestEdgeDefersDurablyAndRefusesVisibly: a denied deferrable request becomes
// one deferred.v1 message without credentials and a 202; past max_queued, over
// max_body or with Kafka down the client gets the plain 429 (never a silent
// drop), and a write Kafka did not acknowledge is cancelled for the worker.
func TestEdgeDefersDurablyAndRefusesVisibly(t *testing.T) {
	rdb := redisClient(t)
	run := fmt.Sprintf("e%d", rand.Uint32())
	topic := "floodgate.deferred.v1." + run
	brokers := kafkatest.Start(t, map[string]int32{topic: 1, topic + ".dlq": 1})
	rs, err := limiter.ParseRules("edge.yaml", []byte(edgeRules))
	require.NoError(t, err)
	prod := stream.NewProducer(stream.ProducerConfig{Brokers: []string{brokers}, Topic: topic})
	defer prod.Close()
	edge, err := deferred.NewEdge(deferred.EdgeConfig{Policy: rs.Deferral, Redis: rdb, Producer: prod, Topic: topic,
		Gateway: "edge-test", ResultTTL: time.Hour, Registerer: prometheus.NewRegistry()})
	require.NoError(t, err)
	srv := edgeServer(t, edge)
	user := run + "-alice"

	resp := post(t, srv.URL, user, `{"qty":2}`)
	require.Equal(t, http.StatusAccepted, resp.StatusCode)
	require.Equal(t, "2", resp.Header.Get("Retry-After"))
	loc := resp.Header.Get("Location")
	require.True(t, strings.HasPrefix(loc, deferred.StatusPrefix))
	id := strings.TrimPrefix(loc, deferred.StatusPrefix)

	r := kafka.NewReader(kafka.ReaderConfig{Brokers: []string{brokers}, Topic: topic, Partition: 0, MaxWait: 200 * time.Millisecond})
	defer r.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	msg, err := r.ReadMessage(ctx)
	require.NoError(t, err)
	require.Equal(t, "user:"+user, string(msg.Key), "keyed by principal")
	ev, err := events.DecodeDeferred(msg.Value)
	require.NoError(t, err)
	require.Equal(t, id, ev.ID)
	require.Equal(t, "dec-1", ev.DecisionID)
	require.Equal(t, "orders", ev.Rule)
	require.Equal(t, "/orders", ev.Path)
	require.Equal(t, "x=1", ev.Query)
	require.Equal(t, base64.StdEncoding.EncodeToString([]byte(`{"qty":2}`)), ev.Body)
	require.Equal(t, []events.Header{{Name: "Content-Type", Value: "application/json"}, {Name: "X-Request-Id", Value: "r1"}}, ev.Headers)
	require.NotContains(t, string(msg.Value), "client-secret")
	require.NotContains(t, string(msg.Value), "session=abc")
	require.WithinDuration(t, ev.TS.Add(2*time.Second), ev.Deadline, 0)

	t.Run("the status is the principal's alone", func(t *testing.T) {
		get := func(who string) *http.Response {
			req, _ := http.NewRequest("GET", srv.URL+loc, nil)
			req.Header.Set("X-Kind", "user")
			req.Header.Set("X-User", who)
			resp, err := http.DefaultClient.Do(req)
			require.NoError(t, err)
			resp.Body.Close()
			return resp
		}
		resp := get(user)
		require.Equal(t, http.StatusAccepted, resp.StatusCode)
		require.Equal(t, "queued", resp.Header.Get(deferred.HeaderDeferredStatus))
		require.Equal(t, http.StatusNotFound, get(run+"-mallory").StatusCode)
	})

	t.Run("past max_queued per principal: the plain 429", func(t *testing.T) {
		require.Equal(t, http.StatusAccepted, post(t, srv.URL, user, `{}`).StatusCode)
		require.Equal(t, http.StatusTooManyRequests, post(t, srv.URL, user, `{}`).StatusCode)
		require.Equal(t, http.StatusAccepted, post(t, srv.URL, run+"-bob", `{}`).StatusCode, "another principal has its own bound")
	})

	t.Run("over max_body: the plain 429", func(t *testing.T) {
		require.Equal(t, http.StatusTooManyRequests, post(t, srv.URL, run+"-carol", strings.Repeat("x", 65)).StatusCode)
	})

	t.Run("the queue frees itself at the deadline", func(t *testing.T) {
		time.Sleep(2100 * time.Millisecond)
		require.Equal(t, http.StatusAccepted, post(t, srv.URL, user, `{}`).StatusCode)
	})

	t.Run("Kafka down: the plain 429", func(t *testing.T) {
		dead := stream.NewProducer(stream.ProducerConfig{Brokers: []string{"127.0.0.1:1"}, Topic: topic, MaxAttempts: 1, WriteTimeout: 200 * time.Millisecond})
		defer dead.Close()
		reg := prometheus.NewRegistry()
		e2, err := deferred.NewEdge(deferred.EdgeConfig{Policy: rs.Deferral, Redis: rdb, Producer: dead, Topic: topic,
			Gateway: "edge-test", WriteTimeout: 500 * time.Millisecond, Registerer: reg})
		require.NoError(t, err)
		s2 := edgeServer(t, e2)
		require.Equal(t, http.StatusTooManyRequests, post(t, s2.URL, run+"-dave", `{}`).StatusCode)
		n, err := testutil.GatherAndCount(reg, "floodgate_deferred_refused_total")
		require.NoError(t, err)
		require.Equal(t, 1, n)
		require.Contains(t, metricText(t, reg), `value:"kafka"`)
	})

	t.Run("a draining route: the plain 429", func(t *testing.T) {
		store := deferred.NewStore(rdb)
		require.NoError(t, store.SetDraining(context.Background(), "POST /orders", "test"))
		t.Cleanup(func() { _ = store.SetDraining(context.Background(), "POST /orders", "") })
		reg := prometheus.NewRegistry()
		e3, err := deferred.NewEdge(deferred.EdgeConfig{Policy: rs.Deferral, Redis: rdb, Producer: prod, Topic: topic,
			Gateway: "edge-test", Registerer: reg})
		require.NoError(t, err)
		require.Equal(t, http.StatusTooManyRequests, post(t, edgeServer(t, e3).URL, run+"-erin", `{}`).StatusCode)
		require.Contains(t, metricText(t, reg), `value:"draining"`)
	})

	t.Run("the worker dead-letters an expired request with the reason", func(t *testing.T) {
		store := deferred.NewStore(rdb)
		w := worker.New(worker.Options{Store: store, Limiter: denyAll{}, Upstream: "http://127.0.0.1:1", HTTP: http.DefaultClient,
			SigningKey: []byte(strings.Repeat("k", 32)), ResultTTL: time.Hour, MinBackoff: 10 * time.Millisecond, MaxBackoff: 50 * time.Millisecond,
			Metrics: worker.NewMetrics(prometheus.NewRegistry()), Logger: slog.New(slog.DiscardHandler)})
		err := w.Handle(context.Background(), msg) // its deadline passed while the limiter kept denying
		require.ErrorIs(t, err, worker.ErrExpired)
		require.True(t, stream.IsPermanent(err), "dead-lettered at once, with the reason")
		rec, ok, err := store.Get(context.Background(), id)
		require.NoError(t, err)
		require.True(t, ok)
		require.Equal(t, deferred.StateExpired, rec.State)
		require.Contains(t, rec.Reason, "max_age")
		require.NoError(t, w.Handle(context.Background(), msg), "a redelivery of a finished request is a no-op")
	})
}

func metricText(t *testing.T, reg *prometheus.Registry) string {
	mfs, err := reg.Gather()
	require.NoError(t, err)
	var b strings.Builder
	for _, mf := range mfs {
		b.WriteString(mf.String())
	}
	return b.String()
}
