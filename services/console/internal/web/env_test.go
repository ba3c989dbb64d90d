package web

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
	"golang.org/x/crypto/bcrypt"

	"github.com/floodgate-dev/floodgate/migrations/migrationstest"
	"github.com/floodgate-dev/floodgate/pkg/dynamo"
	"github.com/floodgate-dev/floodgate/pkg/events"
	"github.com/floodgate-dev/floodgate/pkg/redisx"
	"github.com/floodgate-dev/floodgate/pkg/redisx/redistest"
	"github.com/floodgate-dev/floodgate/pkg/stacktest"
	"github.com/floodgate-dev/floodgate/services/console/internal/auth"
	"github.com/floodgate-dev/floodgate/services/console/internal/store"
)

const testPassword = "correct horse battery"

// testEnv is a console on the real Redis and DynamoDB Local, with its own
// tables (a unique prefix, migrated like production) and its own keys.
type testEnv struct {
	srv    *httptest.Server
	web    *Server
	st     *store.Store
	rdb    redis.UniversalClient
	ddb    *dynamodb.Client
	prefix string
	tokens map[string]string // role → API token
	run    string
}

// testSessionSecret signs the test consoles' sessions.
const testSessionSecret = "test-session-secret-0123456789abcdef"

func newEnv(t *testing.T) *testEnv { t.Helper(); return newEnvWith(t, nil) }

// newEnvWith is newEnv with a hook to adjust the server's configuration once
// the tables exist (it gets the table prefix).
func newEnvWith(t *testing.T, adjust func(cfg *Config, prefix string)) *testEnv {
	t.Helper()
	rdb := redistest.Client(t)
	ddb, prefix := migrationstest.DynamoTables(t, "console")

	hash, err := bcrypt.GenerateFromPassword([]byte(testPassword), bcrypt.MinCost)
	require.NoError(t, err)
	f := auth.File{}
	tokens := map[string]string{}
	for _, role := range []string{"viewer", "analyst", "sre", "admin"} {
		f.Users = append(f.Users, auth.User{Name: role + "1", Role: role, PasswordHash: string(hash)})
		tok, sum, err := auth.NewToken()
		require.NoError(t, err)
		tokens[role] = tok
		f.Tokens = append(f.Tokens, auth.Token{Name: role + "-bot", Role: role, SHA256: sum})
	}
	dir, err := auth.NewDirectory(f)
	require.NoError(t, err)
	run := redistest.Unique(t, "console")
	st := store.New(ddb, rdb, prefix, time.Now)
	sessions, err := auth.NewSessions(rdb, "fg:console:test:"+run+":", []byte(testSessionSecret), 30*time.Minute, time.Hour, time.Now)
	require.NoError(t, err)
	devices, err := auth.NewDeviceCookies([]byte(testSessionSecret), auth.DefaultDeviceTTL, time.Now)
	require.NoError(t, err)
	cfg := Config{
		Directory: dir, Store: st, Log: slog.New(slog.NewTextHandler(io.Discard, nil)), Registry: prometheus.NewRegistry(),
		Sessions: sessions, Devices: devices,
		PollInterval: time.Second, ScalesKey: "fg:test:" + run + ":scales",
	}
	if adjust != nil {
		adjust(&cfg, prefix)
	}
	s, err := New(cfg)
	require.NoError(t, err)
	srv := httptest.NewServer(s)
	t.Cleanup(srv.Close)
	return &testEnv{srv: srv, web: s, st: st, rdb: rdb, ddb: ddb, prefix: prefix, tokens: tokens, run: run}
}

// seed writes an abuse record the way the detector does (docs/detector.md) and,
// when penalty is set, a live penalty in Redis for the principal.
func (e *testEnv) seed(t *testing.T, id string, at time.Time, pattern events.Pattern, sev events.Severity, penalty bool) store.Alert {
	t.Helper()
	ctx := context.Background()
	p := events.Principal{Kind: events.PrincipalBot, ID: e.run + "_" + id}
	a := events.Abuse{
		ID: "ab_" + e.run + "_" + id, DetectedAt: at, Principal: p, Pattern: pattern, Severity: sev, Score: 12.5,
		Window:       events.Window{Start: at.Add(-10 * time.Second), End: at, Seconds: 10},
		FirstEventAt: at.Add(-10 * time.Second),
		Evidence: events.Evidence{ObservedRate: 125, BaselineRate: 2, Threshold: 10, EventCount: 1250, DistinctIPs: 3, DistinctIP24: 2,
			TopRoutes: []events.RouteCount{{Route: "/channels/{channel_id}/messages", Count: 1200}, {Route: "/users/me", Count: 50}},
			TopIPs: []events.IPCount{{IP: netip.MustParseAddr("203.0.113.0"), Count: 1000, SharedPrincipals: 0},
				{IP: netip.MustParseAddr("198.51.100.0"), Count: 250, SharedPrincipals: 40}}},
		Penalty: events.Penalty{Multiplier: 0.1, ExpiresAt: at.Add(30 * time.Minute), Level: 1, Mode: events.PenaltyEnforced,
			Step: 3, Reason: "step 3 of 3, clear: 96% of its calls refused past its limit (1200 refused)"},
		DetectorVersion: "detector-test-1",
	}
	require.NoError(t, a.Validate())
	body, err := events.EncodeAbuse(&a)
	require.NoError(t, err)
	ts := a.DetectedAt.UTC().Format("2006-01-02T15:04:05.000Z")
	_, err = e.ddb.PutItem(ctx, &dynamodb.PutItemInput{TableName: aws.String(e.prefix + dynamo.TableAbuseRecords), Item: map[string]types.AttributeValue{
		"pk": s(p.Key()), "sk": s(ts + "#" + a.ID), "gsi1pk": s("day#" + a.DetectedAt.UTC().Format("2006-01-02")), "gsi1sk": s(ts),
		"id": s(a.ID), "pattern": s(string(a.Pattern)), "severity": s(string(a.Severity)),
		"score": &types.AttributeValueMemberN{Value: "12.5"}, "mode": s(string(a.Penalty.Mode)),
		"level": &types.AttributeValueMemberN{Value: "1"}, "multiplier": &types.AttributeValueMemberN{Value: "0.1"},
		"penalty_until": s(a.Penalty.ExpiresAt.UTC().Format(time.RFC3339)), "detector_version": s(a.DetectorVersion),
		"event": s(string(body)), "expires_at": &types.AttributeValueMemberN{Value: strconv.FormatInt(at.Add(90*24*time.Hour).Unix(), 10)},
	}})
	require.NoError(t, err)
	if penalty {
		key := redisx.PenaltyKey(string(p.Kind), p.ID)
		exp := time.Now().Add(30 * time.Minute).UnixMilli()
		require.NoError(t, e.rdb.HSet(ctx, key, "m", "0.1", "level", 1, "abuse_id", a.ID, "expires_at", exp).Err())
		require.NoError(t, e.rdb.PExpireAt(ctx, key, time.UnixMilli(exp)).Err())
		t.Cleanup(func() { _ = e.rdb.Del(context.Background(), key).Err() })
	}
	al, err := e.st.Get(ctx, p.Key(), ts+"#"+a.ID)
	require.NoError(t, err)
	return al
}

func s(v string) types.AttributeValue { return &types.AttributeValueMemberS{Value: v} }

func (e *testEnv) penaltyExists(t *testing.T, a store.Alert) bool {
	kind, id := a.PrincipalParts()
	n, err := e.rdb.Exists(context.Background(), redisx.PenaltyKey(kind, id)).Result()
	require.NoError(t, err)
	return n == 1
}

// browser is a cookie-keeping client that does not follow redirects.
type browser struct {
	t    *testing.T
	c    *http.Client
	base string
}

func (e *testEnv) client(t *testing.T) *browser {
	jar, err := cookiejar.New(nil)
	require.NoError(t, err)
	return &browser{t: t, base: e.srv.URL, c: &http.Client{Jar: jar, Timeout: 20 * time.Second,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}}
}

// signedIn is a client signed in as user (the test password).
func (e *testEnv) signedIn(t *testing.T, user string) *browser {
	t.Helper()
	b := e.client(t)
	b.login(user)
	return b
}

// formPost is a form an SRE page posts (without its CSRF token).
type formPost struct {
	path string
	form url.Values
}

// readOnlyBelowSRE checks that a viewer and an analyst see page (with
// shown in it, unless empty) without what is hidden from them, and that each of posts,
// sent with the page's CSRF token, is refused (403).
func (e *testEnv) readOnlyBelowSRE(t *testing.T, page, shown string, hidden []string, posts ...formPost) {
	t.Helper()
	for _, user := range []string{"viewer1", "analyst1"} {
		c := e.signedIn(t, user)
		code, body := c.get(page)
		require.Equal(t, http.StatusOK, code, body)
		if shown != "" {
			require.Contains(t, body, shown, user)
		}
		for _, h := range hidden {
			require.NotContains(t, body, h, user)
		}
		csrf := csrfRE.FindStringSubmatch(body)[1]
		for _, p := range posts {
			f := url.Values{"csrf": {csrf}}
			for k, v := range p.form {
				f[k] = v
			}
			res, _ := c.post(p.path, f)
			require.Equal(t, http.StatusForbidden, res.StatusCode, "%s posts %s", user, p.path)
		}
	}
}

var csrfRE = regexp.MustCompile(`name="csrf" value="([^"]+)"`)

func (b *browser) get(path string) (int, string) { return stacktest.Get(b.t, b.c, b.base+path) }

func (b *browser) post(path string, form url.Values) (*http.Response, string) {
	return stacktest.PostForm(b.t, b.c, b.base+path, form)
}

// csrf reads the CSRF token from a page.
func (b *browser) csrf(path string) string {
	code, body := b.get(path)
	require.Equal(b.t, http.StatusOK, code, body)
	m := csrfRE.FindStringSubmatch(body)
	require.NotNil(b.t, m, "no CSRF token on %s", path)
	return m[1]
}

// act posts an action on alert a to path (actionForm: csrf, a, then kv as
// name, value pairs), requires the answer's status to be want and returns
// its body.
func (b *browser) act(t *testing.T, path, csrf string, a store.Alert, want int, kv ...string) string {
	t.Helper()
	res, body := b.post(path, actionForm(csrf, a, kv...))
	require.Equal(t, want, res.StatusCode, body)
	return body
}

func (b *browser) login(user string) {
	tok := b.csrf("/login")
	res, body := b.post("/login", url.Values{"csrf": {tok}, "username": {user}, "password": {testPassword}, "next": {"/alerts"}})
	require.Equal(b.t, http.StatusSeeOther, res.StatusCode, body)
	require.Equal(b.t, "/alerts", res.Header.Get("Location"))
}

// onlyAudit returns the one entry of the audit log of a's principal,
// failing t when there is not exactly one.
func (e *testEnv) onlyAudit(t *testing.T, a store.Alert) store.AuditEntry {
	t.Helper()
	log, err := e.st.AuditLog(t.Context(), a.Principal, 10)
	require.NoError(t, err)
	require.Len(t, log, 1)
	return log[0]
}

func alertPath(a store.Alert) string {
	return "/alert?p=" + url.QueryEscape(a.Principal) + "&k=" + url.QueryEscape(a.SK)
}

func actionForm(csrf string, a store.Alert, kv ...string) url.Values {
	v := url.Values{"csrf": {csrf}, "p": {a.Principal}, "k": {a.SK}}
	for i := 0; i+1 < len(kv); i += 2 {
		v.Set(kv[i], kv[i+1])
	}
	return v
}
