package server

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/floodgate-dev/floodgate/pkg/events"
	"github.com/floodgate-dev/floodgate/pkg/httpapi"
	"github.com/floodgate-dev/floodgate/pkg/limiter"
)

func TestDegradedErrorsNameRedis(t *testing.T) {
	r := limiter.Result{Allowed: true, Tier: events.TierPrincipal, Penalty: 1, Scale: 1, Degraded: true, Error: "redis unavailable"}
	require.True(t, strings.HasPrefix(Headers(r, "x")["X-RateLimit-Error"], "redis unavailable"))
}

// TestShedIsNotAnOutage: a check the engine answered from local state
// because it was past its capacity says so with X-RateLimit-Shed, never
// X-RateLimit-Error: busy is not down.
func TestShedIsNotAnOutage(t *testing.T) {
	r := limiter.Result{Tier: events.TierPrincipal, Penalty: 1, Scale: 1, Limit: 5, Period: 1e9, RetryAfter: 1e9, Degraded: true, Error: limiter.ShedReason}
	h := Headers(r, "cid")
	require.Equal(t, "answered from local state", h["X-RateLimit-Shed"])
	require.Empty(t, h["X-RateLimit-Error"], "busy is not down")
}

// TestPenaltyDenialIsAbnormalUsage: a denial while a penalty shrinks the
// principal's limits answers with the abnormal-usage problem.
func TestPenaltyDenialIsAbnormalUsage(t *testing.T) {
	r := limiter.Result{Tier: events.TierPenalty, Penalty: 0.1, Scale: 1, Limit: 1, Period: 3600e9, RetryAfter: 1e9}
	require.Equal(t, httpapi.ProblemPenalized, DenialProblem(r, "c").Type)
}
