package web

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/crypto/bcrypt"

	"github.com/floodgate-dev/floodgate/services/console/internal/auth"
)

// TestSecurityForgedSessionS1 replays finding S1 of issue 22: someone who can
// write to Redis (but does not hold the console's session secret) writes a
// session hash with role admin and sends the cookie. On main that made them
// console admin; now the key a cookie reads is an HMAC under the secret and
// the fields carry a MAC, so the forged session is no session.
func TestSecurityForgedSessionS1(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	cookie := "attacker-chosen-cookie-value"
	sum := sha256.Sum256([]byte(cookie))
	prefix := "fg:console:test:" + e.run + ":"
	// The key layout of main (sha256 of the cookie), and a guess with fields only.
	for _, key := range []string{prefix + hex.EncodeToString(sum[:])} {
		require.NoError(t, e.rdb.HSet(ctx, key, "name", "admin1", "role", "admin", "csrf", "x",
			"expires_at", time.Now().Add(time.Hour).UnixMilli()).Err())
		t.Cleanup(func() { e.rdb.Del(context.Background(), key) })
	}
	b := e.client(t)
	u, err := url.Parse(e.srv.URL)
	require.NoError(t, err)
	b.c.Jar.SetCookies(u, []*http.Cookie{{Name: SessionCookie, Value: cookie}})
	code, _ := b.get("/sre/overrides")
	require.Equal(t, http.StatusSeeOther, code, "a forged session is sent to sign in, not served")

	// Even with a real session's key in hand, rewriting its user is refused.
	real := e.client(t)
	real.login("viewer1")
	keys, err := e.rdb.Keys(ctx, prefix+"*").Result()
	require.NoError(t, err)
	require.NotEmpty(t, keys)
	for _, k := range keys {
		require.NoError(t, e.rdb.HSet(ctx, k, "name", "admin1").Err())
	}
	code, _ = real.get("/alerts")
	require.Equal(t, http.StatusSeeOther, code, "a session whose fields were changed without the secret is no session")
}

// TestSecurityRemovedUserS8 replays finding S8: a user removed from the users
// file kept a working session for up to 12 h. Now the user and role are
// re-read from the (reloaded) users file on every request.
func TestSecurityRemovedUserS8(t *testing.T) {
	hash, err := bcrypt.GenerateFromPassword([]byte(testPassword), bcrypt.MinCost)
	require.NoError(t, err)
	path := filepath.Join(t.TempDir(), "users.yaml")
	write := func(users ...string) {
		body := "users:\n"
		for _, u := range users {
			body += auth.UserLine(u, auth.RoleAnalyst, string(hash)) + "\n"
		}
		require.NoError(t, os.WriteFile(path, []byte(body), 0o600))
	}
	write("analyst1", "leaver1")
	dir, err := auth.LoadReloading(path, nil)
	require.NoError(t, err)
	e := newEnvWith(t, func(c *Config, _ string) { c.Directory = dir })
	b := e.client(t)
	b.login("leaver1")
	code, _ := b.get("/alerts")
	require.Equal(t, http.StatusOK, code)

	write("analyst1")
	changed, err := dir.Reload()
	require.NoError(t, err)
	require.True(t, changed)
	code, _ = b.get("/alerts")
	require.Equal(t, http.StatusSeeOther, code, "the removed user's next request is sent to sign in")
	code, _ = b.get("/alerts")
	require.Equal(t, http.StatusSeeOther, code, "and the session is gone")

	// An invalid edit keeps the previous users.
	require.NoError(t, os.WriteFile(path, []byte("users: [{name: x, role: emperor}]\n"), 0o600))
	_, err = dir.Reload()
	require.Error(t, err)
	_, ok := dir.User("analyst1")
	require.True(t, ok)
}

// TestSecurityOpenRedirectS12: after sign-in, `next` leads only to a path on
// this console — never to another site, however it is spelled.
func TestSecurityOpenRedirectS12(t *testing.T) {
	for _, tc := range []struct{ next, want string }{
		{"/alerts?state=open", "/alerts?state=open"},
		{"/principals/user/u1", "/principals/user/u1"},
		{"/\t/evil.example", "/alerts"},
		{"/\n/evil.example", "/alerts"},
		{"//evil.example", "/alerts"},
		{"/\\evil.example", "/alerts"},
		{"\\\\evil.example", "/alerts"},
		{"https://evil.example/", "/alerts"},
		{"/%09/evil.example", "/%09/evil.example"}, // stays a path here: the browser receives it escaped
		{"javascript:alert(1)", "/alerts"},
		{"", "/alerts"},
	} {
		require.Equal(t, tc.want, safeNext(tc.next), "%q", tc.next)
	}
	// Through the real sign-in form: the query's %09 is decoded to a tab.
	e := newEnv(t)
	b := e.client(t)
	tok := b.csrf("/login?next=%2F%09%2Fevil.example")
	res, body := b.post("/login", url.Values{"csrf": {tok}, "username": {"analyst1"}, "password": {testPassword}, "next": {"/\t/evil.example"}})
	require.Equal(t, http.StatusSeeOther, res.StatusCode, body)
	require.Equal(t, "/alerts", res.Header.Get("Location"))
}
