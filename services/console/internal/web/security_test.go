package web

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
	"golang.org/x/crypto/bcrypt"

	"github.com/floodgate-dev/floodgate/pkg/gateway"
	"github.com/floodgate-dev/floodgate/pkg/redisx/redistest"
	"github.com/floodgate-dev/floodgate/services/console/internal/auth"
	"github.com/floodgate-dev/floodgate/services/console/internal/store"
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
	real := e.signedIn(t, "viewer1")
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
	b := e.signedIn(t, "leaver1")
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

// TestSecurityLockoutS9 replays finding S9 of issue 22: anyone who could name
// an account could lock its owner out (5 failures per account, from
// anywhere, for 15 minutes; behind a proxy, 20 failures locked every
// address). Now, behind a trusted proxy: 50 failed sign-ins from one address
// lock that address out of that account and nothing else — other accounts
// sign in, and so does the owner, from a browser they signed in with before
// (a device cookie signed under the server secret and bound to the user)
// or from another address. A guess spread over many addresses slows the
// account's unknown browsers to one attempt per interval, never its known
// ones; an attacker without the owner's cookie (or with another user's) is
// still slowed. Lockouts of real accounts are audited.
func TestSecurityLockoutS9(t *testing.T) {
	reg := prometheus.NewRegistry()
	e := newEnvWith(t, func(cfg *Config, _ string) {
		cfg.Registry = reg
		cfg.SignIn = auth.NewLimiter(redistest.Client(t), "fg:console:test:"+redistest.Unique(t, "s9")+":")
		proxies, err := gateway.ParseTrustedProxies([]string{"127.0.0.1/32", "::1/128"}) // the ingress: this test's client
		require.NoError(t, err)
		cfg.Proxies = proxies
	})
	from := func(ip string) []string { return []string{"X-Forwarded-For", ip} }
	deviceCookie := func(res *http.Response) *http.Cookie {
		for _, c := range res.Cookies() {
			if strings.HasPrefix(c.Name, auth.DeviceCookiePrefix) {
				return c
			}
		}
		return nil
	}

	// The owner signed in from their laptop once: it carries a device cookie.
	laptop := e.client(t)
	res, _ := laptop.tryLogin("analyst1", testPassword, from("198.51.100.20")...)
	require.Equal(t, http.StatusSeeOther, res.StatusCode)
	dc := deviceCookie(res)
	require.NotNil(t, dc, "a successful sign-in sets a device cookie")
	require.Equal(t, "/login", dc.Path, "sent back to the sign-in form only")
	require.True(t, dc.HttpOnly)
	require.Equal(t, http.SameSiteStrictMode, dc.SameSite)
	require.NotContains(t, dc.Name+dc.Value, "analyst1", "no user name in clear")

	// 50 failed sign-ins for the owner's account from one address.
	attacker := e.client(t)
	codes := map[int]int{}
	for i := range 50 {
		res, _ := attacker.tryLogin("analyst1", "guess "+strconv.Itoa(i), from("203.0.113.66")...)
		codes[res.StatusCode]++
	}
	require.Equal(t, map[int]int{http.StatusUnauthorized: 5, http.StatusTooManyRequests: 45}, codes, "5 guesses, then that address is locked out of the account")

	// No other account is locked out — not even from the attacker's address.
	for _, u := range []string{"viewer1", "sre1", "admin1"} {
		res, body := e.client(t).tryLogin(u, testPassword, from("203.0.113.66")...)
		require.Equal(t, http.StatusSeeOther, res.StatusCode, "%s: %s", u, body)
	}
	// The owner signs in from the known laptop, even at the attacker's
	// address, and from a new browser at another address.
	res, body := laptop.tryLogin("analyst1", testPassword, from("203.0.113.66")...)
	require.Equal(t, http.StatusSeeOther, res.StatusCode, body)
	res, body = e.client(t).tryLogin("analyst1", testPassword, from("198.51.100.99")...)
	require.Equal(t, http.StatusSeeOther, res.StatusCode, body)
	res, body = attacker.tryLogin("analyst1", testPassword, from("203.0.113.66")...)
	require.Equal(t, http.StatusTooManyRequests, res.StatusCode, "the attacker's address stays locked out of the account, right password or not")
	require.Contains(t, body, "Too many failed sign-ins for this account from your network")

	// A guess spread over addresses: from 10 unknown-device failures on, the
	// account's unknown browsers are slowed to one attempt per 30 s.
	for a := 1; a <= 3; a++ {
		for i := range 5 {
			_, _ = e.client(t).tryLogin("analyst1", "spread "+strconv.Itoa(i), from("203.0.113."+strconv.Itoa(a))...)
		}
	}
	res, body = e.client(t).tryLogin("analyst1", "one more", from("192.0.2.77")...)
	require.Equal(t, http.StatusTooManyRequests, res.StatusCode, body)
	require.Contains(t, body, "from new browsers")
	retry, err := strconv.Atoi(res.Header.Get("Retry-After"))
	require.NoError(t, err)
	require.True(t, retry >= 1 && retry <= 30, "slowed, not locked: Retry-After %d s", retry)
	// Another user's valid device cookie under the owner's cookie name is no
	// device cookie for the owner.
	viewer := e.client(t)
	res, _ = viewer.tryLogin("viewer1", testPassword, from("192.0.2.78")...)
	require.Equal(t, http.StatusSeeOther, res.StatusCode)
	forged := e.client(t)
	u, err := url.Parse(e.srv.URL + "/login")
	require.NoError(t, err)
	forged.c.Jar.SetCookies(u, []*http.Cookie{{Name: dc.Name, Value: deviceCookie(res).Value, Path: "/login"}})
	res, body = forged.tryLogin("analyst1", "with a borrowed cookie", from("192.0.2.79")...)
	require.Equal(t, http.StatusTooManyRequests, res.StatusCode, body)
	// The owner's laptop is not slowed at all.
	res, body = laptop.tryLogin("analyst1", testPassword, from("198.51.100.20")...)
	require.Equal(t, http.StatusSeeOther, res.StatusCode, body)

	// Failures of an invented name are limited too, but not audited.
	for i := range 5 {
		_, _ = e.client(t).tryLogin("nobody-"+e.run, "x"+strconv.Itoa(i), from("192.0.2.200")...)
	}

	require.GreaterOrEqual(t, mustCounter(t, reg, "floodgate_console_auth_lockouts_total", "password", "account"), 46.0)
	require.GreaterOrEqual(t, mustCounter(t, reg, "floodgate_console_auth_lockouts_total", "password", "throttle"), 2.0)
	rows, err := e.st.AuditOf(context.Background(), store.SubjectSignIn, 100)
	require.NoError(t, err)
	scopes := map[string]int{}
	for _, r := range rows {
		require.Equal(t, store.ActionSignInLockout, r.Action)
		require.Equal(t, "console", r.Actor)
		require.Contains(t, r.After, `"account":"analyst1"`, "only accounts of the users file are audited")
		var after map[string]string
		require.NoError(t, json.Unmarshal([]byte(r.After), &after))
		scopes[after["scope"]]++
		if after["scope"] == auth.ScopeAccount && after["client"] == "203.0.113.66" {
			require.Contains(t, r.Reason, "5 failed sign-ins for analyst1 from 203.0.113.66")
		}
	}
	require.Equal(t, map[string]int{auth.ScopeAccount: 2, auth.ScopeThrottle: 1}, scopes,
		"203.0.113.66 and the first address of the spread locked the account for themselves; then the throttle began (once), "+
			"so the later addresses had one attempt between them and locked nothing")
}

// TestSecurityCredentialChangeEndsSessionsT3 replays row 3 of issue 37: a
// console user's password was changed (or their role lowered) while a
// session was open, and the old session still opened /alerts until its
// 12 h limit. Now a session carries the credential generation it was granted
// under, and a new password or role in the reloaded users file ends every
// session of that user at their next request.
func TestSecurityCredentialChangeEndsSessionsT3(t *testing.T) {
	hash, err := bcrypt.GenerateFromPassword([]byte(testPassword), bcrypt.MinCost)
	require.NoError(t, err)
	path := filepath.Join(t.TempDir(), "users.yaml")
	bystanderHash := string(hash)
	write := func(role auth.Role, hash []byte) {
		body := "users:\n" + auth.UserLine("analyst1", role, string(hash)) + "\n" +
			auth.UserLine("viewer1", auth.RoleViewer, bystanderHash) + "\n"
		require.NoError(t, os.WriteFile(path, []byte(body), 0o600))
	}
	write(auth.RoleAnalyst, hash)
	dir, err := auth.LoadReloading(path, nil)
	require.NoError(t, err)
	e := newEnvWith(t, func(c *Config, _ string) { c.Directory = dir })
	reload := func() {
		changed, err := dir.Reload()
		require.NoError(t, err)
		require.True(t, changed)
	}
	serves := func(b *browser) bool {
		code, _ := b.get("/alerts")
		return code == http.StatusOK
	}

	// The attacker's session and the owner's, both as analyst1; a bystander's.
	attacker, owner, bystander := e.signedIn(t, "analyst1"), e.signedIn(t, "analyst1"), e.signedIn(t, "viewer1")
	require.True(t, serves(attacker))

	// The owner changes the password (here: a new hash of another password).
	newHash, err := bcrypt.GenerateFromPassword([]byte(testPassword+"-new"), bcrypt.MinCost)
	require.NoError(t, err)
	write(auth.RoleAnalyst, newHash)
	reload()
	require.False(t, serves(attacker), "a session from before the new password is no session")
	require.False(t, serves(owner), "every session of the user ends, the owner's own too")
	require.True(t, serves(bystander), "other users' sessions are untouched")

	// Role lowered: sessions granted as analyst end; a new sign-in is a viewer.
	write(auth.RoleAnalyst, hash)
	reload()
	attacker = e.signedIn(t, "analyst1")
	require.True(t, serves(attacker))
	write(auth.RoleViewer, hash)
	reload()
	require.False(t, serves(attacker), "a session granted under a higher role ends when the role is lowered")
	require.True(t, serves(e.signedIn(t, "analyst1")), "signing in again gives a session of the new role")
	require.True(t, serves(bystander))
}

// TestSecuritySignedOutSessionStaysEndedT4 replays row 4 of issue 37: a Redis
// writer holding a captured cookie wrote the session hash back after
// sign-out and the cookie worked again; PERSIST removed its idle timeout.
// Now sign-out leaves a revocation under a key of its own, and both the idle
// and the absolute end are signed times in the session's fields, so neither
// a restored hash, PERSIST nor a rewritten field revives or extends it.
func TestSecuritySignedOutSessionStaysEndedT4(t *testing.T) {
	ctx := context.Background()
	var clock atomic.Int64
	clock.Store(time.Now().UnixMilli())
	now := func() time.Time { return time.UnixMilli(clock.Load()) }
	advance := func(d time.Duration) { clock.Add(d.Milliseconds()) }
	const idle, absolute = 30 * time.Minute, 2 * time.Hour
	var prefix string
	e := newEnvWith(t, func(c *Config, _ string) {
		prefix = "fg:console:test:" + redistest.Unique(t, "sessions") + ":"
		s, err := auth.NewSessions(redistest.Client(t), prefix, []byte(testSessionSecret), idle, absolute, now)
		require.NoError(t, err)
		c.Sessions = s
	})
	t.Cleanup(func() {
		keys, _ := e.rdb.Keys(context.Background(), prefix+"*").Result()
		if len(keys) > 0 {
			e.rdb.Del(context.Background(), keys...)
		}
	})
	u, err := url.Parse(e.srv.URL)
	require.NoError(t, err)
	// signIn returns a browser, its cookie (what the attacker captured) and its key in Redis.
	signIn := func() (*browser, string, string) {
		before, err := e.rdb.Keys(ctx, prefix+"*").Result()
		require.NoError(t, err)
		b := e.signedIn(t, "analyst1")
		after, err := e.rdb.Keys(ctx, prefix+"*").Result()
		require.NoError(t, err)
		var key string
		for _, k := range after {
			if !slices.Contains(before, k) && !strings.Contains(k, ":revoked:") {
				key = k
			}
		}
		require.NotEmpty(t, key)
		for _, c := range b.c.Jar.Cookies(u) {
			if c.Name == SessionCookie {
				return b, c.Value, key
			}
		}
		t.Fatal("no session cookie")
		return nil, "", ""
	}
	attackerWith := func(cookie string) *browser {
		b := e.client(t)
		b.c.Jar.SetCookies(u, []*http.Cookie{{Name: SessionCookie, Value: cookie}})
		return b
	}
	serves := func(b *browser) bool {
		code, _ := b.get("/alerts")
		return code == http.StatusOK
	}

	t.Run("hash written back after sign-out", func(t *testing.T) {
		owner, cookie, key := signIn()
		dump, err := e.rdb.Dump(ctx, key).Result()
		require.NoError(t, err)
		fields, err := e.rdb.HGetAll(ctx, key).Result()
		require.NoError(t, err)
		require.True(t, serves(attackerWith(cookie)), "the captured cookie works while the session lives")

		res, body := owner.post("/logout", url.Values{"csrf": {owner.csrf("/alerts")}})
		require.Equal(t, http.StatusSeeOther, res.StatusCode, body)
		require.False(t, serves(attackerWith(cookie)))

		// RESTORE the dumped key, with no TTL at all.
		require.NoError(t, e.rdb.RestoreReplace(ctx, key, 0, dump).Err())
		require.False(t, serves(attackerWith(cookie)), "a restored session key does not undo sign-out")
		// Or HSET its fields back one by one, and PERSIST it.
		for k, v := range fields {
			require.NoError(t, e.rdb.HSet(ctx, key, k, v).Err())
		}
		require.NoError(t, e.rdb.Persist(ctx, key).Err())
		require.False(t, serves(attackerWith(cookie)), "nor do its fields written back")
	})

	t.Run("PERSIST does not lift the idle end", func(t *testing.T) {
		b, _, key := signIn()
		require.True(t, serves(b))
		fields, err := e.rdb.HGetAll(ctx, key).Result()
		require.NoError(t, err)
		require.NoError(t, e.rdb.Persist(ctx, key).Err())
		advance(idle + time.Second)
		require.Equal(t, int64(1), e.rdb.Exists(ctx, key).Val(), "the key outlived its TTL (PERSIST)")
		require.False(t, serves(b), "an idle session ends at its signed last use, whatever the key's TTL")
		// The last use written back (it was the newest there was) revives nothing either.
		for k, v := range fields {
			require.NoError(t, e.rdb.HSet(ctx, key, k, v).Err())
		}
		require.False(t, serves(b))
	})

	t.Run("a later last use needs the secret", func(t *testing.T) {
		b, _, key := signIn()
		advance(idle - time.Minute)
		require.NoError(t, e.rdb.HSet(ctx, key, "seen_at", strconv.FormatInt(now().Add(time.Hour).UnixMilli(), 10)).Err())
		require.False(t, serves(b), "a last use written without the secret is no session")
	})

	t.Run("the absolute end holds while used", func(t *testing.T) {
		b, _, key := signIn()
		for range int(absolute/(idle/2)) - 1 {
			advance(idle / 2)
			require.True(t, serves(b), "used within the idle timeout, the session lives")
		}
		require.NoError(t, e.rdb.Persist(ctx, key).Err())
		advance(idle / 2)
		require.False(t, serves(b), "past the signed absolute expiry, whatever Redis holds")
	})
}
