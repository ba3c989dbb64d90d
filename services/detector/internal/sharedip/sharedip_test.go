package sharedip

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/floodgate-dev/floodgate/pkg/events"
	"github.com/floodgate-dev/floodgate/pkg/redisx/redistest"
	"github.com/floodgate-dev/floodgate/pkg/stacktest"
	"github.com/floodgate-dev/floodgate/services/detector/internal/score"
)

var t0 = time.Now().UTC().Truncate(time.Second)

func decision(p events.Principal, at time.Time, ip string) *events.Decision {
	return &events.Decision{ID: "d", TS: at, Principal: p, IP: netip.MustParseAddr(ip), Method: "GET", Route: "/users/@me",
		Allowed: true, Tier: events.TierPrincipal, Cost: 1, Limit: 20, Remaining: 10, Gateway: "t"}
}

// instance is one detector instance's scoring side: its own IP store,
// shared through Redis.
type instance struct {
	scorer *score.Scorer
	ips    *score.IPStore
	store  *Store
}

func newInstance(t *testing.T, prefix string) *instance {
	cfg := score.DefaultConfig()
	st, err := New(redistest.Client(t), Config{Prefix: prefix, Window: cfg.IPWindow}, prometheus.NewRegistry(), slog.New(slog.NewTextHandler(io.Discard, nil)))
	require.NoError(t, err)
	ips := score.NewIPStore(cfg)
	ips.ShareWith(st)
	return &instance{scorer: score.New(cfg, ips), ips: ips, store: st}
}

// TestSharedAddressAcrossInstances: a carrier NAT address used by three
// principals scored on one instance and three on another is shared (≥ 5
// principals) for both, as it is for a single instance that sees all six.
func TestSharedAddressAcrossInstances(t *testing.T) {
	stacktest.Needs(t, "needs Redis")
	prefix := redistest.Unique(t, "fg:test:ipshare") + ":"
	a, b := newInstance(t, prefix), newInstance(t, prefix)
	nat := "100.64.9.9"
	for i := 0; i < 3; i++ {
		a.scorer.Observe(decision(events.Principal{Kind: events.PrincipalUser, ID: fmt.Sprint("a", i)}, t0, nat), nil)
		b.scorer.Observe(decision(events.Principal{Kind: events.PrincipalUser, ID: fmt.Sprint("b", i)}, t0, nat), nil)
	}
	ms := t0.UnixMilli()
	ctx := context.Background()
	require.NoError(t, a.store.Flush(ctx))
	require.NoError(t, b.store.Flush(ctx))
	ip := netip.MustParseAddr(nat)
	require.EqualValues(t, 6, a.ips.Principals(ip, ms), "instance a counts every instance's principals")
	require.EqualValues(t, 6, b.ips.Principals(ip, ms))

	// Without sharing each instance sees only its half: not shared.
	alone := score.NewIPStore(score.DefaultConfig())
	lone := score.New(score.DefaultConfig(), alone)
	for i := 0; i < 3; i++ {
		lone.Observe(decision(events.Principal{Kind: events.PrincipalUser, ID: fmt.Sprint("a", i)}, t0, nat), nil)
	}
	require.EqualValues(t, 3, alone.Principals(ip, ms))
}

// TestDistributedIPSameAnswerAcrossInstances: a principal on instance a
// whose 25 addresses are each used by 6 principals scored on instance b is
// not distributed_ip — the addresses are shared — exactly as one instance
// seeing everything decides; the same principal on unshared addresses is.
func TestDistributedIPSameAnswerAcrossInstances(t *testing.T) {
	stacktest.Needs(t, "needs Redis")
	prefix := redistest.Unique(t, "fg:test:ipshare") + ":"
	a, b := newInstance(t, prefix), newInstance(t, prefix)
	addr := func(i int) string { return fmt.Sprintf("100.70.%d.1", i) }
	for i := 0; i < 25; i++ {
		for u := 0; u < 6; u++ {
			b.scorer.Observe(decision(events.Principal{Kind: events.PrincipalUser, ID: fmt.Sprintf("sub%d_%d", i, u)}, t0, addr(i)), nil)
		}
	}
	require.NoError(t, b.store.Flush(context.Background()))
	roamer := events.Principal{Kind: events.PrincipalUser, ID: "roamer"}
	var out []score.Detection
	for i := 0; i < 25; i++ {
		out = a.scorer.Observe(decision(roamer, t0.Add(time.Duration(i)*time.Second), addr(i)), out)
	}
	require.Empty(t, out, "every address is shared once all instances' principals count")

	c := newInstance(t, redistest.Unique(t, "fg:test:ipshare")+":")
	out = nil
	for i := 0; i < 25; i++ {
		out = c.scorer.Observe(decision(roamer, t0.Add(time.Duration(i)*time.Second), fmt.Sprintf("100.71.%d.1", i)), out)
	}
	require.NotEmpty(t, out, "on unshared addresses the same principal is distributed_ip")
}
