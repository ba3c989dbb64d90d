package rollout

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestParseSteps(t *testing.T) {
	cases := []struct {
		in   string
		want []int64
		err  string
	}{
		{"1,10,50,100", []int64{100, 1000, 5000, 10000}, ""},
		{"0.5, 5,100", []int64{50, 500, 10000}, ""},
		{"100", []int64{10000}, ""},
		{"", nil, "at least one step"},
		{"1,10,50", nil, "the last step must be 100"},
		{"10,1,100", nil, "more principals than the one before"},
		{"1,1,100", nil, "more principals than the one before"},
		{"0,100", nil, "not a percentage in (0, 100]"},
		{"1,101", nil, "not a percentage in (0, 100]"},
		{"1,x,100", nil, "not a percentage"},
		{"NaN,100", nil, "not a percentage"},
		{"0.001,100", nil, "more than two decimals"},
		{"1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,100", nil, "at most 16 steps"},
	}
	for _, tc := range cases {
		t.Run(tc.in, func(t *testing.T) {
			got, err := ParseSteps(tc.in)
			if tc.err != "" {
				require.ErrorContains(t, err, tc.err)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tc.want, got)
			back, err := ParseSteps(FormatSteps(got))
			require.NoError(t, err)
			require.Equal(t, got, back, "FormatSteps round-trips")
		})
	}
}

func TestParamsValidateSteps(t *testing.T) {
	p := DefaultParams()
	require.NoError(t, p.Validate())
	p.Steps = "1,50"
	require.ErrorContains(t, p.Validate(), "steps")
	p.Steps, p.StepWindow = "1,100", 0
	require.ErrorContains(t, p.Validate(), "step-window")
	p.Steps = "" // no steps: no window needed
	require.NoError(t, p.Validate())
}

// steppedState is version 1 enforced and version 2 proposed with steps
// 1,10,50,100 (a 10-minute shadow, 5-minute steps) at t0.
func steppedState(t *testing.T, a Actor) State {
	t.Helper()
	st := proposedState(t, a, DefaultParams().Steps)
	c, _ := st.Candidate()
	require.Equal(t, "1,10,50,100", c.Steps)
	require.EqualValues(t, 5*time.Minute, c.StepWindow())
	require.Zero(t, c.SliceBP(), "nothing enforced in shadow")
	return st
}

// stepImpact is a candidate's counts: critical people untouched since it
// began, and at its step the classes given (all decisions and its slice's).
func stepImpact(step int64, all, slice map[FullClass]Paired) ImpactOf {
	people := FullClass{"critical", "user", "free", "/m"}
	return func(context.Context, int64) (Impact, error) {
		im := Impact{Shadow: newCounts(), Enforced: newCounts(), Classes: map[FullClass]Paired{people: {5000, 0, 0}},
			Step: step, StepClasses: all, StepSlice: slice}
		im.Shadow.Total["critical"] = 5000
		return im, nil
	}
}

// TestGradualRollout walks a candidate through its steps on a fake clock:
// out of the shadow period to step 1, each step watched for its window and
// passed only with confidence, the last step promoted; and harm at any step
// rolls it back to its parent, with the class's figures.
func TestGradualRollout(t *testing.T) {
	ctx := context.Background()
	sre := Actor{Name: "sre", Reason: "why"}
	ctl := Actor{Name: "adjuster/rollout", Reason: "judged"}
	people := FullClass{"critical", "user", "free", "/m"}
	bots := FullClass{"best_effort", "bot", "pro", "/m"}
	sure := map[FullClass]Paired{people: {5000, 0, 0}, bots: {3000, 3, 2}}

	st := steppedState(t, sre)
	// The shadow period, then step 1 — once a class was judged.
	v, err := Judge(ctx, &st, stepImpact(0, nil, nil), t0.Add(5*time.Minute))
	require.NoError(t, err)
	require.Equal(t, "", v.Action, v.Reason)
	now := t0.Add(10*time.Minute + time.Second)
	few := func(context.Context, int64) (Impact, error) {
		im := Impact{Shadow: newCounts(), Enforced: newCounts(), Classes: map[FullClass]Paired{people: {50, 0, 0}}}
		im.Shadow.Total["critical"] = 500 // enough CRITICAL for the share, too few in any class
		return im, nil
	}
	v, err = Judge(ctx, &st, few, now)
	require.NoError(t, err)
	require.Equal(t, "", v.Action, "the confidence must hold before the first step too: %s", v.Reason)
	require.Contains(t, v.Reason, "waiting for a class with enough decisions")
	v, err = Judge(ctx, &st, stepImpact(0, nil, nil), now)
	require.NoError(t, err)
	require.Equal(t, ActionStep, v.Action, v.Reason)
	require.Contains(t, v.Reason, "step 1 of 4: enforced for 1 % of principals")
	p, err := PlanStep(&st, v.Version, ctl, now)
	require.NoError(t, err)
	apply(&st, p)
	c, _ := st.Candidate()
	require.EqualValues(t, 1, c.Step)
	require.EqualValues(t, 100, c.SliceBP())
	require.Equal(t, "step 1 of 4 (1 %)", c.StepName())
	e, _ := st.Enforced()
	require.EqualValues(t, 1, e.Version, "the parent stays enforced for the others")

	for step := int64(1); step <= 4; step++ {
		start := now
		t.Run(c.StepName(), func(t *testing.T) {
			v, err := Judge(ctx, &st, stepImpact(step, sure, nil), start.Add(4*time.Minute))
			require.NoError(t, err)
			require.Equal(t, "", v.Action, "watched for its window: %s", v.Reason)
			require.Contains(t, v.Reason, "watched until")
			end := start.Add(5*time.Minute + time.Second)
			v, err = Judge(ctx, &st, stepImpact(step, nil, nil), end)
			require.NoError(t, err)
			require.Equal(t, "", v.Action, "no class judged since the step began: %s", v.Reason)
			unsure := map[FullClass]Paired{people: {300, 0, 0}}
			v, err = Judge(ctx, &st, stepImpact(step, unsure, nil), end)
			require.NoError(t, err)
			require.Equal(t, "", v.Action, "confidence must hold before the next step: %s", v.Reason)
			require.Contains(t, v.Reason, "waiting for 95.0 % confidence")
			v, err = Judge(ctx, &st, stepImpact(step, sure, nil), end)
			require.NoError(t, err)
			require.Greater(t, v.StepConfidence, ConfidenceLevel)
			if step < 4 {
				require.Equal(t, ActionStep, v.Action, v.Reason)
				p, err := PlanStep(&st, v.Version, ctl, end)
				require.NoError(t, err)
				apply(&st, p)
			} else {
				require.Equal(t, ActionPromote, v.Action, v.Reason)
				require.Contains(t, v.Reason, "the last step: enforced")
				_, err := PlanStep(&st, v.Version, ctl, end)
				require.ErrorIs(t, err, ErrNoStep)
			}
			now = end
		})
		c, _ = st.Candidate()
	}
	require.EqualValues(t, 4, c.Step)
	require.EqualValues(t, BasisPoints, c.SliceBP())

	harmed := map[FullClass]Paired{people: {5000, 0, 0}, bots: {400, 320, 0}}
	cases := []struct {
		name       string
		all, slice map[FullClass]Paired
		reason     string
	}{
		{"harm since the step began", harmed, nil, "step 1 of 4 (1 %), harm beyond the class's limit, since step 1 of 4 (1 %) began: "},
		{"harm on the decisions it answered", sure, map[FullClass]Paired{bots: {200, 180, 0}}, "on the decisions it answered at step 1 of 4 (1 %): "},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			st := steppedState(t, sre)
			p, err := PlanStep(&st, 2, ctl, t0.Add(11*time.Minute))
			require.NoError(t, err)
			apply(&st, p)
			// Harm decides at once: no window, no waiting.
			v, err := Judge(ctx, &st, stepImpact(1, tc.all, tc.slice), t0.Add(11*time.Minute+10*time.Second))
			require.NoError(t, err)
			require.Equal(t, ActionRollback, v.Action, v.Reason)
			require.Contains(t, v.Reason, tc.reason)
			require.Contains(t, v.Reason, "kind=bot")
			require.Contains(t, v.Reason, "parent version 1 answers every principal again")
			f := v.Figures()
			require.EqualValues(t, 1, f["step"])
			require.InDelta(t, 1.0, f["slice_pct"], 1e-9)
			p, err = PlanStepRollback(&st, v.Version, ctl, t0.Add(11*time.Minute+10*time.Second))
			require.NoError(t, err)
			require.Equal(t, ActionRollback, p.Action)
			apply(&st, p)
			_, ok := st.Candidate()
			require.False(t, ok, "rolled back: nothing of it enforced")
			e, _ := st.Enforced()
			require.EqualValues(t, 1, e.Version)
		})
	}
}

// TestStepRefusesStaleState: a step planned against a state where the
// candidate was withdrawn, or a version that is not the candidate, fails.
func TestStepRefusesStaleState(t *testing.T) {
	sre := Actor{Name: "sre", Reason: "why"}
	st := steppedState(t, sre)
	_, err := PlanStep(&st, 7, sre, t0)
	require.ErrorIs(t, err, ErrNoCandidate)
	_, err = PlanStep(&st, 2, Actor{Name: "sre"}, t0)
	require.ErrorContains(t, err, "reason: required")
	p, err := PlanAbort(&st, 2, sre, t0)
	require.NoError(t, err)
	apply(&st, p)
	_, err = PlanStep(&st, 2, sre, t0)
	require.ErrorIs(t, err, ErrNoCandidate)
}
