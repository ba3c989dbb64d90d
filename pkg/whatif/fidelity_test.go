package whatif

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/floodgate-dev/floodgate/pkg/events"
	"github.com/floodgate-dev/floodgate/pkg/kafkatest"
	"github.com/floodgate-dev/floodgate/pkg/limiter"
	"github.com/floodgate-dev/floodgate/pkg/limiter/admission"
	"github.com/floodgate-dev/floodgate/pkg/limiter/server"
	"github.com/floodgate-dev/floodgate/pkg/redisx/redistest"
	"github.com/floodgate-dev/floodgate/pkg/whatif/whatiftest"
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

// fidelityStart is when the recorded traffic begins: fixed, like the seed.
var fidelityStart = time.Date(2026, 11, 2, 9, 0, 0, 0, time.UTC)

// TestFidelityWhatIfAgreesWithEnforcement records traffic through a real
// limiter engine with rules A (decision events built by the limiter's own
// DecisionEvent, published to a broker topic), asks the what-if about rules
// B, then enforces rules B for real on the same requests at the recorded
// times in the replay's order (whatiftest.Enforce), and requires the blocked
// counts — in total, per rule, priority, plan and kind — to agree within 1 %.
// The traffic is the same on every run: a fixed seed, fixed principals and
// IPs, and fixed event times (0–2 ms apart, so many share a millisecond),
// each decided on its own time (Request.At). It also proves the what-if
// touched no key outside its prefix.
func TestFidelityWhatIfAgreesWithEnforcement(t *testing.T) {
	rdb := redistest.Client(t)
	ctx := context.Background()
	const topic = "whatif-fidelity"
	broker := kafkatest.Start(t, map[string]int32{topic: 3})
	run := redistest.Unique(t, "wif")
	// The recording's keyspace is the test's own: the principals and IPs
	// below are fixed, so the traffic (and its partitions) is too.
	recPrefix := "fgtest-record-" + run + ":"
	t.Cleanup(func() { deleteAny(rdb, recPrefix+"*") })

	kinds := []events.PrincipalKind{events.PrincipalBot, events.PrincipalUser, events.PrincipalAPIKey, events.PrincipalAnonymous}
	plans := []string{"default", "pro", "enterprise"}
	type route struct{ method, path string }
	routes := []route{{"GET", "/v1/items"}, {"GET", "/v1/items"}, {"GET", "/v1/items"}, {"GET", "/v1/items"},
		{"POST", "/v1/charges"}, {"POST", "/v1/charges"}, {"GET", "/v1/export"}, {"POST", "/upload"}}
	const principals, total = 48, 12000
	rng := rand.New(rand.NewPCG(7, 16))
	reqs := make([]limiter.Request, total)
	at := fidelityStart
	for i := range reqs {
		at = at.Add(time.Duration(rng.IntN(3)) * time.Millisecond)
		pi := rng.IntN(principals)
		r := routes[rng.IntN(len(routes))]
		req := limiter.Request{Principal: events.Principal{Kind: kinds[pi%4], ID: fmt.Sprintf("wif-fidelity-%02d", pi)},
			IP:     netip.AddrFrom4([4]byte{198, 18, 99, byte(pi % 6)}),
			Method: r.method, Route: r.path, Cost: 1 + rng.IntN(2), At: at}
		if req.Principal.Kind != events.PrincipalAnonymous {
			req.Plan = plans[pi%3]
		}
		if r.path == "/v1/items" && rng.IntN(4) == 0 {
			req.Priority = admission.PriorityBestEffort
		}
		reqs[i] = req
	}

	// Record: a real engine with rules A decides each request at its time.
	engA, err := limiter.NewEngine(limiter.EngineConfig{Redis: rdb, Rules: limiter.NewRuleStore(rules(t, "a.yaml", rulesA)),
		KeyPrefix: recPrefix, Budget: 5 * time.Second, Registry: prometheus.NewRegistry()})
	require.NoError(t, err)
	require.NoError(t, engA.Load(ctx))
	ds := make([]events.Decision, total)
	byID := map[string]int{}
	for i, req := range reqs {
		res, err := engA.Check(ctx, req)
		require.NoError(t, err)
		require.False(t, res.Degraded)
		require.Truef(t, req.At.Equal(res.Now), "the decision's time is its own: %s, not %s", res.Now, req.At)
		id := fmt.Sprintf("fid-%05d", i)
		ds[i] = server.DecisionEvent(id, "fidelity", req, res)
		byID[id] = i
	}
	publish(t, broker, topic, ds)
	from, to := fidelityStart, at.Add(time.Millisecond)

	// What the recording left in its keyspace must not change, and no key
	// of the production form may appear for these principals or IPs.
	patterns := []string{recPrefix + "*", "fg:{*wif-fidelity-*", "fg:{ip:198.18.99.*"}
	before := snapshot(t, rdb, patterns)
	require.NotEmpty(t, before)

	// What-if: read [from, to) back and replay it under B.
	src := &Source{Client: client(broker), Topic: topic, Slack: 10 * time.Second}
	recs, st, err := src.Read(ctx, from, to)
	require.NoError(t, err)
	require.Len(t, recs, total, "every recorded decision read back (%+v)", st)
	prefix := PrefixBase + run + ":"
	rep, err := Replay(ctx, Config{Redis: rdb, Candidate: rules(t, "b.yaml", rulesB),
		Baseline: rules(t, "a.yaml", rulesA), Prefix: prefix, Keep: true, Topic: topic, Read: st,
		CandidateName: "b.yaml", BaselineName: "a.yaml"}, recs)
	require.NoError(t, err)
	var text strings.Builder
	require.NoError(t, rep.WriteText(&text))
	t.Logf("what-if report:\n%s", text.String())

	// Isolation: the recording's keys are as they were; every new key is
	// under the what-if's prefix.
	after := snapshot(t, rdb, patterns)
	require.Equal(t, before, after, "the what-if changed or created keys outside its prefix")
	n2, err := DeleteKeys(ctx, rdb, prefix)
	require.NoError(t, err)
	require.Positive(t, n2, "the replay wrote under its prefix")

	// Enforce B for real on the original requests, at their recorded times,
	// in the replay's order.
	order := make([]whatiftest.Timed, len(recs))
	for i, r := range recs {
		j, ok := byID[r.ID]
		require.True(t, ok, "decision %s was not recorded by this test", r.ID)
		order[i] = whatiftest.Timed{At: r.TS, Req: reqs[j]}
	}
	enf := whatiftest.Enforce(t, rdb, rules(t, "b.yaml", rulesB), order)

	within := func(what string, whatif, enforced int) {
		t.Helper()
		whatiftest.Within(t, 0.01, what, whatif, enforced)
	}
	within("total", rep.Total.BlockedCandidate, enf.Blocked)
	blocking := 0
	for _, r := range rep.ByRule {
		if r.InCandidate {
			within("rule "+r.Rule, r.BlockedCandidate, enf.ByRule[r.Rule])
			if enf.ByRule[r.Rule] > 0 {
				blocking++
			}
		}
	}
	for rule, n := range enf.ByRule {
		require.Truef(t, slices.ContainsFunc(rep.ByRule, func(r RuleRow) bool { return r.Rule == rule && r.InCandidate }),
			"enforcement blocked %d by %s, which the what-if does not name", n, rule)
	}
	require.Equal(t, 7, blocking, "every rule of B, and its quota, blocks something: the test has teeth")
	for _, r := range rep.ByPrio {
		within("priority "+r.Key, r.BlockedCandidate, enf.ByPrio[r.Key])
	}
	for _, r := range rep.ByPlan {
		within("plan "+r.Key, r.BlockedCandidate, enf.ByPlan[r.Key])
	}
	for _, r := range rep.ByKind {
		within("kind "+r.Key, r.BlockedCandidate, enf.ByKind[r.Key])
	}
	require.Greater(t, rep.Total.NewlyBlocked, 100, "B is materially tighter than A")
	require.Equal(t, total, rep.Replayed)
	require.Zero(t, rep.NoPlan)
	require.Zero(t, rep.CostFixed, "every recorded cost is a multiple of A's route cost")
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
