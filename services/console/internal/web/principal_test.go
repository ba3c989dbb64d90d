package web

import (
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/floodgate-dev/floodgate/migrations/migrationstest"
	"github.com/floodgate-dev/floodgate/pkg/events"
	"github.com/floodgate-dev/floodgate/pkg/stacktest"
	"github.com/floodgate-dev/floodgate/services/console/internal/consoletest"
	"github.com/floodgate-dev/floodgate/services/console/internal/quota"
)

// TestPrincipalPage runs the real quota service (its binary, on an in-process
// broker and this test's DynamoDB tables) and reads the principal page.
func TestPrincipalPage(t *testing.T) {
	qaddr := consoletest.FreeAddr(t)
	var prefix string
	e := newEnvWith(t, func(cfg *Config, p string) {
		prefix = p
		qc, err := quota.New("http://"+qaddr, "", nil)
		require.NoError(t, err)
		cfg.Quota = qc
	})
	b := consoletest.Broker(t)
	stacktest.Exec(t, serviceBinary(t, "quota"), []string{
		"FLOODGATE_QUOTA_ADDR=" + qaddr, "FLOODGATE_KAFKA_BROKERS=" + b, "FLOODGATE_QUOTA_GROUP=console-test-" + e.run,
		"FLOODGATE_DYNAMODB_TABLE_PREFIX=" + prefix, "FLOODGATE_DYNAMODB_ENDPOINT=" + migrationstest.DynamoEndpoint(),
	})
	consoletest.WaitReady(t, "http://"+qaddr+"/healthz")

	now := time.Now().UTC()
	a := e.seed(t, "pp", now.Add(-time.Minute), events.PatternRapidFire, events.SeverityHigh, true)
	kind, id := a.PrincipalParts()
	// The quota ledger as the quota service writes it: pk principal, sk day, units.
	ledger := map[string]int64{now.Format("2006-01-02"): 4321, now.AddDate(0, 0, -3).Format("2006-01-02"): 777}
	for day, units := range ledger {
		e.putUsage(t, a.Principal, day, units)
	}
	c := e.signedIn(t, "viewer1")

	t.Run("alert detail links the principal page", func(t *testing.T) {
		code, body := c.get(alertPath(a))
		require.Equal(t, http.StatusOK, code)
		require.Contains(t, body, `href="/principals/`+kind+`/`+id+`"`)
	})
	t.Run("penalty, detections, usage and timeline", func(t *testing.T) {
		code, body := c.get("/principals/" + kind + "/" + id)
		require.Equal(t, http.StatusOK, code, body)
		require.Contains(t, body, "In force now: limits ×0.1")
		require.Contains(t, body, a.ID)
		require.Contains(t, body, `id="detections"`)
		require.Contains(t, body, "Today 4321 units, 5098 over 14 days.")
		require.Equal(t, 14, strings.Count(body, `class="bar-usage"`), "one bar per day")
		require.Equal(t, 1, strings.Count(body, `class="bar-detected"`), "today's detection is marked")
		require.Regexp(t, regexp.MustCompile(`<td>`+now.AddDate(0, 0, -3).Format("2006-01-02")+`</td><td class="num">777</td>`), body)
		require.NotContains(t, body, `id="usage-error"`)
	})
	t.Run("a principal without detections", func(t *testing.T) {
		code, body := c.get("/principals/bot/" + e.run + "_nobody")
		require.Equal(t, http.StatusOK, code)
		require.Contains(t, body, "No penalty in force")
		require.Contains(t, body, "No detections recorded")
		require.Contains(t, body, "Today 0 units, 0 over 14 days.")
	})
	t.Run("bad principal", func(t *testing.T) {
		for _, path := range []string{"/principals/robot/x", "/principals/bot/" + strings.Repeat("x", 300)} {
			code, _ := c.get(path)
			require.Equal(t, http.StatusNotFound, code, path)
		}
	})
}

// TestPrincipalPageQuotaDown: the quota service unreachable is an error state
// on the page, the rest still renders.
func TestPrincipalPageQuotaDown(t *testing.T) {
	dead := consoletest.FreeAddr(t) // nothing listens here
	e := newEnvWith(t, func(cfg *Config, _ string) {
		qc, err := quota.New("http://"+dead, "", &http.Client{Timeout: 2 * time.Second})
		require.NoError(t, err)
		cfg.Quota = qc
	})
	a := e.seed(t, "down", time.Now().Add(-time.Minute), events.PatternRapidFire, events.SeverityHigh, true)
	kind, id := a.PrincipalParts()
	c := e.signedIn(t, "viewer1")
	code, body := c.get("/principals/" + kind + "/" + id)
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, body, `id="usage-error"`)
	require.Contains(t, body, "Quota usage is unavailable (quota service)")
	require.Contains(t, body, "In force now")
	require.Contains(t, body, a.ID)
	require.NotContains(t, body, `id="usage-chart"`)
}
