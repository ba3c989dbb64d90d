package limiter

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

const deferRules = `version: 1
rules:
  - id: orders
    tier: endpoint
    method: POST
    route: /orders
    limit: 100
    period: 1s
    on_limit: defer
    defer:
      max_age: 2m
      max_queued: {principal: 500, route: 20000}
      max_body: 4096
      headers: [content-type, X-Request-Id]
  - {id: reads, tier: endpoint, method: GET, route: /orders, limit: 10, period: 1s}
`

func TestDeferralParses(t *testing.T) {
	schema := compileRulesSchema(t)
	rs, err := ParseRules("test.yaml", []byte(deferRules))
	require.NoError(t, err)
	require.NoError(t, schemaValidate(t, schema, []byte(deferRules)))
	d := rs.Deferral("POST", "/orders")
	require.NotNil(t, d)
	require.Equal(t, &DeferPolicy{RuleID: "orders", Method: "POST", Route: "/orders", MaxAge: 2 * time.Minute,
		MaxQueuedPrincipal: 500, MaxQueuedRoute: 20000, MaxBody: 4096, Headers: []string{"Content-Type", "X-Request-Id"}}, d)
	require.Same(t, d, rs.Rule("orders").Defer)
	require.Nil(t, rs.Deferral("GET", "/orders"), "a rule without on_limit rejects")
	require.Len(t, rs.Deferrals(), 1)

	t.Run("defaults", func(t *testing.T) {
		doc := "version: 1\nrules:\n  - {id: o, tier: endpoint, method: POST, route: /o, limit: 1, period: 1s, on_limit: defer, defer: {max_age: 30s}}\n"
		rs, err := ParseRules("test.yaml", []byte(doc))
		require.NoError(t, err)
		require.NoError(t, schemaValidate(t, schema, []byte(doc)))
		d := rs.Deferral("POST", "/o")
		require.Equal(t, DefaultDeferBody, d.MaxBody)
		require.Equal(t, DefaultDeferPrincipal, d.MaxQueuedPrincipal)
		require.Equal(t, DefaultDeferRoute, d.MaxQueuedRoute)
		require.Empty(t, d.Headers)
	})
}

func TestDeferralRejectsWithFileAndLine(t *testing.T) {
	const head = "version: 1\nrules:\n  - id: o\n    tier: endpoint\n    method: POST\n    route: /o\n    limit: 1\n    period: 1s\n"
	requireRejected(t, []rejected{
		{"unknown on_limit", head + "    on_limit: queue\n", `test.yaml:9: rules[0] (o).on_limit: "queue": want one of reject|defer`, true},
		{"defer without a block", head + "    on_limit: defer\n", "rules[0] (o).defer: required with on_limit: defer", true},
		{"block without defer", head + "    defer: {max_age: 1m}\n", "test.yaml:9: rules[0] (o).defer: only a rule with on_limit: defer", true},
		{"no max_age", head + "    on_limit: defer\n    defer: {max_body: 10}\n", "rules[0] (o).defer.max_age: required", true},
		{"max_age too long", head + "    on_limit: defer\n    defer: {max_age: 48h}\n", "test.yaml:10: rules[0] (o).defer.max_age: 48h0m0s: must be in 1s..24h", false},
		{"bad max_age", head + "    on_limit: defer\n    defer: {max_age: soon}\n", `defer.max_age: "soon": want a duration`, true},
		{"body too large", head + "    on_limit: defer\n    defer: {max_age: 1m, max_body: 1000000}\n", "defer.max_body: 1000000: must be in 0..131072", true},
		{"principal over route", head + "    on_limit: defer\n    defer: {max_age: 1m, max_queued: {principal: 10, route: 5}}\n", "principal (10) must not exceed route (5)", false},
		{"queue zero", head + "    on_limit: defer\n    defer: {max_age: 1m, max_queued: {route: -1}}\n", "defer.max_queued.route: -1: must be in 1..10000000", true},
		{"credential header", head + "    on_limit: defer\n    defer: {max_age: 1m, headers: [Authorization]}\n", `"Authorization" carries credentials`, false},
		{"cookie header", head + "    on_limit: defer\n    defer: {max_age: 1m, headers: [cookie]}\n", `"cookie" carries credentials`, false},
		{"api key header", head + "    on_limit: defer\n    defer: {max_age: 1m, headers: [X-API-Key]}\n", `"X-API-Key" carries credentials`, false},
		{"bad header name", head + "    on_limit: defer\n    defer: {max_age: 1m, headers: [\"a b\"]}\n", `"a b": not a header name`, true},
		{"unknown defer key", head + "    on_limit: defer\n    defer: {max_age: 1m, ttl: 1m}\n", `test.yaml:10: rules[].defer: unknown key "ttl"`, true},
		{"principal tier", "version: 1\nrules:\n  - {id: p, tier: principal, limit: 1, period: 1s, on_limit: defer, defer: {max_age: 1m}}\n",
			"only endpoint and resource rules defer", true},
		{"route deferred twice", "version: 1\nrules:\n  - {id: a, tier: endpoint, method: POST, route: /o, limit: 1, period: 1s, on_limit: defer, defer: {max_age: 1m}}\n" +
			"  - {id: b, tier: endpoint, method: POST, route: /o, limit: 5, period: 1m, on_limit: defer, defer: {max_age: 1m}}\n",
			"test.yaml:4: rules[1] (b).on_limit: POST /o is already deferred by rule a", false},
	})
}

func TestCredentialHeader(t *testing.T) {
	for _, h := range []string{"Authorization", "authorization", "Cookie", "X-Api-Key", "X-Session-Id", "X-Amz-Security-Token", "X-Floodgate-Principal", "Idempotency-Key", "Host"} {
		require.True(t, CredentialHeader(h), h)
	}
	for _, h := range []string{"Content-Type", "Accept", "X-Request-Id", "User-Agent"} {
		require.False(t, CredentialHeader(h), h)
	}
}
