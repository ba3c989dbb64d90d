package rollout

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestWilsonAndDifference(t *testing.T) {
	lo, hi := wilson(0, 100, 1.96)
	require.Zero(t, lo)
	require.InDelta(t, 0.037, hi, 0.001, "0 of 100 still leaves up to 3.7 % at 95 %")
	lo, hi = wilson(50, 100, 1.96)
	require.InDelta(t, 0.404, lo, 0.001)
	require.InDelta(t, 0.596, hi, 0.001)

	p := Paired{N: 1000, Cand: 794, Parent: 2}
	require.InDelta(t, 0.792, p.Diff(), 1e-9)
	lo, hi = p.Interval(zConfidence)
	require.Greater(t, lo, 0.75)
	require.Less(t, hi, 0.83)
	require.Less(t, p.Confidence(0.05), 1e-6, "certainly above a 5-point limit")

	same := Paired{N: 1000, Cand: 20, Parent: 20}
	require.Zero(t, same.Diff())
	require.Greater(t, same.Confidence(0.05), 0.999, "the same share on 1000 decisions: within 5 points")
	require.InDelta(t, 0.5, Paired{N: 1000, Cand: 70, Parent: 20}.Confidence(0.05), 0.01, "a rise of exactly the limit")
	small := Paired{N: 10, Cand: 0, Parent: 0}
	require.Less(t, small.Confidence(0.05), 0.95, "ten clean decisions do not prove a 5-point bound")
}

// TestJudgeClasses: a candidate that blocks most of one legitimate
// non-critical kind is harmful there although CRITICAL and the other kinds
// are untouched; the difference, not the absolute share, is judged (a class
// the parent already blocks is not the candidate's harm).
func TestJudgeClasses(t *testing.T) {
	full := map[FullClass]Paired{
		{"critical", "user", "free", "/a"}:    {N: 2000, Cand: 10, Parent: 10},
		{"best_effort", "bot", "pro", "/a"}:   {N: 1200, Cand: 953, Parent: 2},
		{"degraded", "api_key", "free", "/b"}: {N: 800, Cand: 400, Parent: 398}, // blocked alike by both
		{"bulk", "anonymous", "free", "/c"}:   {N: 5, Cand: 5, Parent: 0},
	}
	classes := ClassesOf(full)
	require.Equal(t, Paired{N: 1200, Cand: 953, Parent: 2}, classes[Class{DimKind, "bot"}])
	require.Equal(t, Paired{N: 2800, Cand: 410, Parent: 408}, classes[Class{DimPlan, "free"}].Add(Paired{N: -5, Cand: -5}))
	js := JudgeClasses(classes, DefaultClassLimits(), 20)
	byName := map[string]ClassJudged{}
	for _, j := range js {
		byName[j.Class.String()] = j
	}
	require.Equal(t, ClassHarm, js[0].Verdict, "the worst first: %v", js[0])
	require.Equal(t, ClassHarm, byName["kind=bot"].Verdict)
	require.Equal(t, ClassHarm, byName["plan=pro"].Verdict)
	require.Equal(t, ClassHarm, byName["priority=best_effort"].Verdict)
	require.Equal(t, ClassSafe, byName["priority=critical"].Verdict, "%v", byName["priority=critical"])
	require.Equal(t, ClassSafe, byName["kind=api_key"].Verdict, "50 %% blocked by both: no harm of the candidate's")
	require.Equal(t, ClassFew, byName["kind=anonymous"].Verdict)
	require.Contains(t, byName["kind=bot"].String(), "kind=bot: candidate 79.4 % vs parent 0.2 % of 1200")
}

func TestClassLimits(t *testing.T) {
	l, err := ParseClassLimits("default=0.1, kind=user:0.01, route:0.03")
	require.NoError(t, err)
	require.Equal(t, 0.01, l.Of(Class{DimKind, "user"}))
	require.Equal(t, 0.1, l.Of(Class{DimKind, "bot"}))
	require.Equal(t, 0.03, l.Of(Class{DimRoute, "/x:y"}))
	require.Equal(t, 0.005, l.Of(Class{DimPriority, "critical"}), "defaults kept")
	for _, bad := range []string{"kind=user", "colour:0.1", "kind:2", "default=x"} {
		_, err := ParseClassLimits(bad)
		require.Error(t, err, bad)
	}
}

func TestImpactClassField(t *testing.T) {
	fc := FullClass{Priority: "critical", Kind: "user", Plan: "", Route: "/users/@me:x"}
	what, got, ok := parseClassField(ImpactClassField("cand", fc))
	require.True(t, ok)
	require.Equal(t, "cand", what)
	require.Equal(t, fc, got)
	_, _, ok = parseClassField("shadow:critical:total")
	require.False(t, ok)
}

// TestJudgeOnEveryClass: the bad candidate — CRITICAL untouched, one
// legitimate non-critical kind 79 % blocked in shadow against its parent's
// 0.2 % — is aborted in shadow with the class's figures; a candidate whose
// classes are within their limits but not yet with confidence waits past its
// shadow period; once the decisions make it sure, it is promoted, with the
// lowest confidence in the reason.
func TestJudgeOnEveryClass(t *testing.T) {
	sre := Actor{Name: "sre", Reason: "why"}
	st := shadowState(t, sre)
	ctx := context.Background()
	critical := FullClass{"critical", "user", "free", "/channels/{id}/messages"}
	bots := FullClass{"best_effort", "bot", "pro", "/channels/{id}/messages"}
	impact := func(all, recent map[FullClass]Paired) ImpactOf {
		return func(context.Context, int64) (Impact, error) {
			im := Impact{Shadow: newCounts(), Enforced: newCounts(), RecentShadow: newCounts(), RecentEnforced: newCounts(),
				Classes: all, RecentClasses: recent, Window: 5 * time.Minute}
			im.Shadow.Total["critical"], im.Shadow.Blocked["critical"] = all[critical].N, all[critical].Cand
			return im, nil
		}
	}
	cases := []struct {
		name   string
		all    map[FullClass]Paired
		recent map[FullClass]Paired
		at     time.Duration
		action string
		reason string
	}{
		{"a non-critical kind harmed: aborted in shadow", map[FullClass]Paired{critical: {2000, 0, 0}, bots: {1200, 953, 2}}, nil,
			time.Minute, ActionAbort, "shadow, harm beyond the class's limit: kind=bot: candidate 79.4 % vs parent 0.2 % of 1200"},
		{"harm in the recent window only", map[FullClass]Paired{critical: {2000, 0, 0}, bots: {20000, 400, 2}}, map[FullClass]Paired{bots: {500, 300, 0}},
			time.Minute, ActionAbort, "last 5m0s: "},
		{"within the limits but unsure: waits past the shadow", map[FullClass]Paired{critical: {300, 0, 0}, bots: {300, 3, 2}}, nil,
			11 * time.Minute, "", "waiting for 95.0 % confidence: priority=critical"},
		{"sure: promoted", map[FullClass]Paired{critical: {5000, 0, 0}, bots: {3000, 3, 2}}, nil,
			11 * time.Minute, ActionPromote, "every class judged within its limit at ≥ 95.0 % confidence (lowest"},
		{"classes too small to judge do not hold it", map[FullClass]Paired{critical: {5000, 0, 0}, bots: {30, 3, 0}}, nil,
			11 * time.Minute, ActionPromote, "shadow 10m0s passed"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			v, err := Judge(ctx, &st, impact(tc.all, tc.recent), t0.Add(tc.at))
			require.NoError(t, err)
			require.Equal(t, tc.action, v.Action, v.Reason)
			require.Contains(t, v.Reason, tc.reason)
			require.NotEmpty(t, v.Classes)
		})
	}
}
