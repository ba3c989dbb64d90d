package detector_test

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/floodgate-dev/floodgate/pkg/events"
	"github.com/floodgate-dev/floodgate/pkg/redisx"
	"github.com/floodgate-dev/floodgate/pkg/redisx/redistest"
	"github.com/floodgate-dev/floodgate/pkg/stacktest"
	"github.com/floodgate-dev/floodgate/services/detector/internal/detector"
	"github.com/floodgate-dev/floodgate/services/detector/internal/detector/pagertest"
	"github.com/floodgate-dev/floodgate/services/detector/internal/detector/penaltytest"
)

// TestPenaltiesContract runs the contract of Penalties against the Redis
// store and the in-memory double.
func TestPenaltiesContract(t *testing.T) {
	t.Run("redis", func(t *testing.T) {
		rdb := redistest.Client(t)
		penaltytest.Run(t, func() detector.Penalties { return detector.NewPenaltyStore(rdb) })
	})
	t.Run("memory", func(t *testing.T) {
		penaltytest.Run(t, func() detector.Penalties { return detector.NewMemPenalties(time.Now) })
	})
}

// TestPenaltyStoreKeyExpires: the Redis store's key lives as long as the
// penalty, so the limiter's Lua reads nothing once it is over.
func TestPenaltyStoreKeyExpires(t *testing.T) {
	rdb := redistest.Client(t)
	ctx := context.Background()
	p := events.Principal{Kind: events.PrincipalBot, ID: redistest.Unique(t, "pen")}
	_, err := detector.NewPenaltyStore(rdb).Apply(ctx, p, "ab_1", events.Penalty{Multiplier: 0.1, ExpiresAt: time.Now().Add(2 * time.Minute), Level: 1})
	require.NoError(t, err)
	ttl, err := rdb.PTTL(ctx, redisx.PenaltyKey(string(p.Kind), p.ID)).Result()
	require.NoError(t, err)
	require.Greater(t, ttl, time.Minute)
	require.LessOrEqual(t, ttl, 2*time.Minute)
}

// TestAlerterContract runs the contract of Alerter against the PagerDuty pager
// (Events API v2 to a local receiver) and the in-memory double.
func TestAlerterContract(t *testing.T) {
	t.Parallel()
	t.Run("pagerduty", func(t *testing.T) {
		pagertest.Run(t, func(t *testing.T) pagertest.UnderTest {
			recv := stacktest.PagerDutyFor(t)
			p, err := detector.NewPager(detector.PagerConfig{RoutingKey: "rk", Endpoint: recv.URL, MinSeverity: "critical", PerMinute: 1, Now: time.Now,
				Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Registerer: prometheus.NewRegistry()})
			require.NoError(t, err)
			return pagertest.UnderTest{Alerter: p, Pages: func() []detector.Page { return pagertest.PagesOf(recv) }, FailNext: recv.FailNext}
		})
	})
	t.Run("memory", func(t *testing.T) {
		pagertest.Run(t, func(*testing.T) pagertest.UnderTest {
			a := &detector.MemAlerter{}
			return pagertest.UnderTest{Alerter: a, Pages: a.Pages, FailNext: a.FailNext}
		})
	})
}
