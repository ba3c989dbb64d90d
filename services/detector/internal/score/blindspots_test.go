package score

import (
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/floodgate-dev/floodgate/pkg/events"
)

// poissonAcross sends Poisson arrivals at rate per second for dur, each on
// the next of routes, through a limiter bucket per route (limit per second,
// capacity = limit), and returns the detections.
func poissonAcross(s *Scorer, p events.Principal, start time.Time, dur time.Duration, rate float64, limit float64, routes []string, seed uint64) []Detection {
	r := rand.New(rand.NewPCG(seed, 1))
	buckets := map[string]*limiterBucket{}
	var out []Detection
	for at, i := start, 0; at.Before(start.Add(dur)); i++ {
		rt := routes[i%len(routes)]
		b := buckets[rt]
		if b == nil {
			b = &limiterBucket{limit: limit}
			buckets[rt] = b
		}
		out = s.Observe(b.decide(dec(p, at, "198.51.100.77", rt)), out)
		at = at.Add(time.Duration(r.ExpFloat64() / rate * float64(time.Second)))
	}
	return out
}

// TestPersonSpreadOverRoutesIsRapidFire: a scripted account walking four
// routes at 6 req/s each (24 req/s, under its limit of 10/s on every route)
// stays under every route's line (10/s); over all its routes it sends 2.4×
// that line. Per principal × route alone, it was never detected. Inside its
// limits, only the rate held past a burst counts: over all routes the window
// must hold the line in six buckets (6.25 s) and keep holding it for
// PersonSustain (5 s) more, so it is seen after 11–13 s.
func TestPersonSpreadOverRoutesIsRapidFire(t *testing.T) {
	routes := []string{"/repos/{owner}/{repo}/issues", "/users/{username}", "/repos/{owner}/{repo}/stargazers", "/search/repositories"}
	for seed := uint64(1); seed <= 5; seed++ {
		s := newScorer(nil)
		p := events.Principal{Kind: events.PrincipalUser, ID: "spread"}
		got := only(poissonAcross(s, p, t0, time.Minute, 24, 10, routes, seed), RapidFire)
		require.NotEmpty(t, got, "seed %d", seed)
		d := got[0]
		require.Equal(t, AllRoutes, d.Route)
		require.True(t, d.Penalize)
		require.Greater(t, d.At.Sub(t0), 11*time.Second, "seed %d: a storm's length is never enough", seed)
		require.Less(t, d.At.Sub(t0), 13*time.Second, "seed %d: detected once held past a storm", seed)
		require.GreaterOrEqual(t, d.Sustained, 6*1250*time.Millisecond, "seed %d", seed)
		require.Greater(t, d.Score, 2*d.Threshold, "seed %d: the score is the rate held (24/s), not the line just crossed", seed)
		require.Len(t, d.TopRoutes, 4, "the evidence names every route")
	}
	// A busy person (a page view fanning out into a dozen calls every few
	// seconds over several routes) is not.
	s := newScorer(nil)
	p := events.Principal{Kind: events.PrincipalUser, ID: "busy"}
	var out []Detection
	for i := 0; i < 60; i++ {
		at := t0.Add(time.Duration(i) * 3 * time.Second)
		for j := 0; j < 12; j++ {
			out = s.Observe(dec(p, at.Add(time.Duration(j)*40*time.Millisecond), "198.51.100.78", routes[j%len(routes)]), out)
		}
	}
	require.Empty(t, only(out, RapidFire))
}

// TestOnsetIsSeenBeforeTheWindowFills: a person at 40 req/s on one route
// (4× its limit: three calls in four refused) is detected in under 2 s, not
// once the 10 s window averages past the line (2.5 s at 40/s). A person's burst of 40 in one second is
// still not rapid fire (TestRapidFireAgainstTheFloor).
func TestOnsetIsSeenBeforeTheWindowFills(t *testing.T) {
	for seed := uint64(1); seed <= 5; seed++ {
		s := newScorer(nil)
		p := events.Principal{Kind: events.PrincipalUser, ID: "onset"}
		got := only(poissonAcross(s, p, t0, 20*time.Second, 40, 10, []string{"/a"}, seed), RapidFire)
		require.NotEmpty(t, got)
		require.Less(t, got[0].At.Sub(t0), 2*time.Second, "seed %d", seed)
	}
	// At twice its limit (20 req/s on a route limited to 10/s) a person is
	// past the limit: from the second second on half of its calls are
	// refused, and the 20th denial at a third of its calls comes at about
	// 3 s. Rate alone (20/s, twice the line) would wait for PersonSustain.
	var lat []time.Duration
	for seed := uint64(1); seed <= 21; seed++ {
		s := newScorer(nil)
		p := events.Principal{Kind: events.PrincipalUser, ID: "onset20"}
		got := only(poissonAcross(s, p, t0, 20*time.Second, 20, 10, []string{"/a"}, seed), RapidFire)
		require.NotEmpty(t, got)
		lat = append(lat, got[0].At.Sub(t0))
	}
	slices.Sort(lat)
	t.Logf("20 req/s over 21 seeds: median %s, slowest %s", lat[10], lat[20])
	require.Less(t, lat[10], 3200*time.Millisecond)
	require.Less(t, lat[20], 5*time.Second)
}

// TestColdAutomationFloodIsRapidFire: a new bot whose first request starts a
// flood at 1.8× its limit (limit 60/s, 108 req/s: about 45 % denied once
// its bucket is empty). With no history to jump from, the floor is its
// expectation: running past its limit from the start is a jump. Before, it
// needed half of its requests denied and was never detected.
func TestColdAutomationFloodIsRapidFire(t *testing.T) {
	for seed := uint64(1); seed <= 3; seed++ {
		s := newScorer(nil)
		p := events.Principal{Kind: events.PrincipalBot, ID: "cold"}
		got := only(poissonAcross(s, p, t0, 30*time.Second, 108, 60, []string{"/v1/charges"}, seed), RapidFire)
		require.NotEmpty(t, got, "seed %d", seed)
		require.Equal(t, SourceLimit, got[0].BaselineSource)
		require.Less(t, got[0].At.Sub(t0), 5*time.Second, "seed %d", seed)
	}
	// A new bot steady at 90 % of its limit is never denied: not abuse.
	s := newScorer(nil)
	require.Empty(t, only(poissonAcross(s, events.Principal{Kind: events.PrincipalBot, ID: "new"}, t0, time.Minute, 54, 60, []string{"/v1/charges"}, 9), RapidFire))
}

// TestShedDecisionsAreNotTheBotsExcess: a bot at 90 % of its limit whose
// requests the limiter sheds for the platform's lack of capacity (decision.v1
// shed) is not hammering past its limit: shed refusals are not denials.
func TestShedDecisionsAreNotTheBotsExcess(t *testing.T) {
	for _, shed := range []bool{true, false} {
		s := newScorer(nil)
		p := events.Principal{Kind: events.PrincipalBot, ID: "steady"}
		var out []Detection
		for i := range 3000 {
			d := dec(p, t0.Add(time.Duration(i)*time.Second/100), "203.0.113.9", "/v1/charges")
			d.Allowed, d.Shed = i%10 == 0, shed // nine in ten refused
			out = s.Observe(d, out)
		}
		if shed {
			require.Empty(t, only(out, RapidFire), "shed refusals are not the bot's excess")
		} else {
			require.NotEmpty(t, only(out, RapidFire), "the same refusals by its limit are")
		}
	}
}

// TestColdFloodJustPastTheLimitIsSeenInSeconds: a new bot whose first
// request starts a flood at 1.7× its limit (limit 60/s, 102 req/s) spends a
// full bucket first, so the share of its requests denied since the onset
// reaches a quarter only after L / (0.75 r − L) ≈ 3.6 s; the newest buckets'
// share (about 40 % once the bucket is empty) sees it in about 1.5 s
// (without it: median 3.5 s, slowest 5.0 s over the same seeds).
func TestColdFloodJustPastTheLimitIsSeenInSeconds(t *testing.T) {
	var lat []time.Duration
	for seed := uint64(1); seed <= 21; seed++ {
		s := newScorer(nil)
		p := events.Principal{Kind: events.PrincipalBot, ID: "cold17"}
		got := only(poissonAcross(s, p, t0, 20*time.Second, 102, 60, []string{"/v1/charges"}, seed), RapidFire)
		require.NotEmpty(t, got, "seed %d", seed)
		lat = append(lat, got[0].At.Sub(t0))
	}
	slices.Sort(lat)
	t.Logf("1.7x the limit over 21 seeds: median %s, slowest %s", lat[10], lat[20])
	require.Less(t, lat[10], 2*time.Second)
	require.Less(t, lat[20], 3*time.Second)
}
