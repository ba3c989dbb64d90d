package web

import (
	"context"
	"encoding/json"
	"net/http"
	"net/netip"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/floodgate-dev/floodgate/pkg/events"
	"github.com/floodgate-dev/floodgate/services/console/internal/store"
)

// TestCIDRAllowlist adds, lists and removes network allowlist entries through
// the console on DynamoDB Local and checks each item is exactly what the
// detector's loader reads (records.go: pk detector#allow#cidr#<masked
// prefix>, expires_at N epoch s, comment, created_by, created_at).
func TestCIDRAllowlist(t *testing.T) {
	e := newEnv(t)
	a := e.seed(t, "cidr", time.Now().Add(-time.Minute), events.PatternRapidFire, events.SeverityHigh, true)
	analyst := e.signedIn(t, "analyst1")
	csrf := analyst.csrf(alertPath(a))
	require.Contains(t, analyst.mustGet(alertPath(a)), `id="cidr-form"`)
	require.Contains(t, analyst.mustGet(alertPath(a)), `<option value="198.51.100.0/24">`, "the alert's networks are offered")

	t.Run("from an alert: the item the detector reads, audited twice", func(t *testing.T) {
		before := time.Now()
		res, body := analyst.post("/allowlist/cidr", actionForm(csrf, a, "cidr", "203.0.113.77/24", "duration", "7d",
			"comment", "partner office NAT", "reason", "TS-7: verified office range"))
		require.Equal(t, http.StatusSeeOther, res.StatusCode, body)
		require.Contains(t, res.Header.Get("Location"), "done=cidr_allowlisted")
		it := e.runtimeItem(t, "detector#allow#cidr#203.0.113.0/24")
		require.NotEmpty(t, it, "masked prefix as the key")
		require.ElementsMatch(t, []string{"pk", "expires_at", "comment", "created_by", "created_at"}, it.keys())
		p, err := netip.ParsePrefix(strings.TrimPrefix(it.str("pk"), "detector#allow#cidr#"))
		require.NoError(t, err, "the detector parses the key's prefix")
		require.Equal(t, p.Masked(), p)
		require.InDelta(t, before.Add(7*24*time.Hour).Unix(), it.num(t, "expires_at"), 5)
		require.Equal(t, "partner office NAT", it.str("comment"))
		require.Equal(t, "analyst1", it.str("created_by"))

		rows, err := e.st.AuditOf(context.Background(), "cidr#203.0.113.0/24", 5)
		require.NoError(t, err)
		require.Len(t, rows, 1)
		require.Equal(t, store.ActionAllowCIDR, rows[0].Action)
		require.Equal(t, "TS-7: verified office range", rows[0].Reason)
		require.Equal(t, a.ID, rows[0].AbuseID)
		require.Equal(t, "null", rows[0].Before)
		require.Contains(t, rows[0].After, `"pk":"detector#allow#cidr#203.0.113.0/24"`)
		// The alert's audit log shows it too.
		prow := e.onlyAudit(t, a)
		require.Equal(t, store.ActionAllowCIDR, prow.Action)

		page := analyst.mustGet(alertPath(a) + "&done=cidr_allowlisted")
		require.Contains(t, page, "Network allowlisted")
		require.Contains(t, page, `<a href="/allowlist">203.0.113.0/24</a> until`, "the network row says it is allowlisted")
	})
	t.Run("normalized forms", func(t *testing.T) {
		for in, pk := range map[string]string{
			"2001:db8::1":             "detector#allow#cidr#2001:db8::1/128",
			"::ffff:198.51.100.9/120": "detector#allow#cidr#198.51.100.0/24",
			" 2001:db8:abcd:12::/56 ": "detector#allow#cidr#2001:db8:abcd::/56",
		} {
			res, body := analyst.post("/allowlist/cidr", url.Values{"csrf": {csrf}, "cidr": {in}, "duration": {"1d"}, "comment": {"c"}, "reason": {"r"}})
			require.Equal(t, http.StatusSeeOther, res.StatusCode, "%s: %s", in, body)
			require.NotEmpty(t, e.runtimeItem(t, pk), "%s is stored as %s", in, pk)
		}
	})
	t.Run("refused", func(t *testing.T) {
		for _, c := range []struct {
			name string
			form url.Values
			code int
			msg  string
		}{
			{"too broad IPv4", url.Values{"cidr": {"10.0.0.0/7"}}, http.StatusForbidden, "only an admin"},
			{"too broad IPv6", url.Values{"cidr": {"2001:db8::/31"}}, http.StatusForbidden, "only an admin"},
			{"everything", url.Values{"cidr": {"::/0"}}, http.StatusForbidden, "every address"},
			{"not a network", url.Values{"cidr": {"10.0.0.300/24"}}, http.StatusUnprocessableEntity, "want a network"},
			{"zone", url.Values{"cidr": {"fe80::1%eth0"}}, http.StatusUnprocessableEntity, "cidr"},
			{"no reason", url.Values{"reason": {" "}}, http.StatusUnprocessableEntity, "a reason is required"},
			{"no comment", url.Values{"comment": {""}}, http.StatusUnprocessableEntity, "a comment is required"},
			{"too long", url.Values{"duration": {"400d"}}, http.StatusUnprocessableEntity, "days must be 1..365"},
		} {
			t.Run(c.name, func(t *testing.T) {
				form := url.Values{"csrf": {csrf}, "cidr": {"192.0.2.0/24"}, "duration": {"7d"}, "comment": {"c"}, "reason": {"r"}}
				for k, v := range c.form {
					form[k] = v
				}
				res, body := analyst.post("/allowlist/cidr", form)
				require.Equal(t, c.code, res.StatusCode, body)
				require.Contains(t, body, c.msg)
			})
		}
		require.Empty(t, e.runtimeItem(t, "detector#allow#cidr#192.0.2.0/24"), "nothing written")
		require.Empty(t, e.runtimeItem(t, "detector#allow#cidr#10.0.0.0/7"))
	})
	t.Run("admin may allowlist a broad prefix, never /0", func(t *testing.T) {
		res, body := e.apiPost(t, "admin", "/allowlist/cidr", url.Values{"cidr": {"10.0.0.0/7"}, "duration": {"1d"}, "comment": {"c"}, "reason": {"r"}})
		require.Equal(t, http.StatusOK, res.StatusCode, body)
		require.NotEmpty(t, e.runtimeItem(t, "detector#allow#cidr#10.0.0.0/7"))
		res, body = e.apiPost(t, "admin", "/allowlist/cidr", url.Values{"cidr": {"0.0.0.0/0"}, "duration": {"1d"}, "comment": {"c"}, "reason": {"r"}})
		require.Equal(t, http.StatusForbidden, res.StatusCode, body)
	})
	t.Run("viewer: read-only page, POSTs refused", func(t *testing.T) {
		viewer := e.signedIn(t, "viewer1")
		page := viewer.mustGet("/allowlist")
		require.Contains(t, page, "partner office NAT")
		require.Contains(t, page, `id="read-only"`)
		require.NotContains(t, page, `action="/allowlist/`)
		require.NotContains(t, viewer.mustGet(alertPath(a)), `id="cidr-form"`)
		vcsrf := viewer.csrf("/allowlist")
		res, _ := viewer.post("/allowlist/cidr", url.Values{"csrf": {vcsrf}, "cidr": {"192.0.2.0/24"}, "duration": {"1d"}, "comment": {"c"}, "reason": {"r"}})
		require.Equal(t, http.StatusForbidden, res.StatusCode)
		res, _ = viewer.post("/allowlist/remove", url.Values{"csrf": {vcsrf}, "pk": {"detector#allow#cidr#203.0.113.0/24"}, "reason": {"r"}})
		require.Equal(t, http.StatusForbidden, res.StatusCode)
		res, _ = e.apiPost(t, "viewer", "/allowlist/cidr", url.Values{"cidr": {"192.0.2.0/24"}, "duration": {"1d"}, "comment": {"c"}, "reason": {"r"}})
		require.Equal(t, http.StatusForbidden, res.StatusCode)
		res, _ = analyst.post("/allowlist/cidr", url.Values{"csrf": {"forged"}, "cidr": {"192.0.2.0/24"}, "duration": {"1d"}, "comment": {"c"}, "reason": {"r"}})
		require.Equal(t, http.StatusForbidden, res.StatusCode, "a forged CSRF token")
		require.Empty(t, e.runtimeItem(t, "detector#allow#cidr#192.0.2.0/24"))
		require.NotEmpty(t, e.runtimeItem(t, "detector#allow#cidr#203.0.113.0/24"))
	})
	t.Run("list and remove", func(t *testing.T) {
		page := analyst.mustGet("/allowlist")
		for _, want := range []string{"203.0.113.0/24", "partner office NAT", "analyst1", "2001:db8::1/128", `action="/allowlist/remove"`} {
			require.Contains(t, page, want)
		}
		lcsrf := analyst.csrf("/allowlist")
		res, body := analyst.post("/allowlist/remove", url.Values{"csrf": {lcsrf}, "pk": {"detector#allow#cidr#203.0.113.0/24"}, "reason": {""}})
		require.Equal(t, http.StatusUnprocessableEntity, res.StatusCode, body)
		res, body = analyst.post("/allowlist/remove", url.Values{"csrf": {lcsrf}, "pk": {"detector#allow#cidr#203.0.113.0/24"}, "reason": {"range returned to the ISP"}})
		require.Equal(t, http.StatusSeeOther, res.StatusCode, body)
		require.Empty(t, e.runtimeItem(t, "detector#allow#cidr#203.0.113.0/24"))
		rows, err := e.st.AuditOf(context.Background(), "cidr#203.0.113.0/24", 5)
		require.NoError(t, err)
		require.Len(t, rows, 2)
		require.Equal(t, store.ActionAllowRemove, rows[0].Action)
		require.Contains(t, rows[0].Before, "partner office NAT")
		require.Equal(t, "null", rows[0].After)
		res, _ = analyst.post("/allowlist/remove", url.Values{"csrf": {lcsrf}, "pk": {"detector#allow#cidr#203.0.113.0/24"}, "reason": {"again"}})
		require.Equal(t, http.StatusNotFound, res.StatusCode)
		res, _ = analyst.post("/allowlist/remove", url.Values{"csrf": {lcsrf}, "pk": {"detector#false_positives#x#y"}, "reason": {"r"}})
		require.Equal(t, http.StatusUnprocessableEntity, res.StatusCode, "only allowlist keys")
	})
}

func (b *browser) mustGet(path string) string {
	code, body := b.get(path)
	require.Equal(b.t, http.StatusOK, code, body)
	return body
}

// apiPost posts a form with the role's API token (no session, no CSRF).
func (e *testEnv) apiPost(t *testing.T, role, path string, form url.Values) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, e.srv.URL+path, strings.NewReader(form.Encode()))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Authorization", "Bearer "+e.tokens[role])
	res, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer res.Body.Close()
	var v map[string]any
	_ = json.NewDecoder(res.Body).Decode(&v)
	b, _ := json.Marshal(v)
	return res, string(b)
}
