package whatif

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/floodgate-dev/floodgate/pkg/events"
	"github.com/floodgate-dev/floodgate/pkg/kafkatest"
	"github.com/floodgate-dev/floodgate/pkg/limiter"
	"github.com/floodgate-dev/floodgate/pkg/redisx/redistest"
	"github.com/floodgate-dev/floodgate/pkg/stream"
)

// rulesA is what the traffic is recorded under.
const rulesA = `
version: 1
defaults: {algorithm: token_bucket, fail: open}
costs:
  - {method: POST, route: /upload, cost: 2}
priorities:
  - {method: POST, route: /v1/charges, priority: critical}
  - {method: GET, route: /v1/export, priority: bulk}
rules:
  - {id: per-ip, tier: ip, algorithm: fixed_window, limit: 4000, period: 1m}
  - {id: principal, tier: principal, limit: 240, period: 1m}
  - {id: charges, tier: endpoint, method: POST, route: /v1/charges, limit: 30, period: 1m}
  - {id: export, tier: endpoint, method: GET, route: /v1/export, limit: 15, period: 1m}
quotas:
  - {kind: bot, plan: default, limit: 100000}
`

// rulesB is the candidate: tighter limits, other algorithms, a timing-
// sensitive burst rule, a plan-only rule, a dearer route and a bot quota.
const rulesB = `
version: 1
defaults: {algorithm: token_bucket, fail: open}
costs:
  - {method: POST, route: /upload, cost: 3}
priorities:
  - {method: POST, route: /v1/charges, priority: critical}
  - {method: GET, route: /v1/export, priority: bulk}
rules:
  - {id: per-ip, tier: ip, algorithm: sliding_window, limit: 700, period: 1m}
  - {id: principal, tier: principal, limit: 110, period: 1m}
  - {id: user-burst, tier: principal, kinds: [user], limit: 10, period: 1s}
  - {id: charges, tier: endpoint, method: POST, route: /v1/charges, algorithm: gcra, limit: 8, period: 1m}
  - {id: export, tier: endpoint, method: GET, route: /v1/export, algorithm: sliding_window_log, limit: 8, period: 1m}
  - {id: pro-items, tier: endpoint, plans: [pro], method: GET, route: /v1/items, algorithm: leaky_bucket, limit: 6, period: 10s}
quotas:
  - {kind: bot, plan: default, limit: 60}
`

type sent struct {
	seq int
	req limiter.Request
}

// TestFidelityWhatIfAgreesWithEnforcement records real traffic through a
// real limiter (rules A, HTTP, decisions to a broker topic), asks the
// what-if about rules B, then enforces rules B for real on the same requests
// at the recorded times, and requires the per-rule blocked counts (and every
// dimension's) to agree within 1 %. It also proves the what-if touched no
// key outside its prefix.
func TestFidelityWhatIfAgreesWithEnforcement(t *testing.T) {
	rdb := redistest.Client(t)
	const topic = "whatif-fidelity"
	broker := kafkatest.Start(t, map[string]int32{topic: 3})
	run := redistest.Unique(t, "wif")
	n := time.Now().UnixNano()
	ipNet := [2]byte{byte(n >> 24), byte(n >> 16)}

	// Record: a real engine with rules A behind the limiter's HTTP API,
	// publishing decision events to the topic.
	ctx, cancel := context.WithCancel(context.Background())
	engA, err := limiter.NewEngine(limiter.EngineConfig{Redis: rdb, Rules: limiter.NewRuleStore(rules(t, "a.yaml", rulesA)),
		Budget: 5 * time.Second, Registry: prometheus.NewRegistry()})
	require.NoError(t, err)
	require.NoError(t, engA.Load(ctx))
	prod := stream.NewAsyncProducer(stream.AsyncProducerConfig{Brokers: []string{broker}, Topic: topic})
	pdone := make(chan error, 1)
	go func() { pdone <- prod.Run(ctx) }()
	srv := limiter.NewServer(limiter.ServerConfig{Engine: engA, Publisher: prod, Topic: topic, Gateway: "fidelity",
		Logger: slog.New(slog.DiscardHandler), Registry: prometheus.NewRegistry()})
	srv.SetReady(true)
	hs := httptest.NewServer(srv.Handler())
	defer hs.Close()

	kinds := []events.PrincipalKind{events.PrincipalBot, events.PrincipalUser, events.PrincipalAPIKey, events.PrincipalAnonymous}
	plans := []string{"default", "pro", "enterprise"}
	type route struct{ method, path string }
	routes := []route{{"GET", "/v1/items"}, {"GET", "/v1/items"}, {"GET", "/v1/items"}, {"GET", "/v1/items"},
		{"POST", "/v1/charges"}, {"POST", "/v1/charges"}, {"GET", "/v1/export"}, {"POST", "/upload"}}
	const principals, total, workers = 48, 12000, 8
	rng := rand.New(rand.NewPCG(7, uint64(n)))
	reqs := make([]limiter.Request, total)
	for i := range reqs {
		pi := rng.IntN(principals)
		r := routes[rng.IntN(len(routes))]
		req := limiter.Request{Principal: events.Principal{Kind: kinds[pi%4], ID: fmt.Sprintf("%s_%d", run, pi)},
			IP:     netip.AddrFrom4([4]byte{10, ipNet[0], ipNet[1], byte(pi % 6)}),
			Method: r.method, Route: r.path, Cost: 1 + rng.IntN(2)}
		if req.Principal.Kind != events.PrincipalAnonymous {
			req.Plan = plans[pi%3]
		}
		if r.path == "/v1/items" && rng.IntN(4) == 0 {
			req.Priority = limiter.PriorityBestEffort
		}
		reqs[i] = req
	}
	byID := map[string]sent{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	next := make(chan int)
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				req := reqs[i]
				body := map[string]any{"principal": req.Principal, "ip": req.IP.String(), "method": req.Method, "route": req.Route,
					"cost": req.Cost, "plan": req.Plan, "priority": req.Priority.Event()}
				b, _ := json.Marshal(body)
				resp, err := http.Post(hs.URL+"/v1/check", "application/json", bytes.NewReader(b))
				if !assertNoError(t, err) {
					continue
				}
				var out limiter.CheckResponse
				raw, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if !assertNoError(t, json.Unmarshal(raw, &out)) || out.ID == "" || out.Degraded {
					t.Errorf("check %d: %s", i, raw)
					continue
				}
				mu.Lock()
				byID[out.ID] = sent{seq: i, req: req}
				mu.Unlock()
			}
		}()
	}
	recordStart := time.Now().UTC().Truncate(time.Millisecond)
	for i := range reqs {
		next <- i
	}
	close(next)
	wg.Wait()
	recordEnd := time.Now().UTC().Add(time.Millisecond)
	cancel()
	require.NoError(t, <-pdone)
	require.Len(t, byID, total)
	t.Logf("recorded %d decisions in %s", total, recordEnd.Sub(recordStart))

	// What the recording left in production-form keys: must not change.
	patterns := []string{"*" + run + "*", fmt.Sprintf("*{ip:10.%d.%d.*", ipNet[0], ipNet[1])}
	before := snapshot(t, rdb, patterns)
	require.NotEmpty(t, before)

	// What-if: read [start, end) back and replay it under B.
	src := &Source{Client: client(broker), Topic: topic, Slack: 10 * time.Second}
	recs, st, err := src.Read(context.Background(), recordStart.Add(-time.Second), recordEnd.Add(time.Second))
	require.NoError(t, err)
	require.Len(t, recs, total, "every recorded decision read back (%+v)", st)
	prefix := PrefixBase + run + ":"
	rep, err := Replay(context.Background(), Config{Redis: rdb, Candidate: rules(t, "b.yaml", rulesB),
		Baseline: rules(t, "a.yaml", rulesA), Prefix: prefix, Keep: true, Topic: topic, Read: st,
		CandidateName: "b.yaml", BaselineName: "a.yaml"}, recs)
	require.NoError(t, err)
	var text strings.Builder
	require.NoError(t, rep.WriteText(&text))
	t.Logf("what-if report:\n%s", text.String())

	// Isolation: every production-form key is as it was; the replay's keys
	// are all under its prefix.
	after := snapshot(t, rdb, patterns)
	for k, v := range before {
		require.Equalf(t, v, after[k], "key %s changed", k)
	}
	for k := range after {
		if _, ok := before[k]; !ok {
			require.Truef(t, strings.HasPrefix(k, prefix), "key %s appeared outside the prefix", k)
		}
	}
	n2, err := DeleteKeys(context.Background(), rdb, prefix)
	require.NoError(t, err)
	require.Positive(t, n2, "the replay wrote under its prefix")

	// Enforce B for real: a limiter engine with rules B (its own keyspace,
	// so A's recorded state does not leak in) decides the original requests,
	// each at its recorded time, in recorded order.
	engB, err := limiter.NewEngine(limiter.EngineConfig{Redis: rdb, Rules: limiter.NewRuleStore(rules(t, "b.yaml", rulesB)),
		KeyPrefix: "fgtest-enforce-" + run + ":", Budget: 5 * time.Second, Registry: prometheus.NewRegistry()})
	require.NoError(t, err)
	require.NoError(t, engB.Load(context.Background()))
	t.Cleanup(func() { deleteAny(rdb, "fgtest-enforce-"+run+":*") })
	type timed struct {
		at  time.Time
		seq int
		req limiter.Request
	}
	var order []timed
	for _, r := range recs {
		s := byID[r.ID]
		order = append(order, timed{at: r.TS, seq: s.seq, req: s.req})
	}
	slices.SortStableFunc(order, func(a, b timed) int {
		if c := a.at.Compare(b.at); c != 0 {
			return c
		}
		return a.seq - b.seq
	})
	enfRule := map[string]int{}
	enfPrio, enfPlan, enfKind := map[string]int{}, map[string]int{}, map[string]int{}
	enfBlocked := 0
	for _, o := range order {
		o.req.At = o.at
		res, err := engB.Check(context.Background(), o.req)
		require.NoError(t, err)
		require.False(t, res.Degraded)
		if !res.Allowed {
			enfBlocked++
			enfRule[res.Rule]++
			enfPrio[res.Priority.String()]++
			enfPlan[res.Plan]++
			enfKind[string(o.req.Principal.Kind)]++
		}
	}

	withinShare := func(share float64, what string, whatif, enforced int) {
		t.Helper()
		t.Logf("%-28s what-if %5d enforced %5d", what, whatif, enforced)
		require.LessOrEqualf(t, math.Abs(float64(whatif-enforced)), share*float64(enforced),
			"%s: what-if blocks %d, enforcement %d — more than %g %% apart", what, whatif, enforced, 100*share)
	}
	within := func(what string, whatif, enforced int) { t.Helper(); withinShare(0.01, what, whatif, enforced) }
	within("total", rep.Total.BlockedCandidate, enfBlocked)
	blocking := 0
	// Per rule the bound is 3 %: when several of a request's rules would
	// deny it, which one is named as deciding can differ between the replay
	// and enforcement while the request is blocked in both (a CI run: +15,
	// −9, −8 across three rules, −2 in total). Totals, priorities, plans and
	// kinds are the request's own and keep the 1 % bound.
	for _, r := range rep.ByRule {
		if r.InCandidate {
			withinShare(0.03, "rule "+r.Rule, r.BlockedCandidate, enfRule[r.Rule])
			if enfRule[r.Rule] > 0 {
				blocking++
			}
		}
	}
	// The traffic is random: a narrow rule (per-ip) may block nothing in a run.
	require.GreaterOrEqual(t, blocking, 4, "several rules block something: the test has teeth")
	for _, r := range rep.ByPrio {
		within("priority "+r.Key, r.BlockedCandidate, enfPrio[r.Key])
	}
	for _, r := range rep.ByPlan {
		within("plan "+r.Key, r.BlockedCandidate, enfPlan[r.Key])
	}
	for _, r := range rep.ByKind {
		within("kind "+r.Key, r.BlockedCandidate, enfKind[r.Key])
	}
	require.Greater(t, rep.Total.NewlyBlocked, 100, "B is materially tighter than A")
	require.Equal(t, total, rep.Replayed)
	require.Zero(t, rep.NoPlan)
	require.Zero(t, rep.CostFixed, "every recorded cost is a multiple of A's route cost")
}

func assertNoError(t *testing.T, err error) bool {
	t.Helper()
	if err != nil {
		t.Error(err)
		return false
	}
	return true
}

// snapshot dumps every key matching the patterns (value only: TTLs tick).
func snapshot(t *testing.T, rdb redis.UniversalClient, patterns []string) map[string]string {
	t.Helper()
	ctx := context.Background()
	out := map[string]string{}
	for _, p := range patterns {
		it := rdb.Scan(ctx, 0, p, 1000).Iterator()
		for it.Next(ctx) {
			v, err := rdb.Dump(ctx, it.Val()).Result()
			if errors.Is(err, redis.Nil) {
				continue
			}
			require.NoError(t, err)
			out[it.Val()] = v
		}
		require.NoError(t, it.Err())
	}
	return out
}

func deleteAny(rdb redis.UniversalClient, pattern string) {
	ctx := context.Background()
	it := rdb.Scan(ctx, 0, pattern, 1000).Iterator()
	for it.Next(ctx) {
		rdb.Unlink(ctx, it.Val())
	}
}
