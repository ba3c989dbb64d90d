package limiter

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/floodgate-dev/floodgate/pkg/limiter/admission"
	"github.com/floodgate-dev/floodgate/pkg/redisx/redistest"
)

var prioRules = mustRead("limitertest/testdata/prio-rules.yaml")

// TestEngineShedsByPriority: with the adjuster's shed hash in Redis the engine
// refuses the lower buckets before asking Redis (their buckets are untouched)
// and keeps serving CRITICAL; a request's own priority beats the route's
// default; a bad hash keeps the previous state and a missing one sheds nothing.
func TestEngineShedsByPriority(t *testing.T) {
	ctx := context.Background()
	rdb := redistest.Client(t)
	e := newTestEngine(t, rdb, prioRules, nil)
	p := principal(t)
	req := func(method, route string, prio admission.Priority) Request {
		return Request{Principal: p, Method: method, Route: route, Cost: 1, Priority: prio}
	}
	r := check(t, e, req("GET", "/v1/export", admission.PriorityUnset))
	require.True(t, r.Allowed)
	require.Equal(t, admission.PriorityBulk, r.Priority, "the route's default")
	require.Empty(t, r.Utilization)
	require.Equal(t, admission.PriorityBestEffort, check(t, e, req("GET", "/v1/other", admission.PriorityUnset)).Priority, "defaults.priority")

	setShed := func(h map[string]any) {
		require.NoError(t, rdb.Del(ctx, e.rt.ShedKey).Err())
		if h != nil {
			require.NoError(t, rdb.HSet(ctx, e.rt.ShedKey, h).Err())
		}
		require.NoError(t, e.rt.Refresh(ctx))
	}
	setShed(map[string]any{"level": 1, "retry_after_ms": 2500, "reason": "cpu"})
	r = check(t, e, req("GET", "/v1/export", admission.PriorityUnset))
	require.False(t, r.Allowed)
	require.True(t, r.Shed)
	require.Equal(t, 2500*time.Millisecond, r.RetryAfter)
	require.Equal(t, admission.StatusDegraded, r.Utilization)
	require.Equal(t, 97, check(t, e, req("GET", "/v1/other", admission.PriorityUnset)).Remaining, "best_effort is served at level 1; the bulk request consumed nothing")
	r = check(t, e, req("GET", "/v1/export", admission.PriorityCritical))
	require.True(t, r.Allowed, "the request's own priority beats the route's")
	require.Equal(t, admission.StatusDegraded, r.Utilization, "answers say the platform is shedding")

	setShed(map[string]any{"level": 3})
	for _, c := range []struct {
		route string
		prio  admission.Priority
		shed  bool
	}{{"/v1/charges", admission.PriorityUnset, false}, {"/v1/other", admission.PriorityUnset, true}, {"/v1/other", admission.PriorityDegraded, true}, {"/v1/other", admission.PriorityCritical, false}} {
		method := "GET"
		if c.route == "/v1/charges" {
			method = "POST"
		}
		r := check(t, e, req(method, c.route, c.prio))
		require.Equal(t, c.shed, r.Shed, "%s %s", c.route, c.prio)
		require.Equal(t, !c.shed, r.Allowed)
		require.Equal(t, admission.StatusCritical, r.Utilization)
	}

	setShed(map[string]any{"level": "nine"})
	require.True(t, check(t, e, req("GET", "/v1/other", admission.PriorityDegraded)).Shed, "a bad hash keeps level 3")
	setShed(nil)
	r = check(t, e, req("GET", "/v1/export", admission.PriorityBulk))
	require.True(t, r.Allowed, "no hash: nothing shed")
	require.Empty(t, r.Utilization)
}

func TestRulesPriorities(t *testing.T) {
	rs, err := ParseRules("r.yaml", []byte(prioRules))
	require.NoError(t, err)
	require.Equal(t, admission.PriorityCritical, rs.Priority("POST", "/v1/charges"))
	require.Equal(t, admission.PriorityBestEffort, rs.Priority("GET", "/v1/charges"))
	rs, err = ParseRules("r.yaml", []byte(oneBucket))
	require.NoError(t, err)
	require.Equal(t, admission.DefaultPriority, rs.Priority("GET", "/x"))

	_, err = ParseRules("r.yaml", []byte(fmt.Sprintf("%s\npriorities:\n  - {method: GET, route: /a, priority: urgent}\n  - {method: GET, route: /a, priority: bulk}\n", oneBucket)))
	require.ErrorContains(t, err, `r.yaml:7: priorities[0].priority: "urgent": want one of critical|degraded|best_effort|bulk`)
	require.ErrorContains(t, err, "r.yaml:8: priorities[1]: a priority for GET /a is already set")
	_, err = ParseRules("r.yaml", []byte("version: 1\ndefaults: {priority: low}\n"+oneBucket[len("\nversion: 1\n"):]))
	require.ErrorContains(t, err, "defaults.priority")
}

// TestCriticalChecksGoFirstToRedis: while every pipeline slot is taken, a
// CRITICAL check (its own priority, or its route's default) is queued ahead
// of the checks already waiting, so the next pipeline carries it; the
// others keep their order.
func TestCriticalChecksGoFirstToRedis(t *testing.T) {
	rdb := redistest.Client(t)
	e := newTestEngine(t, rdb, prioRules, func(c *EngineConfig) { c.RedisBatch = 2 })
	sh := e.shards.all()[0]
	require.NotNil(t, sh.batch)
	var mu sync.Mutex
	var pipelines [][]time.Time // each pipeline's items, by their deadline
	flush := sh.batch.gc.Flush
	sh.batch.gc.Flush = func(batch []*batchItem) {
		mu.Lock()
		var ds []time.Time
		for _, it := range batch {
			ds = append(ds, it.deadline)
		}
		pipelines = append(pipelines, ds)
		mu.Unlock()
		flush(batch)
	}
	release := sh.batch.gc.Hold()
	base := time.Now().Add(time.Hour).Truncate(time.Second)
	reqs := []Request{ // in the order they queue; each named by its deadline
		{Principal: principal(t), Method: "GET", Route: "/v1/other", Deadline: base.Add(1 * time.Second)},
		{Principal: principal(t), Method: "GET", Route: "/v1/other", Deadline: base.Add(2 * time.Second)},
		{Principal: principal(t), Method: "GET", Route: "/v1/other", Deadline: base.Add(3 * time.Second), Priority: admission.PriorityCritical},
		{Principal: principal(t), Method: "POST", Route: "/v1/charges", Deadline: base.Add(4 * time.Second)},
	}
	errs := make(chan error, len(reqs))
	for i, req := range reqs {
		go func() {
			_, err := e.Check(context.Background(), req)
			errs <- err
		}()
		require.Eventually(t, func() bool { return sh.batch.gc.Queued() == i+1 }, 5*time.Second, time.Millisecond)
	}
	release()
	for range reqs {
		require.NoError(t, <-errs)
	}
	d := func(i int) time.Time { return reqs[i].Deadline }
	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, [][]time.Time{{d(3), d(2)}, {d(0), d(1)}}, pipelines,
		"both CRITICAL checks in the first pipeline (the later first), then the others in their order")
}
