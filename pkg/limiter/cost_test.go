package limiter

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"strconv"
	"testing"

	commonrl "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/floodgate-dev/floodgate/pkg/events"
	"github.com/floodgate-dev/floodgate/pkg/kafkatest"
	"github.com/floodgate-dev/floodgate/pkg/redisx"
	"github.com/floodgate-dev/floodgate/pkg/redisx/redistest"
)

// costRules: a bot rule at the default cap, a route whose rule allows large
// costs (exports weigh their rows), a user quota with its own cap.
const costRules = `version: 1
defaults:
  max_cost: 500
costs:
  - {method: POST, route: /imports, cost: 10}
rules:
  - {id: bots, tier: principal, kinds: [bot], limit: 100000, period: 1h}
  - {id: users, tier: principal, kinds: [user], limit: 100000, period: 1h, max_cost: 5000}
  - {id: exports, tier: endpoint, kinds: [user], method: GET, route: /exports, limit: 1000000, period: 1h, max_cost: 1000000}
quotas:
  - {kind: user, limit: 9000000, max_cost: 20000}
`

// TestSecurityCostCappedPerRuleS3 replays finding S3 of issue 22 at the
// limiter: a check with cost 1,000,000 naming a victim. On main the per-caller
// cap was the only bound (none without tokens), so one check could charge a
// rule and the day quota 1,000,000 units. Now every rule and quota has a
// max_cost: the check is refused with a 400 problem (cost-over-limit),
// nothing is counted in Redis and no decision event is published.
func TestSecurityCostCappedPerRuleS3(t *testing.T) {
	srv, pub := newTestServerRules(t, costRules, nil)
	victim := redistest.Unique(t, "victim")
	body := func(kind, route string, cost int) string {
		return `{"principal":{"kind":"` + kind + `","id":"` + victim + `"},"ip":"203.0.113.7","method":"GET","route":"` + route + `","cost":` + strconv.Itoa(cost) + `}`
	}
	resp, b := post(t, srv.URL, body("bot", "/messages", 1_000_000), map[string]string{"X-Request-Id": "s3-attack"})
	require.Equal(t, http.StatusBadRequest, resp.StatusCode, string(b))
	require.Equal(t, "application/problem+json", resp.Header.Get("Content-Type"))
	require.Equal(t, "s3-attack", resp.Header.Get("X-Request-Id"))
	var p Problem
	require.NoError(t, json.Unmarshal(b, &p))
	require.Equal(t, ProblemCostOverLimit, p.Type)
	require.Equal(t, http.StatusBadRequest, p.Status)
	require.Equal(t, "cost 1000000 is over the max_cost 500 of rule bots", p.Detail)
	require.Equal(t, "s3-attack", p.CorrelationID)
	require.Empty(t, pub.Messages(), "a refused check publishes no decision event")
	n, err := redistest.Client(t).Exists(context.Background(), redisx.BucketKey("bot", victim, "bots|tb")).Result()
	require.NoError(t, err)
	require.Zero(t, n, "and counts nothing: the victim's bucket was never touched")

	// The victim's own traffic is untouched: a check at the cap is decided.
	resp, b = post(t, srv.URL, body("bot", "/messages", 500), nil)
	require.Equal(t, http.StatusOK, resp.StatusCode, string(b))
	var ok CheckResponse
	require.NoError(t, json.Unmarshal(b, &ok))
	require.True(t, ok.Allowed)
	require.Equal(t, 100000-500, ok.Remaining, "the refused check took nothing")
	n, err = redistest.Client(t).Exists(context.Background(), redisx.BucketKey("bot", victim, "bots|tb")).Result()
	require.NoError(t, err)
	require.Equal(t, int64(1), n, "the key the refused check would have written (so its absence above meant something)")

	for _, tc := range []struct {
		name, kind, method, route string
		cost                      int
		detail                    string // "" = decided
	}{
		{"a rule's own cap", "user", "GET", "/messages", 5001, "cost 5001 is over the max_cost 5000 of rule users"},
		{"every matching rule's cap applies", "user", "GET", "/exports", 6000, "cost 6000 is over the max_cost 5000 of rule users"},
		{"under every cap", "user", "GET", "/exports", 5000, ""},
		{"the route's cost counts", "bot", "POST", "/imports", 51, "cost 510 (51 × the route's cost 10) is over the max_cost 500 of rule bots"},
		{"no rule matches: the default cap", "api_key", "GET", "/messages", 501, "cost 501 is over the max_cost 500 of the rules (defaults.max_cost: no rule or quota matches)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := `{"principal":{"kind":"` + tc.kind + `","id":"` + redistest.Unique(t, "p") + `"},"ip":"203.0.113.7","method":"` + tc.method + `","route":"` + tc.route + `","cost":` + strconv.Itoa(tc.cost) + `}`
			resp, out := post(t, srv.URL, b, nil)
			if tc.detail == "" {
				require.Equal(t, http.StatusOK, resp.StatusCode, string(out))
				return
			}
			require.Equal(t, http.StatusBadRequest, resp.StatusCode, string(out))
			var p Problem
			require.NoError(t, json.Unmarshal(out, &p))
			require.Equal(t, ProblemCostOverLimit, p.Type)
			require.Equal(t, tc.detail, p.Detail)
		})
	}

	t.Run("batch: the over-cost check alone is refused", func(t *testing.T) {
		resp, out := postPath(t, srv.URL+"/v1/check/batch", `{"checks":[`+body("bot", "/messages", 1)+`,`+body("bot", "/messages", 1_000_000)+`]}`)
		require.Equal(t, http.StatusOK, resp.StatusCode, string(out))
		var br struct {
			Results []struct {
				Status int      `json:"status"`
				Error  *Problem `json:"error"`
			} `json:"results"`
		}
		require.NoError(t, json.Unmarshal(out, &br))
		require.Len(t, br.Results, 2)
		require.Equal(t, http.StatusOK, br.Results[0].Status)
		require.Equal(t, http.StatusBadRequest, br.Results[1].Status)
		require.Equal(t, ProblemCostOverLimit, br.Results[1].Error.Type)
	})
}

// TestSecurityEnvoyCostOverTheCapS3: over Envoy's API an over-cost descriptor
// is answered OVER_LIMIT with a cost-over-limit problem and nothing counted —
// an error would make Envoy fail open and let the request through.
func TestSecurityEnvoyCostOverTheCapS3(t *testing.T) {
	rdb := redistest.Client(t)
	e := newTestEngine(t, rdb, costRules, nil)
	pub := &kafkatest.Capture{}
	s := NewServer(ServerConfig{Engine: e, Publisher: pub, Topic: "decisions", Gateway: "test",
		Logger: slog.New(slog.DiscardHandler), Registry: prometheus.NewRegistry()})
	rls := NewEnvoyRLS(s)
	victim := redistest.Unique(t, "victim")
	entries := []*commonrl.RateLimitDescriptor_Entry{
		{Key: KeyPrincipalKind, Value: "bot"}, {Key: KeyPrincipalID, Value: victim}, {Key: KeyRemoteAddress, Value: "203.0.113.7"},
		{Key: KeyMethod, Value: "GET"}, {Key: KeyRoute, Value: "/messages"},
	}
	out, err := rls.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "floodgate", HitsAddend: 1_000_000,
		Descriptors: []*commonrl.RateLimitDescriptor{{Entries: entries}}})
	require.NoError(t, err)
	require.Equal(t, rlsv3.RateLimitResponse_OVER_LIMIT, out.OverallCode)
	var p Problem
	require.NoError(t, json.Unmarshal(out.RawBody, &p))
	require.Equal(t, ProblemCostOverLimit, p.Type)
	require.Contains(t, p.Detail, "over the max_cost 500 of rule bots")
	require.Empty(t, pub.Messages())
	n, err := rdb.Exists(context.Background(), redisx.BucketKey("bot", victim, "bots|tb")).Result()
	require.NoError(t, err)
	require.Zero(t, n)
}

func TestMaxCostRulesFile(t *testing.T) {
	schema := compileRulesSchema(t)
	t.Run("defaults", func(t *testing.T) {
		rs, err := ParseRules("test.yaml", []byte("version: 1\nrules:\n  - {id: a, tier: ip, limit: 5, period: 1s}\nquotas:\n  - {kind: bot, limit: 5}\n"))
		require.NoError(t, err)
		require.Equal(t, events.DefaultMaxCost, rs.MaxCost)
		require.Equal(t, events.DefaultMaxCost, rs.Rule("a").MaxCost)
		require.Equal(t, events.DefaultMaxCost, rs.Quotas[0].MaxCost)
		rs, err = ParseRules("test.yaml", []byte(costRules))
		require.NoError(t, err)
		require.NoError(t, schemaValidate(t, schema, []byte(costRules)))
		require.Equal(t, 500, rs.Rule("bots").MaxCost, "defaults.max_cost")
		require.Equal(t, 5000, rs.Rule("users").MaxCost)
		require.Equal(t, 20000, rs.Quotas[0].MaxCost)
		require.Equal(t, int64(500), rs.minMaxCost)
	})
	requireRejected(t, []rejected{
		{"zero", "version: 1\nrules:\n  - id: a\n    tier: ip\n    limit: 5\n    period: 1s\n    max_cost: 0\n", "test.yaml:7: rules[0] (a).max_cost: 0: must be in 1..1000000", true},
		{"above the API's bound", "version: 1\ndefaults:\n  max_cost: 2000000\nrules:\n  - {id: a, tier: ip, limit: 5, period: 1s}\n", "test.yaml:3: defaults.max_cost: 2000000: must be in 1..1000000", true},
		{"a quota's", "version: 1\nquotas:\n  - {kind: bot, limit: 5, max_cost: -1}\n", "test.yaml:3: quotas[0].max_cost: -1: must be in 1..1000000", true},
		{"a route cost no rule admits", "version: 1\ncosts:\n  - {method: GET, route: /big, cost: 20000}\nrules:\n  - {id: a, tier: principal, limit: 5, period: 1s}\n",
			"test.yaml:3: costs[0].cost: 20000 is over max_cost 10000 of rule a (line 5): every request on GET /big would be refused", false}, // the schema cannot relate costs to rules
		{"a route cost a quota refuses", "version: 1\ncosts:\n  - {method: GET, route: /big, cost: 600}\nquotas:\n  - {kind: bot, limit: 5, max_cost: 500}\n",
			"costs[0].cost: 600 is over max_cost 500 of quota quota-bot-default (line 5)", false},
	})
	t.Run("a route cost other routes' rules do not count", func(t *testing.T) {
		_, err := ParseRules("test.yaml", []byte("version: 1\ncosts:\n  - {method: GET, route: /big, cost: 20000}\nrules:\n  - {id: a, tier: endpoint, method: GET, route: /small, limit: 5, period: 1s}\n"))
		require.NoError(t, err)
	})
	t.Run("the cost error names what it is over", func(t *testing.T) {
		rs, err := ParseRules("test.yaml", []byte(costRules))
		require.NoError(t, err)
		err = rs.checkCost(events.PrincipalUser, DefaultPlan, "GET", "/x", "", true, 30000, 30000, false)
		var ce *CostError
		require.True(t, errors.As(err, &ce))
		require.Equal(t, "users", ce.Scope, "the first matching rule over its cap")
		err = rs.checkCost(events.PrincipalUser, DefaultPlan, "GET", "/exports", "", true, 4000, 4000, false)
		require.NoError(t, err)
		require.NoError(t, rs.checkCost(events.PrincipalBot, DefaultPlan, "GET", "/x", "", true, 500, 500, false), "at the cap")
	})
}
