package web

import (
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"

	"github.com/floodgate-dev/floodgate/pkg/events"
)

// TestBrowserVerdict drives the console in headless Chromium: an analyst
// opens an alert, marks the detection a false positive with a reason and an
// allowlist duration; the page confirms it, the real limiter engine on the
// same Redis no longer applies the penalty, verdict.v1 is published, and the
// precision page counts the verdict. Screenshots as TestBrowser.
func TestBrowserVerdict(t *testing.T) {
	bin, shots := browserSetup(t)
	e, pub := newVerdictEnv(t)
	now := time.Now()
	ok := e.seed(t, "bv_ok", now.Add(-3*time.Minute), events.PatternRapidFire, events.SeverityHigh, false)
	a := e.seed(t, "bv_fp", now.Add(-time.Minute), events.PatternRapidFire, events.SeverityHigh, true)
	code, body := e.postVerdict(t, "analyst", map[string]string{"principal": ok.Principal, "key": ok.SK, "verdict": "confirmed", "reason": "scraper"})
	require.Equal(t, 200, code, body)

	principal, err := events.ParsePrincipalKey(a.Principal)
	require.NoError(t, err)
	botLimit := penaltyEngine(t, e)
	limit, mult := botLimit(principal)
	require.Equal(t, 0.1, mult, "the penalty applies before the verdict")
	require.Equal(t, int64(10), limit)

	ctx := startBrowser(t, bin)
	text := func(sel string) string { t.Helper(); return textOf(t, ctx, sel) }
	require.NoError(t, chromedp.Do(ctx,
		fillFalsePositive(e.srv.URL, a, "30d", "TS-77: one person's three devices reconnecting"),
		screenshot(shots, "console-verdict"),
		chromedp.Click(chromedp.ID("verdict-submit")),
		chromedp.WaitVisible(chromedp.CSS(`p.ok`)),
	))
	require.Contains(t, text("p.ok"), "Verdict recorded: false positive")
	v := text("#verdict")
	require.Contains(t, v, "false_positive")
	require.Contains(t, v, "analyst1")
	require.Contains(t, v, "TS-77: one person's three devices reconnecting")
	require.Contains(t, v, "penalty lifted")
	require.False(t, e.penaltyExists(t, a))
	limit, mult = botLimit(principal)
	require.Equal(t, 1.0, mult, "the limiter no longer applies the penalty")
	require.Equal(t, int64(100), limit)
	allow, allowed, err := e.st.GetAllow(t.Context(), a.Principal)
	require.NoError(t, err)
	require.True(t, allowed)
	require.InDelta(t, now.Add(30*24*time.Hour).Unix(), allow.ExpiresAt, 120)
	evs := pub.all()
	require.Len(t, evs, 2)
	require.Equal(t, events.VerdictFalsePositive, evs[1].Verdict)
	require.Equal(t, "analyst1", evs[1].Reviewer)

	// The precision page counts both verdicts: one of two right.
	require.NoError(t, chromedp.Do(ctx,
		chromedp.Navigate(e.srv.URL+"/precision"),
		chromedp.WaitVisible(chromedp.ID("precision-table")),
		screenshot(shots, "console-precision"),
	))
	require.Contains(t, text("#precision-all"), "50.00 %")
}
