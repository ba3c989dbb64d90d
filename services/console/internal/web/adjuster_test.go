package web

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"html"
	"net/http"
	"net/url"
	"regexp"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/floodgate-dev/floodgate/migrations/migrationstest"
	"github.com/floodgate-dev/floodgate/pkg/redisx/redistest"
	"github.com/floodgate-dev/floodgate/pkg/stacktest"
	"github.com/floodgate-dev/floodgate/services/console/internal/adjuster"
	"github.com/floodgate-dev/floodgate/services/console/internal/consoletest"
	"github.com/floodgate-dev/floodgate/services/console/internal/store"
)

// startAdjuster runs the real adjuster binary on this test's tables, its own
// scales key and an in-process broker, and returns its URL and an sre token.
func startAdjuster(t *testing.T, prefix string) (string, string) {
	t.Helper()
	return startAdjusterOn(t, prefix, consoletest.Broker(t))
}

// startAdjusterOn is startAdjuster on the broker at addr (whose
// floodgate.adjustments.v1 then carries its adjustment events).
func startAdjusterOn(t *testing.T, prefix, brokerAddr string) (string, string) {
	t.Helper()
	a := startAdjusterProc(t, prefix, brokerAddr)
	return a.URL, a.Token
}

// adjusterProc is a running adjuster binary: its admin URL, an sre token,
// and the Redis keys of its scales and its shed level (the test's own).
type adjusterProc struct {
	URL, Token, ScalesKey, ShedKey string
}

// startAdjusterProc runs the real adjuster binary on this test's tables, its
// own scales and shed keys and the broker at brokerAddr, with env added to
// its environment.
func startAdjusterProc(t *testing.T, prefix, brokerAddr string, env ...string) adjusterProc {
	t.Helper()
	b := make([]byte, 32)
	_, err := rand.Read(b)
	require.NoError(t, err)
	token := "fga_" + base64.RawURLEncoding.EncodeToString(b)
	sum := sha256.Sum256([]byte(token))
	addr := consoletest.FreeAddr(t)
	key := redistest.Unique(t, "fg:test:console:scales")
	rdb := redistest.Client(t)
	t.Cleanup(func() { _ = rdb.Del(context.Background(), key, key+":shed").Err() })
	stacktest.Exec(t, serviceBinary(t, "adjuster"), append([]string{
		"FLOODGATE_ADJUSTER_ADDR=" + addr, "FLOODGATE_ADJUSTER_TOKENS=console:sre:" + hex.EncodeToString(sum[:]),
		"FLOODGATE_ADJUSTER_SCALES_KEY=" + key, "FLOODGATE_ADJUSTER_SHED_KEY=" + key + ":shed", "FLOODGATE_KAFKA_BROKERS=" + brokerAddr,
		"FLOODGATE_DYNAMODB_ENDPOINT=" + migrationstest.DynamoEndpoint(), "FLOODGATE_DYNAMODB_TABLE_PREFIX=" + prefix,
	}, env...))
	consoletest.WaitReady(t, "http://"+addr+"/healthz")
	return adjusterProc{URL: "http://" + addr, Token: token, ScalesKey: key, ShedKey: key + ":shed"}
}

var etagRE = regexp.MustCompile(`name="etag" value="([^"]+)"`)

func TestAdjusterPage(t *testing.T) {
	var adjURL, adjToken string
	e := newEnvWith(t, func(cfg *Config, prefix string) {
		adjURL, adjToken = startAdjuster(t, prefix)
		c, err := adjuster.New(adjURL, adjToken, nil)
		require.NoError(t, err)
		cfg.Adjuster = c
	})
	direct, err := adjuster.New(adjURL, adjToken, nil)
	require.NoError(t, err)
	ctx := context.Background()
	sre := e.signedIn(t, "sre1")

	pageETag := func(t *testing.T) (string, string) {
		code, body := sre.get("/sre/adjuster")
		require.Equal(t, http.StatusOK, code, body)
		m := etagRE.FindStringSubmatch(body)
		require.NotNil(t, m, "no ETag in the forms")
		return html.UnescapeString(m[1]), csrfRE.FindStringSubmatch(body)[1]
	}

	t.Run("viewer and analyst read only", func(t *testing.T) {
		e.readOnlyBelowSRE(t, "/sre/adjuster", `id="adjuster-mode"`, []string{`id="mode-form"`},
			formPost{"/sre/adjuster/mode", url.Values{"etag": {`"0"`}, "dry_run": {"on"}, "reason": {"x"}}})
		s, _, err := direct.Settings(ctx)
		require.NoError(t, err)
		require.False(t, s.DryRun)
	})
	t.Run("reason required", func(t *testing.T) {
		etag, csrf := pageETag(t)
		res, body := sre.post("/sre/adjuster/mode", url.Values{"csrf": {csrf}, "etag": {etag}, "dry_run": {"on"}, "reason": {"  "}})
		require.Equal(t, http.StatusUnprocessableEntity, res.StatusCode)
		require.Contains(t, body, "a reason is required")
	})
	t.Run("forged CSRF", func(t *testing.T) {
		etag, _ := pageETag(t)
		res, _ := sre.post("/sre/adjuster/mode", url.Values{"csrf": {"forged"}, "etag": {etag}, "dry_run": {"on"}, "reason": {"x"}})
		require.Equal(t, http.StatusForbidden, res.StatusCode)
	})
	t.Run("dry run and kill switch", func(t *testing.T) {
		etag, csrf := pageETag(t)
		res, body := sre.post("/sre/adjuster/mode", url.Values{"csrf": {csrf}, "etag": {etag}, "dry_run": {"on"}, "frozen": {"on"}, "reason": {"INC-7: freeze during failover"}})
		require.Equal(t, http.StatusSeeOther, res.StatusCode, body)
		s, _, err := direct.Settings(ctx)
		require.NoError(t, err)
		require.True(t, s.DryRun)
		require.True(t, s.Frozen)
		recs, err := direct.Audit(ctx, 5)
		require.NoError(t, err)
		require.Equal(t, "console", recs[0].Actor, "the adjuster audits the console's token")
		require.Equal(t, "INC-7: freeze during failover (console user sre1)", recs[0].Reason)
		rows, err := e.st.AuditOf(ctx, store.SubjectAdjuster, 5)
		require.NoError(t, err)
		require.Len(t, rows, 1)
		require.Equal(t, "sre1", rows[0].Actor)
		require.Equal(t, store.ActionAdjusterMode, rows[0].Action)
		require.Equal(t, recs[0].ID, rows[0].AbuseID, "the console's row names the adjuster's audit record")
		require.JSONEq(t, `{"version":0,"dry_run":false,"frozen":false}`, rows[0].Before)
		require.JSONEq(t, `{"version":1,"dry_run":true,"frozen":true}`, rows[0].After)
		code, page := sre.get("/sre/adjuster")
		require.Equal(t, http.StatusOK, code)
		require.Contains(t, page, "INC-7: freeze during failover")
		require.Regexp(t, `id="dry-run">on`, page)
		require.Regexp(t, `id="frozen">on`, page)
	})
	t.Run("stale ETag is refused, nothing changes", func(t *testing.T) {
		_, csrf := pageETag(t)
		res, body := sre.post("/sre/adjuster/mode", url.Values{"csrf": {csrf}, "etag": {`"0"`}, "reason": {"late"}})
		require.Equal(t, http.StatusConflict, res.StatusCode)
		require.Contains(t, body, "The settings changed since this page was loaded")
		s, _, err := direct.Settings(ctx)
		require.NoError(t, err)
		require.True(t, s.DryRun)
		rows, err := e.st.AuditOf(ctx, store.SubjectAdjuster, 5)
		require.NoError(t, err)
		require.Len(t, rows, 1)
	})
	t.Run("threshold edit", func(t *testing.T) {
		etag, csrf := pageETag(t)
		res, body := sre.post("/sre/adjuster/rules", url.Values{"csrf": {csrf}, "etag": {etag},
			"rules": {`{"cpu_high":{"above":0.93,"clear_below":0.88}}`}, "reason": {"INC-42: runs hot by design"}})
		require.Equal(t, http.StatusSeeOther, res.StatusCode, body)
		s, _, err := direct.Settings(ctx)
		require.NoError(t, err)
		require.Equal(t, int64(2), s.Version)
		var rules struct {
			CPUHigh struct {
				Above, ClearBelow, Factor float64
			} `json:"cpu_high"`
		}
		require.NoError(t, json.Unmarshal(s.Rules, &rules))
		require.Equal(t, 0.93, rules.CPUHigh.Above)
		require.Equal(t, 0.7, rules.CPUHigh.Factor, "fields not sent are kept")
		rows, err := e.st.AuditOf(ctx, store.SubjectAdjuster, 5)
		require.NoError(t, err)
		require.Len(t, rows, 2)
		require.Equal(t, store.ActionAdjusterRules, rows[0].Action)
	})
	t.Run("invalid rules are refused by the adjuster, the edit is kept", func(t *testing.T) {
		etag, csrf := pageETag(t)
		res, body := sre.post("/sre/adjuster/rules", url.Values{"csrf": {csrf}, "etag": {etag},
			"rules": {`{"cpu_high":{"above":0.5,"clear_below":0.9}}`}, "reason": {"try"}})
		require.Equal(t, http.StatusUnprocessableEntity, res.StatusCode, body)
		require.Contains(t, body, "The adjuster refused the change")
		require.Contains(t, body, "clear_below&#34;:0.9")
		res, body = sre.post("/sre/adjuster/rules", url.Values{"csrf": {csrf}, "etag": {etag}, "rules": {`not json`}, "reason": {"try"}})
		require.Equal(t, http.StatusUnprocessableEntity, res.StatusCode, body)
		s, _, err := direct.Settings(ctx)
		require.NoError(t, err)
		require.Equal(t, int64(2), s.Version)
	})
	t.Run("adjuster down is an error state", func(t *testing.T) {
		dead, err := adjuster.New("http://"+consoletest.FreeAddr(t), "x", &http.Client{Timeout: time.Second})
		require.NoError(t, err)
		e2 := newEnvWith(t, func(cfg *Config, _ string) { cfg.Adjuster = dead })
		c := e2.signedIn(t, "sre1")
		code, body := c.get("/sre/adjuster")
		require.Equal(t, http.StatusServiceUnavailable, code)
		require.Contains(t, body, "Adjuster settings unavailable")
		require.NotContains(t, body, `id="mode-form"`)
	})
}
