package embedded

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/floodgate-dev/floodgate/pkg/events"
	"github.com/floodgate-dev/floodgate/pkg/gateway"
	"github.com/floodgate-dev/floodgate/pkg/kafkatest"
	"github.com/floodgate-dev/floodgate/pkg/limiter"
	"github.com/floodgate-dev/floodgate/pkg/limiter/limitertest"
	"github.com/floodgate-dev/floodgate/pkg/promtest"
	"github.com/floodgate-dev/floodgate/pkg/redisx"
	"github.com/floodgate-dev/floodgate/pkg/redisx/redistest"
	"github.com/floodgate-dev/floodgate/pkg/rollout"
	"github.com/floodgate-dev/floodgate/pkg/rollout/rollouttest"
)

// Rules of the rollout tests: v1 is generous; the bad candidate allows one
// request an hour per bot (blocks nearly all CRITICAL traffic); the good one
// is generous too.
const (
	rolloutV1   = "version: 1\nrules:\n  - {id: bots, tier: principal, kinds: [bot], limit: 100000, period: 1s}\n"
	rolloutBad  = "version: 1\nrules:\n  - {id: bots, tier: principal, kinds: [bot], limit: 1, period: 1h}\n"
	rolloutGood = "version: 1\nrules:\n  - {id: bots, tier: principal, kinds: [bot], limit: 50000, period: 1s}\n"
)

// replica is one limiter of the fleet: an embedded limiter on the rules topic.
type replica struct {
	*Limiter
	events *kafkatest.Capture
	reg    *prometheus.Registry
}

func startReplica(t *testing.T, brokers []string, topic, name string) *replica {
	t.Helper()
	rdb := redistest.Client(t)
	pub := &kafkatest.Capture{}
	reg := prometheus.NewRegistry()
	fallback, err := limiter.ParseRules("fallback.yaml", []byte(rolloutV1))
	require.NoError(t, err)
	e, err := New(context.Background(), Config{Redis: rdb, Rules: fallback, Publisher: pub, Brokers: brokers,
		RulesTopic: topic, Gateway: name, Logger: slog.New(slog.DiscardHandler), Registry: reg})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- e.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	return &replica{Limiter: e, events: pub, reg: reg}
}

func (r *replica) versions() (int64, int64) {
	var c int64
	if cand := r.Candidate(); cand != nil {
		c = cand.Version
	}
	return r.Rules().Version, c
}

// waitVersions waits until every replica enforces enforced with candidate in shadow.
func waitVersions(t *testing.T, enforced, candidate int64, rs ...*replica) {
	t.Helper()
	require.Eventually(t, func() bool {
		for _, r := range rs {
			if e, c := r.versions(); e != enforced || c != candidate {
				return false
			}
		}
		return true
	}, 10*time.Second, 20*time.Millisecond, "replicas should enforce version %d with candidate %d", enforced, candidate)
}

// traffic sends n CRITICAL checks of distinct bots through r and returns how many were denied.
func traffic(t *testing.T, r *replica, base string, n int) int {
	t.Helper()
	denied := 0
	for i := range n {
		d, err := r.Check(context.Background(), gateway.Request{Principal: events.Principal{Kind: events.PrincipalBot, ID: fmt.Sprintf("%s_%d", base, i%5)},
			IP: "203.0.113.9", Method: "GET", Route: "/x", Cost: 1, Priority: "critical"})
		require.NoError(t, err)
		if !d.Allowed {
			denied++
		}
	}
	return denied
}

func testOperator(topic *rollout.Topic, now func() time.Time) *rollout.Operator {
	return &rollout.Operator{Topic: topic, Now: now, Validate: func(name string, b []byte) error { _, err := limiter.ParseRules(name, b); return err }}
}

// shadowThenEnforce is the params of a candidate judged once 10 CRITICAL
// decisions were counted and enforced at once after the shadow
// (pkg/limiter/candidate TestStepsOnTwoReplicas has the steps).
func shadowThenEnforce() rollout.Params {
	p := rollout.DefaultParams()
	p.MinCritical = 10
	p.Steps = ""
	return p
}

// TestRolloutAcrossReplicas runs rule rollouts against the real broker and
// Redis with two limiter replicas: both load the same version; decision
// events carry it and the candidate's verdict; a candidate that would block
// CRITICAL traffic is aborted by the controller in shadow without ever
// changing an answer; a good one is promoted after its shadow period; a
// version that blocks CRITICAL traffic once enforced is rolled back to its
// parent; an invalid version is refused and the rules in force stay.
func TestRolloutAcrossReplicas(t *testing.T) {
	topic, name := rollouttest.OpenTopic(t)
	ctx := context.Background()
	var mu sync.Mutex
	now := time.Now()
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	advance := func(d time.Duration) { mu.Lock(); now = now.Add(d); mu.Unlock() }
	op := testOperator(topic, clock)
	sre := rollout.Actor{Name: "sre alice", Reason: "test", Via: "test"}

	_, err := op.Bootstrap(ctx, rolloutV1, sre)
	require.NoError(t, err)
	a, b := startReplica(t, rollouttest.Brokers(), name, "edge-a"), startReplica(t, rollouttest.Brokers(), name, "edge-b")
	waitVersions(t, 1, 0, a, b)
	base := redistest.Unique(t, "rollout")
	require.Zero(t, traffic(t, a, base+"_v1", 10))
	require.EqualValues(t, 1, limitertest.LastDecision(t, a.events).RulesVersion, "decision events carry the rules version")
	require.Zero(t, limitertest.LastDecision(t, a.events).CandidateVersion)

	ctl := rollout.NewController(op, redistest.Client(t), "adjuster/rollout", nil, prometheus.NewRegistry())
	ctl.Now = clock
	step := func() rollout.Verdict {
		t.Helper()
		for _, r := range []*replica{a, b} { // what the replicas counted, in Redis now
			require.NoError(t, r.flushImpact(ctx))
		}
		st, err := topic.Read(ctx)
		require.NoError(t, err)
		v, err := ctl.Step(ctx, &st)
		require.NoError(t, err)
		return v
	}

	t.Run("a bad candidate is aborted in shadow", func(t *testing.T) {
		p := shadowThenEnforce()
		plan, err := op.Propose(ctx, rolloutBad, p, sre)
		require.NoError(t, err)
		require.EqualValues(t, 2, plan.Version)
		waitVersions(t, 1, 2, a, b)
		// The candidate would block nearly everything; the answers do not change.
		require.Zero(t, traffic(t, a, base+"_bad", 20))
		require.Zero(t, traffic(t, b, base+"_bad", 20))
		ev := limitertest.LastDecision(t, a.events)
		require.EqualValues(t, 1, ev.RulesVersion)
		require.EqualValues(t, 2, ev.CandidateVersion)
		require.True(t, ev.CandidateBlocked, "the event carries the candidate's verdict")
		// Its buckets are its own: the enforced bucket was charged once per check, never by the candidate.
		n, err := redistest.Client(t).Exists(ctx, redisx.CandidateKey(2, redisx.BucketKey("bot", base+"_bad_0", "bots|tb"))).Result()
		require.NoError(t, err)
		require.EqualValues(t, 1, n, "the candidate counts in its own key prefix")

		v := step()
		require.Equal(t, rollout.ActionAbort, v.Action, v.Reason)
		require.Contains(t, v.Reason, "CRITICAL would-block share")
		require.Contains(t, v.Reason, "> 5.0 %")
		waitVersions(t, 1, 0, a, b)
		st, err := topic.Read(ctx)
		require.NoError(t, err)
		e, _ := st.Version(2)
		require.Equal(t, events.RulesStateRolledBack, e.State)
		require.Equal(t, "adjuster/rollout", e.Author)
	})

	t.Run("a good candidate is promoted after its shadow period", func(t *testing.T) {
		p := shadowThenEnforce()
		_, err := op.Propose(ctx, rolloutGood, p, sre)
		require.NoError(t, err)
		waitVersions(t, 1, 3, a, b)
		require.Zero(t, traffic(t, a, base+"_good", 20))
		require.Zero(t, traffic(t, b, base+"_good", 20))
		require.False(t, limitertest.LastDecision(t, a.events).CandidateBlocked)
		v := step()
		require.Empty(t, v.Action, "nothing happens before the shadow period ends: %s", v.Reason)
		advance(p.ShadowFor + time.Second)
		v = step()
		require.Equal(t, rollout.ActionPromote, v.Action, v.Reason)
		waitVersions(t, 3, 0, a, b)
		require.Zero(t, traffic(t, a, base+"_good2", 5))
		require.EqualValues(t, 3, limitertest.LastDecision(t, a.events).RulesVersion)
		v = step()
		require.Empty(t, v.Action, "a healthy enforced version stays: %s", v.Reason)
	})

	t.Run("an enforced version that blocks CRITICAL traffic is rolled back", func(t *testing.T) {
		advance(time.Hour) // v3's watch is over
		p := shadowThenEnforce()
		_, err := op.Propose(ctx, rolloutBad, p, sre)
		require.NoError(t, err)
		waitVersions(t, 3, 4, a, b)
		// An SRE promotes it ahead of its shadow period (audited like any step).
		_, err = op.Promote(ctx, rollout.Actor{Name: "sre bob", Reason: "urgent", Via: "test"})
		require.NoError(t, err)
		waitVersions(t, 4, 0, a, b)
		require.Greater(t, traffic(t, a, base+"_enf", 20), 10, "version 4 blocks CRITICAL traffic")
		v := step()
		require.Equal(t, rollout.ActionRollback, v.Action, v.Reason)
		require.Contains(t, v.Reason, "CRITICAL block share")
		waitVersions(t, 3, 0, a, b)
		require.Zero(t, traffic(t, b, base+"_enf2", 5))
		require.EqualValues(t, 3, limitertest.LastDecision(t, b.events).RulesVersion)
	})

	t.Run("an invalid version is refused and the rules in force stay", func(t *testing.T) {
		require.Error(t, func() error { _, err := op.Propose(ctx, "version: 2\n", rollout.DefaultParams(), sre); return err }(),
			"the operator validates before publishing")
		// A record that skipped validation (another tool) reaches the replicas.
		bad := events.RulesVersion{ID: "bad-5", TS: clock().UTC().Truncate(time.Millisecond), Version: 5, State: events.RulesStateEnforced,
			Rules: "version: 1\nrules:\n  - {id: x, tier: nowhere, limit: 1, period: 1s}\n", Author: "someone", Reason: "typo",
			CreatedAt: clock().UTC().Truncate(time.Millisecond), ParentVersion: 3}
		require.NoError(t, topic.Publish(ctx, bad))
		require.Eventually(t, func() bool {
			return a.rejected(t) == 1 && b.rejected(t) == 1
		}, 10*time.Second, 20*time.Millisecond)
		e, _ := a.versions()
		require.EqualValues(t, 3, e, "version 3 stays in force")
		require.Zero(t, traffic(t, a, base+"_inv", 5))
		require.EqualValues(t, 3, limitertest.LastDecision(t, a.events).RulesVersion)
	})
}

func (r *replica) rejected(t *testing.T) float64 {
	return promtest.Value(t, r.reg, "floodgate_limiter_rules_versions_total", map[string]string{"role": "enforced", "result": "rejected"})
}

func (r *replica) flushImpact(ctx context.Context) error { return r.impact.Flush(ctx) }
