package web

import (
	"context"
	"net/http"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/chromedp/chromedp"
	influxdb2 "github.com/influxdata/influxdb-client-go/v2"
	"github.com/stretchr/testify/require"

	"github.com/floodgate-dev/floodgate/pkg/config"
	"github.com/floodgate-dev/floodgate/pkg/dynamo"
	"github.com/floodgate-dev/floodgate/pkg/events"
	"github.com/floodgate-dev/floodgate/services/console/internal/adjuster"
	"github.com/floodgate-dev/floodgate/services/console/internal/blockrate"
	"github.com/floodgate-dev/floodgate/services/console/internal/quota"
	"github.com/floodgate-dev/floodgate/services/console/internal/store"
)

// TestBrowserSRE drives the SRE flows in headless Chromium against the real
// adjuster and quota binaries and InfluxDB: an SRE opens an alert's principal
// page, then switches the adjuster to dry run with a reason (the adjuster's
// settings change and both audit rows exist), and looks at the block rate.
func TestBrowserSRE(t *testing.T) {
	if testing.Short() {
		t.Skip("drives a real browser against the local stack; run `make test`")
	}
	bin := os.Getenv("FLOODGATE_CHROMIUM")
	if bin == "" {
		bin = "/usr/bin/chromium"
	}
	if st, err := os.Stat(bin); err != nil || st.IsDir() || st.Mode()&0o111 == 0 {
		t.Fatalf("chromium not found at %s (set FLOODGATE_CHROMIUM or run deploy/local/browser.sh): %v", bin, err)
	}
	shots := os.Getenv("FLOODGATE_CONSOLE_SCREENSHOTS")
	if shots == "" {
		shots = t.TempDir()
	}
	require.NoError(t, os.MkdirAll(shots, 0o755))

	env := config.NewEnv(os.Getenv)
	influx := influxdb2.NewClient(env.String("FLOODGATE_INFLUX_URL", config.DefaultInfluxURL), env.String("FLOODGATE_INFLUX_TOKEN", ""))
	t.Cleanup(influx.Close)
	bucket := env.String("FLOODGATE_INFLUX_BUCKET", config.DefaultInfluxBucket)
	qaddr := freeAddr(t)
	var adjURL, adjToken, prefix string
	e := newEnvWith(t, func(cfg *Config, p string) {
		prefix = p
		adjURL, adjToken = startAdjuster(t, p)
		c, err := adjuster.New(adjURL, adjToken, nil)
		require.NoError(t, err)
		cfg.Adjuster = c
		q, err := quota.New("http://"+qaddr, nil)
		require.NoError(t, err)
		cfg.Quota = q
		cfg.BlockRate = &blockrate.Reader{Query: influx.QueryAPI(""), Bucket: bucket}
	})
	startProcess(t, serviceBinary(t, "quota"), []string{
		"FLOODGATE_QUOTA_ADDR=" + qaddr, "FLOODGATE_KAFKA_BROKERS=" + broker(t), "FLOODGATE_QUOTA_GROUP=quota-" + e.run,
		"FLOODGATE_DYNAMODB_TABLE_PREFIX=" + prefix, "FLOODGATE_DYNAMODB_ENDPOINT=" + dynamoEndpoint(),
	})
	waitReady(t, "http://"+qaddr+"/readyz")
	now := time.Now()
	a := e.seed(t, "sre", now.Add(-time.Minute), events.PatternRapidFire, events.SeverityCritical, true)
	for d, units := range []int64{120, 340, 0, 800, 1500, 2200, 900, 4000, 3100, 600, 0, 450, 5200, 7400} {
		day := now.UTC().AddDate(0, 0, d-13).Format("2006-01-02")
		_, err := e.ddb.PutItem(context.Background(), &dynamodb.PutItemInput{TableName: aws.String(prefix + dynamo.TableQuotaLedger),
			Item: map[string]types.AttributeValue{"pk": s(a.Principal), "sk": s(day), "units": &types.AttributeValueMemberN{Value: strconv.FormatInt(units, 10)}}})
		require.NoError(t, err)
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
		chromedp.Navigate(e.srv.URL+"/login"),
		chromedp.WaitVisible(chromedp.ID("username")),
		chromedp.SendKeys(chromedp.ID("username"), "sre1"),
		chromedp.SendKeys(chromedp.ID("password"), testPassword),
		chromedp.Submit(chromedp.ID("password")),
		chromedp.WaitVisible(chromedp.ID("alert-rows")),
		chromedp.Click(chromedp.CSS(`a[href*="`+a.ID+`"]`)),
		chromedp.WaitVisible(chromedp.ID("principal-link")),
		chromedp.Click(chromedp.ID("principal-link")),
		chromedp.WaitVisible(chromedp.ID("usage-chart")),
		shot("console-principal"),
	))
	require.Contains(t, text("#live-penalty"), "In force now")
	require.Contains(t, text("#detections"), "rapid_fire")

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
	direct, err := adjuster.New(adjURL, adjToken, nil)
	require.NoError(t, err)
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
}
