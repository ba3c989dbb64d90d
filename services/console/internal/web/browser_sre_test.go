package web

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	influxdb2 "github.com/influxdata/influxdb-client-go/v2"
	"github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/require"

	"github.com/floodgate-dev/floodgate/migrations/migrationstest"
	"github.com/floodgate-dev/floodgate/pkg/config"
	"github.com/floodgate-dev/floodgate/pkg/events"
	"github.com/floodgate-dev/floodgate/pkg/redisx/redistest"
	"github.com/floodgate-dev/floodgate/pkg/stacktest"
	"github.com/floodgate-dev/floodgate/services/console/internal/adjuster"
	"github.com/floodgate-dev/floodgate/services/console/internal/blockrate"
	"github.com/floodgate-dev/floodgate/services/console/internal/consoletest"
	"github.com/floodgate-dev/floodgate/services/console/internal/quota"
	"github.com/floodgate-dev/floodgate/services/console/internal/store"
)

// TestBrowserSRE drives the SRE flows in headless Chromium against the real
// adjuster and quota binaries and InfluxDB: an SRE opens an alert's principal
// page, then switches the adjuster to dry run with a reason (the adjuster's
// settings change and both audit rows exist), and looks at the block rate.
func TestBrowserSRE(t *testing.T) {
	bin, shots := browserSetup(t)

	env := config.NewEnv(os.Getenv)
	influx := influxdb2.NewClient(env.String("FLOODGATE_INFLUX_URL", config.DefaultInfluxURL), env.String("FLOODGATE_INFLUX_TOKEN", ""))
	t.Cleanup(influx.Close)
	bucket := env.String("FLOODGATE_INFLUX_BUCKET", config.DefaultInfluxBucket)
	qaddr := consoletest.FreeAddr(t)
	var adjURL, adjToken, prefix string
	kb := consoletest.Broker(t)
	overridesKey := redistest.Unique(t, "fg:test:console:overrides")
	e := newEnvWith(t, func(cfg *Config, p string) {
		prefix = p
		adjURL, adjToken = startAdjusterOn(t, p, kb)
		cfg.ScaleSeries = &adjuster.Series{Query: influx.QueryAPI(""), Bucket: bucket}
		cfg.Adjustments = &adjuster.Adjustments{Client: &kafka.Client{Addr: kafka.TCP(kb), Timeout: 10 * time.Second}, Topic: config.DefaultAdjustmentsTopic}
		cfg.OverridesKey = overridesKey
		c, err := adjuster.New(adjURL, adjToken, nil)
		require.NoError(t, err)
		cfg.Adjuster = c
		q, err := quota.New("http://"+qaddr, "", nil)
		require.NoError(t, err)
		cfg.Quota = q
		cfg.BlockRate = &blockrate.Reader{Query: influx.QueryAPI(""), Bucket: bucket}
	})
	stacktest.Exec(t, serviceBinary(t, "quota"), []string{
		"FLOODGATE_QUOTA_ADDR=" + qaddr, "FLOODGATE_KAFKA_BROKERS=" + consoletest.Broker(t), "FLOODGATE_QUOTA_GROUP=quota-" + e.run,
		"FLOODGATE_DYNAMODB_TABLE_PREFIX=" + prefix, "FLOODGATE_DYNAMODB_ENDPOINT=" + migrationstest.DynamoEndpoint(),
	})
	consoletest.WaitReady(t, "http://"+qaddr+"/readyz")
	now := time.Now()
	a := e.seed(t, "sre", now.Add(-time.Minute), events.PatternRapidFire, events.SeverityCritical, true)
	for d, units := range []int64{120, 340, 0, 800, 1500, 2200, 900, 4000, 3100, 600, 0, 450, 5200, 7400} {
		day := now.UTC().AddDate(0, 0, d-13).Format("2006-01-02")
		e.putUsage(t, a.Principal, day, units)
	}
	gw := "console-browser-" + e.run
	wr := influx.WriteAPIBlocking("", bucket)
	for i, scope := range []string{"messages.create", "global", "login"} {
		for m := 50; m >= 0; m -= 10 {
			require.NoError(t, wr.WritePoint(context.Background(), influxdb2.NewPoint("limiter_decisions",
				map[string]string{"gateway": gw, "scope": scope, "tier": "principal"},
				map[string]any{"allowed": int64(100), "blocked": int64((i + 1) * (60 - m) / 3), "shadow": int64(0)}, now.Add(-time.Duration(m)*time.Minute))))
		}
	}

	ctx := startBrowser(t, bin)
	shot := func(name string) chromedp.Action[chromedp.Void] { return screenshot(shots, name) }
	text := func(sel string) string { t.Helper(); return textOf(t, ctx, sel) }

	// SRE: sign in → the alert → its principal page.
	require.NoError(t, chromedp.Do(ctx,
		signIn(e.srv.URL, "sre1"),
		chromedp.Click(chromedp.CSS(`a[href*="`+a.ID+`"]`)),
		chromedp.WaitVisible(chromedp.ID("principal-link")),
		chromedp.Click(chromedp.ID("principal-link")),
		chromedp.WaitVisible(chromedp.ID("usage-chart")),
		shot("console-principal"),
	))
	require.Contains(t, text("#live-penalty"), "In force now")
	require.Contains(t, text("#detections"), "rapid_fire")

	// Scale history: the real adjuster manages a scope of this run's own; an
	// operator override moves it (its loop writes the series to InfluxDB and
	// the adjustment event to the broker). The SRE finds the change and its cause.
	scope := "route:" + e.run
	direct, err := adjuster.New(adjURL, adjToken, nil)
	require.NoError(t, err)
	_, etag, err := direct.Settings(context.Background())
	require.NoError(t, err)
	rules := `{"scopes": {"global": {"min": 0.1, "max": 1}, "tier:ip": {"min": 0.1, "max": 1}, ` + jsString(scope) + `: {"min": 0.1, "max": 1}}}`
	pr, err := direct.PutRules(context.Background(), etag, "", json.RawMessage(rules), "CHG-40: manage "+scope)
	require.NoError(t, err)
	require.Eventually(t, func() bool { // the loop ticks on the change: the scope is at its max
		st, err := direct.Status(context.Background())
		return err == nil && st.Scales[scope] == 1
	}, 30*time.Second, 200*time.Millisecond)
	putOverride(t, adjURL, adjToken, pr.ETag, scope, 0.25, "INC-77: shed load from the route")
	require.Eventually(t, func() bool {
		_, body := e.client(t).loginGet("sre1", "/scales?window=1h&scope="+url.QueryEscape(scope))
		return strings.Contains(body, `id="scale-chart"`) && strings.Contains(body, "INC-77: shed load from the route") &&
			strings.Contains(body, ": scale 0.25 at the end")
	}, 45*time.Second, 500*time.Millisecond, "the adjuster's series and event reach the scales page")
	require.NoError(t, chromedp.Do(ctx,
		chromedp.Click(chromedp.CSS(`nav a[href="/scales"]`)),
		chromedp.WaitVisible(chromedp.ID("scale-history")),
		chromedp.SetValue(chromedp.ID("sh-window"), "1h"),
		chromedp.SendKeys(chromedp.ID("sh-scope"), scope),
		chromedp.Click(chromedp.ID("sh-show")),
		// the reloaded page, not the one the form was filled on: the chart holds the one scope
		chromedp.WaitVisible(chromedp.CSS(`svg#scale-chart[aria-label*=" 1 scopes"]`)),
		chromedp.WaitVisible(chromedp.ID("scale-changes")),
		shot("console-scales"),
	))
	changes := text("#scale-changes")
	require.Contains(t, changes, "1 → 0.25")
	require.Contains(t, changes, "override")
	require.Contains(t, changes, "INC-77: shed load from the route")
	require.Contains(t, changes, "SRE console", "the adjuster names the operator (the console's token)")
	require.Contains(t, changes, "override set", "and the settings change from its audit")
	label, err := chromedp.Run(ctx, chromedp.AttributeValue(chromedp.ID("scale-chart"), "aria-label"))
	require.NoError(t, err)
	require.Contains(t, label.Value, "applied limit scale per scope over time, 1 scopes")

	// Overrides: create a per-principal limit; a real limiter engine applies it.
	op := events.Principal{Kind: events.PrincipalBot, ID: e.run + "_partner"}
	require.NoError(t, chromedp.Do(ctx,
		chromedp.Click(chromedp.CSS(`nav a[href="/sre/overrides"]`)),
		chromedp.WaitVisible(chromedp.ID("override-form")),
		chromedp.SendKeys(chromedp.ID("ov-field"), "principal:"+op.Key()),
		chromedp.SetValue(chromedp.ID("ov-value"), `{"limits": {"free": 9}, "quota": 5000}`),
		chromedp.SendKeys(chromedp.ID("ov-expires"), "7d"),
		chromedp.SendKeys(chromedp.ID("ov-reason"), "CHG-51: partner launch week"),
		chromedp.Click(chromedp.CSS(`#override-form button[type=submit]`)),
		chromedp.WaitVisible(chromedp.CSS(`p.ok`)),
		shot("console-overrides"),
	))
	require.Contains(t, text("#override-list"), "principal:"+op.Key())
	require.Contains(t, text("#override-audit"), "CHG-51: partner launch week")
	eng, rt := overrideEngine(t, e, overridesKey)
	require.Equal(t, int64(9), freeLimit(t, eng, rt, op), "the limiter applies the override the SRE created")

	// Adjuster: turn dry run on with a reason.
	require.NoError(t, chromedp.Do(ctx,
		chromedp.Click(chromedp.CSS(`nav a[href="/sre/adjuster"]`)),
		chromedp.WaitVisible(chromedp.ID("mode-form")),
		chromedp.Click(chromedp.ID("mode-dry")),
		chromedp.SendKeys(chromedp.ID("mode-reason"), "CHG-12: trial new rules without enforcing"),
		chromedp.Click(chromedp.CSS(`#mode-form button[type=submit]`)),
		chromedp.WaitVisible(chromedp.CSS(`p.ok`)),
		shot("console-adjuster"),
	))
	require.Contains(t, text("#dry-run"), "on")
	require.Contains(t, text("#settings-history"), "CHG-12: trial new rules without enforcing")
	st, _, err := direct.Settings(context.Background())
	require.NoError(t, err)
	require.True(t, st.DryRun, "the adjuster is in dry run")
	require.False(t, st.Frozen)
	rows, err := e.st.AuditOf(context.Background(), store.SubjectAdjuster, 5)
	require.NoError(t, err)
	require.Len(t, rows, 1)
	require.Equal(t, "sre1", rows[0].Actor)

	// Block rate.
	require.NoError(t, chromedp.Do(ctx,
		chromedp.Navigate(e.srv.URL+"/sre/block-rate?window=1h&gateway="+gw),
		chromedp.WaitVisible(chromedp.ID("block-chart")),
		shot("console-block-rate"),
	))
	require.Contains(t, text("#block-table"), "messages.create")
	code := 0
	res, err := http.Get(e.srv.URL + "/healthz")
	if err == nil {
		code = res.StatusCode
		res.Body.Close()
	}
	require.Equal(t, http.StatusOK, code)

	// A viewer sees the overrides but no form or button, and a forged POST is refused.
	require.NoError(t, chromedp.Do(ctx,
		chromedp.Click(chromedp.CSS(`button.link`)), chromedp.WaitVisible(chromedp.ID("username")),
		chromedp.SendKeys(chromedp.ID("username"), "viewer1"),
		chromedp.SendKeys(chromedp.ID("password"), testPassword),
		chromedp.Submit(chromedp.ID("password")),
		chromedp.WaitVisible(chromedp.CSS(`nav a[href="/sre/overrides"]`)),
		chromedp.Click(chromedp.CSS(`nav a[href="/sre/overrides"]`)),
		chromedp.WaitVisible(chromedp.ID("override-list")),
	))
	n, err := chromedp.Run(ctx, chromedp.Evaluate[int](`document.querySelectorAll('#override-form, form[action="/sre/overrides/delete"], a.edit-override').length`))
	require.NoError(t, err)
	require.Zero(t, n, "no override form or button for a viewer")
	status, err := chromedp.Run(ctx, chromedp.Evaluate[int](`(async () => {
		const csrf = document.querySelector('input[name=csrf]').value;
		const body = new URLSearchParams({csrf, field: `+jsString("principal:"+op.Key())+`, value: '{"limits":{"free":1000}}', reason: "try"});
		const res = await fetch("/sre/overrides", {method: "POST", body, redirect: "manual"});
		return res.status;
	})()`, chromedp.EvalAwaitPromise))
	require.NoError(t, err)
	require.Equal(t, 403, status)
	require.Equal(t, int64(9), freeLimit(t, eng, rt, op), "the viewer's forged POST changed nothing")
}

// putOverride pins scope to scale for 30 minutes through the adjuster's admin API.
func putOverride(t *testing.T, base, token, etag, scope string, scale float64, reason string) {
	t.Helper()
	body, err := json.Marshal(map[string]any{"scope": scope, "scale": scale, "ttl": "30m", "reason": reason})
	require.NoError(t, err)
	req, err := http.NewRequest(http.MethodPut, base+"/v1/overrides", bytes.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("If-Match", etag)
	res, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer res.Body.Close()
	msg, _ := io.ReadAll(res.Body)
	require.Equal(t, http.StatusOK, res.StatusCode, string(msg))
}

// loginGet signs user in and reads path.
func (b *browser) loginGet(user, path string) (int, string) {
	b.login(user)
	return b.get(path)
}
