package server

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/floodgate-dev/floodgate/pkg/events"
	"github.com/floodgate-dev/floodgate/pkg/httpapi"
	"github.com/floodgate-dev/floodgate/pkg/kafkatest"
	"github.com/floodgate-dev/floodgate/pkg/limiter/admission"
	"github.com/floodgate-dev/floodgate/pkg/limiter/checkapi"
	"github.com/floodgate-dev/floodgate/pkg/limiter/limitertest"
	"github.com/floodgate-dev/floodgate/pkg/redisx/redistest"
)

// TestCheckAnswersAShedRequest: over HTTP a shed check is a decision like any
// other (200 from the limiter) whose contract tells the gateway to answer 503
// with the reduced-capacity problem, Retry-After and the utilization status; an
// unknown priority is a 400.
func TestCheckAnswersAShedRequest(t *testing.T) {
	ctx := context.Background()
	rdb := redistest.Client(t)
	e := limitertest.Engine(t, rdb, limitertest.PrioRules(), nil)
	obs, pub := &scopeRecorder{}, &kafkatest.Capture{}
	s := New(Config{Engine: e, Publisher: pub, Observer: obs, Topic: "decisions", Gateway: "test",
		Logger: slog.New(slog.DiscardHandler), Registry: prometheus.NewRegistry()})
	s.SetReady(true)
	srv := httptest.NewServer(s.Handler())
	t.Cleanup(srv.Close)
	require.NoError(t, rdb.HSet(ctx, e.Runtime().ShedKey, "level", 2, "retry_after_ms", 2200).Err())
	require.NoError(t, e.Runtime().Refresh(ctx))

	body := func(prio string) string {
		return `{"principal":{"kind":"bot","id":"` + redistest.Unique(t, "b") + `"},"ip":"192.0.2.1","method":"GET","route":"/v1/other"` + prio + `}`
	}
	resp, b := limitertest.Post(t, srv.URL, body(`,"priority":"best_effort"`), nil)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	var got checkapi.CheckResponse
	require.NoError(t, json.Unmarshal(b, &got))
	require.False(t, got.Allowed)
	require.True(t, got.Shed)
	require.Equal(t, "best_effort", got.Priority)
	require.Equal(t, admission.StatusDegraded, got.Utilization)
	require.Equal(t, map[string]string{"Retry-After": "3", "X-Floodgate-Priority": "best_effort", "X-Floodgate-Utilization": admission.StatusDegraded,
		"X-Request-Id": got.Headers["X-Request-Id"]}, got.Headers)
	require.NotNil(t, got.Problem)
	require.Equal(t, 503, got.Problem.Status)
	require.Equal(t, httpapi.ProblemReducedCapacity, got.Problem.Type)
	require.Equal(t, admission.StatusDegraded, got.Problem.UtilizationStatus)

	require.Equal(t, []string{"shed:best_effort"}, obs.scopes, "InfluxDB counts shed requests by priority")
	require.Len(t, pub.Messages(), 1)
	ev, err := events.DecodeDecision(pub.Messages()[0].Value)
	require.NoError(t, err)
	require.True(t, ev.Shed, "the decision event says it was shed, so consumers do not count it as the principal's excess")
	require.Equal(t, events.PriorityBestEffort, ev.Priority)
	require.False(t, ev.Allowed)

	_, b = limitertest.Post(t, srv.URL, body(`,"priority":"critical"`), nil)
	require.NoError(t, json.Unmarshal(b, &got))
	require.True(t, got.Allowed, "critical is served")
	ev, err = events.DecodeDecision(pub.Messages()[1].Value)
	require.NoError(t, err)
	require.False(t, ev.Shed)
	require.Equal(t, events.PriorityCritical, ev.Priority)
	require.Equal(t, admission.StatusDegraded, got.Utilization)

	resp, b = limitertest.Post(t, srv.URL, body(`,"priority":"urgent"`), nil)
	require.Equal(t, http.StatusBadRequest, resp.StatusCode)
	require.Contains(t, string(b), "priority")
}

type scopeRecorder struct{ scopes []string }

func (r *scopeRecorder) Observe(scope string, _ events.Tier, allowed, _ bool) {
	if !allowed {
		r.scopes = append(r.scopes, scope)
	}
}
