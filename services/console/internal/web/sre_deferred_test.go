package web

import (
	"context"
	"net/http"
	"net/url"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/floodgate-dev/floodgate/pkg/deferred"
)

// TestDeferredPage: anyone signed in sees each deferring route's depth and
// the age of its oldest request; an SRE pauses, resumes, drains and un-drains
// a route with a reason, each change audited and applied to the Redis flags
// the workers and edges read; a viewer cannot change anything.
func TestDeferredPage(t *testing.T) {
	e := newEnvWith(t, func(cfg *Config, _ string) { cfg.Deferred = nil })
	e.web.cfg.Deferred = deferred.NewStore(e.rdb)
	ds := e.web.cfg.Deferred
	ctx := context.Background()
	route := "POST /console-test/" + e.run
	t.Cleanup(func() {
		_ = ds.SetPaused(context.Background(), route, "")
		_ = ds.SetDraining(context.Background(), route, "")
	})
	for range 3 {
		id := uuid.Must(uuid.NewV7()).String()
		require.NoError(t, ds.Reserve(ctx, id, "user:c"+e.run, route, time.Now().Add(time.Minute), 100, 100))
		t.Cleanup(func() { _ = ds.Release(context.Background(), id, "user:c"+e.run, route) })
	}

	viewer := e.signedIn(t, "viewer1")
	code, body := viewer.get("/sre/deferred")
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, body, route)
	require.Contains(t, body, "<td>3</td>")
	require.NotContains(t, body, `value="deferred.pause"`, "a viewer gets no buttons")
	res, _ := viewer.post("/sre/deferred", url.Values{"csrf": {viewer.csrf("/sre/deferred")}, "route": {route}, "action": {ActionDeferredPause}, "reason": {"x"}})
	require.Equal(t, http.StatusForbidden, res.StatusCode)

	sre := e.signedIn(t, "sre1")
	act := func(action, reason string) int {
		res, _ := sre.post("/sre/deferred", url.Values{"csrf": {sre.csrf("/sre/deferred")}, "route": {route}, "action": {action}, "reason": {reason}})
		return res.StatusCode
	}
	require.Equal(t, http.StatusUnprocessableEntity, act(ActionDeferredPause, ""), "a reason is required")
	paused, err := ds.Paused(ctx, route)
	require.NoError(t, err)
	require.False(t, paused)

	require.Equal(t, http.StatusSeeOther, act(ActionDeferredPause, "upstream is deploying"))
	paused, err = ds.Paused(ctx, route)
	require.NoError(t, err)
	require.True(t, paused)
	require.Equal(t, http.StatusSeeOther, act(ActionDeferredDrain, "stop the queue growing"))
	d, err := ds.Depth(ctx, route)
	require.NoError(t, err)
	require.True(t, d.Draining)
	require.Equal(t, int64(3), d.Queued)
	require.False(t, d.OldestQueued.IsZero(), "the age comes from the UUIDv7 id")
	_, body = sre.get("/sre/deferred")
	require.Contains(t, body, "paused")
	require.Contains(t, body, "draining")
	require.Equal(t, http.StatusSeeOther, act(ActionDeferredResume, "deploy done"))
	require.Equal(t, http.StatusSeeOther, act(ActionDeferredUndrain, "deploy done"))
	d, err = ds.Depth(ctx, route)
	require.NoError(t, err)
	require.False(t, d.Paused)
	require.False(t, d.Draining)

	rows, err := e.st.AuditOf(ctx, SubjectDeferred, 10)
	require.NoError(t, err)
	var mine []string
	for _, r := range rows {
		if r.AbuseID == route {
			require.Equal(t, "sre1", r.Actor)
			mine = append(mine, r.Action+": "+r.Reason)
		}
	}
	require.Equal(t, []string{"deferred.undrain: deploy done", "deferred.resume: deploy done",
		"deferred.drain: stop the queue growing", "deferred.pause: upstream is deploying"}, mine)
}
