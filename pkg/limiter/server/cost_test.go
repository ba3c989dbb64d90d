package server

import (
	"context"
	"encoding/json"
	"net/http"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/floodgate-dev/floodgate/pkg/httpapi"
	"github.com/floodgate-dev/floodgate/pkg/limiter/checkapi"
	"github.com/floodgate-dev/floodgate/pkg/limiter/limitertest"
	"github.com/floodgate-dev/floodgate/pkg/redisx"
	"github.com/floodgate-dev/floodgate/pkg/redisx/redistest"
)

// TestSecurityCostCappedPerRuleS3 replays finding S3 of issue 22 at the
// limiter: a check with cost 1,000,000 naming a victim. On main the per-caller
// cap was the only bound (none without tokens), so one check could charge a
// rule and the day quota 1,000,000 units. Now every rule and quota has a
// max_cost: the check is refused with a 400 problem (cost-over-limit),
// nothing is counted in Redis and no decision event is published.
func TestSecurityCostCappedPerRuleS3(t *testing.T) {
	forTransports(t, func(t *testing.T, tr string) {
		srv, pub := newTestServerRules(t, tr, limitertest.CostRules(), nil)
		victim := redistest.Unique(t, "victim")
		body := func(kind, route string, cost int) string {
			return `{"principal":{"kind":"` + kind + `","id":"` + victim + `"},"ip":"203.0.113.7","method":"GET","route":"` + route + `","cost":` + strconv.Itoa(cost) + `}`
		}
		resp, b := limitertest.Post(t, srv.URL, body("bot", "/messages", 1_000_000), map[string]string{"X-Request-Id": "s3-attack"})
		require.Equal(t, http.StatusBadRequest, resp.StatusCode, string(b))
		require.Equal(t, "application/problem+json", resp.Header.Get("Content-Type"))
		require.Equal(t, "s3-attack", resp.Header.Get("X-Request-Id"))
		var p httpapi.Problem
		require.NoError(t, json.Unmarshal(b, &p))
		require.Equal(t, httpapi.ProblemCostOverLimit, p.Type)
		require.Equal(t, http.StatusBadRequest, p.Status)
		require.Equal(t, "cost 1000000 is over the max_cost 500 of rule bots", p.Detail)
		require.Equal(t, "s3-attack", p.CorrelationID)
		require.Empty(t, pub.Messages(), "a refused check publishes no decision event")
		n, err := redistest.Client(t).Exists(context.Background(), redisx.BucketKey("bot", victim, "bots|tb")).Result()
		require.NoError(t, err)
		require.Zero(t, n, "and counts nothing: the victim's bucket was never touched")

		// The victim's own traffic is untouched: a check at the cap is decided.
		resp, b = limitertest.Post(t, srv.URL, body("bot", "/messages", 500), nil)
		require.Equal(t, http.StatusOK, resp.StatusCode, string(b))
		var ok checkapi.CheckResponse
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
				resp, out := limitertest.Post(t, srv.URL, b, nil)
				if tc.detail == "" {
					require.Equal(t, http.StatusOK, resp.StatusCode, string(out))
					return
				}
				require.Equal(t, http.StatusBadRequest, resp.StatusCode, string(out))
				var p httpapi.Problem
				require.NoError(t, json.Unmarshal(out, &p))
				require.Equal(t, httpapi.ProblemCostOverLimit, p.Type)
				require.Equal(t, tc.detail, p.Detail)
			})
		}

		t.Run("batch: the over-cost check alone is refused", func(t *testing.T) {
			resp, out := postPath(t, srv.URL+"/v1/check/batch", `{"checks":[`+body("bot", "/messages", 1)+`,`+body("bot", "/messages", 1_000_000)+`]}`)
			require.Equal(t, http.StatusOK, resp.StatusCode, string(out))
			var br struct {
				Results []struct {
					Status int              `json:"status"`
					Error  *httpapi.Problem `json:"error"`
				} `json:"results"`
			}
			require.NoError(t, json.Unmarshal(out, &br))
			require.Len(t, br.Results, 2)
			require.Equal(t, http.StatusOK, br.Results[0].Status)
			require.Equal(t, http.StatusBadRequest, br.Results[1].Status)
			require.Equal(t, httpapi.ProblemCostOverLimit, br.Results[1].Error.Type)
		})
	})
}
