package admin

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/stretchr/testify/require"

	"github.com/floodgate-dev/floodgate/migrations/migrationstest"
	"github.com/floodgate-dev/floodgate/pkg/dynamo"
	"github.com/floodgate-dev/floodgate/pkg/httpapi"
	"github.com/floodgate-dev/floodgate/pkg/stacktest"
	"github.com/floodgate-dev/floodgate/services/adjuster/internal/control"
	"github.com/floodgate-dev/floodgate/services/adjuster/internal/loop"
	"github.com/floodgate-dev/floodgate/services/adjuster/internal/settings"
)

type fakeLoop struct{ used []settings.Settings }

func (f *fakeLoop) Status() loop.Status {
	return loop.Status{Scales: map[string]float64{"global": 0.7}}
}
func (f *fakeLoop) Use(s settings.Settings) { f.used = append(f.used, s) }
func (f *fakeLoop) Nudge()                  {}
func (f *fakeLoop) last() settings.Settings { return f.used[len(f.used)-1] }
func (f *fakeLoop) count() int              { return len(f.used) }
func (f *fakeLoop) versions() (out []int64) {
	for _, s := range f.used {
		out = append(out, s.Version)
	}
	return out
}

// dynamoStore applies the real migrations to DynamoDB Local under a per-run
// table prefix and returns the settings store on those tables.
func dynamoStore(t *testing.T) *settings.Dynamo {
	t.Helper()
	ddb, prefix := migrationstest.DynamoTables(t, "adj")
	return &settings.Dynamo{Client: ddb, RuntimeTable: prefix + dynamo.TableRuntimeConfig, AuditTable: prefix + dynamo.TableAuditLog}
}

type client struct {
	t   *testing.T
	url string
}

func (c client) do(method, path, token, ifMatch, body string) (int, http.Header, map[string]any) {
	c.t.Helper()
	req, err := http.NewRequest(method, c.url+path, strings.NewReader(body))
	require.NoError(c.t, err)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	if ifMatch != "" {
		req.Header.Set("If-Match", ifMatch)
	}
	req.Header.Set("X-Request-Id", "req-"+strings.ToLower(method))
	resp, err := http.DefaultClient.Do(req)
	require.NoError(c.t, err)
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	var out map[string]any
	_ = json.Unmarshal(raw, &out)
	return resp.StatusCode, resp.Header, out
}

// testTokens are an SRE's (alice) and a viewer's (dash) fresh tokens and
// the callers that accept them.
func testTokens(t *testing.T) (tokens *httpapi.Tokens, sre, viewer string) {
	t.Helper()
	sre, err := NewToken()
	require.NoError(t, err)
	viewer, err = NewToken()
	require.NoError(t, err)
	tokens, err = ParseTokens("alice:sre:" + HashToken(sre) + ",dash:viewer:" + HashToken(viewer))
	require.NoError(t, err)
	return tokens, sre, viewer
}

func TestAdminAPIAgainstDynamoDBLocal(t *testing.T) {
	stacktest.Needs(t, "needs the local stack: `make test` runs it (`make test-unit` is -short, no stack)")
	store := dynamoStore(t)
	tokens, sreTok, viewerTok := testTokens(t)
	now := time.Now().UTC().Truncate(time.Millisecond)
	fl := &fakeLoop{}
	srv := NewServer(Config{Tokens: tokens, Store: store, Loop: fl, Defaults: control.Defaults(), Now: func() time.Time { return now }})
	hs := httptest.NewServer(httpapi.Middleware(httpapi.Options{}, srv.Handler()))
	t.Cleanup(hs.Close)
	c := client{t: t, url: hs.URL}

	t.Run("authentication and roles", func(t *testing.T) {
		cases := []struct {
			name, method, path, token string
			want                      int
		}{
			{"no token", "GET", "/v1/settings", "", http.StatusUnauthorized},
			{"bad token", "GET", "/v1/settings", "fga_not-a-real-token", http.StatusUnauthorized},
			{"viewer reads settings", "GET", "/v1/settings", viewerTok, http.StatusOK},
			{"viewer reads status", "GET", "/v1/status", viewerTok, http.StatusOK},
			{"viewer reads audit", "GET", "/v1/audit", viewerTok, http.StatusOK},
			{"viewer cannot change rules", "PUT", "/v1/settings/rules", viewerTok, http.StatusForbidden},
			{"viewer cannot set an override", "PUT", "/v1/overrides", viewerTok, http.StatusForbidden},
			{"viewer cannot freeze", "PUT", "/v1/settings/mode", viewerTok, http.StatusForbidden},
		}
		for _, tc := range cases {
			t.Run(tc.name, func(t *testing.T) {
				code, h, body := c.do(tc.method, tc.path, tc.token, `"0"`, `{"rules":{"cpu_high":{"above":0.5}},"reason":"x"}`)
				require.Equal(t, tc.want, code, "%v", body)
				require.Equal(t, "req-"+strings.ToLower(tc.method), h.Get("X-Request-Id"))
				if code >= 400 { // an RFC 9457 problem
					require.Equal(t, httpapi.ContentTypeProblem, h.Get("Content-Type"))
					require.Contains(t, body["type"], httpapi.ProblemBase)
					require.Equal(t, float64(code), body["status"])
					require.NotEmpty(t, body["detail"])
					require.Equal(t, h.Get("X-Request-Id"), body["correlation_id"])
				}
			})
		}
	})
	require.Zero(t, fl.count(), "refused calls changed nothing")

	// Read the defaults at version 0, then change a threshold.
	code, h, body := c.do("GET", "/v1/settings", viewerTok, "", "")
	require.Equal(t, http.StatusOK, code)
	require.Equal(t, `"0"`, h.Get("ETag"))
	require.Equal(t, 0.85, body["rules"].(map[string]any)["cpu_high"].(map[string]any)["above"])

	t.Run("validation", func(t *testing.T) {
		cases := []struct {
			name, path, ifMatch, body string
			want                      int
			msg                       string
		}{
			{"no If-Match", "/v1/settings/rules", "", `{"rules":{"cpu_high":{"above":0.9}},"reason":"r"}`, http.StatusPreconditionRequired, "If-Match"},
			{"no reason", "/v1/settings/rules", `"0"`, `{"rules":{"cpu_high":{"above":0.9}}}`, http.StatusBadRequest, "reason is required"},
			{"unknown field", "/v1/settings/rules", `"0"`, `{"rules":{"cpu_hihg":{"above":0.9}},"reason":"r"}`, http.StatusBadRequest, "cpu_hihg"},
			{"threshold out of range", "/v1/settings/rules", `"0"`, `{"rules":{"cpu_high":{"above":1.5}},"reason":"r"}`, http.StatusUnprocessableEntity, "cpu_high.above"},
			{"oscillating recovery", "/v1/settings/rules", `"0"`, `{"rules":{"recover":{"cpu_below":0.8}},"reason":"r"}`, http.StatusUnprocessableEntity, "oscillates"},
			{"override on an unmanaged scope", "/v1/overrides", `"0"`, `{"scope":"route:search","scale":0.5,"ttl":"10m","reason":"r"}`, http.StatusUnprocessableEntity, "not managed"},
			{"override ttl too long", "/v1/overrides", `"0"`, `{"scope":"global","scale":0.5,"ttl":"720h","reason":"r"}`, http.StatusBadRequest, "ttl"},
			{"override scale out of range", "/v1/overrides", `"0"`, `{"scope":"global","scale":0,"ttl":"10m","reason":"r"}`, http.StatusBadRequest, "scale"},
		}
		for _, tc := range cases {
			t.Run(tc.name, func(t *testing.T) {
				code, _, body := c.do("PUT", tc.path, sreTok, tc.ifMatch, tc.body)
				require.Equal(t, tc.want, code, "%v", body)
				require.Contains(t, body["detail"], tc.msg)
			})
		}
	})
	require.Zero(t, fl.count(), "invalid changes changed nothing")

	code, h, body = c.do("PUT", "/v1/settings/rules", sreTok, `"0"`, `{"rules":{"cpu_high":{"above":0.9,"clear_below":0.85}},"reason":"INC-42: fleet runs hot by design"}`)
	require.Equal(t, http.StatusOK, code, "%v", body)
	require.Equal(t, `"1"`, h.Get("ETag"))
	require.Equal(t, 0.9, fl.last().Rules.CPUHigh.Above)
	require.Equal(t, 0.7, fl.last().Rules.CPUHigh.Factor, "fields left out keep their values")

	// A second writer still holding version 0 loses.
	code, h, body = c.do("PUT", "/v1/settings/mode", sreTok, `"0"`, `{"dry_run":true,"reason":"try it"}`)
	require.Equal(t, http.StatusPreconditionFailed, code, "%v", body)
	require.Equal(t, `"1"`, h.Get("ETag"))

	// The store itself refuses a stale version even if the API's check raced.
	s1, _, err := store.Get(context.Background())
	require.NoError(t, err)
	stale := s1.Clone()
	stale.Version = 1
	err = store.Put(context.Background(), 0, stale, settings.AuditRecord{ID: "race", At: now, Actor: "bob", Before: []byte("{}"), After: []byte("{}")})
	require.ErrorIs(t, err, settings.ErrConflict)

	code, _, body = c.do("PUT", "/v1/settings/mode", sreTok, `"1"`, `{"dry_run":true,"frozen":true,"reason":"freeze during the migration"}`)
	require.Equal(t, http.StatusOK, code, "%v", body)
	code, _, body = c.do("PUT", "/v1/overrides", sreTok, `"2"`, `{"scope":"tier:ip","scale":0.25,"ttl":"30m","reason":"botnet on /login"}`)
	require.Equal(t, http.StatusOK, code, "%v", body)
	o := fl.last().Overrides["tier:ip"]
	require.Equal(t, 0.25, o.Scale)
	require.Equal(t, now.Add(30*time.Minute), o.ExpiresAt.UTC())
	require.Equal(t, "alice", o.Actor)
	code, _, body = c.do("DELETE", "/v1/overrides", sreTok, `"3"`, `{"scope":"tier:ip","reason":"botnet gone"}`)
	require.Equal(t, http.StatusOK, code, "%v", body)
	require.Equal(t, []int64{1, 2, 3, 4}, fl.versions())

	// Settings survive: a fresh read from DynamoDB has them.
	got, found, err := store.Get(context.Background())
	require.NoError(t, err)
	require.True(t, found)
	require.Equal(t, int64(4), got.Version)
	require.True(t, got.DryRun && got.Frozen)
	require.Equal(t, 0.9, got.Rules.CPUHigh.Above)
	require.Empty(t, got.Overrides)

	// The audit log has who, when, why and before/after for every change, newest first.
	code, _, body = c.do("GET", "/v1/audit?limit=10", viewerTok, "", "")
	require.Equal(t, http.StatusOK, code)
	recs := body["records"].([]any)
	require.Len(t, recs, 4)
	var actions []string
	for _, r := range recs {
		m := r.(map[string]any)
		actions = append(actions, m["action"].(string))
		require.Equal(t, "alice", m["actor"])
		require.Equal(t, RoleSRE, m["role"])
		require.NotEmpty(t, m["reason"])
		wantCorr := "req-put"
		if m["action"] == "override.delete" {
			wantCorr = "req-delete"
		}
		require.Equal(t, wantCorr, m["correlation_id"])
	}
	require.Equal(t, []string{"override.delete", "override.set", "mode.update", "rules.update"}, actions)
	first := recs[3].(map[string]any)
	require.Equal(t, "INC-42: fleet runs hot by design", first["reason"])
	require.Equal(t, 0.85, first["before"].(map[string]any)["rules"].(map[string]any)["cpu_high"].(map[string]any)["above"])
	require.Equal(t, 0.9, first["after"].(map[string]any)["rules"].(map[string]any)["cpu_high"].(map[string]any)["above"])

	// The raw row carries the table's TTL and the actor index keys.
	out, err := store.Client.Query(context.Background(), &dynamodb.QueryInput{
		TableName: aws.String(store.AuditTable), IndexName: aws.String("gsi1"),
		KeyConditionExpression:    aws.String("gsi1pk = :a"),
		ExpressionAttributeValues: map[string]types.AttributeValue{":a": &types.AttributeValueMemberS{Value: "actor#alice"}},
	})
	require.NoError(t, err)
	require.Len(t, out.Items, 4)
	ttl := out.Items[0]["expires_at"].(*types.AttributeValueMemberN).Value
	require.Equal(t, fmt.Sprint(now.Add(settings.AuditRetention).Unix()), ttl)
}

func TestParseTokens(t *testing.T) {
	h := HashToken("secret")
	cases := []struct {
		name, spec, err string
		n               int
	}{
		{"empty", "", "", 0},
		{"two", "a:sre:" + h + ", b:viewer:" + HashToken("other"), "", 2},
		{"one token twice", "a:sre:" + h + ", b:viewer:" + h, "twice", 0},
		{"bad role", "a:admin:" + h, "role", 0},
		{"bad hash", "a:sre:abc", "64 hex", 0},
		{"duplicate name", "a:sre:" + h + ",a:viewer:" + h, "twice", 0},
		{"missing part", "a:" + h, "name:role", 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			toks, err := ParseTokens(tc.spec)
			if tc.err != "" {
				require.ErrorContains(t, err, tc.err)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tc.n, toks.Len())
		})
	}
	toks, _ := ParseTokens("a:sre:" + h)
	who, ok := toks.Lookup("secret")
	require.True(t, ok)
	require.Equal(t, "a", who.Name)
	_, ok = toks.Lookup("Secret")
	require.False(t, ok)
}
