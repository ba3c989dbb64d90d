// Package whatiftest proves a what-if against the real thing: Enforce has a
// limiter engine with the candidate rules — in a keyspace of its own, deleted
// when the test ends — decide the original requests of recorded traffic for
// real, each at its recorded time, one after the other in the replay's order,
// and counts what it blocks the way a what-if report does. Tests compare the
// two with Within. It does not import pkg/whatif, so that package's own tests
// can use it.
package whatiftest

import (
	"context"
	"math"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/floodgate-dev/floodgate/pkg/limiter"
	"github.com/floodgate-dev/floodgate/pkg/redisx/redistest"
)

// Timed is one original request and the time it was recorded at.
type Timed struct {
	At  time.Time
	Req limiter.Request
}

// Enforced is what enforcement blocked: in total and by the deciding rule,
// the priority, the plan and the principal kind (a what-if report's keys).
type Enforced struct {
	Requests, Blocked              int
	ByRule, ByPrio, ByPlan, ByKind map[string]int
}

// Enforce decides reqs, in order, with a real engine of rules on rdb (keys
// under a prefix of the test's own) and counts the denials. Every answer
// must come from Redis (none degraded).
func Enforce(t testing.TB, rdb redis.UniversalClient, rules *limiter.Ruleset, reqs []Timed) Enforced {
	t.Helper()
	ctx := context.Background()
	prefix := redistest.Unique(t, "fgtest-enforce") + ":"
	eng, err := limiter.NewEngine(limiter.EngineConfig{Redis: rdb, Rules: limiter.NewRuleStore(rules), KeyPrefix: prefix,
		Budget: 5 * time.Second, Registry: prometheus.NewRegistry()})
	require.NoError(t, err)
	require.NoError(t, eng.Load(ctx))
	t.Cleanup(func() {
		it := rdb.Scan(ctx, 0, prefix+"*", 1000).Iterator()
		for it.Next(ctx) {
			rdb.Unlink(ctx, it.Val())
		}
	})
	out := Enforced{ByRule: map[string]int{}, ByPrio: map[string]int{}, ByPlan: map[string]int{}, ByKind: map[string]int{}}
	for _, r := range reqs {
		req := r.Req
		req.At = r.At
		res, err := eng.Check(ctx, req)
		require.NoError(t, err)
		require.False(t, res.Degraded, "enforcement answered without Redis: %s", res.Error)
		out.Requests++
		if !res.Allowed {
			out.Blocked++
			out.ByRule[res.Rule]++
			out.ByPrio[res.Priority.String()]++
			out.ByPlan[res.Plan]++
			out.ByKind[string(req.Principal.Kind)]++
		}
	}
	return out
}

// Within requires a what-if's count to be within share (0.01 = 1 %) of
// enforcement's, and logs both.
func Within(t testing.TB, share float64, what string, whatif, enforced int) {
	t.Helper()
	t.Logf("%-28s what-if %5d enforced %5d", what, whatif, enforced)
	require.LessOrEqualf(t, math.Abs(float64(whatif-enforced)), share*float64(enforced),
		"%s: what-if blocks %d, enforcement %d — more than %g %% apart", what, whatif, enforced, 100*share)
}
