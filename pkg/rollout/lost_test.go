package rollout

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestLostDetectionsJudged: with a lost gate (the detector parameters'
// controller), a candidate that stops penalizing more than MaxLost of what
// its parent penalizes is aborted in shadow and rolled back at a step,
// with the figures; within the gate, below MinLost, or without a gate (the
// rules'), it goes on as before.
func TestLostDetectionsJudged(t *testing.T) {
	ctx := context.Background()
	sre := Actor{Name: "sre", Reason: "why"}
	gate := DefaultClassGate()
	gate.MaxLost, gate.MinLost = 0.1, 1000
	impact := func(step int64, lost Lost) ImpactOf {
		return func(ctx context.Context, v int64) (Impact, error) {
			im, err := stepImpact(step, nil, nil)(ctx, v)
			im.Lost = lost
			return im, err
		}
	}
	for _, tc := range []struct {
		name   string
		gate   ClassGate
		lost   Lost
		action string
	}{
		{"lost beyond the gate", gate, Lost{Parent: 5000, Lost: 600}, ActionAbort},
		{"within the gate", gate, Lost{Parent: 5000, Lost: 500}, ""},
		{"too few penalized decisions yet", gate, Lost{Parent: 999, Lost: 999}, ""},
		{"no lost gate (rules)", DefaultClassGate(), Lost{Parent: 5000, Lost: 5000}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st := steppedState(t, sre)
			v, err := JudgeWith(ctx, &st, impact(0, tc.lost), t0.Add(time.Minute), tc.gate)
			require.NoError(t, err)
			require.Equal(t, tc.action, v.Action, v.Reason)
			if tc.action != "" {
				require.Contains(t, v.Reason, "shadow, lost 600 of the 5000 decisions its parent penalizes (12.0 % > 10.0 %)")
			}
		})
	}

	st := steppedState(t, sre)
	p, err := PlanStep(&st, 2, Actor{Name: "adjuster/rollout", Reason: "judged"}, t0.Add(11*time.Minute))
	require.NoError(t, err)
	apply(&st, p)
	v, err := JudgeWith(ctx, &st, impact(1, Lost{Parent: 20000, Lost: 19000}), t0.Add(11*time.Minute+time.Second), gate)
	require.NoError(t, err)
	require.Equal(t, ActionRollback, v.Action, v.Reason)
	require.Contains(t, v.Reason, "step 1 of 4 (1 %), lost 19000 of the 20000 decisions its parent penalizes (95.0 % > 10.0 %); parent version 1 answers every principal again")
}

// TestCounterCountsLost: the paired counts of a detector parameters
// candidate carry what the parent penalizes and the candidate does not,
// read back into Impact.Lost.
func TestCounterCountsLost(t *testing.T) {
	c := NewCounter(PhaseShadow)
	fc := FullClass{"degraded", "user", "free", "/m"}
	for i := range 10 {
		c.AddPaired(fc, i < 3, i < 8, false) // the candidate penalizes 3, the parent 8
	}
	c.AddPaired(FullClass{"degraded", "bot", "free", "/m"}, true, true, true)
	h := map[string]string{}
	c.Take(func(k string, n int64) { h[k] = strconv.FormatInt(n, 10) })
	im := Impact{Shadow: newCounts(), Enforced: newCounts(), Classes: map[FullClass]Paired{}, SliceClasses: map[FullClass]Paired{}}
	addFields(h, fieldSink{&im.Shadow, &im.Enforced, im.Classes, im.SliceClasses, &im.Lost})
	require.Equal(t, Lost{Parent: 9, Lost: 5}, im.Lost)
	require.InDelta(t, 5.0/9, im.Lost.Share(), 1e-9)
	require.Equal(t, Paired{N: 10, Cand: 3, Parent: 8}, im.Classes[fc], "the class counts are unchanged")
}
