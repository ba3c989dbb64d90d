package score

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/floodgate-dev/floodgate/pkg/events"
)

// People burst: the tests below send the shapes real clients make, each
// inside the person's limits (a token bucket of 10/s per route with a burst
// of 10, as the held-out limiter model), and require no rapid_fire — rate
// alone never penalizes a person inside their limits — while a person past
// their limits, or holding a rate past a burst, still is.

// person sends calls at the given offsets from start, each on the route the
// function names, through a limiter bucket per route, and returns the
// detections and how many calls the limiter refused.
func person(s *Scorer, p events.Principal, ip string, start time.Time, offsets []time.Duration, route func(i int) string, out []Detection) ([]Detection, int) {
	buckets := map[string]*limiterBucket{}
	denied := 0
	for i, off := range offsets {
		rt := route(i)
		b := buckets[rt]
		if b == nil {
			b = &limiterBucket{limit: 10}
			buckets[rt] = b
		}
		d := b.decide(dec(p, start.Add(off), ip, rt))
		if !d.Allowed {
			denied++
		}
		out = s.Observe(d, out)
	}
	return out, denied
}

// spread is n calls evenly over d.
func spread(n int, d time.Duration) []time.Duration {
	out := make([]time.Duration, n)
	for i := range out {
		out[i] = time.Duration(int64(d) * int64(i) / int64(n))
	}
	return out
}

func routesOf(n int) func(int) string {
	return func(i int) string { return fmt.Sprintf("/r%d/{id}", i%n) }
}

func TestPeopleBurstsInsideTheirLimitsAreNotRapidFire(t *testing.T) {
	user := events.Principal{Kind: events.PrincipalUser}
	cases := []struct {
		name string
		run  func(s *Scorer, p events.Principal) ([]Detection, int)
	}{
		{"cold start: 60 calls over 12 routes in one second, on every resume (every 20 s for 5 minutes)", func(s *Scorer, p events.Principal) ([]Detection, int) {
			var out []Detection
			denied := 0
			for r := range 15 {
				var n int
				out, n = person(s, p, "100.64.3.7", t0.Add(time.Duration(r)*20*time.Second), spread(60, time.Second), routesOf(12), out)
				denied += n
			}
			return out, denied
		}},
		{"restored tabs: five tabs booting at once, 200 calls over 24 routes in 4 s", func(s *Scorer, p events.Principal) ([]Detection, int) {
			return person(s, p, "198.51.100.20", t0, spread(200, 4*time.Second), routesOf(24), nil)
		}},
		{"naive retries: 40 failed calls over 10 routes, each retried three times at once", func(s *Scorer, p events.Principal) ([]Detection, int) {
			offs := spread(40, 800*time.Millisecond)
			for a := 1; a <= 3; a++ {
				for i := range 40 {
					offs = append(offs, offs[i]+time.Duration(a)*5*time.Millisecond)
				}
			}
			sortDurations(offs)
			return person(s, p, "100.64.3.8", t0, offs, routesOf(10), nil)
		}},
		{"three devices at once: 16 calls/s over 20 routes for 7.5 s (a phone's cold start, a desktop restoring tabs, a laptop)", func(s *Scorer, p events.Principal) ([]Detection, int) {
			return person(s, p, "100.64.3.9", t0, spread(120, 7500*time.Millisecond), routesOf(20), nil)
		}},
		{"an engaged session: page loads of 25 calls every 3 s for two minutes", func(s *Scorer, p events.Principal) ([]Detection, int) {
			var out []Detection
			for r := range 40 {
				out, _ = person(s, p, "198.51.100.21", t0.Add(time.Duration(r)*3*time.Second), spread(25, 1500*time.Millisecond), routesOf(8), out)
			}
			return out, 0
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := newScorer(nil)
			p := user
			p.ID = "p_" + fmt.Sprint(len(tc.name))
			got, denied := tc.run(s, p)
			require.Empty(t, only(got, RapidFire), "limiter refused %d calls", denied)
		})
	}
}

// TestReconnectStormBehindOneAddressIsNotRapidFire: 300 people behind one
// carrier address reconnect within 3 s of a network change, each with a
// 40-call cold start; anonymous (logged-out) ones too. Nobody is rapid fire.
func TestReconnectStormBehindOneAddressIsNotRapidFire(t *testing.T) {
	s := newScorer(nil)
	var out []Detection
	for i := range 300 {
		kind := events.PrincipalUser
		if i%5 == 0 {
			kind = events.PrincipalAnonymous
		}
		p := events.Principal{Kind: kind, ID: fmt.Sprintf("storm_%03d", i)}
		at := t0.Add(time.Duration(i) * 10 * time.Millisecond)
		out, _ = person(s, p, "100.64.9.9", at, spread(40, 800*time.Millisecond), routesOf(10), out)
	}
	require.Empty(t, only(out, RapidFire))
}

// TestPersonPastTheLimitIsRapidFireInItsFirstBurst: an on/off abuser at
// 150 req/s on one route for 3 s (a pulse) is refused 14 calls in 15 and
// caught inside that first burst; a person holding 3× the line over routes
// inside their limits is caught once the rate held past a storm (the
// window's six buckets, then PersonSustain more).
func TestPersonPastTheLimitIsRapidFireInItsFirstBurst(t *testing.T) {
	s := newScorer(nil)
	p := events.Principal{Kind: events.PrincipalUser, ID: "pulse"}
	got, denied := person(s, p, "203.0.113.40", t0, spread(450, 3*time.Second), routesOf(1), nil)
	got = only(got, RapidFire)
	require.Greater(t, denied, 350)
	require.NotEmpty(t, got)
	require.Less(t, got[0].At.Sub(t0), time.Second)
	require.Equal(t, SourceLimit, got[0].BaselineSource)
	require.GreaterOrEqual(t, got[0].Denials, int64(20))

	s = newScorer(nil)
	p.ID = "held"
	got, denied = person(s, p, "203.0.113.41", t0, spread(600, 20*time.Second), routesOf(6), nil)
	got = only(got, RapidFire)
	require.Zero(t, denied, "30/s over six routes is 5/s a route: inside every limit")
	require.NotEmpty(t, got)
	require.GreaterOrEqual(t, got[0].At.Sub(t0), 11*time.Second)
	require.Less(t, got[0].At.Sub(t0), 13*time.Second)
	require.Equal(t, AllRoutes, got[0].Route)
	require.InDelta(t, 30/2.0, got[0].Score, 2, "scored on the rate held: 30/s against the floor of 2/s")
}

func sortDurations(ds []time.Duration) {
	for i := 1; i < len(ds); i++ {
		for j := i; j > 0 && ds[j] < ds[j-1]; j-- {
			ds[j], ds[j-1] = ds[j-1], ds[j]
		}
	}
}
