package candidate

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/floodgate-dev/floodgate/pkg/events"
	"github.com/floodgate-dev/floodgate/pkg/limiter"
	"github.com/floodgate-dev/floodgate/pkg/limiter/admission"
	"github.com/floodgate-dev/floodgate/pkg/rollout"
)

// TestImpactPairedClasses: a shadow's paired counts — the candidate's and
// the parent's verdicts on the same decisions, by full class — reach the
// impact hash and its slots, and the controller's reader sums them by
// dimension; past maxImpactClasses classes, new routes count as "other".
func TestImpactPairedClasses(t *testing.T) {
	ctx := context.Background()
	now := time.Date(2026, 11, 29, 6, 0, 3, 0, time.UTC)
	f, rdb, topic := testFlusher(t, "test.rules.classes", 9, &now)
	c := f.track(9, rollout.PhaseShadow, 2)
	bot := limiter.Request{Principal: events.Principal{Kind: events.PrincipalBot, ID: "b"}, Route: "/users/@me:x"}
	user := limiter.Request{Principal: events.Principal{Kind: events.PrincipalUser, ID: "u"}, Route: "/users/@me:x"}
	for i := range 100 {
		c.AddPaired(admission.PriorityBestEffort, bot, "pro", i < 80, i < 1, i < 10)
		c.AddPaired(admission.PriorityCritical, user, "free", false, false, false)
	}
	require.NoError(t, f.Flush(ctx))

	im, err := rollout.ReadImpact(ctx, rdb, topic, 9)
	require.NoError(t, err)
	require.Equal(t, rollout.Paired{N: 100, Cand: 80, Parent: 1}, im.Classes[rollout.FullClass{Priority: "best_effort", Kind: "bot", Plan: "pro", Route: "/users/@me:x"}])
	classes := rollout.ClassesOf(im.Classes)
	require.Equal(t, rollout.Paired{N: 200, Cand: 80, Parent: 1}, classes[rollout.Class{Dim: rollout.DimRoute, Value: "/users/@me:x"}])
	require.Equal(t, rollout.Paired{N: 100}, classes[rollout.Class{Dim: rollout.DimKind, Value: "user"}])
	botClass := rollout.FullClass{Priority: "best_effort", Kind: "bot", Plan: "pro", Route: "/users/@me:x"}
	require.Equal(t, rollout.Paired{N: 10, Cand: 10, Parent: 1}, im.SliceClasses[botClass], "the decisions the candidate answered, apart")
	require.NoError(t, rollout.ReadRecent(ctx, rdb, topic, &im, time.Minute, now))
	require.Equal(t, im.Classes, im.RecentClasses, "the slot holds the same counts")
	require.NoError(t, rollout.ReadStep(ctx, rdb, topic, &im, 2))
	require.Equal(t, im.Classes, im.StepClasses, "so does the step's own hash")
	require.Equal(t, im.SliceClasses, im.StepSlice)
	require.NoError(t, rollout.ReadStep(ctx, rdb, topic, &im, 3))
	require.Empty(t, im.StepClasses, "another step counts on its own")

	for i := range maxImpactClasses + 10 {
		c.AddPaired(admission.PriorityBulk, bot, "pro", false, false, false)
		c.AddPaired(admission.PriorityBulk, limiter.Request{Principal: bot.Principal, Route: fmt.Sprintf("/r/%d", i)}, "pro", false, false, false)
	}
	require.NoError(t, f.Flush(ctx))
	im, err = rollout.ReadImpact(ctx, rdb, topic, 9)
	require.NoError(t, err)
	require.LessOrEqual(t, len(im.Classes), maxImpactClasses+1, "bounded, with the overflow under route other")
	require.Positive(t, im.Classes[rollout.FullClass{Priority: "bulk", Kind: "bot", Plan: "pro", Route: "other"}].N)
}
