package detector

import (
	"context"
	"fmt"
	"hash/fnv"
	"log/slog"
	"sort"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/floodgate-dev/floodgate/loadtest/labeled"
	"github.com/floodgate-dev/floodgate/pkg/events"
	"github.com/floodgate-dev/floodgate/pkg/limiter/limitertest"
	"github.com/floodgate-dev/floodgate/pkg/promtest"
	"github.com/floodgate-dev/floodgate/pkg/redisx"
	"github.com/floodgate-dev/floodgate/pkg/redisx/redistest"
	"github.com/floodgate-dev/floodgate/pkg/rollout"
	"github.com/floodgate-dev/floodgate/pkg/rollout/rollouttest"
	"github.com/floodgate-dev/floodgate/services/detector/internal/score"
)

// paramsRecord is one detector parameters version on the topic.
func paramsRecord(v int64, doc string, state events.RulesState, step int64) events.RulesVersion {
	now := time.Now().UTC().Truncate(time.Millisecond)
	r := events.RulesVersion{ID: fmt.Sprintf("p-%d-%d-%s", v, step, state), Version: v, Rules: doc, Author: "test", Reason: "test",
		CreatedAt: now, TS: now, State: state}
	if v > 1 {
		r.ParentVersion = v - 1
	}
	if step > 0 {
		r.Steps, r.Step, r.StepWindowMs, r.ShadowForMs = "1,50,100", step, 60_000, 60_000
	}
	return r
}

// mistunedBase lets a 1 s burst count as a person's sustained pressure: on
// the held-out families it penalizes people with several devices.
func mistunedBase() score.Config {
	c := score.DefaultConfig()
	c.PersonSustain = time.Second
	return c
}

func paramsDetector(t *testing.T) *Detector {
	return New(Config{Score: mistunedBase(), Logger: slog.New(slog.DiscardHandler), Registerer: prometheus.NewRegistry()})
}

// TestParamsFeedAppliesLiveAndRefusesInvalid: the detector follows the
// parameters topic: a version is applied while it runs, a version that does
// not compile is refused and counted (the one in force stays), and the next
// valid one is applied.
func TestParamsFeedAppliesLiveAndRefusesInvalid(t *testing.T) {
	topic, _ := rollouttest.OpenTopic(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	det := paramsDetector(t)
	reg := prometheus.NewRegistry()
	feed := NewParamsFeed(topic, mistunedBase(), det, nil, nil, reg)
	require.NoError(t, feed.Sync(ctx))
	require.Nil(t, det.Params(), "an empty topic: the environment's parameters")

	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- feed.Run(runCtx) }()
	version := func() int64 {
		if p := det.Params(); p != nil {
			return p.Enforced.Version
		}
		return 0
	}
	require.NoError(t, topic.Publish(ctx, paramsRecord(1, "overrides:\n  - kind: user\n    person_sustain: 5s\n", events.RulesStateEnforced, 0)))
	require.Eventually(t, func() bool { return version() == 1 }, 20*time.Second, 50*time.Millisecond, "applied while running")
	require.Equal(t, 5*time.Second, det.Params().Enforced.Config(events.PrincipalUser, "/r").PersonSustain)

	require.NoError(t, topic.Publish(ctx, paramsRecord(2, "overrides:\n  - kind: user\n    person_sustain: 90s\n", events.RulesStateEnforced, 0)))
	require.Eventually(t, func() bool {
		return promtest.Value(t, reg, "floodgate_detector_params_versions_total", map[string]string{"role": "enforced", "result": "rejected"}) == 1
	}, 20*time.Second, 50*time.Millisecond, "the invalid version is refused")
	require.EqualValues(t, 1, version(), "the parameters in force stay")

	require.NoError(t, topic.Publish(ctx, paramsRecord(3, "defaults:\n  rapid_fire_threshold: 6\n", events.RulesStateEnforced, 0)))
	require.Eventually(t, func() bool { return version() == 3 }, 20*time.Second, 50*time.Millisecond)
	require.Equal(t, 6.0, det.Params().Enforced.Config(events.PrincipalBot, "/r").Threshold)
	require.Equal(t, time.Second, det.Params().Enforced.Config(events.PrincipalUser, "/r").PersonSustain, "version 3 has no override: the base")
	stop()
	require.NoError(t, <-done)
}

// TestParamsCandidateSameOnOneAndThreeInstances: a candidate at a step (50 %
// of principals) answers for the principals of its slice and the enforced
// version for the others; one detector and three (each holding a third of
// the partitions, each following the topic itself) give the same
// detections, and both versions' verdicts are counted for the controller.
func TestParamsCandidateSameOnOneAndThreeInstances(t *testing.T) {
	topic, name := rollouttest.OpenTopic(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	fix := "overrides:\n  - kind: user\n    person_sustain: 5s\n"
	require.NoError(t, topic.Publish(ctx, paramsRecord(1, "defaults: {}\n", events.RulesStateEnforced, 0), paramsRecord(2, fix, events.RulesStateShadow, 2)))

	s, err := labeled.NewHeldOut(labeled.HeldOut{Seed: 7, Start: time.Date(2026, 11, 22, 10, 0, 0, 0, time.UTC),
		Duration: 2 * time.Minute, Legit: 3000, Abusive: 60, Prefix: "pp_"})
	require.NoError(t, err)
	ds, labels := s.All(), s.Labels()

	rdb := redistest.Client(t)
	t.Cleanup(func() { limitertest.CleanKeys(rdb, redisx.RulesImpactKey(name, 2)+"*") })
	const partitions = 12
	run := func(instances int, count bool) map[string]bool {
		dets := make([]*Detector, instances)
		var flusher *rollout.Flusher
		if count {
			flusher = &rollout.Flusher{Redis: rdb, Topic: name}
		}
		for i := range dets {
			dets[i] = paramsDetector(t)
			require.NoError(t, NewParamsFeed(topic, mistunedBase(), dets[i], flusher, nil, prometheus.NewRegistry()).Sync(ctx))
			require.NotNil(t, dets[i].Params().Candidate)
			require.EqualValues(t, 5000, dets[i].Params().SliceBP)
		}
		got := map[string]bool{}
		for i := range ds {
			p := int(fnv32(ds[i].Principal.Key()) % partitions)
			for _, det := range dets[p%instances].observe(p, &ds[i]) {
				if det.Penalize {
					got[det.Principal.Key()] = true
				}
			}
		}
		if flusher != nil {
			require.NoError(t, flusher.Flush(ctx))
		}
		return got
	}
	one, three := run(1, true), run(3, false)
	keys := func(m map[string]bool) []string {
		var out []string
		for k := range m {
			out = append(out, k)
		}
		sort.Strings(out)
		return out
	}
	require.Equal(t, keys(one), keys(three), "one instance and three detect the same principals")

	// Without the candidate, the mistuned enforced version penalizes
	// people of the multi-device family; with it, only those outside the
	// slice still are.
	base := paramsDetector(t)
	var fpIn, fpOut, fpInBase, fpOutBase, abusive, abusiveKept int
	baseDet := map[string]bool{}
	for i := range ds {
		for _, det := range base.scorer(int(fnv32(ds[i].Principal.Key())%partitions)).Observe(&ds[i], nil) {
			if det.Penalize {
				baseDet[det.Principal.Key()] = true
			}
		}
	}
	for k := range baseDet {
		l := labels[k]
		in := rollout.PrincipalSlice(principalOf(k)) < 5000
		switch {
		case l.Abusive:
			abusive++
			if one[k] {
				abusiveKept++
			}
		case in:
			fpInBase++
			if one[k] {
				fpIn++
			}
		default:
			fpOutBase++
			if one[k] {
				fpOut++
			}
		}
	}
	t.Logf("mistuned: %d abusive, %d legitimate in the slice, %d outside; with the candidate at 50 %%: %d abusive kept, %d in the slice and %d outside still penalized",
		abusive, fpInBase, fpOutBase, abusiveKept, fpIn, fpOut)
	require.Positive(t, fpInBase, "the scenario has false positives in the slice")
	require.Positive(t, fpOutBase, "and outside it")
	require.Zero(t, fpIn, "the candidate answers its slice")
	require.Equal(t, fpOutBase, fpOut, "the enforced version answers the others")
	require.Equal(t, abusive, abusiveKept)

	im, err := rollout.ReadImpact(ctx, rdb, name, 2)
	require.NoError(t, err)
	var n, cand, parent, sliceN int64
	for fc, p := range im.Classes {
		require.NotEmpty(t, fc.Kind)
		n, cand, parent = n+p.N, cand+p.Cand, parent+p.Parent
	}
	for _, p := range im.SliceClasses {
		sliceN += p.N
	}
	t.Logf("counted: %d decisions, %d under a candidate penalty, %d under a parent penalty, %d answered by the candidate", n, cand, parent, sliceN)
	require.EqualValues(t, len(ds), n, "every decision judged by both")
	require.Less(t, cand, parent, "the candidate penalizes less")
	require.Positive(t, sliceN)
	require.Less(t, sliceN, n)
	var total int64
	for _, v := range im.Shadow.Total {
		total += v
	}
	require.EqualValues(t, len(ds), total)
	var added int64
	for _, v := range im.Shadow.Blocked {
		added += v
	}
	require.Zero(t, added, "the candidate penalizes nobody its parent does not")
}

// fnv32 is FNV-1a (32-bit) of s.
func fnv32(s string) uint32 {
	h := fnv.New32a()
	_, _ = h.Write([]byte(s))
	return h.Sum32()
}

// principalOf splits a principal key "kind:id".
func principalOf(key string) events.Principal {
	for i := 0; i < len(key); i++ {
		if key[i] == ':' {
			return events.Principal{Kind: events.PrincipalKind(key[:i]), ID: key[i+1:]}
		}
	}
	return events.Principal{ID: key}
}

// TestParamsHarmRolledBack: the rollout controller judges a detector
// parameters candidate on the counts the detector flushed, as it judges
// rules: a candidate at a step that penalizes people the parent does not
// (a person's sustain of 0 s and one denial enough) is rolled back, while
// the proposal that penalizes fewer passes.
func TestParamsHarmRolledBack(t *testing.T) {
	s, err := labeled.NewHeldOut(labeled.HeldOut{Seed: 7, Start: time.Date(2026, 11, 22, 10, 0, 0, 0, time.UTC),
		Duration: 2 * time.Minute, Legit: 1500, Abusive: 60, Prefix: "ph_"})
	require.NoError(t, err)
	ds := s.All()
	for i := range ds {
		ds[i].Priority = events.PriorityCritical
	}
	rdb := redistest.Client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	lostGate := rollout.DefaultClassGate()
	lostGate.MaxLost, lostGate.MinLost = 0.1, rollout.DefaultMinLost // the adjuster's parameters controller
	var lost rollout.Lost
	judge := func(candidate string) rollout.Verdict {
		topic, name := rollouttest.OpenTopic(t)
		t.Cleanup(func() { limitertest.CleanKeys(rdb, redisx.RulesImpactKey(name, 2)+"*") })
		require.NoError(t, topic.Publish(ctx, paramsRecord(1, "defaults: {}\n", events.RulesStateEnforced, 0), paramsRecord(2, candidate, events.RulesStateShadow, 1)))
		det := paramsDetector(t)
		flusher := &rollout.Flusher{Redis: rdb, Topic: name}
		require.NoError(t, NewParamsFeed(topic, mistunedBase(), det, flusher, nil, prometheus.NewRegistry()).Sync(ctx))
		for i := range ds {
			det.observe(int(fnv32(ds[i].Principal.Key())%12), &ds[i])
		}
		require.NoError(t, flusher.Flush(ctx))
		st, err := topic.Read(ctx)
		require.NoError(t, err)
		v, err := rollout.JudgeWith(ctx, &st, func(ctx context.Context, v int64) (rollout.Impact, error) {
			im, err := rollout.ReadImpact(ctx, rdb, name, v)
			if err == nil {
				err = rollout.ReadStep(ctx, rdb, name, &im, 1)
			}
			lost = im.Lost
			return im, err
		}, time.Now(), lostGate)
		require.NoError(t, err)
		return v
	}
	harm := judge("overrides:\n  - kind: user\n    person_sustain: 0s\n    person_min_denials: 1\n    person_denial_ratio: 0.01\n    rapid_fire_threshold: 1.1\n")
	t.Logf("harmful: %s %s", harm.Action, harm.Reason)
	require.Equal(t, rollout.ActionRollback, harm.Action, harm.Reason)
	fix := judge("overrides:\n  - kind: user\n    person_sustain: 5s\n")
	t.Logf("proposal: %q %s; lost %d of %d penalized decisions (%.2f %%)", fix.Action, fix.Reason, lost.Lost, lost.Parent, 100*lost.Share())
	require.NotEqual(t, rollout.ActionRollback, fix.Action, fix.Reason)
	require.Positive(t, lost.Parent, "the parent's penalized decisions are counted")
	require.LessOrEqual(t, lost.Share(), 0.1, "the proposal gives up only the people's penalties")
	// A candidate that stops catching the abusers: no harm to any class
	// (it penalizes less), but it loses what the parent catches.
	blind := judge("defaults:\n  rapid_fire_threshold: 100\n  rapid_fire_rate: 100\n  automated_denial_ratio: 0.99\n")
	t.Logf("blind: %s %s", blind.Action, blind.Reason)
	require.Equal(t, rollout.ActionRollback, blind.Action, blind.Reason)
	require.Contains(t, blind.Reason, "decisions its parent penalizes")
	require.Greater(t, lost.Share(), 0.1)
}
