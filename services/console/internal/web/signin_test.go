package web

import (
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/floodgate-dev/floodgate/pkg/redisx/redistest"
	"github.com/floodgate-dev/floodgate/services/console/internal/auth"
)

// limitedEnv is a console whose sign-in limits live in real Redis under this
// test's keys; reg is its metrics registry.
func limitedEnv(t *testing.T) (*testEnv, *prometheus.Registry) {
	reg := prometheus.NewRegistry()
	e := newEnvWith(t, func(cfg *Config, _ string) {
		cfg.Registry = reg
		cfg.SignIn = auth.NewLimiter(redistest.Client(t), "fg:console:test:"+redistest.Unique(t, "authfail")+":")
	})
	return e, reg
}

func (b *browser) tryLogin(user, password string, hdr ...string) (*http.Response, string) {
	tok := b.csrf("/login")
	form := url.Values{"csrf": {tok}, "username": {user}, "password": {password}, "next": {"/alerts"}}
	req, err := http.NewRequest(http.MethodPost, b.base+"/login", stringsReader(form.Encode()))
	require.NoError(b.t, err)
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	res, err := b.c.Do(req)
	require.NoError(b.t, err)
	defer res.Body.Close()
	body := readAll(b.t, res)
	return res, body
}

// TestSignInLimits: 5 failures lock an account from that address for 15
// minutes (even the right password is refused, with Retry-After and a clear
// message), other accounts are unaffected, a success clears the account's
// count, 20 failures lock a client address (but not a browser that signed in
// before), a spoofed X-Forwarded-For does not help, and failures and lockouts
// are counted.
func TestSignInLimits(t *testing.T) {
	e, reg := limitedEnv(t)
	c := e.client(t)

	for i := 0; i < 5; i++ {
		res, body := c.tryLogin("analyst1", "wrong password "+strconv.Itoa(i))
		require.Equal(t, http.StatusUnauthorized, res.StatusCode, body)
	}
	res, body := c.tryLogin("analyst1", testPassword)
	require.Equal(t, http.StatusTooManyRequests, res.StatusCode, "locked: the right password is not even checked")
	require.Contains(t, body, "Too many failed sign-ins for this account")
	retry, err := strconv.Atoi(res.Header.Get("Retry-After"))
	require.NoError(t, err)
	require.True(t, retry > 890 && retry <= 900, "Retry-After %d s: the rest of the 15-minute window", retry)
	for _, ck := range res.Cookies() {
		require.NotEqual(t, SessionCookie, ck.Name, "no session")
	}
	require.Equal(t, 5.0, mustCounter(t, reg, "floodgate_console_auth_failures_total", "password"))
	require.Equal(t, 1.0, mustCounter(t, reg, "floodgate_console_auth_lockouts_total", "password", "account"))

	// Another account from the same address signs in; a success clears its count.
	for i := 0; i < 4; i++ {
		res, _ := c.tryLogin("viewer1", "nope nope nope")
		require.Equal(t, http.StatusUnauthorized, res.StatusCode)
	}
	res, _ = c.tryLogin("viewer1", testPassword)
	require.Equal(t, http.StatusSeeOther, res.StatusCode)
	for i := 0; i < 4; i++ {
		res, _ := c.tryLogin("viewer1", "nope nope nope")
		require.Equal(t, http.StatusUnauthorized, res.StatusCode, "the success cleared the earlier failures")
	}

	// 20 failures from one address (9 so far: the last 4 came from a browser
	// viewer1 signed in with, so they count against that device only — plus 11
	// unknown names) lock the address, whatever X-Forwarded-For says (no
	// trusted proxy is configured).
	for i := 0; i < 11; i++ {
		res, _ := c.tryLogin("nobody"+strconv.Itoa(i), "x", "X-Forwarded-For", "192.0.2."+strconv.Itoa(i))
		require.Equal(t, http.StatusUnauthorized, res.StatusCode, "failure %d", 10+i)
	}
	res, body = c.tryLogin("sre1", testPassword, "X-Forwarded-For", "192.0.2.99")
	require.Equal(t, http.StatusTooManyRequests, res.StatusCode)
	require.Contains(t, body, "Too many failed sign-ins from your network")
	require.Equal(t, 1.0, mustCounter(t, reg, "floodgate_console_auth_lockouts_total", "password", "ip"))
	res, _ = c.tryLogin("viewer1", testPassword)
	require.Equal(t, http.StatusSeeOther, res.StatusCode, "a known device is not locked out with its address")
}

// TestTokenFailureLimits: 20 unknown API tokens from one address lock it out
// (429 problem with Retry-After), even for a valid token.
func TestTokenFailureLimits(t *testing.T) {
	e, reg := limitedEnv(t)
	get := func(tok string) *http.Response {
		req, err := http.NewRequest(http.MethodGet, e.srv.URL+"/api/v1/alerts", nil)
		require.NoError(t, err)
		req.Header.Set("Authorization", "Bearer "+tok)
		res, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		res.Body.Close()
		return res
	}
	require.Equal(t, http.StatusOK, get(e.tokens["viewer"]).StatusCode)
	for i := 0; i < 20; i++ {
		require.Equal(t, http.StatusUnauthorized, get("fgc_guess"+strconv.Itoa(i)).StatusCode)
	}
	res := get(e.tokens["viewer"])
	require.Equal(t, http.StatusTooManyRequests, res.StatusCode)
	require.Equal(t, "application/problem+json", res.Header.Get("Content-Type")) // RFC 9457
	require.NotEmpty(t, res.Header.Get("Retry-After"))
	require.Equal(t, 20.0, mustCounter(t, reg, "floodgate_console_auth_failures_total", "token"))
	require.Equal(t, 1.0, mustCounter(t, reg, "floodgate_console_auth_lockouts_total", "token", "ip"))
}

// mustCounter is the value of the counter name with labels (0 when absent).
func mustCounter(t *testing.T, reg *prometheus.Registry, name string, labels ...string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.Metric {
			match := len(m.Label) == len(labels)
			for i, l := range m.Label {
				if match && l.GetValue() != labels[i] {
					match = false
				}
			}
			if match {
				return m.GetCounter().GetValue()
			}
		}
	}
	return 0
}

func stringsReader(s string) *strings.Reader { return strings.NewReader(s) }

func readAll(t *testing.T, res *http.Response) string {
	b, err := io.ReadAll(res.Body)
	require.NoError(t, err)
	return string(b)
}
