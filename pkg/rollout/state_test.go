package rollout

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/floodgate-dev/floodgate/pkg/events"
)

var t0 = time.Date(2026, 11, 22, 10, 0, 0, 0, time.UTC)

func apply(st *State, p Plan) {
	for _, r := range p.Records {
		st.Apply(st.Next(), r)
	}
}

// shadowState is a log with version 1 enforced and version 2 in shadow,
// judged once 100 CRITICAL decisions were counted.
func shadowState(t *testing.T, a Actor) State {
	t.Helper()
	return proposedState(t, a, "") // promoted at once (steps_test.go has the gradual rollout)
}

// proposedState is a log with version 1 enforced and version 2 proposed at
// t0 with the default params but steps, judged once 100 CRITICAL decisions
// were counted.
func proposedState(t *testing.T, a Actor, steps string) State {
	t.Helper()
	var st State
	p, err := PlanBootstrap(&st, "r1", a, t0)
	require.NoError(t, err)
	apply(&st, p)
	params := DefaultParams()
	params.MinCritical = 100
	params.Steps = steps
	p, err = PlanPropose(&st, "r2", params, a, t0)
	require.NoError(t, err)
	apply(&st, p)
	return st
}

func TestStateFollowsTheLog(t *testing.T) {
	var st State
	_, ok := st.Enforced()
	require.False(t, ok)
	sre := Actor{Name: "sre", Reason: "why"}

	_, err := PlanPropose(&st, "r2", DefaultParams(), sre, t0)
	require.ErrorIs(t, err, ErrNoEnforced, "the first version is a bootstrap")
	p, err := PlanBootstrap(&st, "r1", sre, t0)
	require.NoError(t, err)
	apply(&st, p)
	_, err = PlanBootstrap(&st, "r1", sre, t0)
	require.ErrorIs(t, err, ErrHasEnforced)
	_, err = PlanRollback(&st, sre, t0)
	require.ErrorIs(t, err, ErrNothingToUndo, "a bootstrap has no parent")

	p, err = PlanPropose(&st, "r2", DefaultParams(), sre, t0)
	require.NoError(t, err)
	apply(&st, p)
	c, ok := st.Candidate()
	require.True(t, ok)
	require.EqualValues(t, 2, c.Version)
	require.EqualValues(t, 1, c.ParentVersion)
	_, err = PlanPropose(&st, "r3", DefaultParams(), sre, t0)
	require.ErrorIs(t, err, ErrInProgress, "one rollout at a time")

	p, err = PlanPromote(&st, sre, t0.Add(time.Minute))
	require.NoError(t, err)
	apply(&st, p)
	e, _ := st.Enforced()
	require.EqualValues(t, 2, e.Version)
	_, ok = st.Candidate()
	require.False(t, ok)
	_, err = PlanPropose(&st, "r3", DefaultParams(), sre, t0.Add(2*time.Minute))
	require.ErrorIs(t, err, ErrInProgress, "no new rollout while the last one is watched")

	p, err = PlanRollback(&st, sre, t0.Add(3*time.Minute))
	require.NoError(t, err)
	require.Equal(t, ActionRollback, p.Action)
	apply(&st, p)
	e, _ = st.Enforced()
	require.EqualValues(t, 1, e.Version, "the parent is back")
	require.Equal(t, "r1", e.Rules)
	require.False(t, Watching(e, t0.Add(3*time.Minute)), "a restored parent is not watched")
	v2, _ := st.Version(2)
	require.Equal(t, events.RulesStateRolledBack, v2.State)

	// A candidate proposed after the rollback is judged against version 1.
	p, err = PlanPropose(&st, "r3", DefaultParams(), sre, t0.Add(4*time.Minute))
	require.NoError(t, err)
	require.EqualValues(t, 3, p.Version)
	apply(&st, p)
	p, err = PlanRollback(&st, sre, t0.Add(5*time.Minute))
	require.NoError(t, err)
	require.Equal(t, ActionAbort, p.Action, "rolling back a candidate in shadow aborts it")
	apply(&st, p)
	_, ok = st.Candidate()
	require.False(t, ok)
	e, _ = st.Enforced()
	require.EqualValues(t, 1, e.Version)

	_, err = PlanPropose(&st, "r4", DefaultParams(), Actor{Name: "sre"}, t0)
	require.ErrorContains(t, err, "reason: required")
	bad := DefaultParams()
	bad.MaxShare = 0
	_, err = PlanPropose(&st, "r4", bad, sre, t0)
	require.ErrorContains(t, err, "max-critical-block")
}

func TestJudge(t *testing.T) {
	sre := Actor{Name: "sre", Reason: "why"}
	st := shadowState(t, sre)
	counts := func(phase string, total, blocked int64) ImpactOf {
		return func(context.Context, int64) (Impact, error) {
			c := Counts{Total: map[string]int64{"critical": total, "bulk": 1000}, Blocked: map[string]int64{"critical": blocked, "bulk": 900}}
			im := Impact{Shadow: Counts{Total: map[string]int64{}, Blocked: map[string]int64{}}, Enforced: Counts{Total: map[string]int64{}, Blocked: map[string]int64{}}}
			if phase == PhaseShadow {
				im.Shadow = c
			} else {
				im.Enforced = c
			}
			return im, nil
		}
	}
	ctx := context.Background()
	cases := []struct {
		name   string
		phase  string
		total  int64
		block  int64
		at     time.Duration
		action string
		reason string
	}{
		{"too few critical decisions to judge", PhaseShadow, 99, 99, time.Minute, "", "in shadow until"},
		{"above the share aborts at once", PhaseShadow, 1000, 73, time.Minute, ActionAbort, "CRITICAL would-block share 7.3 % (73 of 1000) > 5.0 %"},
		{"exactly the share is allowed", PhaseShadow, 1000, 50, time.Minute, "", "in shadow until"},
		{"bulk blocks do not count", PhaseShadow, 1000, 0, time.Minute, "", "0.0 %"},
		{"promoted after the shadow period", PhaseShadow, 1000, 10, 11 * time.Minute, ActionPromote, "1.0 % (10 of 1000) ≤ 5.0 %"},
		{"not promoted without enough evidence", PhaseShadow, 10, 0, 11 * time.Minute, "", "waiting for 100 CRITICAL decisions"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			v, err := Judge(ctx, &st, counts(tc.phase, tc.total, tc.block), t0.Add(tc.at))
			require.NoError(t, err)
			require.Equal(t, tc.action, v.Action, v.Reason)
			require.Contains(t, v.Reason, tc.reason)
		})
	}

	p, _ := PlanPromote(&st, sre, t0.Add(11*time.Minute))
	apply(&st, p)
	v, err := Judge(ctx, &st, counts(PhaseEnforced, 500, 60), t0.Add(12*time.Minute))
	require.NoError(t, err)
	require.Equal(t, ActionRollback, v.Action)
	require.Contains(t, v.Reason, "enforced: CRITICAL block share 12.0 % (60 of 500) > 5.0 %; parent version 1 restored")
	v, err = Judge(ctx, &st, counts(PhaseEnforced, 500, 60), t0.Add(11*time.Minute+DefaultParams().WatchFor+time.Second))
	require.NoError(t, err)
	require.Empty(t, v.Action, "after its watch an enforced version is left alone")

	_, err = Judge(ctx, &st, func(context.Context, int64) (Impact, error) { return Impact{}, errors.New("redis down") }, t0.Add(12*time.Minute))
	require.ErrorContains(t, err, "redis down", "no verdict without counts")
}

// TestJudgeRecentWindow: a version that turns bad late in a long period is
// caught on the recent window although its cumulative share is within
// bounds; a recent window with too few decisions decides nothing; a
// candidate is promoted only when both shares are within bounds.
func TestJudgeRecentWindow(t *testing.T) {
	sre := Actor{Name: "sre", Reason: "why"}
	st := shadowState(t, sre)
	crit := func(total, blocked int64) Counts {
		return Counts{Total: map[string]int64{"critical": total}, Blocked: map[string]int64{"critical": blocked}}
	}
	impact := func(phase string, all, recent Counts, window time.Duration) ImpactOf {
		return func(context.Context, int64) (Impact, error) {
			im := Impact{Shadow: newCounts(), Enforced: newCounts(), RecentShadow: newCounts(), RecentEnforced: newCounts(), Window: window}
			if phase == PhaseShadow {
				im.Shadow, im.RecentShadow = all, recent
			} else {
				im.Enforced, im.RecentEnforced = all, recent
			}
			return im, nil
		}
	}
	ctx := context.Background()
	// 10,000 CRITICAL decisions judged, 300 would be blocked — all among the
	// last 1,000: 3.0 % since it began, 30 % over the last 5 minutes.
	late := impact(PhaseShadow, crit(10000, 300), crit(1000, 300), 5*time.Minute)
	cases := []struct {
		name   string
		im     ImpactOf
		at     time.Duration
		action string
		reason string
	}{
		{"turned bad late: aborted on the window", late, 5 * time.Minute, ActionAbort,
			"shadow, last 5m0s: CRITICAL would-block share 30.0 % (300 of 1000) > 5.0 %; since it began CRITICAL would-block share 3.0 % (300 of 10000)"},
		{"without a window the dilution hides it", impact(PhaseShadow, crit(10000, 300), crit(1000, 300), 0), 5 * time.Minute, "", "in shadow until"},
		{"too few recent decisions decide nothing", impact(PhaseShadow, crit(10000, 40), crit(50, 40), 5*time.Minute), 5 * time.Minute, "", "in shadow until"},
		{"not promoted while the window is bad", late, 11 * time.Minute, ActionAbort, "last 5m0s"},
		{"promoted when both are within bounds", impact(PhaseShadow, crit(10000, 100), crit(1000, 20), 5*time.Minute), 11 * time.Minute, ActionPromote, "≤ 5.0 %"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			v, err := Judge(ctx, &st, tc.im, t0.Add(tc.at))
			require.NoError(t, err)
			require.Equal(t, tc.action, v.Action, v.Reason)
			require.Contains(t, v.Reason, tc.reason)
		})
	}

	p, _ := PlanPromote(&st, sre, t0.Add(11*time.Minute))
	apply(&st, p)
	v, err := Judge(ctx, &st, impact(PhaseEnforced, crit(20000, 400), crit(500, 100), time.Minute), t0.Add(20*time.Minute))
	require.NoError(t, err)
	require.Equal(t, ActionRollback, v.Action, v.Reason)
	require.Contains(t, v.Reason, "enforced, last 1m0s: CRITICAL block share 20.0 % (100 of 500) > 5.0 %")
	require.Contains(t, v.Reason, "parent version 1 restored")

	require.NoError(t, ValidWindow(0))
	require.NoError(t, ValidWindow(5*time.Minute))
	require.ErrorContains(t, ValidWindow(time.Second), "10s..1h")
	require.ErrorContains(t, ValidWindow(2*time.Hour), "10s..1h")
}

func TestDiff(t *testing.T) {
	d := Diff("a\nb\nc\n", "a\nB\nc\nd\n")
	require.Equal(t, " a\n-b\n+B\n c\n+d\n", FormatDiff(d))
	add, rm := DiffStat(d)
	require.Equal(t, 2, add)
	require.Equal(t, 1, rm)
	require.Empty(t, Diff("", ""))
}
