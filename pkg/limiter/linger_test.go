package limiter

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/floodgate-dev/floodgate/pkg/events"
	"github.com/floodgate-dev/floodgate/pkg/redisx"
	"github.com/floodgate-dev/floodgate/pkg/redisx/redistest"
)

// TestLateReplyKeepsItsConnection: Redis behind a link slower than the budget.
// Checks are answered at the budget (degraded), not at the linger, and the
// pipelines keep their connections: before, the socket timed out at the
// budget, go-redis closed the connection, and every next pipeline dialed and
// shook hands inside its own budget (chaos redis-slow at +40 ms: 78 dials and
// 850 degraded answers in 10 s).
func TestLateReplyKeepsItsConnection(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a Redis process")
	}
	r := redistest.NewProc(t)
	px := redistest.NewProxy(t, r.Addr)
	budget := 50 * time.Millisecond
	linger := 4 * budget
	rdb := redisx.NewClient(redisx.Options{Addrs: []string{px.Addr}, DialTimeout: 200 * time.Millisecond,
		ReadTimeout: linger, WriteTimeout: linger})
	t.Cleanup(func() { _ = rdb.Close() })
	e, _ := faultEngine(t, rdb, budget)
	var ps []events.Principal
	for i := range 8 {
		ps = append(ps, events.Principal{Kind: events.PrincipalBot, ID: fmt.Sprintf("%s-%d", redistest.Unique(t, "lg"), i)})
	}
	// Warm: the pool holds what four pipelines in flight need.
	ctx, stop := context.WithTimeout(context.Background(), 300*time.Millisecond)
	drive(ctx, e, ps, time.Millisecond)()
	stop()

	px.SetDelay(budget + 25*time.Millisecond)
	dialed := px.Accepted()
	var slowest time.Duration
	late := 0
	for i := range 40 {
		start := time.Now()
		res, err := e.Check(context.Background(), Request{Principal: ps[i%len(ps)], Method: "GET", Route: "/x", Cost: 1})
		require.NoError(t, err)
		slowest = max(slowest, time.Since(start))
		if res.Degraded {
			late++
		}
		time.Sleep(10 * time.Millisecond)
	}
	px.SetDelay(0)
	t.Logf("reply 75 ms late on a 50 ms budget: %d of 40 degraded, slowest answer %v, %d connections dialed",
		late, slowest.Round(time.Millisecond), px.Accepted()-dialed)
	require.Equal(t, 40, late, "every check past its budget is degraded")
	require.Less(t, slowest, budget+40*time.Millisecond, "a check waits for its budget, not for the linger")
	require.LessOrEqual(t, px.Accepted()-dialed, int64(4), "late replies are read on their connections, which stay in the pool")
}
