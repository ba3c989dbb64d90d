package limiter

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/floodgate-dev/floodgate/pkg/events"
	"github.com/floodgate-dev/floodgate/pkg/kafkatest"
	"github.com/floodgate-dev/floodgate/pkg/redisx/redistest"
)

func TestSheddingOrder(t *testing.T) {
	want := map[int][]Priority{ // shed at each level
		0: nil,
		1: {PriorityBulk},
		2: {PriorityBestEffort, PriorityBulk},
		3: {PriorityDegraded, PriorityBestEffort, PriorityBulk},
	}
	for level, shed := range want {
		s := Shedding{Level: level}
		for p := PriorityCritical; p <= PriorityBulk; p++ {
			require.Equal(t, contains(shed, p), s.Sheds(p), "level %d, %s", level, p)
		}
	}
	require.Equal(t, StatusNormal, Shedding{}.Status())
	require.Equal(t, StatusDegraded, Shedding{Level: 2}.Status())
	require.Equal(t, StatusCritical, Shedding{Level: 3}.Status())
}

func contains(ps []Priority, p Priority) bool {
	for _, q := range ps {
		if q == p {
			return true
		}
	}
	return false
}

func TestParsePriorityAndShedding(t *testing.T) {
	for i, n := range []string{"critical", "degraded", "best_effort", "bulk"} {
		p, err := ParsePriority(n)
		require.NoError(t, err)
		require.Equal(t, Priority(i+1), p)
		require.Equal(t, n, p.String())
	}
	_, err := ParsePriority("CRITICAL")
	require.ErrorContains(t, err, "critical|degraded|best_effort|bulk")

	s, err := ParseShedding(map[string]string{})
	require.NoError(t, err)
	require.Equal(t, Shedding{RetryAfter: defaultShedRetry}, s, "no hash: nothing shed")
	s, err = ParseShedding(map[string]string{"level": "2", "retry_after_ms": "1500", "reason": "cpu 0.91"})
	require.NoError(t, err)
	require.Equal(t, Shedding{Level: 2, RetryAfter: 1500 * time.Millisecond, Reason: "cpu 0.91"}, s)
	for _, bad := range []map[string]string{{"level": "4"}, {"level": "-1"}, {"level": "x"}, {"retry_after_ms": "0"}} {
		_, err := ParseShedding(bad)
		require.Error(t, err, "%v", bad)
	}
}

const prioRules = `
version: 1
defaults: {priority: best_effort}
priorities:
  - {method: POST, route: /v1/charges, priority: critical}
  - {method: GET, route: /v1/export, priority: bulk}
rules:
  - {id: p, tier: principal, limit: 100, period: 1h}
`

// TestEngineShedsByPriority: with the adjuster's shed hash in Redis the engine
// refuses the lower buckets before asking Redis (their buckets are untouched)
// and keeps serving CRITICAL; a request's own priority beats the route's
// default; a bad hash keeps the previous state and a missing one sheds nothing.
func TestEngineShedsByPriority(t *testing.T) {
	ctx := context.Background()
	rdb := redistest.Client(t)
	e := newTestEngine(t, rdb, prioRules, nil)
	p := principal(t)
	req := func(method, route string, prio Priority) Request {
		return Request{Principal: p, Method: method, Route: route, Cost: 1, Priority: prio}
	}
	r := check(t, e, req("GET", "/v1/export", PriorityUnset))
	require.True(t, r.Allowed)
	require.Equal(t, PriorityBulk, r.Priority, "the route's default")
	require.Empty(t, r.Utilization)
	require.Equal(t, PriorityBestEffort, check(t, e, req("GET", "/v1/other", PriorityUnset)).Priority, "defaults.priority")

	setShed := func(h map[string]any) {
		require.NoError(t, rdb.Del(ctx, e.rt.ShedKey).Err())
		if h != nil {
			require.NoError(t, rdb.HSet(ctx, e.rt.ShedKey, h).Err())
		}
		require.NoError(t, e.rt.Refresh(ctx))
	}
	setShed(map[string]any{"level": 1, "retry_after_ms": 2500, "reason": "cpu"})
	r = check(t, e, req("GET", "/v1/export", PriorityUnset))
	require.False(t, r.Allowed)
	require.True(t, r.Shed)
	require.Equal(t, 2500*time.Millisecond, r.RetryAfter)
	require.Equal(t, StatusDegraded, r.Utilization)
	require.Equal(t, 97, check(t, e, req("GET", "/v1/other", PriorityUnset)).Remaining, "best_effort is served at level 1; the bulk request consumed nothing")
	r = check(t, e, req("GET", "/v1/export", PriorityCritical))
	require.True(t, r.Allowed, "the request's own priority beats the route's")
	require.Equal(t, StatusDegraded, r.Utilization, "answers say the platform is shedding")

	setShed(map[string]any{"level": 3})
	for _, c := range []struct {
		route string
		prio  Priority
		shed  bool
	}{{"/v1/charges", PriorityUnset, false}, {"/v1/other", PriorityUnset, true}, {"/v1/other", PriorityDegraded, true}, {"/v1/other", PriorityCritical, false}} {
		method := "GET"
		if c.route == "/v1/charges" {
			method = "POST"
		}
		r := check(t, e, req(method, c.route, c.prio))
		require.Equal(t, c.shed, r.Shed, "%s %s", c.route, c.prio)
		require.Equal(t, !c.shed, r.Allowed)
		require.Equal(t, StatusCritical, r.Utilization)
	}

	setShed(map[string]any{"level": "nine"})
	require.True(t, check(t, e, req("GET", "/v1/other", PriorityDegraded)).Shed, "a bad hash keeps level 3")
	setShed(nil)
	r = check(t, e, req("GET", "/v1/export", PriorityBulk))
	require.True(t, r.Allowed, "no hash: nothing shed")
	require.Empty(t, r.Utilization)
}

func TestRulesPriorities(t *testing.T) {
	rs, err := ParseRules("r.yaml", []byte(prioRules))
	require.NoError(t, err)
	require.Equal(t, PriorityCritical, rs.Priority("POST", "/v1/charges"))
	require.Equal(t, PriorityBestEffort, rs.Priority("GET", "/v1/charges"))
	rs, err = ParseRules("r.yaml", []byte(oneBucket))
	require.NoError(t, err)
	require.Equal(t, DefaultPriority, rs.Priority("GET", "/x"))

	_, err = ParseRules("r.yaml", []byte(fmt.Sprintf("%s\npriorities:\n  - {method: GET, route: /a, priority: urgent}\n  - {method: GET, route: /a, priority: bulk}\n", oneBucket)))
	require.ErrorContains(t, err, `r.yaml:7: priorities[0].priority: "urgent": want one of critical|degraded|best_effort|bulk`)
	require.ErrorContains(t, err, "r.yaml:8: priorities[1]: a priority for GET /a is already set")
	_, err = ParseRules("r.yaml", []byte("version: 1\ndefaults: {priority: low}\n"+oneBucket[len("\nversion: 1\n"):]))
	require.ErrorContains(t, err, "defaults.priority")
}

// TestCheckAnswersAShedRequest: over HTTP a shed check is a decision like any
// other (200 from the limiter) whose contract tells the gateway to answer 503
// with the reduced-capacity problem, Retry-After and the utilization status; an
// unknown priority is a 400.
func TestCheckAnswersAShedRequest(t *testing.T) {
	ctx := context.Background()
	rdb := redistest.Client(t)
	e := newTestEngine(t, rdb, prioRules, nil)
	obs, pub := &scopeRecorder{}, &kafkatest.Capture{}
	s := NewServer(ServerConfig{Engine: e, Publisher: pub, Observer: obs, Topic: "decisions", Gateway: "test",
		Logger: slog.New(slog.DiscardHandler), Registry: prometheus.NewRegistry()})
	s.SetReady(true)
	srv := httptest.NewServer(s.Handler())
	t.Cleanup(srv.Close)
	require.NoError(t, rdb.HSet(ctx, e.rt.ShedKey, "level", 2, "retry_after_ms", 2200).Err())
	require.NoError(t, e.rt.Refresh(ctx))

	body := func(prio string) string {
		return `{"principal":{"kind":"bot","id":"` + redistest.Unique(t, "b") + `"},"ip":"192.0.2.1","method":"GET","route":"/v1/other"` + prio + `}`
	}
	resp, b := post(t, srv.URL, body(`,"priority":"best_effort"`), nil)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	var got CheckResponse
	require.NoError(t, json.Unmarshal(b, &got))
	require.False(t, got.Allowed)
	require.True(t, got.Shed)
	require.Equal(t, "best_effort", got.Priority)
	require.Equal(t, StatusDegraded, got.Utilization)
	require.Equal(t, map[string]string{"Retry-After": "3", "X-Floodgate-Priority": "best_effort", "X-Floodgate-Utilization": StatusDegraded,
		"X-Request-Id": got.Headers["X-Request-Id"]}, got.Headers)
	require.NotNil(t, got.Problem)
	require.Equal(t, 503, got.Problem.Status)
	require.Equal(t, ProblemReducedCapacity, got.Problem.Type)
	require.Equal(t, StatusDegraded, got.Problem.UtilizationStatus)

	require.Equal(t, []string{"shed:best_effort"}, obs.scopes, "InfluxDB counts shed requests by priority")
	require.Len(t, pub.Messages(), 1)
	ev, err := events.DecodeDecision(pub.Messages()[0].Value)
	require.NoError(t, err)
	require.True(t, ev.Shed, "the decision event says it was shed, so consumers do not count it as the principal's excess")
	require.Equal(t, events.PriorityBestEffort, ev.Priority)
	require.False(t, ev.Allowed)

	_, b = post(t, srv.URL, body(`,"priority":"critical"`), nil)
	require.NoError(t, json.Unmarshal(b, &got))
	require.True(t, got.Allowed, "critical is served")
	ev, err = events.DecodeDecision(pub.Messages()[1].Value)
	require.NoError(t, err)
	require.False(t, ev.Shed)
	require.Equal(t, events.PriorityCritical, ev.Priority)
	require.Equal(t, StatusDegraded, got.Utilization)

	resp, b = post(t, srv.URL, body(`,"priority":"urgent"`), nil)
	require.Equal(t, http.StatusBadRequest, resp.StatusCode)
	require.Contains(t, string(b), "priority")
}

type scopeRecorder struct{ scopes []string }

func (r *scopeRecorder) Observe(scope string, _ events.Tier, allowed, _ bool) {
	if !allowed {
		r.scopes = append(r.scopes, scope)
	}
}
