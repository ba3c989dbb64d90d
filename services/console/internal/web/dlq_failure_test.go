package web

import (
	"net/http"
	"net/http/httptest"
	"net/url"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/floodgate-dev/floodgate/pkg/httpapi"
	"github.com/floodgate-dev/floodgate/pkg/promtest"
	"github.com/floodgate-dev/floodgate/services/console/internal/dlq"
	"github.com/floodgate-dev/floodgate/services/console/internal/store"
)

// TestDeadLetterActionsWhenTheAuditorFails: an auditor that answers a
// replay or a purge with a 5xx problem did not refuse it — it failed,
// perhaps halfway — so both actions answer 502 (Bad Gateway) saying so,
// counted as errors, not as the refusals a 4xx is.
func TestDeadLetterActionsWhenTheAuditorFails(t *testing.T) {
	auditor := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		httpapi.WriteProblem(w, r, httpapi.Problem{Type: httpapi.ProblemInternal, Status: http.StatusInternalServerError, Detail: "dynamodb: throttled"})
	}))
	t.Cleanup(auditor.Close)
	var reg *prometheus.Registry
	e := newEnvWith(t, func(cfg *Config, _ string) {
		c, err := dlq.New(auditor.URL, "fgdlq_test", nil)
		require.NoError(t, err)
		cfg.DLQ = c
		reg = prometheus.NewRegistry()
		cfg.Registry = reg
	})
	sre := e.signedIn(t, "sre1")
	csrf := sre.csrf("/alerts") // the dlq page itself answers 502 while the auditor fails
	for _, tc := range []struct{ path, action, says string }{
		{"/sre/dlq/replay", store.ActionDLQReplay, "the replay may have run in part"},
		{"/sre/dlq/purge", actionDLQPurge, "some records may have been purged"},
	} {
		t.Run(tc.path, func(t *testing.T) {
			res, body := sre.post(tc.path, url.Values{"csrf": {csrf}, "id": {"floodgate.decisions.v1.dlq:0:1"},
				"reason": {"INC-9"}, "confirm": {"yes"}})
			require.Equal(t, http.StatusBadGateway, res.StatusCode, body)
			require.Contains(t, body, tc.says)
			require.NotContains(t, body, "refused")
			require.Equal(t, 1.0, promtest.Value(t, reg, "floodgate_console_actions_total", map[string]string{"action": tc.action, "outcome": "error"}))
			require.Zero(t, promtest.Value(t, reg, "floodgate_console_actions_total", map[string]string{"action": tc.action, "outcome": "refused"}))
		})
	}
}
