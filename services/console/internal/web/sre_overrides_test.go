package web

import (
	"context"
	"encoding/json"
	"html"
	"log/slog"
	"net/http"
	"net/url"
	"regexp"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/floodgate-dev/floodgate/pkg/events"
	"github.com/floodgate-dev/floodgate/pkg/limiter"
	"github.com/floodgate-dev/floodgate/pkg/redisx/redistest"
	"github.com/floodgate-dev/floodgate/services/console/internal/store"
)

const overrideRules = `
version: 1
rules:
  - {id: free, tier: principal, kinds: [bot], limit: 2, period: 1h}
`

// overrideEngine is a real limiter engine on the real Redis whose runtime
// reads overrides from key.
func overrideEngine(t *testing.T, e *testEnv, key string) (*limiter.Engine, *limiter.Runtime) {
	t.Helper()
	rs, err := limiter.ParseRules("test.yaml", []byte(overrideRules))
	require.NoError(t, err)
	rt := limiter.NewRuntime(e.rdb, slog.New(slog.DiscardHandler), prometheus.NewRegistry())
	rt.ScalesKey, rt.OverridesKey = redistest.Unique(t, "fg:test:console:scales"), key
	eng, err := limiter.NewEngine(limiter.EngineConfig{Redis: e.rdb, Rules: limiter.NewRuleStore(rs), Runtime: rt, Budget: 2 * time.Second})
	require.NoError(t, err)
	require.NoError(t, eng.Load(context.Background()))
	return eng, rt
}

// freeLimit is the limit the engine applies to p's "free" rule now.
func freeLimit(t *testing.T, eng *limiter.Engine, rt *limiter.Runtime, p events.Principal) int64 {
	t.Helper()
	require.NoError(t, rt.Refresh(context.Background()))
	r, err := eng.Check(context.Background(), limiter.Request{Principal: p, Method: "GET", Route: "/x", Cost: 1})
	require.NoError(t, err)
	require.NotEmpty(t, r.Tiers)
	return r.Tiers[0].Limit
}

var tagRE = regexp.MustCompile(`name="tag" value="([^"]*)"`)

// TestOverrides: an SRE creates, edits and deletes limiter overrides with
// optimistic concurrency, each audited with before/after, and a real limiter
// engine applies what the console wrote; viewers and analysts cannot change them.
func TestOverrides(t *testing.T) {
	key := redistest.Unique(t, "fg:test:console:overrides")
	e := newEnvWith(t, func(cfg *Config, _ string) { cfg.OverridesKey = key })
	ctx := context.Background()
	t.Cleanup(func() { e.rdb.Del(context.Background(), key, store.MetaKey(key)) })
	eng, rt := overrideEngine(t, e, key)
	p := events.Principal{Kind: events.PrincipalBot, ID: e.run + "_ov"}
	field := "principal:" + p.Key()
	require.Equal(t, int64(2), freeLimit(t, eng, rt, p), "the rules file's limit")

	sre := e.signedIn(t, "sre1")
	save := func(t *testing.T, form url.Values) (*http.Response, string) {
		t.Helper()
		form.Set("csrf", sre.csrf("/sre/overrides"))
		return sre.post("/sre/overrides", form)
	}
	auditRows := func(t *testing.T) []store.AuditEntry {
		t.Helper()
		rows, err := e.st.AuditOf(ctx, store.SubjectOverrides, 20)
		require.NoError(t, err)
		return rows
	}

	t.Run("viewer and analyst read only", func(t *testing.T) {
		e.readOnlyBelowSRE(t, "/sre/overrides", `id="overrides"`, []string{`id="override-form"`, `/sre/overrides/delete`},
			formPost{"/sre/overrides", url.Values{"field": {field}, "value": {`{"limits":{"free":9}}`}, "reason": {"x"}}},
			formPost{"/sre/overrides/delete", url.Values{"field": {field}, "tag": {"x"}, "reason": {"x"}}})
		n, err := e.rdb.Exists(ctx, key).Result()
		require.NoError(t, err)
		require.Zero(t, n)
	})
	t.Run("refused: no reason, not JSON, the limiter's parser, bad field", func(t *testing.T) {
		for _, tc := range []struct{ name, field, value, reason, want string }{
			{"no reason", field, `{"limits":{"free":5}}`, "", "a reason is required"},
			{"not JSON", field, `{"limits":`, "r", "not JSON"},
			{"limit out of range", field, `{"limits":{"free":0}}`, "r", "limits.free: 0 must be in 1..1000000000"},
			{"unknown member", field, `{"limit":{"free":5}}`, "r", "unknown field"},
			{"bad field", "user:" + p.Key(), `{"limits":{"free":5}}`, "r", "must start with principal: or plan:"},
		} {
			t.Run(tc.name, func(t *testing.T) {
				res, body := save(t, url.Values{"field": {tc.field}, "value": {tc.value}, "reason": {tc.reason}})
				require.Equal(t, http.StatusUnprocessableEntity, res.StatusCode, body)
				require.Contains(t, html.UnescapeString(body), tc.want)
			})
		}
		n, err := e.rdb.Exists(ctx, key).Result()
		require.NoError(t, err)
		require.Zero(t, n, "nothing written")
		require.Empty(t, auditRows(t))
	})
	var tag string
	t.Run("create: applied by the limiter, audited", func(t *testing.T) {
		res, body := save(t, url.Values{"field": {field}, "value": {"{\n  \"limits\": {\"free\": 5}\n}"}, "reason": {"INC-31: partner bot launch"}})
		require.Equal(t, http.StatusSeeOther, res.StatusCode, body)
		v, err := e.rdb.HGet(ctx, key, field).Result()
		require.NoError(t, err)
		require.Equal(t, `{"limits":{"free":5}}`, v, "stored compact, as the limiter reads it")
		require.Equal(t, int64(5), freeLimit(t, eng, rt, p), "the real limiter applies the console's override")
		rows := auditRows(t)
		require.Len(t, rows, 1)
		require.Equal(t, store.ActionOverrideSet, rows[0].Action)
		require.Equal(t, "sre1", rows[0].Actor)
		require.Equal(t, field, rows[0].AbuseID)
		require.Equal(t, "INC-31: partner bot launch", rows[0].Reason)
		require.JSONEq(t, `{}`, rows[0].Before)
		require.JSONEq(t, `{"value":{"limits":{"free":5}}}`, rows[0].After)
		code, page := sre.get("/sre/overrides?done=saved")
		require.Equal(t, http.StatusOK, code)
		require.Contains(t, page, "Override saved.")
		require.Contains(t, page, "sre1 at ")
		_, page = sre.get("/sre/overrides?edit=" + url.QueryEscape(field))
		tag = tagRE.FindStringSubmatch(page)[1]
		require.NotEmpty(t, tag)
	})
	t.Run("create over an existing one is a conflict", func(t *testing.T) {
		res, body := save(t, url.Values{"field": {field}, "value": {`{"limits":{"free":50}}`}, "reason": {"r"}})
		require.Equal(t, http.StatusConflict, res.StatusCode, body)
		require.Equal(t, int64(5), freeLimit(t, eng, rt, p))
	})
	t.Run("edit with the tag; a stale tag changes nothing", func(t *testing.T) {
		res, body := save(t, url.Values{"field": {field}, "tag": {tag}, "value": {`{"limits":{"free":7}}`}, "expires": {"6h"}, "reason": {"INC-31: more headroom"}})
		require.Equal(t, http.StatusSeeOther, res.StatusCode, body)
		require.Equal(t, int64(7), freeLimit(t, eng, rt, p))
		res, body = save(t, url.Values{"field": {field}, "tag": {tag}, "value": {`{"limits":{"free":3}}`}, "reason": {"second SRE, stale page"}})
		require.Equal(t, http.StatusConflict, res.StatusCode, body)
		require.Contains(t, body, "Someone changed")
		require.Equal(t, int64(7), freeLimit(t, eng, rt, p), "the stale edit did not overwrite")
		rows := auditRows(t)
		require.Len(t, rows, 2)
		require.JSONEq(t, `{"value":{"limits":{"free":5}}}`, rows[0].Before)
		var after struct {
			Value     json.RawMessage `json:"value"`
			ExpiresAt time.Time       `json:"expires_at"`
		}
		require.NoError(t, json.Unmarshal([]byte(rows[0].After), &after))
		require.JSONEq(t, `{"limits":{"free":7}}`, string(after.Value))
		require.WithinDuration(t, time.Now().Add(6*time.Hour), after.ExpiresAt, time.Minute)
	})
	t.Run("expiry: the sweeper removes it, audited", func(t *testing.T) {
		later := store.New(e.ddb, e.rdb, e.prefix, func() time.Time { return time.Now().Add(7 * time.Hour) })
		n, err := later.ExpireOverrides(ctx, key, store.Actor{Name: "console", Role: "system", CorrelationID: "override-expiry"})
		require.NoError(t, err)
		require.Equal(t, 1, n)
		require.Equal(t, int64(2), freeLimit(t, eng, rt, p), "expired: back to the rules file")
		rows := auditRows(t)
		require.Equal(t, store.ActionOverrideExpire, rows[0].Action)
		require.Equal(t, "console", rows[0].Actor)
		require.Contains(t, rows[0].Reason, "set by sre1: INC-31: more headroom")
		require.JSONEq(t, `{}`, rows[0].After)
		notes, err := e.rdb.HLen(ctx, store.MetaKey(key)).Result()
		require.NoError(t, err)
		require.Zero(t, notes)
		n, err = later.ExpireOverrides(ctx, key, store.Actor{Name: "console", Role: "system"})
		require.NoError(t, err)
		require.Zero(t, n, "nothing left to expire")
	})
	t.Run("delete with the tag, audited; twice is 404", func(t *testing.T) {
		res, body := save(t, url.Values{"field": {"plan:pro"}, "value": {`{"limits":{"free":40}}`}, "reason": {"pro plan trial"}})
		require.Equal(t, http.StatusSeeOther, res.StatusCode, body)
		_, page := sre.get("/sre/overrides?edit=plan:pro")
		ptag := tagRE.FindStringSubmatch(page)[1]
		csrf := sre.csrf("/sre/overrides")
		res, body = sre.post("/sre/overrides/delete", url.Values{"csrf": {csrf}, "field": {"plan:pro"}, "tag": {ptag}})
		require.Equal(t, http.StatusUnprocessableEntity, res.StatusCode, body)
		res, body = sre.post("/sre/overrides/delete", url.Values{"csrf": {csrf}, "field": {"plan:pro"}, "tag": {ptag}, "reason": {"trial over"}})
		require.Equal(t, http.StatusSeeOther, res.StatusCode, body)
		n, err := e.rdb.HExists(ctx, key, "plan:pro").Result()
		require.NoError(t, err)
		require.False(t, n)
		var del *store.AuditEntry // (the expiry's row sorts first: it was written 7 h "later")
		for i, r := range auditRows(t) {
			if r.Action == store.ActionOverrideDelete {
				del = &auditRows(t)[i]
			}
		}
		require.NotNil(t, del, "an override.delete row")
		require.Equal(t, "trial over", del.Reason)
		require.JSONEq(t, `{"value":{"limits":{"free":40}}}`, del.Before)
		res, _ = sre.post("/sre/overrides/delete", url.Values{"csrf": {csrf}, "field": {"plan:pro"}, "tag": {ptag}, "reason": {"again"}})
		require.Equal(t, http.StatusNotFound, res.StatusCode)
	})
	t.Run("the server's sweeper removes an expired override", func(t *testing.T) {
		srv, err := New(Config{Directory: nil, Store: e.st, Log: slog.New(slog.DiscardHandler), Registry: prometheus.NewRegistry(), OverridesKey: key})
		require.NoError(t, err)
		who := store.Actor{Name: "sre1", Role: "sre", Reason: "short trial"}
		require.NoError(t, e.st.SetOverride(ctx, key, "plan:trial", `{"limits":{"free":3}}`, "", time.Now().Add(1500*time.Millisecond), who))
		sctx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- srv.ExpireOverrides(sctx, 100*time.Millisecond) }()
		require.Eventually(t, func() bool {
			ok, err := e.rdb.HExists(ctx, key, "plan:trial").Result()
			return err == nil && !ok
		}, 20*time.Second, 100*time.Millisecond, "removed after its expiry")
		cancel()
		require.NoError(t, <-done)
	})
	t.Run("no unaudited change: a failed audit row undoes the write", func(t *testing.T) {
		broken := store.New(e.ddb, e.rdb, "missing_"+e.prefix, time.Now) // no audit table under this prefix
		who := store.Actor{Name: "sre1", Role: "sre", Reason: "audit down"}
		err := broken.SetOverride(ctx, key, "plan:undo", `{"limits":{"free":3}}`, "", time.Time{}, who)
		require.ErrorIs(t, err, store.ErrAuditFailed)
		ok, err := e.rdb.HExists(ctx, key, "plan:undo").Result()
		require.NoError(t, err)
		require.False(t, ok, "the override was taken back")
		require.NoError(t, e.st.SetOverride(ctx, key, "plan:undo", `{"limits":{"free":3}}`, "", time.Time{}, who))
		o, found, err := e.st.GetOverride(ctx, key, "plan:undo")
		require.NoError(t, err)
		require.True(t, found)
		require.ErrorIs(t, broken.DeleteOverride(ctx, key, "plan:undo", o.Tag, who), store.ErrAuditFailed)
		v, err := e.rdb.HGet(ctx, key, "plan:undo").Result()
		require.NoError(t, err)
		require.Equal(t, `{"limits":{"free":3}}`, v, "the deleted override was put back")
	})
	t.Run("forged CSRF", func(t *testing.T) {
		res, _ := sre.post("/sre/overrides", url.Values{"csrf": {"forged"}, "field": {field}, "value": {`{"limits":{"free":9}}`}, "reason": {"x"}})
		require.Equal(t, http.StatusForbidden, res.StatusCode)
	})
}
