package worker_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/require"

	"github.com/floodgate-dev/floodgate/pkg/deferred"
	"github.com/floodgate-dev/floodgate/pkg/gateway"
	"github.com/floodgate-dev/floodgate/pkg/kafkatest"
	"github.com/floodgate-dev/floodgate/pkg/limiter"
	"github.com/floodgate-dev/floodgate/pkg/limiter/embedded"
	"github.com/floodgate-dev/floodgate/pkg/stacktest"
	"github.com/floodgate-dev/floodgate/pkg/stream"
	"github.com/floodgate-dev/floodgate/services/deferred/internal/worker"
)

// upstream is a real HTTP upstream that applies each order once: it dedupes
// replays by Idempotency-Key, refuses to start a replay past its
// X-Floodgate-Deadline, checks the signed principal and that no client
// credential reached it.
type upstream struct {
	t   *testing.T
	key []byte

	mu        sync.Mutex
	byKey     map[string]int       // idempotency key → times seen
	applied   map[string]int       // order id → times applied
	appliedAt map[string]time.Time // order id → when
	deadline  map[string]time.Time // order id → its deadline (replays)
	principal map[string]string    // order id → principal it was applied for
	replays   []time.Time          // when each replay was applied
	fail5xx   atomic.Int32         // answer 503 to this many replays first
	problems  []string
}

func newUpstream(t *testing.T, key []byte) *upstream {
	return &upstream{t: t, key: key, byKey: map[string]int{}, applied: map[string]int{}, appliedAt: map[string]time.Time{},
		deadline: map[string]time.Time{}, principal: map[string]string{}}
}

func (u *upstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	order := r.Header.Get("X-Order")
	body, _ := io.ReadAll(r.Body)
	u.mu.Lock()
	defer u.mu.Unlock()
	key := r.Header.Get(deferred.HeaderIdempotency)
	if key != "" && (r.Header.Get("Cookie") != "" || strings.HasPrefix(r.Header.Get("Authorization"), "Bearer client-")) {
		u.problems = append(u.problems, "a client credential reached the upstream in a replay: "+order)
	}
	who := r.Header.Get("X-User")
	if key != "" { // a replay
		if r.Header.Get("Authorization") != "Bearer worker-token" {
			u.problems = append(u.problems, "replay without the worker's token: "+order)
		}
		p, err := deferred.VerifyPrincipal(r, u.key, time.Now(), time.Minute)
		if err != nil {
			u.problems = append(u.problems, "replay principal: "+err.Error())
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		who = p
		if u.byKey[key]++; u.byKey[key] > 1 {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusCreated) // the stored answer of the first
			fmt.Fprintf(w, `{"order":%q}`, order)
			return
		}
		dl, err := time.Parse(time.RFC3339Nano, r.Header.Get(deferred.HeaderDeadline))
		if err != nil || time.Now().After(dl) {
			w.WriteHeader(http.StatusGone)
			return
		}
		if u.fail5xx.Add(-1) >= 0 {
			u.byKey[key]-- // not applied: a retry is a first time
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		u.deadline[order] = dl
		u.replays = append(u.replays, time.Now())
	}
	if !bytes.Equal(body, []byte(`{"order":"`+order+`"}`)) {
		u.problems = append(u.problems, fmt.Sprintf("order %s arrived with body %q", order, body))
	}
	u.applied[order]++
	u.appliedAt[order] = time.Now()
	u.principal[order] = who
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Set-Cookie", "upstream=1")
	w.WriteHeader(http.StatusCreated)
	fmt.Fprintf(w, `{"order":%q}`, order)
}

type nopPublisher struct{}

func (nopPublisher) TryPublish(kafka.Message) bool { return true }

// ordersRules is one endpoint rule, POST /orders at limit per period,
// deferring what is over it as deferral (the lines of its defer block).
func ordersRules(limit int, period, deferral string) string {
	return fmt.Sprintf(`version: 1
rules:
  - id: orders
    tier: endpoint
    method: POST
    route: /orders
    limit: %d
    period: %s
    on_limit: defer
    defer:
%s`, limit, period, deferral)
}

var flowRules = ordersRules(20, "1s", `      max_age: 60s
      max_queued: {principal: 400, route: 5000}
      headers: [Content-Type, X-Order, X-User]
`)

// redisClient is a client of the local stack's Redis; a -short run skips
// the test instead.
func redisClient(t testing.TB) *redis.Client {
	stacktest.Needs(t, "integration: needs Redis")
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"})
	t.Cleanup(func() { _ = rdb.Close() })
	require.NoError(t, rdb.Ping(context.Background()).Err(), "the local stack's Redis must run (make up)")
	return rdb
}

// TestDeferredFlowExactlyOnce sends a burst of orders at 5× their limit
// through the reverse proxy: each one is applied by the upstream exactly once —
// directly or by the worker's paced replay — or refused with a 429 the client
// saw; none after its deadline; the worker is stopped and replaced midway.
func TestDeferredFlowExactlyOnce(t *testing.T) {
	ctx := t.Context()
	rdb := redisClient(t)
	run := fmt.Sprintf("t%d", rand.Uint32())
	topic := "floodgate.deferred.v1." + run
	brokers := kafkatest.Start(t, map[string]int32{topic: 8, topic + ".dlq": 1})
	signKey := []byte(strings.Repeat("k", 32))

	rs, err := limiter.ParseRules("flow.yaml", []byte(flowRules))
	require.NoError(t, err)
	emb, err := embedded.New(ctx, embedded.Config{Redis: rdb, Rules: rs, Gateway: "flow-test", Publisher: nopPublisher{}})
	require.NoError(t, err)
	go func() { _ = emb.Run(ctx) }()

	up := newUpstream(t, signKey)
	upSrv := httptest.NewServer(up)
	defer upSrv.Close()
	upURL, _ := url.Parse(upSrv.URL)

	prod := stream.NewProducer(stream.ProducerConfig{Brokers: []string{brokers}, Topic: topic})
	defer prod.Close()
	edge, err := deferred.NewEdge(deferred.EdgeConfig{Policy: emb.Rules().Deferral, Redis: rdb, Producer: prod, Topic: topic,
		Gateway: "flow-test", ResultTTL: time.Hour, Registerer: prometheus.NewRegistry()})
	require.NoError(t, err)
	router, err := gateway.NewRouter([]gateway.Route{{Method: "POST", Template: "/orders"}}, "")
	require.NoError(t, err)
	loop := gateway.TrustedProxies{netip.MustParsePrefix("127.0.0.0/8")}
	proxy, err := gateway.NewReverseProxy(upURL, gateway.Options{Checker: emb, Router: router, TrustedProxies: loop,
		Principal: gateway.PrincipalFromHeaders("X-Kind", "X-User", loop), Deferrer: edge, Timeout: time.Second})
	require.NoError(t, err)
	edgeSrv := httptest.NewServer(proxy)
	defer edgeSrv.Close()

	store := deferred.NewStore(rdb)
	metrics := worker.NewMetrics(prometheus.NewRegistry())
	w := worker.New(worker.Options{Store: store, Limiter: emb, Upstream: upSrv.URL, HTTP: &http.Client{Timeout: 5 * time.Second},
		ServiceToken: "worker-token", SigningKey: signKey, ResultTTL: time.Hour, ResultMaxBody: 1 << 10,
		ResultHeaders: []string{"Content-Type"}, MinBackoff: 20 * time.Millisecond, MaxBackoff: 200 * time.Millisecond,
		Metrics: metrics, Logger: slog.New(slog.DiscardHandler)})
	startWorker := func() context.CancelFunc {
		wctx, wcancel := context.WithCancel(ctx)
		c, err := stream.NewConsumer(stream.ConsumerConfig{Brokers: []string{brokers}, Topic: topic, GroupID: "deferred-" + run,
			Service: "deferred", MaxAttempts: 1 << 30, InitialBackoff: 20 * time.Millisecond, MaxBackoff: 200 * time.Millisecond,
			DrainTimeout: 2 * time.Second, CommitInterval: 100 * time.Millisecond, HeartbeatInterval: 300 * time.Millisecond,
			SessionTimeout: time.Second, JoinGroupBackoff: 100 * time.Millisecond, MaxWait: 200 * time.Millisecond,
			Logger: slog.New(slog.DiscardHandler), Registerer: prometheus.NewRegistry()}, w.Handle)
		require.NoError(t, err)
		done := make(chan struct{})
		go func() { defer close(done); _ = c.Run(wctx) }()
		return func() { wcancel(); <-done }
	}
	stop := startWorker()
	up.fail5xx.Store(5) // the first replays meet a failing upstream

	// The burst: 5 principals, 20/s each allowed, 100 orders/s each sent.
	const principals, perPrincipal = 5, 200
	type outcome struct {
		order, user, location string
		status                int
	}
	results := make(chan outcome, principals*perPrincipal)
	var wg sync.WaitGroup
	client := &http.Client{Timeout: 10 * time.Second}
	for p := range principals {
		wg.Add(1)
		go func() {
			defer wg.Done()
			user := fmt.Sprintf("%s-u%d", run, p)
			tick := time.NewTicker(10 * time.Millisecond)
			defer tick.Stop()
			for i := range perPrincipal {
				<-tick.C
				order := fmt.Sprintf("%s-%d", user, i)
				req, _ := http.NewRequest("POST", edgeSrv.URL+"/orders?src=flow", strings.NewReader(`{"order":"`+order+`"}`))
				req.Header.Set("Content-Type", "application/json")
				req.Header.Set("X-Kind", "user")
				req.Header.Set("X-User", user)
				req.Header.Set("X-Order", order)
				req.Header.Set("Authorization", "Bearer client-secret")
				req.Header.Set("Cookie", "session=client")
				resp, err := client.Do(req)
				if !assertNoErr(t, err) {
					return
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				results <- outcome{order: order, user: user, location: resp.Header.Get("Location"), status: resp.StatusCode}
			}
		}()
	}
	wg.Wait()
	close(results)
	var direct, accepted, refused []outcome
	for o := range results {
		switch o.status {
		case http.StatusCreated:
			direct = append(direct, o)
		case http.StatusAccepted:
			require.True(t, strings.HasPrefix(o.location, deferred.StatusPrefix), o.location)
			accepted = append(accepted, o)
		case http.StatusTooManyRequests:
			refused = append(refused, o)
		default:
			t.Fatalf("order %s: status %d", o.order, o.status)
		}
	}
	t.Logf("burst: %d applied directly, %d deferred (202), %d refused (429)", len(direct), len(accepted), len(refused))
	require.NotEmpty(t, accepted)

	// The worker is replaced midway through the replay.
	time.Sleep(2 * time.Second)
	stop()
	stop = startWorker()
	defer func() { stop() }()

	// Every accepted order ends: poll its Location as its principal.
	deadline := time.Now().Add(120 * time.Second)
	var expired []outcome
	for _, o := range accepted {
		for {
			req, _ := http.NewRequest("GET", edgeSrv.URL+o.location, nil)
			req.Header.Set("X-Kind", "user")
			req.Header.Set("X-User", o.user)
			resp, err := client.Do(req)
			require.NoError(t, err)
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			st := resp.Header.Get(deferred.HeaderDeferredStatus)
			if st == string(deferred.StateExpired) { // visible to the client; never applied (checked below)
				require.Equal(t, http.StatusGone, resp.StatusCode)
				expired = append(expired, o)
				break
			}
			if st == string(deferred.StateDone) {
				require.Equal(t, http.StatusCreated, resp.StatusCode)
				require.JSONEq(t, `{"order":"`+o.order+`"}`, string(body))
				require.Empty(t, resp.Header.Get("Set-Cookie"), "only the listed result headers are kept")
				break
			}
			require.Contains(t, []string{"queued", "sending"}, st, "order %s: %d %s", o.order, resp.StatusCode, body)
			require.True(t, time.Now().Before(deadline), "order %s still %s", o.order, st)
			time.Sleep(100 * time.Millisecond)
		}
	}
	// Another principal cannot read it.
	req, _ := http.NewRequest("GET", edgeSrv.URL+accepted[0].location, nil)
	req.Header.Set("X-Kind", "user")
	req.Header.Set("X-User", run+"-intruder")
	resp, err := client.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusNotFound, resp.StatusCode)

	up.mu.Lock()
	defer up.mu.Unlock()
	require.Empty(t, up.problems[:min(len(up.problems), 5)])
	t.Logf("replay: %d deferred orders done, %d expired (410, never applied)", len(accepted)-len(expired), len(expired))
	isExpired := map[string]bool{}
	for _, o := range expired {
		isExpired[o.order] = true
		require.Zero(t, up.applied[o.order], "an expired order was applied: %s", o.order)
	}
	require.Less(t, len(expired), len(accepted)/10, "most deferred orders are replayed within their max_age")
	for _, o := range append(append([]outcome{}, direct...), accepted...) {
		if isExpired[o.order] {
			continue
		}
		require.Equal(t, 1, up.applied[o.order], "order %s applied %d times", o.order, up.applied[o.order])
		require.Equal(t, "user:"+o.user, normalize(up.principal[o.order]), "order %s", o.order)
		if dl, ok := up.deadline[o.order]; ok {
			require.False(t, up.appliedAt[o.order].After(dl), "order %s applied after its deadline", o.order)
		}
	}
	for _, o := range refused {
		require.Zero(t, up.applied[o.order], "a refused order was applied: %s", o.order)
	}
	require.Len(t, up.applied, len(direct)+len(accepted)-len(expired))
	// Pace: replays of 5 principals at 20/s each.
	sort.Slice(up.replays, func(i, j int) bool { return up.replays[i].Before(up.replays[j]) })
	if n := len(up.replays); n > 20 {
		span := up.replays[n-1].Sub(up.replays[0]).Seconds()
		t.Logf("replay: %d requests in %.2fs = %.1f/s (the rule allows %d/s for %d principals, less their direct traffic)", n, span, float64(n)/span, 20, principals)
	}
}

func normalize(p string) string {
	if strings.Contains(p, ":") {
		return p
	}
	return "user:" + p
}

func assertNoErr(t *testing.T, err error) bool {
	t.Helper()
	if err != nil {
		t.Error(err)
		return false
	}
	return true
}
