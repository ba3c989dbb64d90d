package web

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/floodgate-dev/floodgate/pkg/events"
	"github.com/floodgate-dev/floodgate/pkg/redisx"
	"github.com/floodgate-dev/floodgate/services/console/internal/store"
)

func TestAuth(t *testing.T) {
	e := newEnv(t)
	e.seed(t, "auth", time.Now().Add(-time.Minute), events.PatternRapidFire, events.SeverityHigh, false)

	t.Run("anonymous is sent to sign in", func(t *testing.T) {
		b := e.client(t)
		res, err := b.c.Get(e.srv.URL + "/alerts?pattern=rapid_fire")
		require.NoError(t, err)
		res.Body.Close()
		require.Equal(t, http.StatusSeeOther, res.StatusCode)
		require.Equal(t, "/login?next=%2Falerts%3Fpattern%3Drapid_fire", res.Header.Get("Location"))
	})
	t.Run("wrong password", func(t *testing.T) {
		b := e.client(t)
		tok := b.csrf("/login")
		res, body := b.post("/login", url.Values{"csrf": {tok}, "username": {"analyst1"}, "password": {"nope nope nope"}})
		require.Equal(t, http.StatusUnauthorized, res.StatusCode)
		require.Contains(t, body, "Wrong user name or password")
		require.Empty(t, cookieNamed(res, SessionCookie))
	})
	t.Run("unknown user", func(t *testing.T) {
		b := e.client(t)
		tok := b.csrf("/login")
		res, _ := b.post("/login", url.Values{"csrf": {tok}, "username": {"mallory"}, "password": {testPassword}})
		require.Equal(t, http.StatusUnauthorized, res.StatusCode)
	})
	t.Run("sign-in without the login CSRF cookie", func(t *testing.T) {
		b := e.client(t)
		res, _ := b.post("/login", url.Values{"csrf": {"forged"}, "username": {"analyst1"}, "password": {testPassword}})
		require.Equal(t, http.StatusForbidden, res.StatusCode)
	})
	t.Run("sign-in sets a hardened session cookie and sign-out ends it", func(t *testing.T) {
		b := e.client(t)
		tok := b.csrf("/login")
		res, _ := b.post("/login", url.Values{"csrf": {tok}, "username": {"analyst1"}, "password": {testPassword}, "next": {"//evil.example/"}})
		require.Equal(t, http.StatusSeeOther, res.StatusCode)
		require.Equal(t, "/alerts", res.Header.Get("Location"), "an off-site next is ignored")
		c := cookieNamed(res, SessionCookie)
		require.NotNil(t, c)
		require.True(t, c.HttpOnly)
		require.Equal(t, http.SameSiteLaxMode, c.SameSite)
		require.Positive(t, c.MaxAge)
		code, body := b.get("/alerts")
		require.Equal(t, http.StatusOK, code)
		require.Contains(t, body, "analyst1")

		out, _ := b.post("/logout", url.Values{"csrf": {b.csrf("/alerts")}})
		require.Equal(t, http.StatusSeeOther, out.StatusCode)
		// The old cookie no longer works even if a client kept it.
		b2 := e.client(t)
		u, _ := url.Parse(e.srv.URL)
		b2.c.Jar.SetCookies(u, []*http.Cookie{{Name: SessionCookie, Value: c.Value}})
		code, _ = b2.get("/alerts")
		require.Equal(t, http.StatusSeeOther, code)
	})
	t.Run("API tokens", func(t *testing.T) {
		for _, tc := range []struct {
			name  string
			token string
			want  int
		}{
			{"viewer token reads", e.tokens["viewer"], http.StatusOK},
			{"unknown token", "fgc_not-a-token", http.StatusUnauthorized},
		} {
			t.Run(tc.name, func(t *testing.T) {
				req, _ := http.NewRequest(http.MethodGet, e.srv.URL+"/api/v1/alerts", nil)
				req.Header.Set("Authorization", "Bearer "+tc.token)
				res, err := http.DefaultClient.Do(req)
				require.NoError(t, err)
				body, _ := io.ReadAll(res.Body)
				res.Body.Close()
				require.Equal(t, tc.want, res.StatusCode, string(body))
				if tc.want == http.StatusOK {
					var out struct {
						Alerts []struct{ ID string } `json:"alerts"`
					}
					require.NoError(t, json.Unmarshal(body, &out))
					require.Len(t, out.Alerts, 1)
				}
			})
		}
	})
}

func cookieNamed(res *http.Response, name string) *http.Cookie {
	for _, c := range res.Cookies() {
		if c.Name == name && c.Value != "" {
			return c
		}
	}
	return nil
}

func TestCSRFAndRoles(t *testing.T) {
	e := newEnv(t)
	a := e.seed(t, "csrf", time.Now().Add(-time.Minute), events.PatternRapidFire, events.SeverityCritical, true)

	analyst := e.signedIn(t, "analyst1")
	viewer := e.signedIn(t, "viewer1")
	viewerCSRF := viewer.csrf("/alerts")

	actions := []struct {
		path string
		kv   []string
	}{
		{"/alert/lift", []string{"reason", "test"}},
		{"/alert/extend", []string{"reason", "test", "duration", "1h"}},
		{"/alert/allowlist", []string{"reason", "test", "duration", "7d", "comment", "partner"}},
		{"/alert/verdict", []string{"reason", "test", "verdict", "false_positive", "duration", "1d"}},
	}
	for _, act := range actions {
		t.Run("analyst without CSRF token "+act.path, func(t *testing.T) {
			form := actionForm("", a, act.kv...)
			form.Del("csrf")
			res, _ := analyst.post(act.path, form)
			require.Equal(t, http.StatusForbidden, res.StatusCode)
		})
		t.Run("analyst with a forged CSRF token "+act.path, func(t *testing.T) {
			res, _ := analyst.post(act.path, actionForm("forged", a, act.kv...))
			require.Equal(t, http.StatusForbidden, res.StatusCode)
		})
		t.Run("viewer "+act.path, func(t *testing.T) {
			res, body := viewer.post(act.path, actionForm(viewerCSRF, a, act.kv...))
			require.Equal(t, http.StatusForbidden, res.StatusCode)
			require.Contains(t, body, "needs the analyst role")
		})
		t.Run("viewer token "+act.path, func(t *testing.T) {
			res, _ := e.apiPost(t, "viewer", act.path, actionForm("", a, act.kv...))
			require.Equal(t, http.StatusForbidden, res.StatusCode)
		})
	}
	t.Run("viewer is offered no action", func(t *testing.T) {
		code, body := viewer.get(alertPath(a))
		require.Equal(t, http.StatusOK, code)
		require.Contains(t, body, "read-only access")
		require.NotContains(t, body, `action="/alert/`)
	})
	t.Run("nothing changed", func(t *testing.T) {
		require.True(t, e.penaltyExists(t, a))
		log, err := e.st.AuditLog(context.Background(), a.Principal, 10)
		require.NoError(t, err)
		require.Empty(t, log)
		_, allowed, err := e.st.GetAllow(context.Background(), a.Principal)
		require.NoError(t, err)
		require.False(t, allowed)
	})
}

func TestActions(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	b := e.signedIn(t, "analyst1")

	t.Run("lift", func(t *testing.T) {
		a := e.seed(t, "lift", time.Now().Add(-time.Minute), events.PatternRapidFire, events.SeverityCritical, true)
		csrf := b.csrf(alertPath(a))
		body := b.act(t, "/alert/lift", csrf, a, http.StatusUnprocessableEntity, "reason", "  ")
		require.Contains(t, body, "a reason is required")
		require.True(t, e.penaltyExists(t, a), "a refused lift changes nothing")

		b.act(t, "/alert/lift", csrf, a, http.StatusSeeOther, "reason", "TS-17: partner load test")
		require.False(t, e.penaltyExists(t, a), "the penalty key is gone")
		row := e.onlyAudit(t, a)
		require.Equal(t, store.ActionLift, row.Action)
		require.Equal(t, "analyst1", row.Actor)
		require.Equal(t, "analyst", row.Role)
		require.Equal(t, "TS-17: partner load test", row.Reason)
		require.Equal(t, a.ID, row.AbuseID)
		require.Contains(t, row.Before, `"abuse_id":"`+a.ID+`"`)
		require.Equal(t, "null", row.After)
		require.NotEmpty(t, row.CorrelationID)
		got, err := e.st.Get(ctx, a.Principal, a.SK)
		require.NoError(t, err)
		require.Equal(t, store.StatusLifted, got.Status)
		require.Equal(t, "analyst1", got.LiftedBy)

		code, page := b.get(alertPath(a) + "&done=lifted")
		require.Equal(t, http.StatusOK, code)
		require.Contains(t, page, "Penalty lifted")
		require.Contains(t, page, "No penalty in force")

		res, _ := b.post("/alert/lift", actionForm(csrf, a, "reason", "again"))
		require.Equal(t, http.StatusConflict, res.StatusCode, "nothing left to lift")
	})

	t.Run("extend", func(t *testing.T) {
		a := e.seed(t, "extend", time.Now().Add(-time.Minute), events.PatternRapidFire, events.SeverityHigh, true)
		before, ok, err := e.st.GetPenalty(ctx, a.Principal)
		require.NoError(t, err)
		require.True(t, ok)
		csrf := b.csrf(alertPath(a))
		b.act(t, "/alert/extend", csrf, a, http.StatusUnprocessableEntity, "reason", "repeat offender", "duration", "soon")
		b.act(t, "/alert/extend", csrf, a, http.StatusSeeOther, "reason", "repeat offender", "duration", "6h")
		after, ok, err := e.st.GetPenalty(ctx, a.Principal)
		require.NoError(t, err)
		require.True(t, ok)
		require.Equal(t, before.ExpiresAt+6*time.Hour.Milliseconds(), after.ExpiresAt)
		kind, id := a.PrincipalParts()
		pttl, err := e.rdb.PTTL(ctx, redisx.PenaltyKey(kind, id)).Result()
		require.NoError(t, err)
		require.Greater(t, pttl, 6*time.Hour, "the key's own expiry moved too")
		row := e.onlyAudit(t, a)
		require.Equal(t, store.ActionExtend, row.Action)
		require.Contains(t, row.Before, strconv.FormatInt(before.ExpiresAt, 10))
		require.Contains(t, row.After, strconv.FormatInt(after.ExpiresAt, 10))
	})

	t.Run("allowlist", func(t *testing.T) {
		a := e.seed(t, "allow", time.Now().Add(-time.Minute), events.PatternDistributedIP, events.SeverityMedium, false)
		csrf := b.csrf(alertPath(a))
		b.act(t, "/alert/allowlist", csrf, a, http.StatusUnprocessableEntity, "reason", "known partner", "duration", "7d", "comment", "")
		b.act(t, "/alert/allowlist", csrf, a, http.StatusUnprocessableEntity, "reason", "known partner", "duration", "400d", "comment", "x")
		b.act(t, "/alert/allowlist", csrf, a, http.StatusSeeOther, "reason", "known partner", "duration", "7d", "comment", "Acme status poller")
		// The entry is where and how the detector reads it.
		it := e.runtimeItem(t, "detector#allow#principal#"+a.Principal)
		require.Equal(t, "Acme status poller", it.str("comment"))
		require.Equal(t, "analyst1", it.str("created_by"))
		require.InDelta(t, time.Now().Add(7*24*time.Hour).Unix(), it.num(t, "expires_at"), 60)
		row := e.onlyAudit(t, a)
		require.Equal(t, store.ActionAllowlist, row.Action)
		require.Equal(t, "null", row.Before)
		require.Contains(t, row.After, "Acme status poller")
	})

	t.Run("false positive is counted once", func(t *testing.T) {
		a := e.seed(t, "fp", time.Now().Add(-time.Minute), events.PatternRapidFire, events.SeverityHigh, false)
		csrf := b.csrf(alertPath(a))
		// One way to say it: the verdict (the old /alert/false-positive is gone).
		b.act(t, "/alert/verdict", csrf, a, http.StatusSeeOther, "reason", "NAT'd carrier", "verdict", "false_positive", "duration", "1d")
		res, _ := b.post("/alert/verdict", actionForm(csrf, a, "reason", "twice", "verdict", "false_positive", "duration", "1d"))
		require.Less(t, res.StatusCode, 500)
		res, _ = b.post("/alert/false-positive", actionForm(csrf, a, "reason", "the old button"))
		require.Contains(t, []int{http.StatusNotFound, http.StatusMethodNotAllowed}, res.StatusCode)
		counts, err := e.st.FalsePositives(ctx)
		require.NoError(t, err)
		require.Equal(t, []store.FalsePositiveCount{{Pattern: "rapid_fire", DetectorVersion: "detector-test-1", Count: 1, UpdatedAt: counts[0].UpdatedAt}}, counts)
		got, err := e.st.Get(ctx, a.Principal, a.SK)
		require.NoError(t, err)
		require.Equal(t, store.StatusFalsePositive, got.Status)
		code, page := b.get("/false-positives")
		require.Equal(t, http.StatusOK, code)
		require.Contains(t, page, "detector-test-1")
	})

	t.Run("API token acts without CSRF and is audited", func(t *testing.T) {
		a := e.seed(t, "api", time.Now().Add(-time.Minute), events.PatternRapidFire, events.SeverityHigh, true)
		form := actionForm("", a, "reason", "automation: ticket TS-99")
		req, _ := http.NewRequest(http.MethodPost, e.srv.URL+"/alert/lift", strings.NewReader(form.Encode()))
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		req.Header.Set("Authorization", "Bearer "+e.tokens["analyst"])
		req.Header.Set("X-Request-Id", "req-123")
		res, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		res.Body.Close()
		require.Equal(t, http.StatusOK, res.StatusCode)
		require.False(t, e.penaltyExists(t, a))
		row := e.onlyAudit(t, a)
		require.Equal(t, "analyst-bot", row.Actor)
		require.Equal(t, "req-123", row.CorrelationID)
	})
}

func TestAlertsList(t *testing.T) {
	e := newEnv(t)
	now := time.Now()
	old := e.seed(t, "l1", now.Add(-3*time.Hour), events.PatternRapidFire, events.SeverityHigh, false)
	mid := e.seed(t, "l2", now.Add(-2*time.Hour), events.PatternDistributedIP, events.SeverityCritical, false)
	newest := e.seed(t, "l3", now.Add(-time.Hour), events.PatternRapidFire, events.SeverityLow, false)
	b := e.signedIn(t, "viewer1")

	t.Run("filters", func(t *testing.T) {
		for _, tc := range []struct {
			name  string
			query string
			want  []store.Alert
			not   []store.Alert
		}{
			{"all", "", []store.Alert{old, mid, newest}, nil},
			{"pattern", "pattern=rapid_fire", []store.Alert{old, newest}, []store.Alert{mid}},
			{"severity", "severity=critical", []store.Alert{mid}, []store.Alert{old, newest}},
			{"status", "status=expired", []store.Alert{old, mid, newest}, nil},
			{"status none", "status=lifted", nil, []store.Alert{old, mid, newest}},
			{"time", "window=1h", nil, []store.Alert{old, mid, newest}},
		} {
			t.Run(tc.name, func(t *testing.T) {
				code, body := b.get("/alerts?" + tc.query)
				require.Equal(t, http.StatusOK, code)
				for _, a := range tc.want {
					require.Contains(t, body, a.ID)
				}
				for _, a := range tc.not {
					require.NotContains(t, body, a.ID)
				}
				if len(tc.want) == 0 {
					require.Contains(t, body, "No alerts match")
				}
			})
		}
	})
	t.Run("bad filter", func(t *testing.T) {
		code, body := b.get("/alerts?severity=apocalyptic")
		require.Equal(t, http.StatusBadRequest, code)
		require.Contains(t, body, "severity must be one of")
		code, _ = b.get("/alerts?cursor=xyz")
		require.Equal(t, http.StatusBadRequest, code)
	})
	t.Run("pagination", func(t *testing.T) {
		var seen []string
		path := "/alerts?pattern=rapid_fire&limit=1"
		for range 4 {
			code, body := b.get(path)
			require.Equal(t, http.StatusOK, code)
			for _, a := range []store.Alert{old, mid, newest} {
				if strings.Contains(body, a.ID) {
					seen = append(seen, a.ID)
				}
			}
			i := strings.Index(body, `cursor=`)
			if i < 0 {
				break
			}
			cur := body[i+len("cursor="):]
			cur = cur[:strings.IndexByte(cur, '"')]
			require.Contains(t, body, `href="/alerts?pattern=rapid_fire&amp;cursor=`, "the next link keeps the filters, encoded once")
			path = "/alerts?pattern=rapid_fire&limit=1&cursor=" + cur
		}
		require.Equal(t, []string{newest.ID, old.ID}, seen, "newest first, each once, filter kept")
	})
	t.Run("new alerts appear by polling", func(t *testing.T) {
		code, body := b.get("/alerts")
		require.Equal(t, http.StatusOK, code)
		i := strings.Index(body, `data-after="`)
		require.Positive(t, i)
		after := body[i+len(`data-after="`):]
		after = after[:strings.IndexByte(after, '"')]
		require.Greater(t, after, newest.GSI1SK, "polls from five minutes back when the newest shown is older")

		code, _ = b.get("/alerts/new?after=" + url.QueryEscape(after))
		require.Equal(t, http.StatusOK, code)
		fresh := e.seed(t, "l4", time.Now(), events.PatternRapidFire, events.SeverityCritical, false)
		res, err := b.c.Get(e.srv.URL + "/alerts/new?after=" + url.QueryEscape(after))
		require.NoError(t, err)
		frag, _ := io.ReadAll(res.Body)
		res.Body.Close()
		require.Equal(t, http.StatusOK, res.StatusCode)
		require.Equal(t, "1", res.Header.Get("X-New-Count"))
		require.Equal(t, fresh.GSI1SK, res.Header.Get("X-Latest"))
		require.Contains(t, string(frag), fresh.ID)
		require.NotContains(t, string(frag), newest.ID)
	})
	t.Run("detail shows the evidence", func(t *testing.T) {
		code, body := b.get(alertPath(mid))
		require.Equal(t, http.StatusOK, code)
		for _, want := range []string{"/channels/{channel_id}/messages", "198.51.100.0", "shared (NAT / proxy)", "addresses 3.00, /24 + /64 2.00", "detector-test-1", "escalation level 1", "step 3 — step 3 of 3, clear: 96% of its calls refused past its limit", "History of"} {
			require.Contains(t, body, want)
		}
		require.NotContains(t, body, "125.00/s", "distributed_ip shows networks, not a rate bar")
		code, _ = b.get("/alert?p=bot:nobody&k=x")
		require.Equal(t, http.StatusNotFound, code)
	})
	t.Run("scales", func(t *testing.T) {
		require.NoError(t, e.rdb.HSet(context.Background(), "fg:test:"+e.run+":scales", "global", "0.7", "tier:ip", "0.5").Err())
		t.Cleanup(func() { e.rdb.Del(context.Background(), "fg:test:"+e.run+":scales") })
		code, body := b.get("/scales")
		require.Equal(t, http.StatusOK, code)
		require.Contains(t, body, "tier:ip")
		require.Contains(t, body, "0.7")
	})
}
