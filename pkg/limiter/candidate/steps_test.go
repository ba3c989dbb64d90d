package candidate

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
	"github.com/floodgate-dev/floodgate/pkg/limiter"
	"github.com/floodgate-dev/floodgate/pkg/limiter/admission"
	"github.com/floodgate-dev/floodgate/pkg/limiter/limitertest"
	"github.com/floodgate-dev/floodgate/pkg/redisx"
	"github.com/floodgate-dev/floodgate/pkg/redisx/redistest"
	"github.com/floodgate-dev/floodgate/pkg/rollout"
	"github.com/floodgate-dev/floodgate/pkg/rollout/rollouttest"
)

// memAudit keeps audit rows in memory.
type memAudit struct {
	mu   sync.Mutex
	rows []rollout.AuditEntry
}

func (m *memAudit) Audit(_ context.Context, e rollout.AuditEntry) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.rows = append(m.rows, e)
	return nil
}

func TestPrincipalSlice(t *testing.T) {
	p := events.Principal{Kind: events.PrincipalBot, ID: "bot_abc123"}
	require.Equal(t, limiter.PrincipalSlice(p), limiter.PrincipalSlice(p), "deterministic")
	in := 0
	for i := range 20000 {
		s := limiter.PrincipalSlice(events.Principal{Kind: events.PrincipalUser, ID: fmt.Sprintf("u%d", i)})
		require.True(t, s >= 0 && s < rollout.BasisPoints)
		if s < 100 {
			in++
		}
	}
	// 1 % of 20,000 is 200; a binomial's 4 standard deviations are ±56.
	require.InDelta(t, 200, in, 56, "a 1 %% slice holds about 1 %% of principals")
	c := &limiter.Candidate{SliceBP: 0}
	require.False(t, c.Enforces(p), "shadow enforces for nobody")
	c.SliceBP = rollout.BasisPoints
	require.True(t, c.Enforces(p), "the last step enforces for everybody")
}

// TestStepsOnTwoReplicas: a candidate at a step on the real broker and
// Redis answers, on two limiter replicas alike, for exactly the principals
// whose hash falls in the step's slice, and the enforced rules for the
// others; the controller rolls it back at that step on the harmed class,
// audited with its figures, and every principal gets the parent's answers
// again.
func TestStepsOnTwoReplicas(t *testing.T) {
	brokers, name := rollouttest.Topic(t)
	rdb := redistest.Client(t)
	ctx := context.Background()
	audit := &memAudit{}
	opTopic := rollout.NewTopic(brokers, nil, name, nil)
	t.Cleanup(func() { _ = opTopic.Close() })
	op := testOperator(opTopic, nil)
	op.Audit = audit
	sre := rollout.Actor{Name: "sre alice", Reason: "test", Via: "test"}
	_, err := op.Bootstrap(ctx, rolloutV1, sre)
	require.NoError(t, err)
	params := rollout.DefaultParams()
	params.Steps, params.StepWindow = "10,100", time.Hour
	const harmful = "version: 1\nrules:\n  - {id: bots, tier: principal, kinds: [bot], limit: 1, period: 1h}\n"
	p, err := op.Propose(ctx, harmful, params, sre)
	require.NoError(t, err)
	t.Cleanup(func() {
		limitertest.CleanKeys(rdb, redisx.RulesImpactKey(name, p.Version)+"*")
		limitertest.CleanKeys(rdb, redisx.RulesImpactKey(name, 1)+"*")
	})
	// Step 1 (10 %), as the controller takes it once the shadow passed.
	_, err = op.Apply(ctx, sre, func(s *rollout.State) (rollout.Plan, error) { return rollout.PlanStep(s, p.Version, sre, time.Now()) })
	require.NoError(t, err)

	type replica struct {
		e      *limiter.Engine
		feed   *RulesFeed
		impact *ImpactFlusher
	}
	replicas := make([]replica, 2)
	for i := range replicas {
		e := limitertest.Engine(t, rdb, rolloutGood, nil) // the topic's rules replace it
		require.NoError(t, e.Load(ctx))
		topic := rollout.NewTopic(brokers, nil, name, nil)
		t.Cleanup(func() { _ = topic.Close() })
		impact := NewImpactFlusher(rdb, name, slog.New(slog.DiscardHandler))
		feed := NewRulesFeed(topic, e.RuleSource().(*limiter.RuleStore), impact, slog.New(slog.DiscardHandler), prometheus.NewRegistry())
		require.NoError(t, feed.Sync(ctx))
		enf, cand := feed.Versions()
		require.EqualValues(t, 1, enf)
		require.Equal(t, p.Version, cand)
		require.EqualValues(t, 1000, e.Candidate().SliceBP, "step 1: 10 %% of the principal-hash space")
		replicas[i] = replica{e, feed, impact}
	}

	bots := make([]events.Principal, 300)
	inSlice := 0
	prefix := redistest.Unique(t, "stepbot")
	for i := range bots {
		bots[i] = events.Principal{Kind: events.PrincipalBot, ID: fmt.Sprintf("%s_%d", prefix, i)}
		if limiter.PrincipalSlice(bots[i]) < 1000 {
			inSlice++
		}
	}
	t.Cleanup(func() {
		limitertest.CleanKeys(rdb, "fg:{bot:"+prefix+"_*")
		limitertest.CleanKeys(rdb, fmt.Sprintf("fg:cand:%d:{bot:%s_*", p.Version, prefix))
	})
	require.Positive(t, inSlice)
	denied := 0
	for _, b := range bots {
		in := limiter.PrincipalSlice(b) < 1000
		for k := range 4 {
			r := limitertest.Check(t, replicas[k%2].e, limiter.Request{Principal: b, Cost: 1, Priority: admission.PriorityBestEffort})
			require.Equal(t, p.Version, r.CandidateVersion)
			if !in {
				require.True(t, r.Allowed, "outside the slice: the parent answers")
				require.EqualValues(t, 1, r.RulesVersion)
				continue
			}
			require.Equal(t, p.Version, r.RulesVersion, "inside the slice: the candidate answers, on either replica")
			require.Equal(t, k == 0, r.Allowed, "the candidate's one call an hour, shared across replicas")
			if !r.Allowed {
				denied++
				require.Equal(t, 1, r.Limit)
				require.Positive(t, r.RetryAfter)
			}
		}
	}
	require.Equal(t, 3*inSlice, denied)
	for _, r := range replicas {
		require.NoError(t, r.impact.Flush(ctx))
	}

	im, err := rollout.ReadImpact(ctx, rdb, name, p.Version)
	require.NoError(t, err)
	require.NoError(t, rollout.ReadStep(ctx, rdb, name, &im, 1))
	bot := rollout.ClassesOf(im.StepClasses)[rollout.Class{Dim: rollout.DimKind, Value: "bot"}]
	require.Equal(t, rollout.Paired{N: 1200, Cand: 900, Parent: 0}, bot, "the step judges every decision, both versions (the candidate would block every bot's 2nd to 4th)")
	slice := rollout.ClassesOf(im.StepSlice)[rollout.Class{Dim: rollout.DimKind, Value: "bot"}]
	require.Equal(t, rollout.Paired{N: int64(4 * inSlice), Cand: int64(3 * inSlice)}, slice, "and the decisions the candidate answered, apart")

	ctl := rollout.NewController(op, rdb, "adjuster/rollout", nil, prometheus.NewRegistry())
	ctl.Gate.MinClass = 50
	st, err := opTopic.Read(ctx)
	require.NoError(t, err)
	v, err := ctl.Step(ctx, &st)
	require.NoError(t, err)
	require.Equal(t, rollout.ActionRollback, v.Action, v.Reason)
	require.Contains(t, v.Reason, "step 1 of 2 (10 %), harm beyond the class's limit")
	require.Contains(t, v.Reason, "parent version 1 answers every principal again")
	audit.mu.Lock()
	last := audit.rows[len(audit.rows)-1]
	audit.mu.Unlock()
	require.Equal(t, rollout.ActionRollback, last.Action)
	require.Equal(t, "adjuster/rollout", last.Actor)
	require.EqualValues(t, 1, last.Before["candidate_step"])
	require.InDelta(t, 10.0, last.Before["candidate_slice_pct"], 1e-9)
	fig, ok := last.After["figures"].(map[string]any)
	require.True(t, ok, "the rollback's figures in its audit row: %+v", last.After)
	require.EqualValues(t, 1, fig["step"])
	require.NotEmpty(t, fig["step_classes"])

	for _, r := range replicas {
		require.NoError(t, r.feed.Sync(ctx))
		_, cand := r.feed.Versions()
		require.Zero(t, cand, "the candidate withdrawn")
	}
	for _, b := range bots {
		r := limitertest.Check(t, replicas[0].e, limiter.Request{Principal: b, Cost: 1, Priority: admission.PriorityBestEffort})
		require.True(t, r.Allowed, "the parent answers every principal again")
		require.EqualValues(t, 1, r.RulesVersion)
	}
}
