package detector

import (
	"net/netip"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/floodgate-dev/floodgate/pkg/events"
)

var t0 = time.Date(2026, 11, 22, 10, 0, 0, 0, time.UTC)

func decision(p events.Principal, at time.Time, ip, route string) *events.Decision {
	return &events.Decision{ID: "d", TS: at, Principal: p, IP: netip.MustParseAddr(ip), Method: "POST", Route: route, Allowed: true,
		Tier: events.TierPrincipal, Cost: 1, Limit: 50, Remaining: 10, Gateway: "t"}
}

// feed sends n events spread evenly over d, starting at start, and returns the detections.
func feed(r *RapidFire, p events.Principal, start time.Time, d time.Duration, n int, ip string) []*Detection {
	var out []*Detection
	for i := 0; i < n; i++ {
		at := start.Add(time.Duration(int64(d) * int64(i) / int64(n)))
		if det := r.Observe(decision(p, at, ip, "/channels/{channel_id}/messages")); det != nil {
			out = append(out, det)
		}
	}
	return out
}

func TestRapidFireThresholds(t *testing.T) {
	cfg := RapidFireConfig{Window: 10 * time.Second, Threshold: 20, Cooldown: time.Minute}
	bot := events.Principal{Kind: events.PrincipalBot, ID: "b"}
	cases := []struct {
		name   string
		events int
		over   time.Duration
		want   int
	}{
		{"human pace never detected", 30, 30 * time.Second, 0},
		{"just under threshold over the window", 200, 10 * time.Second, 0},
		{"five times the threshold", 1000, 10 * time.Second, 1},
		{"burst: 250 in one second exceeds 20/s averaged over 10s", 250, time.Second, 1},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := NewRapidFire(cfg)
			got := feed(r, bot, t0, tc.over, tc.events, "203.0.113.9")
			require.Len(t, got, tc.want)
		})
	}
}

func TestRapidFireDetectionCarriesEvidence(t *testing.T) {
	r := NewRapidFire(RapidFireConfig{Window: 5 * time.Second, Threshold: 10, Cooldown: time.Minute})
	bot := events.Principal{Kind: events.PrincipalBot, ID: "b"}
	var det *Detection
	for i := 0; det == nil && i < 1000; i++ {
		ip := []string{"203.0.113.9", "203.0.113.10", "2001:db8::1"}[i%3]
		route := []string{"/a", "/a", "/b/{id}"}[i%3]
		det = r.Observe(decision(bot, t0.Add(time.Duration(i)*10*time.Millisecond), ip, route))
	}
	require.NotNil(t, det)
	require.Equal(t, 51, det.Count, "first event over 10/s × 5s")
	require.InDelta(t, 51, det.Rate, 1e-9, "51 events within half a second: rated over one second, not the 5s window")
	require.Equal(t, t0, det.FirstEventAt)
	require.Equal(t, int64(3), det.DistinctIPs)
	require.Equal(t, int64(1), det.DistinctIP24)
	require.Equal(t, int64(1), det.DistinctIP64)
	require.Equal(t, "/a", det.TopRoutes[0].Route)
	require.Equal(t, int64(34), det.TopRoutes[0].Count)
	require.Equal(t, t0.Add(-4*time.Second), det.WindowStart)
}

func TestRapidFireCooldownAndWindowSlide(t *testing.T) {
	r := NewRapidFire(RapidFireConfig{Window: 2 * time.Second, Threshold: 5, Cooldown: 30 * time.Second})
	bot := events.Principal{Kind: events.PrincipalBot, ID: "b"}
	require.Len(t, feed(r, bot, t0, 10*time.Second, 200, "203.0.113.9"), 1, "one detection per cooldown")
	require.Len(t, feed(r, bot, t0.Add(31*time.Second), time.Second, 50, "203.0.113.9"), 1, "detected again after the cooldown")
	// A late event older than the window does not count.
	other := events.Principal{Kind: events.PrincipalBot, ID: "c"}
	require.Nil(t, r.Observe(decision(other, t0.Add(100*time.Second), "203.0.113.9", "/a")))
	for i := 0; i < 100; i++ {
		require.Nil(t, r.Observe(decision(other, t0.Add(90*time.Second), "203.0.113.9", "/a")))
	}
}

func TestRapidFireIsDeterministicOnReplay(t *testing.T) {
	cfg := RapidFireConfig{Window: 10 * time.Second, Threshold: 20, Cooldown: time.Minute}
	bot := events.Principal{Kind: events.PrincipalBot, ID: "b"}
	a := feed(NewRapidFire(cfg), bot, t0, 10*time.Second, 1000, "203.0.113.9")
	b := feed(NewRapidFire(cfg), bot, t0, 10*time.Second, 1000, "203.0.113.9")
	require.Len(t, a, 1)
	require.Equal(t, a, b)
	require.Equal(t, AbuseID(bot, events.PatternRapidFire, a[0].WindowStart), AbuseID(bot, events.PatternRapidFire, b[0].WindowStart))
}

func TestRapidFireSweepForgetsIdlePrincipals(t *testing.T) {
	r := NewRapidFire(RapidFireConfig{Window: 10 * time.Second, Threshold: 20})
	for i := 0; i < 100; i++ {
		r.Observe(decision(events.Principal{Kind: events.PrincipalUser, ID: string(rune('a' + i%26))}, t0, "198.51.100.1", "/a"))
	}
	require.Equal(t, 26, r.Len())
	require.Zero(t, r.Sweep(t0.Add(5*time.Second)), "still inside the window")
	require.Equal(t, 26, r.Sweep(t0.Add(11*time.Second)))
	require.Zero(t, r.Len())
}

func TestSeverity(t *testing.T) {
	for score, want := range map[float64]events.Severity{1.1: events.SeverityLow, 2: events.SeverityMedium, 5: events.SeverityHigh, 12: events.SeverityCritical} {
		require.Equal(t, want, severity(score), "score %g", score)
	}
}

func BenchmarkRapidFireObserve(b *testing.B) {
	r := NewRapidFire(RapidFireConfig{Window: 10 * time.Second, Threshold: 1e9})
	ds := make([]*events.Decision, 4096)
	for i := range ds {
		ds[i] = decision(events.Principal{Kind: events.PrincipalUser, ID: string(rune(0x4e00 + i))}, t0.Add(time.Duration(i)*time.Millisecond), "198.51.100.1", "/a")
	}
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		r.Observe(ds[i%len(ds)])
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "events/s")
}
