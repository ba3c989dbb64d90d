package candidate

import (
	"context"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/floodgate-dev/floodgate/pkg/events"
	"github.com/floodgate-dev/floodgate/pkg/limiter"
	"github.com/floodgate-dev/floodgate/pkg/limiter/admission"
	"github.com/floodgate-dev/floodgate/pkg/limiter/limitertest"
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
	rolloutGood = "version: 1\nrules:\n  - {id: bots, tier: principal, kinds: [bot], limit: 50000, period: 1s}\n"
)

func testOperator(topic *rollout.Topic, now func() time.Time) *rollout.Operator {
	return &rollout.Operator{Topic: topic, Now: now, Validate: func(name string, b []byte) error { _, err := limiter.ParseRules(name, b); return err }}
}

// testFlusher is a flusher, on the local Redis, of a topic of the test's own
// named after base, whose clock reads *now; version v's impact keys are
// deleted after the test.
func testFlusher(t *testing.T, base string, v int64, now *time.Time) (*ImpactFlusher, redis.UniversalClient, string) {
	t.Helper()
	rdb := redistest.Client(t)
	topic := redistest.Unique(t, base)
	t.Cleanup(func() { limitertest.CleanKeys(rdb, redisx.RulesImpactKey(topic, v)+"*") })
	f := NewImpactFlusher(rdb, topic, slog.New(slog.DiscardHandler))
	f.Now = func() time.Time { return *now }
	return f, rdb, topic
}

// TestImpactRecentWindow: the flusher adds each flush's counts to the
// version's cumulative hash and to its time slot; the controller's recent
// window sums only the slots it covers.
func TestImpactRecentWindow(t *testing.T) {
	ctx := context.Background()
	now := time.Date(2026, 11, 27, 12, 0, 3, 0, time.UTC)
	f, rdb, topic := testFlusher(t, "test.rules.window", 7, &now)
	c := f.track(7, rollout.PhaseShadow, 0)
	for range 900 { // the first ten minutes: good
		c.Add(admission.PriorityCritical, false)
	}
	require.NoError(t, f.Flush(ctx))
	now = now.Add(10 * time.Minute)
	for i := range 100 { // then bad
		c.Add(admission.PriorityCritical, i < 60)
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
	e := limitertest.Engine(t, rdb, fmt.Sprintf(rules, 100), nil)
	require.NoError(t, e.Load(ctx))
	cand, err := limiter.ParseRules("candidate", []byte(fmt.Sprintf(rules, 3)))
	require.NoError(t, err)
	counts := &impactCounts{}
	e.RuleSource().(*limiter.RuleStore).SetCandidate(&limiter.Candidate{Version: 9, Rules: cand, Impact: counts})
	p := limitertest.Principal(t)
	t.Cleanup(func() {
		limitertest.CleanKeys(rdb, "fg:{"+string(p.Kind)+":"+p.ID+"}:*")
		limitertest.CleanKeys(rdb, "fg:cand:9:{"+string(p.Kind)+":"+p.ID+"}:*")
	})
	var verdicts []bool
	var now time.Time
	for range 5 {
		r := limitertest.Check(t, e, limiter.Request{Principal: p, Cost: 1, Priority: admission.PriorityCritical})
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
	require.GreaterOrEqual(t, counts.blocked[admission.PriorityCritical].Load(), int64(2))
}

// TestControllerCatchesALateHarm: a candidate that judged 2,000 CRITICAL
// decisions well and then, in the last minute, would block 60 of 100 is
// aborted by the controller on the real broker and Redis — on its recent
// window: its cumulative share (2.9 %) is within the 5 % maximum, and a
// controller judging cumulative shares only lets it run on.
func TestControllerCatchesALateHarm(t *testing.T) {
	topic, name := rollouttest.OpenTopic(t)
	rdb := redistest.Client(t)
	ctx := context.Background()
	now := time.Now()
	op := testOperator(topic, func() time.Time { return now })
	sre := rollout.Actor{Name: "sre alice", Reason: "test", Via: "test"}
	_, err := op.Bootstrap(ctx, rolloutV1, sre)
	require.NoError(t, err)
	p, err := op.Propose(ctx, rolloutGood, rollout.DefaultParams(), sre)
	require.NoError(t, err)
	t.Cleanup(func() { limitertest.CleanKeys(rdb, redisx.RulesImpactKey(name, p.Version)+"*") })

	f := NewImpactFlusher(rdb, name, slog.New(slog.DiscardHandler))
	c := f.track(p.Version, rollout.PhaseShadow, 0)
	f.Now = func() time.Time { return now.Add(-9 * time.Minute) }
	for range 2000 {
		c.Add(admission.PriorityCritical, false)
	}
	require.NoError(t, f.Flush(ctx))
	f.Now = func() time.Time { return now }
	for i := range 100 {
		c.Add(admission.PriorityCritical, i < 60)
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
