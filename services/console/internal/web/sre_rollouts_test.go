package web

import (
	"context"
	"html"
	"net/http"
	"net/url"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/require"

	"github.com/floodgate-dev/floodgate/pkg/dynamo"
	"github.com/floodgate-dev/floodgate/pkg/redisx"
	"github.com/floodgate-dev/floodgate/pkg/rollout"
	"github.com/floodgate-dev/floodgate/pkg/rollout/rollouttest"
	"github.com/floodgate-dev/floodgate/pkg/whatif"
)

const (
	rolloutV1 = "version: 1\nrules:\n  - {id: bots, tier: principal, kinds: [bot], limit: 100, period: 1s}\n"
	rolloutV2 = "version: 1\nrules:\n  - {id: bots, tier: principal, kinds: [bot], limit: 1, period: 1h}\n"
)

// TestRollouts: the rule rollouts page on the real broker, Redis and
// DynamoDB Local — an SRE starts a rollout (the limiter's parser refuses bad
// rules), everyone sees the diff against the enforced rules and the live
// impact the limiters counted, viewers cannot act, and the SRE's abort and
// rollback are audited with who, the role and why.
func TestRollouts(t *testing.T) {
	topic, name := rollouttest.OpenTopic(t)
	var audit *rollout.DynamoAudit
	var claims *rollout.DynamoClaims
	_, decisions := rollouttest.Topic(t) // no decision recorded: the first gate replays nothing
	e := newEnvWith(t, func(cfg *Config, prefix string) {
		audit = &rollout.DynamoAudit{Table: prefix + dynamo.TableAuditLog}
		claims = &rollout.DynamoClaims{Table: prefix + dynamo.TableAuditLog}
		cfg.Rollouts = &Rollouts{Operator: &rollout.Operator{Topic: topic, Audit: audit, Claims: claims, Validate: ValidateRules}, Audit: audit}
		cfg.WhatIf = &WhatIf{Timeout: 20 * time.Second,
			Source: &whatif.Source{Client: &kafka.Client{Addr: kafka.TCP(rollouttest.Brokers()...), Timeout: 5 * time.Second}, Topic: decisions, MaxEvents: 1000}}
	})
	audit.Client, claims.Client = e.ddb, e.ddb
	e.web.cfg.Rollouts.Redis = e.rdb
	e.web.cfg.WhatIf.Redis = e.rdb
	ctx := context.Background()
	t.Cleanup(func() { e.rdb.Del(ctx, redisx.RulesImpactKey(name, 2), redisx.RulesImpactKey(name, 3)) })

	sre := e.signedIn(t, "sre1")
	code, body := sre.get("/sre/rollouts")
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, body, "No version on the topic yet")
	_, err := e.web.cfg.Rollouts.Operator.Bootstrap(ctx, rolloutV1, rollout.Actor{Name: "alice", Reason: "first", Via: "cli"})
	require.NoError(t, err)

	start := func(rules, reason string) (*http.Response, string) {
		return sre.post("/sre/rollouts", url.Values{"csrf": {sre.csrf("/sre/rollouts")}, "rules": {rules}, "reason": {reason},
			"shadow": {"5m"}, "max_block": {"5"}, "min_critical": {"10"}})
	}
	res, body := start("version: 1\nrules:\n  - {id: bots, tier: nowhere, limit: 1, period: 1h}\n", "typo")
	require.Equal(t, http.StatusUnprocessableEntity, res.StatusCode)
	require.Contains(t, html.UnescapeString(body), `candidate:3: rules[0] (bots).tier: "nowhere"`)
	res, _ = start(rolloutV2, "")
	require.Equal(t, http.StatusUnprocessableEntity, res.StatusCode, "a reason is required")
	res, body = sre.post("/sre/rollouts", url.Values{"csrf": {sre.csrf("/sre/rollouts")}, "rules": {rolloutV2}, "reason": {"r"}, "steps": {"1,50"}})
	require.Equal(t, http.StatusUnprocessableEntity, res.StatusCode)
	require.Contains(t, html.UnescapeString(body), "the last step must be 100")
	res, body = sre.post("/sre/rollouts", url.Values{"csrf": {sre.csrf("/sre/rollouts")}, "rules": {rolloutV2}, "reason": {"r"}, "whatif": {"forever"}})
	require.Equal(t, http.StatusUnprocessableEntity, res.StatusCode)
	require.Contains(t, html.UnescapeString(body), "whatif: a duration")
	res, body = start(rolloutV2, "INC-77 one an hour")
	require.Equal(t, http.StatusSeeOther, res.StatusCode, body)

	// The limiters counted: 12 of 40 CRITICAL decisions would be blocked.
	key := redisx.RulesImpactKey(name, 2)
	require.NoError(t, e.rdb.HSet(ctx, key, "shadow:critical:total", 40, "shadow:critical:blocked", 12, "shadow:bulk:total", 7).Err())
	// And, paired with the parent's answers by class: 953 of 1200 best_effort
	// bot decisions would be blocked, against the parent's 2.
	bots := rollout.FullClass{Priority: "best_effort", Kind: "bot", Plan: "pro", Route: "/channels/{id}/messages"}
	require.NoError(t, e.rdb.HSet(ctx, key, rollout.ImpactClassField("n", bots), 1200, rollout.ImpactClassField("cand", bots), 953,
		rollout.ImpactClassField("parent", bots), 2).Err())
	viewer := e.signedIn(t, "viewer1")
	code, body = viewer.get("/sre/rollouts")
	require.Equal(t, http.StatusOK, code)
	body = html.UnescapeString(body)
	require.Contains(t, body, "Version <strong>2</strong> in shadow")
	require.Contains(t, body, "First gate, the what-if on recorded traffic: <strong>what-if over the last 10m: review, confidence low, 0 decisions replayed</strong>",
		"the first gate ran on the console and its verdict is on the record")
	require.Contains(t, body, `<li data-state="next">Step 1: 1 % of principals</li>`, "the default steps")
	require.Contains(t, body, `<span class="del">-  - {id: bots, tier: principal, kinds: [bot], limit: 100, period: 1s}</span>`)
	require.Contains(t, body, `<span class="add">+  - {id: bots, tier: principal, kinds: [bot], limit: 1, period: 1h}</span>`)
	require.Contains(t, body, `<tr><td>critical</td><td>40</td><td>12</td><td class="over">30.0 %</td></tr>`)
	require.Contains(t, body, `<tr><td>bulk</td><td>7</td><td>0</td><td>0.0 %</td></tr>`)
	require.Contains(t, body, `<tr data-class="kind=bot" data-verdict="harm"><td><code>kind=bot</code></td><td>1200</td><td>79.4 %</td><td>0.2 %</td><td>79.2 %</td><td>5.0 %</td><td>0.0 %</td><td class="over">harm</td>`,
		"the class a non-critical harm hides in, against its parent")
	require.Contains(t, body, `id="candidate-confidence">0.0 %</span>`)
	require.NotContains(t, body, `id="abort-form"`, "viewers see no actions")
	res, _ = viewer.post("/sre/rollouts/abort", url.Values{"csrf": {viewer.csrf("/sre/rollouts")}, "reason": {"no"}})
	require.Equal(t, http.StatusForbidden, res.StatusCode)

	res, _ = start(rolloutV2, "again")
	require.Equal(t, http.StatusConflict, res.StatusCode, "one rollout at a time")
	res, body = sre.post("/sre/rollouts/abort", url.Values{"csrf": {sre.csrf("/sre/rollouts")}, "reason": {"blocks CRITICAL"}})
	require.Equal(t, http.StatusSeeOther, res.StatusCode, body)
	res, _ = sre.post("/sre/rollouts/abort", url.Values{"csrf": {sre.csrf("/sre/rollouts")}, "reason": {"twice"}})
	require.Equal(t, http.StatusConflict, res.StatusCode, "nothing left to abort")
	res, _ = sre.post("/sre/rollouts/rollback", url.Values{"csrf": {sre.csrf("/sre/rollouts")}, "reason": {"x"}})
	require.Equal(t, http.StatusConflict, res.StatusCode, "a bootstrap has no parent")

	st, err := topic.Read(ctx)
	require.NoError(t, err)
	v2, _ := st.Version(2)
	require.Equal(t, "rolled_back", string(v2.State))
	require.Equal(t, "sre1", v2.Author)
	hist, err := audit.History(ctx, 10)
	require.NoError(t, err)
	require.Len(t, hist, 3)
	require.Equal(t, rollout.ActionAbort, hist[0].Action)
	require.Equal(t, "sre1", hist[0].Actor)
	require.Equal(t, "sre", hist[0].Role)
	require.Equal(t, "console", hist[0].Via)
	require.Equal(t, "blocks CRITICAL", hist[0].Reason)
	require.Equal(t, rollout.ActionPropose, hist[1].Action)
	code, body = sre.get("/sre/rollouts")
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, body, "No rollout in progress.")
	require.Contains(t, body, `id="rollout-form"`)
	require.Contains(t, body, "<td>2</td><td>rolled back</td>")
}
