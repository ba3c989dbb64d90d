package worker_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
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
	"github.com/floodgate-dev/floodgate/pkg/httpapi"
	"github.com/floodgate-dev/floodgate/pkg/kafkatest"
	"github.com/floodgate-dev/floodgate/pkg/limiter"
	"github.com/floodgate-dev/floodgate/pkg/limiter/embedded"
	"github.com/floodgate-dev/floodgate/pkg/stream"
	"github.com/floodgate-dev/floodgate/services/deferred/internal/worker"
)

// allowAll lets every replay go at once: these tests are about outcomes, not pace.
type allowAll struct{}

func (allowAll) Check(context.Context, gateway.Request) (gateway.Decision, error) {
	return gateway.Decision{ID: "dec-ok", Allowed: true}, nil
}

// redisFault is a go-redis hook that makes a client's Redis unreachable on
// demand: while down, every command fails as a refused connection would.
// trip, when set, is asked about each command while up; true takes Redis
// down from that command on (the command itself fails).
type redisFault struct {
	down atomic.Bool
	trip func(args []any) bool
	hits atomic.Int32
	// loseAnswer, when set, is asked about each command while up; true
	// lets the command run and then fails it, as a reply lost on the way.
	loseAnswer func(args []any) bool
}

var errRedisDown = &net.OpError{Op: "dial", Net: "tcp", Err: errors.New("connect: connection refused (injected)")}

func (f *redisFault) DialHook(next redis.DialHook) redis.DialHook { return next }

func (f *redisFault) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if !f.down.Load() && f.trip != nil && f.trip(cmd.Args()) {
			f.down.Store(true)
		}
		if f.down.Load() {
			f.hits.Add(1)
			cmd.SetErr(errRedisDown)
			return errRedisDown
		}
		if f.loseAnswer != nil && f.loseAnswer(cmd.Args()) {
			_ = next(ctx, cmd)
			f.hits.Add(1)
			cmd.SetErr(errRedisDown)
			return errRedisDown
		}
		return next(ctx, cmd)
	}
}

func (f *redisFault) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if f.down.Load() {
			f.hits.Add(1)
			for _, c := range cmds {
				c.SetErr(errRedisDown)
			}
			return errRedisDown
		}
		return next(ctx, cmds)
	}
}

// storesDone matches the script call that stores a replay's result.
func storesDone(args []any) bool { return transitionTo(args, deferred.StateDone) }

// transitionTo matches a script call that moves a record to state st.
func transitionTo(args []any, st deferred.State) bool {
	if len(args) < 3 || !strings.HasPrefix(strings.ToLower(fmt.Sprint(args[0])), "eval") {
		return false
	}
	for _, a := range args[3:] {
		if fmt.Sprint(a) == string(st) {
			return true
		}
	}
	return false
}

var outcomeRules = ordersRules(1, "1m", `      max_age: 60s
      max_queued: {principal: 100, route: 1000}
      headers: [Content-Type, X-Order, X-User]
`)

type outcomeEnv struct {
	t       *testing.T
	run     string
	topic   string
	brokers string
	rdb     *redis.Client
	rules   *limiter.Ruleset
	signKey []byte
	up      *upstream
	upURL   string
}

func newOutcomeEnv(t *testing.T, rules string) *outcomeEnv {
	t.Helper()
	run := fmt.Sprintf("o%d", rand.Uint32())
	topic := "floodgate.deferred.v1." + run
	e := &outcomeEnv{t: t, run: run, topic: topic, rdb: redisClient(t), signKey: []byte(strings.Repeat("k", 32))}
	e.brokers = kafkatest.Start(t, map[string]int32{topic: 1, topic + ".dlq": 1})
	rs, err := limiter.ParseRules("outcome.yaml", []byte(rules))
	require.NoError(t, err)
	e.rules = rs
	e.up = newUpstream(t, e.signKey)
	srv := httptest.NewServer(e.up)
	t.Cleanup(srv.Close)
	e.upURL = srv.URL
	return e
}

func (e *outcomeEnv) producer() *stream.Producer {
	p := stream.NewProducer(stream.ProducerConfig{Brokers: []string{e.brokers}, Topic: e.topic})
	e.t.Cleanup(func() { _ = p.Close() })
	return p
}

func (e *outcomeEnv) edge(rdb redis.UniversalClient, pub deferred.Publisher, grace time.Duration) *deferred.Edge {
	edge, err := deferred.NewEdge(deferred.EdgeConfig{Policy: e.rules.Deferral, Redis: rdb, Producer: pub, Topic: e.topic,
		Gateway: "outcome-test", ResultTTL: time.Hour, WriteTimeout: 2 * time.Second, StatusExpiryGrace: grace,
		Registerer: prometheus.NewRegistry()})
	require.NoError(e.t, err)
	return edge
}

// startWorker runs a worker in consumer group "deferred-<run>" until ctx ends;
// handle may wrap the worker's handler. The returned channel closes when it stopped.
func (e *outcomeEnv) startWorker(ctx context.Context, store *deferred.Store, wrap func(stream.Handler) stream.Handler) <-chan struct{} {
	w := worker.New(worker.Options{Store: store, Limiter: allowAll{}, Upstream: e.upURL, HTTP: &http.Client{Timeout: 5 * time.Second},
		ServiceToken: "worker-token", SigningKey: e.signKey, ResultTTL: time.Hour, ResultMaxBody: 1 << 10,
		ResultHeaders: []string{"Content-Type"}, MinBackoff: 20 * time.Millisecond, MaxBackoff: 200 * time.Millisecond,
		Metrics: worker.NewMetrics(prometheus.NewRegistry()), Logger: slog.New(slog.DiscardHandler)})
	h := stream.Handler(w.Handle)
	if wrap != nil {
		h = wrap(h)
	}
	c, err := stream.NewConsumer(stream.ConsumerConfig{Brokers: []string{e.brokers}, Topic: e.topic, GroupID: "deferred-" + e.run,
		Service: "deferred", MaxAttempts: 1 << 30, InitialBackoff: 20 * time.Millisecond, MaxBackoff: 200 * time.Millisecond,
		DrainTimeout: 200 * time.Millisecond, CommitInterval: 100 * time.Millisecond, HeartbeatInterval: 300 * time.Millisecond,
		SessionTimeout: time.Second, JoinGroupBackoff: 100 * time.Millisecond, MaxWait: 200 * time.Millisecond,
		Logger: slog.New(slog.DiscardHandler), Registerer: prometheus.NewRegistry()}, h)
	require.NoError(e.t, err)
	done := make(chan struct{})
	go func() { defer close(done); _ = c.Run(ctx) }()
	return done
}

// sendOrder sends one order as user through srv; it is denied and deferred.
func sendOrder(t *testing.T, srv, user, id string) *http.Response {
	t.Helper()
	req, _ := http.NewRequest("POST", srv+"/orders", strings.NewReader(`{"order":"`+id+`"}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Kind", "user")
	req.Header.Set("X-User", user)
	req.Header.Set("X-Order", id)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	return resp
}

// getAs asks for url as the user (X-Kind, X-User) and returns the answer
// and its body.
func getAs(t *testing.T, url, user string) (*http.Response, string) {
	t.Helper()
	req, _ := http.NewRequest("GET", url, nil)
	req.Header.Set("X-Kind", "user")
	req.Header.Set("X-User", user)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp, string(body)
}

// awaitStatus polls loc as user until its status is final (or within).
func awaitStatus(t *testing.T, srv, loc, user string, within time.Duration) (*http.Response, string) {
	t.Helper()
	end := time.Now().Add(within)
	for {
		resp, body := getAs(t, srv+loc, user)
		st := resp.Header.Get(deferred.HeaderDeferredStatus)
		if st != string(deferred.StateQueued) && st != string(deferred.StateSending) {
			return resp, body
		}
		require.True(t, time.Now().Before(end), "%s still %s", loc, st)
		time.Sleep(50 * time.Millisecond)
	}
}

// TestReplayAfterCrashBetweenSendAndResult: the worker's send reaches the
// upstream, which applies the order; the worker dies before it stores the
// result (its Redis goes away at that very write) and before the offset is
// committed. The next worker of the group gets the message again, finds it
// "sending", replays it with the same Idempotency-Key, the upstream answers
// from its dedupe store, and the client's status ends with that one result.
// Real broker, real Redis.
func TestReplayAfterCrashBetweenSendAndResult(t *testing.T) {
	ctx := t.Context()
	e := newOutcomeEnv(t, outcomeRules)
	srv := edgeServer(t, e.edge(e.rdb, e.producer(), 0))
	user, orderID := e.run+"-alice", e.run+"-order-1"
	resp := sendOrder(t, srv.URL, user, orderID)
	require.Equal(t, http.StatusAccepted, resp.StatusCode)
	loc := resp.Header.Get("Location")
	id := strings.TrimPrefix(loc, deferred.StatusPrefix)

	// Worker 1: Redis disappears at the write of the result, and the worker
	// with it (its handler fails from then on; its context is cancelled).
	fault := &redisFault{trip: storesDone}
	dying := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379", MaxRetries: -1})
	defer dying.Close()
	dying.AddHook(fault)
	w1ctx, kill := context.WithCancel(ctx)
	done1 := e.startWorker(w1ctx, deferred.NewStore(dying), func(h stream.Handler) stream.Handler {
		return func(ctx context.Context, m kafka.Message) error {
			if fault.down.Load() {
				kill()
				return errors.New("the worker is dead")
			}
			err := h(ctx, m)
			if fault.down.Load() {
				kill()
			}
			return err
		}
	})
	select {
	case <-done1:
	case <-time.After(30 * time.Second):
		t.Fatal("worker 1 never reached the result write")
	}
	require.True(t, fault.down.Load())

	store := deferred.NewStore(e.rdb)
	rec, ok, err := store.Get(ctx, id)
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, deferred.StateSending, rec.State, "sent, result not stored")
	e.up.mu.Lock()
	require.Equal(t, 1, e.up.applied[orderID], "the upstream applied the order")
	require.Equal(t, 1, e.up.byKey[id])
	e.up.mu.Unlock()

	// Worker 2 takes the uncommitted message over.
	w2ctx, stop2 := context.WithCancel(ctx)
	done2 := e.startWorker(w2ctx, store, nil)
	defer func() { stop2(); <-done2 }()
	resp, body := awaitStatus(t, srv.URL, loc, user, 30*time.Second)
	require.Equal(t, string(deferred.StateDone), resp.Header.Get(deferred.HeaderDeferredStatus))
	require.Equal(t, http.StatusCreated, resp.StatusCode)
	require.JSONEq(t, `{"order":"`+orderID+`"}`, body, "the client gets the one result")

	e.up.mu.Lock()
	defer e.up.mu.Unlock()
	require.Equal(t, 1, e.up.applied[orderID], "applied exactly once")
	require.Equal(t, 2, e.up.byKey[id], "replayed once more under the same Idempotency-Key and answered from the dedupe store")
	require.Empty(t, e.up.problems)
	rec, _, err = store.Get(ctx, id)
	require.NoError(t, err)
	require.Equal(t, 2, rec.Attempts)
}

// flakyPublisher is the edge's Kafka: while lose is set, a write either
// reaches the broker (deliver) or not, then fails as if its acknowledgement
// were lost — and Redis goes away for the edge (fault) at that moment.
type flakyPublisher struct {
	inner   deferred.Publisher
	fault   *redisFault
	lose    atomic.Bool
	lost    atomic.Bool
	deliver atomic.Bool
	calls   atomic.Int32
	fail    atomic.Bool   // fail every write without delivering (Kafka down)
	slow    time.Duration // how long a failing write takes (a writer's retries)
}

func (p *flakyPublisher) Publish(ctx context.Context, msgs ...kafka.Message) error {
	p.calls.Add(1)
	if p.fail.Load() {
		time.Sleep(p.slow)
		return errors.New("dial tcp: connection refused (injected)")
	}
	if !p.lose.Load() {
		return p.inner.Publish(ctx, msgs...)
	}
	if p.lost.Swap(true) { // the edge's retries: Kafka is gone
		return errors.New("dial tcp: connection refused (injected)")
	}
	if p.deliver.Load() {
		if err := p.inner.Publish(ctx, msgs...); err != nil {
			return err
		}
	}
	if p.fault != nil {
		p.fault.down.Store(true)
	}
	return errors.New("write: i/o timeout (injected: the acknowledgement was lost)")
}

// TestEdgeUnknownWriteOutcome: a Kafka write fails without an answer and
// Redis is unreachable for the cancel. The client gets a 202 with status
// unknown, never a 429 for a request that may run; its poll then ends with the
// truth: done (exactly once) when the write had reached the log, expired (and
// never applied) when it had not.
func TestEdgeUnknownWriteOutcome(t *testing.T) {
	ctx := t.Context()
	rules := strings.Replace(outcomeRules, "max_age: 60s", "max_age: 3s", 1)
	e := newOutcomeEnv(t, rules)
	fault := &redisFault{}
	edgeRedis := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379", MaxRetries: -1})
	defer edgeRedis.Close()
	edgeRedis.AddHook(fault)
	pub := &flakyPublisher{inner: e.producer(), fault: fault}
	srv := edgeServer(t, e.edge(edgeRedis, pub, 200*time.Millisecond))
	wctx, stop := context.WithCancel(ctx)
	done := e.startWorker(wctx, deferred.NewStore(e.rdb), nil)
	defer func() { stop(); <-done }()

	for _, tc := range []struct {
		name    string
		deliver bool
		want    deferred.State
	}{
		{"the write reached the log: replayed once", true, deferred.StateDone},
		{"the write never reached the log: expired at the poll", false, deferred.StateExpired},
	} {
		t.Run(tc.name, func(t *testing.T) {
			user, orderID := e.run+"-u-"+string(tc.want), e.run+"-o-"+string(tc.want)
			pub.lose.Store(true)
			pub.lost.Store(false)
			pub.deliver.Store(tc.deliver)
			resp := sendOrder(t, srv.URL, user, orderID)
			pub.lose.Store(false)
			fault.down.Store(false) // Redis is back
			require.Equal(t, http.StatusAccepted, resp.StatusCode, "never a 429 for a request that may still run")
			require.Equal(t, string(deferred.StateUnknown), resp.Header.Get(deferred.HeaderDeferredStatus))
			require.Positive(t, fault.hits.Load(), "the cancel met an unreachable Redis")
			loc := resp.Header.Get("Location")
			id := strings.TrimPrefix(loc, deferred.StatusPrefix)

			resp, body := awaitStatus(t, srv.URL, loc, user, 30*time.Second)
			require.Equal(t, string(tc.want), resp.Header.Get(deferred.HeaderDeferredStatus), body)
			e.up.mu.Lock()
			applied, seen := e.up.applied[orderID], e.up.byKey[id]
			e.up.mu.Unlock()
			if tc.want == deferred.StateDone {
				require.Equal(t, http.StatusCreated, resp.StatusCode)
				require.JSONEq(t, `{"order":"`+orderID+`"}`, body)
				require.Equal(t, 1, applied)
				require.Equal(t, 1, seen)
				return
			}
			require.Equal(t, http.StatusGone, resp.StatusCode)
			var p struct{ Type, Detail string }
			require.NoError(t, json.Unmarshal([]byte(body), &p))
			require.Equal(t, deferred.ProblemExpired, p.Type)
			require.Contains(t, p.Detail, "may never have reached the queue")
			require.Zero(t, applied)
			require.Zero(t, seen)
		})
	}
}

// TestEdgeCancelAnswerLost: the write fails and the edge's cancel reaches
// Redis but its answer does not; the edge tries again, finds the record
// cancelled by its own first try, and answers 429 — not the 202 of "a worker
// took it" (a client once got a 202 for a request that ended cancelled).
func TestEdgeCancelAnswerLost(t *testing.T) {
	e := newOutcomeEnv(t, outcomeRules)
	var lost atomic.Bool
	fault := &redisFault{loseAnswer: func(args []any) bool {
		return transitionTo(args, deferred.StateCancelled) && !lost.Swap(true)
	}}
	edgeRedis := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379", MaxRetries: -1})
	defer edgeRedis.Close()
	edgeRedis.AddHook(fault)
	pub := &flakyPublisher{inner: e.producer()}
	pub.fail.Store(true)
	edge, err := deferred.NewEdge(deferred.EdgeConfig{Policy: e.rules.Deferral, Redis: edgeRedis, Producer: pub, Topic: e.topic,
		Gateway: "cancel-test", ResultTTL: time.Hour, WriteTimeout: 200 * time.Millisecond, Registerer: prometheus.NewRegistry()})
	require.NoError(t, err)
	srv := edgeServer(t, edge)
	resp := sendOrder(t, srv.URL, e.run+"-a", "a1")
	require.True(t, lost.Load(), "the cancel's first answer was lost")
	require.Equal(t, http.StatusTooManyRequests, resp.StatusCode)
	require.Empty(t, resp.Header.Get("Location"))
}

// TestEdgeKafkaGate: after a failed write the edge refuses deferrals at once
// (429, reason kafka_down) with one write at a time probing Kafka, so
// abandoned writes cannot pile up in the producer; the first write that
// succeeds opens the gate again.
func TestEdgeKafkaGate(t *testing.T) {
	e := newOutcomeEnv(t, outcomeRules)
	pub := &flakyPublisher{inner: e.producer(), slow: 300 * time.Millisecond}
	reg := prometheus.NewRegistry()
	edge, err := deferred.NewEdge(deferred.EdgeConfig{Policy: e.rules.Deferral, Redis: e.rdb, Producer: pub, Topic: e.topic,
		Gateway: "gate-test", ResultTTL: time.Hour, WriteTimeout: time.Second, Registerer: reg})
	require.NoError(t, err)
	srv := edgeServer(t, edge)

	require.Equal(t, http.StatusAccepted, sendOrder(t, srv.URL, e.run+"-a", "a1").StatusCode)
	pub.fail.Store(true)
	require.Equal(t, http.StatusTooManyRequests, sendOrder(t, srv.URL, e.run+"-a", "a2").StatusCode, "the write keeps failing: 429")
	require.Greater(t, pub.calls.Load(), int32(2), "the edge retried while its client waited")
	require.Contains(t, metricText(t, reg), "floodgate_deferred_kafka_writable")
	calls := pub.calls.Load()

	// Concurrent deferrals while Kafka is down: one probe at a time reaches
	// the writer (a failing write takes 300 ms; the probe retries for its
	// client's second), the others are refused at once.
	var wg sync.WaitGroup
	var refused atomic.Int32
	for i := range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req, _ := http.NewRequest("POST", srv.URL+"/orders", strings.NewReader(`{}`))
			req.Header.Set("X-Kind", "user")
			req.Header.Set("X-User", fmt.Sprintf("%s-c%d", e.run, i))
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Error(err)
				return
			}
			resp.Body.Close()
			if resp.StatusCode == http.StatusTooManyRequests {
				refused.Add(1)
			}
		}()
	}
	wg.Wait()
	require.EqualValues(t, 20, refused.Load())
	require.LessOrEqual(t, pub.calls.Load()-calls, int32(5), "writes tried while Kafka was down: one probe's")
	text := metricText(t, reg)
	require.Contains(t, text, `value:"kafka_down"`)

	// Kafka is back: the next deferral is the probe, succeeds, and opens the gate.
	pub.fail.Store(false)
	require.Equal(t, http.StatusAccepted, sendOrder(t, srv.URL, e.run+"-b", "b1").StatusCode)
	before := pub.calls.Load()
	require.Equal(t, http.StatusAccepted, sendOrder(t, srv.URL, e.run+"-b", "b2").StatusCode)
	require.Equal(t, before+1, pub.calls.Load())
}

var pollRules = outcomeRules + `  - id: deferred-status
    tier: endpoint
    method: GET
    route: /v1/deferred/{id}
    limit: 3
    period: 1m
`

// TestStatusPollsLimited: polls of /v1/deferred/{id} go through the limiter
// as that route, per principal, and past the rule's limit get the standard
// 429 problem; another principal's polls are not counted against it.
func TestStatusPollsLimited(t *testing.T) {
	ctx := t.Context()
	e := newOutcomeEnv(t, pollRules)
	emb, err := embedded.New(ctx, embedded.Config{Redis: e.rdb, Rules: e.rules, Gateway: "poll-test", Publisher: nopPublisher{}})
	require.NoError(t, err)
	go func() { _ = emb.Run(ctx) }()
	edge := e.edge(e.rdb, e.producer(), 0)
	router, err := gateway.NewRouter([]gateway.Route{{Method: "POST", Template: "/orders"}}, "")
	require.NoError(t, err)
	loop := gateway.TrustedProxies{netip.MustParsePrefix("127.0.0.0/8")}
	mw, err := gateway.Middleware(gateway.Options{Checker: emb, Router: router, TrustedProxies: loop,
		Principal: gateway.PrincipalFromHeaders("X-Kind", "X-User", loop), Deferrer: edge, Timeout: time.Second})
	require.NoError(t, err)
	srv := httptest.NewServer(mw(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusCreated) })))
	defer srv.Close()

	alice := e.run + "-alice"
	require.Equal(t, http.StatusCreated, sendOrder(t, srv.URL, alice, "p1").StatusCode, "within the order limit")
	resp := sendOrder(t, srv.URL, alice, "p2")
	require.Equal(t, http.StatusAccepted, resp.StatusCode)
	loc := resp.Header.Get("Location")
	poll := func(who string) (*http.Response, string) { return getAs(t, srv.URL+loc, who) }
	for i := range 3 {
		resp, _ := poll(alice)
		require.Equal(t, http.StatusAccepted, resp.StatusCode, "poll %d", i+1)
		require.Equal(t, "queued", resp.Header.Get(deferred.HeaderDeferredStatus))
		require.Equal(t, "3", resp.Header.Get("X-RateLimit-Limit"))
		require.Contains(t, resp.Header.Get("RateLimit-Policy"), `"deferred-status"`, "the poll rule decided")
	}
	resp, body := poll(alice)
	require.Equal(t, http.StatusTooManyRequests, resp.StatusCode)
	require.Equal(t, "application/problem+json", resp.Header.Get("Content-Type"))
	require.NotEmpty(t, resp.Header.Get("Retry-After"))
	require.Empty(t, resp.Header.Get(deferred.HeaderDeferredStatus), "a refused poll learns nothing")
	var p struct {
		Type   string
		Status int
	}
	require.NoError(t, json.Unmarshal([]byte(body), &p), body)
	require.Equal(t, http.StatusTooManyRequests, p.Status)
	require.Equal(t, httpapi.ProblemRateLimited, p.Type)

	resp, _ = poll(e.run + "-mallory")
	require.Equal(t, http.StatusNotFound, resp.StatusCode, "another principal's budget, and no access")
}
