package web

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/require"

	"github.com/floodgate-dev/floodgate/pkg/events"
	"github.com/floodgate-dev/floodgate/pkg/limiter"
	"github.com/floodgate-dev/floodgate/pkg/redisx/redistest"
	"github.com/floodgate-dev/floodgate/pkg/stacktest/browsertest"
	"github.com/floodgate-dev/floodgate/services/console/internal/auth"
	"github.com/floodgate-dev/floodgate/services/console/internal/consoletest"
	"github.com/floodgate-dev/floodgate/services/console/internal/store"
)

// TestBrowser drives the console in headless Chromium (Debian's chromium at
// FLOODGATE_CHROMIUM, default /usr/bin/chromium; `deploy/local/browser.sh`
// installs it): an analyst signs in, opens an alert from the list, lifts its
// penalty with a reason — the Redis penalty key is gone and the audit row
// exists — then a viewer finds no action to take. It fails when Chromium is
// missing. Screenshots go to FLOODGATE_CONSOLE_SCREENSHOTS when set
// (docs/screenshots), else to a temporary directory.
func TestBrowser(t *testing.T) {
	bin, shots := browserSetup(t)

	b := consoletest.Broker(t)
	e := newEnvWith(t, func(cfg *Config, _ string) {
		cfg.Samples = &store.SampleReader{Client: &kafka.Client{Addr: kafka.TCP(b), Timeout: 5 * time.Second}, Topic: decisionsTopic}
		cfg.SignIn = auth.NewLimiter(redistest.Client(t), "fg:console:test:"+redistest.Unique(t, "authfail")+":")
	})
	now := time.Now()
	e.seed(t, "older", now.Add(-40*time.Minute), events.PatternDistributedIP, events.SeverityHigh, false)
	e.seed(t, "sim", now.Add(-20*time.Minute), events.PatternRapidFire, events.SeverityMedium, false)
	a := e.seed(t, "browser", now.Add(-time.Minute), events.PatternRapidFire, events.SeverityCritical, true)
	// The principal's decisions on partition 2, as the limiter produced them;
	// the detection crossed on the last one.
	kind, id := a.PrincipalParts()
	var ds []*events.Decision
	for i := 0; i < 12; i++ {
		ds = append(ds, sampleDecision(events.Principal{Kind: events.PrincipalKind(kind), ID: id}, i, now.Add(-time.Minute-time.Duration(12-i)*time.Second), "203.0.113.77"))
	}
	crossing := produce(t, b, 2, ds) + 11
	a = e.setCrossing(t, a, &events.EventRef{Topic: decisionsTopic, Partition: 2, Offset: crossing})
	require.NoError(t, e.rdb.HSet(context.Background(), "fg:test:"+e.run+":scales", "global", "0.7", "tier:ip", "0.5", "route:write", "1").Err())

	ctx := startBrowser(t, bin)
	shot := func(name string) chromedp.Action[chromedp.Void] { return screenshot(shots, name) }
	text := func(sel string) string { t.Helper(); return textOf(t, ctx, sel) }

	// A real limiter engine on the same Redis applies the detector's penalty to the
	// alert's principal before the lift, and stops applying it after.
	principal, err := events.ParsePrincipalKey(a.Principal)
	require.NoError(t, err)
	botLimit := penaltyEngine(t, e)
	limit, mult := botLimit(principal)
	require.Equal(t, 0.1, mult, "the penalty is applied before the lift")
	require.Equal(t, int64(10), limit, "100 × 0.1")

	// Analyst: sign in → alerts list → the alert → lift its penalty with a reason.
	require.NoError(t, chromedp.Do(ctx,
		chromedp.Navigate(e.srv.URL+"/login"),
		chromedp.WaitVisible(chromedp.ID("username")),
		shot("console-login"),
		signIn(e.srv.URL, "analyst1"),
		shot("console-alerts"),
	))
	require.Contains(t, text("#alert-rows"), a.Principal)
	require.NoError(t, chromedp.Do(ctx,
		chromedp.Click(chromedp.CSS(`a[href*="`+a.ID+`"]`)),
		chromedp.WaitVisible(chromedp.ID("lift-form")),
		chromedp.WaitVisible(chromedp.ID("samples")),
		shot("console-alert"),
		chromedp.SendKeys(chromedp.ID("lift-reason"), "TS-42: verified partner load test"),
		chromedp.Click(chromedp.CSS(`#lift-form button[type=submit]`)),
		chromedp.WaitVisible(chromedp.CSS(`p.ok`)),
		shot("console-alert-lifted"),
	))
	samples := text("#samples")
	require.Contains(t, samples, strconv.FormatInt(crossing, 10), "the crossing offset")
	require.Contains(t, samples, strconv.FormatInt(crossing-11, 10), "the oldest sample's offset")
	require.Contains(t, samples, "crossed the threshold")
	require.Contains(t, samples, "203.0.113.0")
	require.NotContains(t, samples, "203.0.113.77")
	afterLift := text("#main")
	require.Contains(t, afterLift, "Penalty lifted")
	require.Contains(t, afterLift, "TS-42: verified partner load test", "the audit row is on the page")
	require.False(t, e.penaltyExists(t, a), "the Redis penalty key is gone")
	limit, mult = botLimit(principal)
	require.Equal(t, 1.0, mult, "the limiter no longer applies the lifted penalty")
	require.Equal(t, int64(100), limit)
	row := e.onlyAudit(t, a)
	require.Equal(t, store.ActionLift, row.Action)
	require.Equal(t, "analyst1", row.Actor)
	require.Equal(t, "TS-42: verified partner load test", row.Reason)

	// Allowlist the alert's busiest network (offered from the evidence), then see it listed.
	require.NoError(t, chromedp.Do(ctx,
		chromedp.SendKeys(chromedp.ID("cidr-comment"), "partner office NAT"),
		chromedp.SendKeys(chromedp.ID("cidr-reason"), "TS-43: partner's office range"),
		chromedp.Click(chromedp.CSS(`#cidr-form button[type=submit]`)),
		chromedp.WaitVisible(chromedp.CSS(`#networks a[href="/allowlist"]`)),
	))
	require.Contains(t, text("p.ok"), "Network allowlisted")
	require.NotEmpty(t, e.runtimeItem(t, "detector#allow#cidr#203.0.113.0/24"), "the entry the detector reads")
	require.NoError(t, chromedp.Do(ctx,
		chromedp.Navigate(e.srv.URL+"/allowlist"), chromedp.WaitVisible(chromedp.ID("allow-entries")), shot("console-allowlist"),
	))
	require.Contains(t, text("#allow-entries"), "partner office NAT")

	// A new alert appears in the open list without a reload.
	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(e.srv.URL+"/alerts"), chromedp.WaitVisible(chromedp.ID("alert-rows"))))
	fresh := e.seed(t, "live", time.Now(), events.PatternRapidFire, events.SeverityCritical, false)
	require.NoError(t, chromedp.Do(ctx, chromedp.WaitVisible(chromedp.CSS(`tr[data-id="`+fresh.ID+`"]`))))
	require.Contains(t, text("#live"), "1 new alert")

	// The SRE-facing pages render; then sign out.
	require.NoError(t, chromedp.Do(ctx,
		chromedp.Navigate(e.srv.URL+"/scales"), chromedp.WaitVisible(chromedp.CSS(`svg.chart`)), // console-scales.png: TestBrowserSRE (with history)
		chromedp.Navigate(e.srv.URL+"/false-positives"), chromedp.WaitVisible(chromedp.CSS(`h1`)), shot("console-false-positives"),
		chromedp.Click(chromedp.CSS(`button.link`)), chromedp.WaitVisible(chromedp.ID("username")),
	))

	// Viewer: reads the alert, is offered nothing, and a forged POST is refused.
	other := e.seed(t, "viewer", now.Add(-2*time.Minute), events.PatternRapidFire, events.SeverityHigh, true)
	require.NoError(t, chromedp.Do(ctx,
		signIn(e.srv.URL, "viewer1"),
		chromedp.Click(chromedp.CSS(`a[href*="`+other.ID+`"]`)),
		chromedp.WaitVisible(chromedp.ID("read-only")),
		shot("console-alert-viewer"),
	))
	require.Contains(t, text("#read-only"), "read-only")
	forms, err := chromedp.Run(ctx, chromedp.Evaluate[int](`document.querySelectorAll('form[action^="/alert/"]').length`))
	require.NoError(t, err)
	require.Zero(t, forms, "no action form for a viewer")
	cidrForms, err := chromedp.Run(ctx, chromedp.Evaluate[int](`document.querySelectorAll('form[action^="/allowlist/"]').length`))
	require.NoError(t, err)
	require.Zero(t, cidrForms, "no allowlist form for a viewer")
	status, err := chromedp.Run(ctx, chromedp.Evaluate[int](`(async () => {
		const csrf = document.querySelector('input[name=csrf]').value;
		const body = new URLSearchParams({csrf, p: `+jsString(other.Principal)+`, k: `+jsString(other.SK)+`, reason: "try"});
		const res = await fetch("/alert/lift", {method: "POST", body, redirect: "manual"});
		return res.status;
	})()`, chromedp.EvalAwaitPromise))
	require.NoError(t, err)
	require.Equal(t, 403, status)
	require.True(t, e.penaltyExists(t, other), "the viewer's forged lift changed nothing")
	status, err = chromedp.Run(ctx, chromedp.Evaluate[int](`(async () => {
		const csrf = document.querySelector('input[name=csrf]').value;
		const body = new URLSearchParams({csrf, cidr: "192.0.2.0/24", duration: "1d", comment: "c", reason: "try"});
		const res = await fetch("/allowlist/cidr", {method: "POST", body, redirect: "manual"});
		return res.status;
	})()`, chromedp.EvalAwaitPromise))
	require.NoError(t, err)
	require.Equal(t, 403, status)
	require.Empty(t, e.runtimeItem(t, "detector#allow#cidr#192.0.2.0/24"))
	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(e.srv.URL+"/allowlist"), chromedp.WaitVisible(chromedp.ID("read-only")),
		chromedp.Click(chromedp.CSS(`button.link`)), chromedp.WaitVisible(chromedp.ID("username"))))

	// Five wrong passwords lock the account: the sixth attempt is told so.
	for i := 0; i < 6; i++ {
		require.NoError(t, chromedp.Do(ctx,
			chromedp.Navigate(e.srv.URL+"/login"), chromedp.WaitVisible(chromedp.ID("username")),
			chromedp.SendKeys(chromedp.ID("username"), "admin1"), chromedp.SendKeys(chromedp.ID("password"), "guess number "+strconv.Itoa(i)),
			chromedp.Submit(chromedp.ID("password")), chromedp.WaitVisible(chromedp.CSS(`p.error`)),
		))
	}
	require.NoError(t, chromedp.Do(ctx, shot("console-login-locked")))
	require.Contains(t, text("p.error"), "Too many failed sign-ins for this account")
}

func jsString(s string) string {
	return `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\n", `\n`).Replace(s) + `"`
}

// startBrowser starts headless Chromium at bin (browsertest.Start) with a
// context bounded to 90 s; the browser is closed when the test ends.
func startBrowser(t *testing.T, bin string) context.Context {
	return browsertest.Start(t, bin, 90*time.Second)
}

// screenshot saves a full-page PNG named name into dir.
func screenshot(dir, name string) chromedp.Action[chromedp.Void] {
	return func(ctx context.Context, tg *chromedp.Target) (chromedp.Void, error) {
		buf, err := chromedp.FullScreenshot(100)(ctx, tg)
		if err != nil {
			return chromedp.Void{}, err
		}
		return chromedp.Void{}, os.WriteFile(filepath.Join(dir, name+".png"), buf, 0o644)
	}
}

// signIn signs user in with the test password at the console at base and
// waits for the alerts list.
func signIn(base, user string) chromedp.Action[chromedp.Void] {
	return chromedp.Steps(
		chromedp.Navigate(base+"/login"),
		chromedp.WaitVisible(chromedp.ID("username")),
		chromedp.SendKeys(chromedp.ID("username"), user),
		chromedp.SendKeys(chromedp.ID("password"), testPassword),
		chromedp.Submit(chromedp.ID("password")),
		chromedp.WaitVisible(chromedp.ID("alert-rows")),
	)
}

// fillFalsePositive signs analyst1 in at the console at base, opens alert
// a's page and fills its verdict form: false positive, allowlisted for
// duration, with reason. The caller submits it (verdict-submit).
func fillFalsePositive(base string, a store.Alert, duration, reason string) chromedp.Action[chromedp.Void] {
	return chromedp.Steps(
		signIn(base, "analyst1"),
		chromedp.Navigate(base+alertPath(a)),
		chromedp.WaitVisible(chromedp.ID("verdict-form")),
		chromedp.Click(chromedp.ID("verdict-false-positive")),
		chromedp.SetValue(chromedp.ID("verdict-duration"), duration),
		chromedp.SendKeys(chromedp.ID("verdict-reason"), reason),
	)
}

// textOf returns the text of the first element matching sel.
func textOf(t *testing.T, ctx context.Context, sel string) string {
	t.Helper()
	v, err := chromedp.Run(ctx, chromedp.Text(chromedp.CSS(sel)))
	require.NoError(t, err, "text of %s", sel)
	return v
}

// penaltyEngine is a real limiter engine on the test's Redis with one bot rule of
// 100 per hour; the function it returns checks p once and reports the limit the
// engine applied and the penalty multiplier it read.
func penaltyEngine(t *testing.T, e *testEnv) func(p events.Principal) (int64, float64) {
	t.Helper()
	rs, err := limiter.ParseRules("test.yaml", []byte("version: 1\nrules:\n  - {id: bots, tier: principal, kinds: [bot], limit: 100, period: 1h}\n"))
	require.NoError(t, err)
	eng, err := limiter.NewEngine(limiter.EngineConfig{Redis: e.rdb, Rules: limiter.NewRuleStore(rs), Budget: 2 * time.Second})
	require.NoError(t, err)
	require.NoError(t, eng.Load(context.Background()))
	return func(p events.Principal) (int64, float64) {
		t.Helper()
		r, err := eng.Check(context.Background(), limiter.Request{Principal: p, Method: "GET", Route: "/x", Cost: 1})
		require.NoError(t, err)
		require.Len(t, r.Tiers, 1)
		return r.Tiers[0].Limit, r.Penalty
	}
}

// browserSetup skips in -short mode, fails when Chromium is missing, and
// returns its path (FLOODGATE_CHROMIUM, default /usr/bin/chromium) and the
// screenshot directory (FLOODGATE_CONSOLE_SCREENSHOTS, else a temporary one).
func browserSetup(t *testing.T) (bin, shots string) {
	t.Helper()
	if testing.Short() {
		t.Skip("drives a real browser against the local stack; run `make test`")
	}
	bin = browsertest.Bin(t)
	shots = os.Getenv("FLOODGATE_CONSOLE_SCREENSHOTS")
	if shots == "" {
		shots = t.TempDir()
	}
	require.NoError(t, os.MkdirAll(shots, 0o755))
	return bin, shots
}
