package limiter

import (
	"errors"
	"os"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/floodgate-dev/floodgate/pkg/events"
)

// costRules: a bot rule at the default cap, a route whose rule allows large
// costs, a user quota with its own cap (shared with the server's and envoy's
// cost tests).
var costRules = mustRead("limitertest/testdata/cost-rules.yaml")

// mustRead is a test fixture's text.
func mustRead(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		panic(err)
	}
	return string(b)
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
