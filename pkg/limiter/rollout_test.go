package limiter

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
	*Embedded
	events *kafkatest.Capture
	reg    *prometheus.Registry
}

func startReplica(t *testing.T, brokers []string, topic, name string) *replica {
	t.Helper()
	rdb := redistest.Client(t)
	pub := &kafkatest.Capture{}
	reg := prometheus.NewRegistry()
	fallback, err := ParseRules("fallback.yaml", []byte(rolloutV1))
	require.NoError(t, err)
	e, err := NewEmbedded(context.Background(), EmbedConfig{Redis: rdb, Rules: fallback, Publisher: pub, Brokers: brokers,
		RulesTopic: topic, Gateway: name, Logger: slog.New(slog.DiscardHandler), Registry: reg})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- e.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	return &replica{Embedded: e, events: pub, reg: reg}
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
	return &rollout.Operator{Topic: topic, Now: now, Validate: func(name string, b []byte) error { _, err := ParseRules(name, b); return err }}
}

// TestRolloutAcrossReplicas runs rule rollouts against the real broker and
// Redis with two limiter replicas: both load the same version; decision
// events carry it and the candidate's verdict; a candidate that would block
// CRITICAL traffic is aborted by the controller in shadow without ever
// changing an answer; a good one is promoted after its shadow period; a
// version that blocks CRITICAL traffic once enforced is rolled back to its
// parent; an invalid version is refused and the rules in force stay.
func TestRolloutAcrossReplicas(t *testing.T) {
	brokers, name := rollouttest.Topic(t)
	topic := rollout.NewTopic(brokers, nil, name, nil)
	t.Cleanup(func() { _ = topic.Close() })
	ctx := context.Background()
	var mu sync.Mutex
	now := time.Now()
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	advance := func(d time.Duration) { mu.Lock(); now = now.Add(d); mu.Unlock() }
	op := testOperator(topic, clock)
	sre := rollout.Actor{Name: "sre alice", Reason: "test", Via: "test"}

	_, err := op.Bootstrap(ctx, rolloutV1, sre)
	require.NoError(t, err)
	a, b := startReplica(t, brokers, name, "edge-a"), startReplica(t, brokers, name, "edge-b")
	waitVersions(t, 1, 0, a, b)
	base := redistest.Unique(t, "rollout")
	require.Zero(t, traffic(t, a, base+"_v1", 10))
	require.EqualValues(t, 1, lastDecision(t, a.events).RulesVersion, "decision events carry the rules version")
	require.Zero(t, lastDecision(t, a.events).CandidateVersion)

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
		p := rollout.DefaultParams()
		p.MinCritical = 10
		plan, err := op.Propose(ctx, rolloutBad, p, sre)
		require.NoError(t, err)
		require.EqualValues(t, 2, plan.Version)
		waitVersions(t, 1, 2, a, b)
		// The candidate would block nearly everything; the answers do not change.
		require.Zero(t, traffic(t, a, base+"_bad", 20))
		require.Zero(t, traffic(t, b, base+"_bad", 20))
		ev := lastDecision(t, a.events)
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
		p := rollout.DefaultParams()
		p.MinCritical = 10
		_, err := op.Propose(ctx, rolloutGood, p, sre)
		require.NoError(t, err)
		waitVersions(t, 1, 3, a, b)
		require.Zero(t, traffic(t, a, base+"_good", 20))
		require.Zero(t, traffic(t, b, base+"_good", 20))
		require.False(t, lastDecision(t, a.events).CandidateBlocked)
		v := step()
		require.Empty(t, v.Action, "nothing happens before the shadow period ends: %s", v.Reason)
		advance(p.ShadowFor + time.Second)
		v = step()
		require.Equal(t, rollout.ActionPromote, v.Action, v.Reason)
		waitVersions(t, 3, 0, a, b)
		require.Zero(t, traffic(t, a, base+"_good2", 5))
		require.EqualValues(t, 3, lastDecision(t, a.events).RulesVersion)
		v = step()
		require.Empty(t, v.Action, "a healthy enforced version stays: %s", v.Reason)
	})

	t.Run("an enforced version that blocks CRITICAL traffic is rolled back", func(t *testing.T) {
		advance(time.Hour) // v3's watch is over
		p := rollout.DefaultParams()
		p.MinCritical = 10
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
		require.EqualValues(t, 3, lastDecision(t, b.events).RulesVersion)
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
		require.EqualValues(t, 3, lastDecision(t, a.events).RulesVersion)
	})
}

func (r *replica) rejected(t *testing.T) float64 {
	return promtest.Value(t, r.reg, "floodgate_limiter_rules_versions_total", map[string]string{"role": "enforced", "result": "rejected"})
}

func (r *replica) flushImpact(ctx context.Context) error { return r.impact.Flush(ctx) }

// TestImpactRecentWindow: the flusher adds each flush's counts to the
// version's cumulative hash and to its time slot; the controller's recent
// window sums only the slots it covers.
func TestImpactRecentWindow(t *testing.T) {
	rdb := redistest.Client(t)
	ctx := context.Background()
	topic := redistest.Unique(t, "test.rules.window")
	t.Cleanup(func() { cleanKeys(rdb, redisx.RulesImpactKey(topic, 7)+"*") })
	now := time.Date(2026, 11, 27, 12, 0, 3, 0, time.UTC)
	f := NewImpactFlusher(rdb, topic, slog.New(slog.DiscardHandler))
	f.now = func() time.Time { return now }
	c := f.track(7, rollout.PhaseShadow)
	for range 900 { // the first ten minutes: good
		c.add(PriorityCritical, false)
	}
	require.NoError(t, f.Flush(ctx))
	now = now.Add(10 * time.Minute)
	for i := range 100 { // then bad
		c.add(PriorityCritical, i < 60)
	}
	require.NoError(t, f.Flush(ctx))

	im, err := rollout.ReadImpact(ctx, rdb, topic, 7)
	require.NoError(t, err)
	require.EqualValues(t, 1000, im.Shadow.Total["critical"])
	require.EqualValues(t, 60, im.Shadow.Blocked["critical"])
	require.NoError(t, rollout.ReadRecent(ctx, rdb, topic, &im, time.Minute, now.Add(5*time.Second)))
	require.EqualValues(t, 100, im.RecentShadow.Total["critical"], "only the last minute's slots")
	require.EqualValues(t, 60, im.RecentShadow.Blocked["critical"])
	require.Equal(t, time.Minute, im.Window)
	ttl, err := rdb.TTL(ctx, redisx.RulesImpactSlotKey(topic, 7, now)).Result()
	require.NoError(t, err)
	require.InDelta(t, redisx.RulesImpactSlotTTL.Seconds(), ttl.Seconds(), 5)
	require.NoError(t, rollout.ReadRecent(ctx, rdb, topic, &im, 20*time.Minute, now))
	require.EqualValues(t, 1000, im.RecentShadow.Total["critical"], "a window over both flushes")
}

// TestCandidateJudgesDailyQuota: a candidate in shadow judges its daily
// quota on the principal's real day usage (the enforced ledger's key) and
// never counts into it: with a candidate quota of 3 a day, the 4th request
// of the day is a would-block while the enforced rules (quota 100) allow it,
// and the day usage counts the enforced admissions only.
func TestCandidateJudgesDailyQuota(t *testing.T) {
	rdb := redistest.Client(t)
	ctx := context.Background()
	const rules = "version: 1\nrules:\n  - {id: p, tier: principal, limit: 1000, period: 1h}\nquotas:\n  - {kind: bot, plan: default, limit: %d}\n"
	e := newTestEngine(t, rdb, fmt.Sprintf(rules, 100), nil)
	require.NoError(t, e.Load(ctx))
	cand, err := ParseRules("candidate", []byte(fmt.Sprintf(rules, 3)))
	require.NoError(t, err)
	counts := &impactCounts{}
	e.rules.(*RuleStore).SetCandidate(&Candidate{Version: 9, Rules: cand, impact: counts})
	p := principal(t)
	t.Cleanup(func() {
		cleanKeys(rdb, "fg:{"+string(p.Kind)+":"+p.ID+"}:*")
		cleanKeys(rdb, "fg:cand:9:{"+string(p.Kind)+":"+p.ID+"}:*")
	})
	var verdicts []bool
	var now time.Time
	for range 5 {
		r := check(t, e, Request{Principal: p, Cost: 1, Priority: PriorityCritical})
		require.True(t, r.Allowed, "the enforced quota of 100 allows")
		require.EqualValues(t, 9, r.CandidateVersion)
		verdicts = append(verdicts, r.CandidateBlocked)
		now = r.Now
	}
	// The candidate's check runs beside the enforced one: the 3rd may see
	// the usage with or without its own enforced unit. From the 4th on the
	// day already holds 3 admitted units: would-block.
	require.Equal(t, []bool{false, false}, verdicts[:2])
	require.Equal(t, []bool{true, true}, verdicts[3:])
	used, err := rdb.Get(ctx, redisx.DayUsageKey(string(p.Kind), p.ID, now.Format(time.DateOnly))).Int()
	require.NoError(t, err)
	require.Equal(t, 5, used, "the enforced admissions only: the candidate counts nothing into the ledger")
	require.GreaterOrEqual(t, counts.blocked[PriorityCritical].Load(), int64(2))
}

// TestControllerCatchesALateHarm: a candidate that judged 2,000 CRITICAL
// decisions well and then, in the last minute, would block 60 of 100 is
// aborted by the controller on the real broker and Redis — on its recent
// window: its cumulative share (2.9 %) is within the 5 % maximum, and a
// controller judging cumulative shares only lets it run on.
func TestControllerCatchesALateHarm(t *testing.T) {
	brokers, name := rollouttest.Topic(t)
	topic := rollout.NewTopic(brokers, nil, name, nil)
	t.Cleanup(func() { _ = topic.Close() })
	rdb := redistest.Client(t)
	ctx := context.Background()
	now := time.Now()
	op := testOperator(topic, func() time.Time { return now })
	sre := rollout.Actor{Name: "sre alice", Reason: "test", Via: "test"}
	_, err := op.Bootstrap(ctx, rolloutV1, sre)
	require.NoError(t, err)
	p, err := op.Propose(ctx, rolloutGood, rollout.DefaultParams(), sre)
	require.NoError(t, err)
	t.Cleanup(func() { cleanKeys(rdb, redisx.RulesImpactKey(name, p.Version)+"*") })

	f := NewImpactFlusher(rdb, name, slog.New(slog.DiscardHandler))
	c := f.track(p.Version, rollout.PhaseShadow)
	f.now = func() time.Time { return now.Add(-9 * time.Minute) }
	for range 2000 {
		c.add(PriorityCritical, false)
	}
	require.NoError(t, f.Flush(ctx))
	f.now = func() time.Time { return now }
	for i := range 100 {
		c.add(PriorityCritical, i < 60)
	}
	require.NoError(t, f.Flush(ctx))

	ctl := rollout.NewController(op, rdb, "adjuster/rollout", nil, prometheus.NewRegistry())
	ctl.Now = func() time.Time { return now.Add(time.Second) }
	st, err := topic.Read(ctx)
	require.NoError(t, err)
	ctl.Window = 0
	v, err := ctl.Step(ctx, &st)
	require.NoError(t, err)
	require.Empty(t, v.Action, "cumulative only: %s", v.Reason)
	require.Contains(t, v.Reason, "CRITICAL would-block share 2.9 % (60 of 2100)")

	ctl.Window = time.Minute
	v, err = ctl.Step(ctx, &st)
	require.NoError(t, err)
	require.Equal(t, rollout.ActionAbort, v.Action, v.Reason)
	require.Contains(t, v.Reason, "shadow, last 1m0s: CRITICAL would-block share 60.0 % (60 of 100) > 5.0 %")
	st, err = topic.Read(ctx)
	require.NoError(t, err)
	e, _ := st.Version(p.Version)
	require.Equal(t, events.RulesStateRolledBack, e.State, "aborted on the topic")
}
