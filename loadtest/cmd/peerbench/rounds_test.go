package main

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestSummarizeEqualLoad: an open-loop run's sums leave out a service's
// INVALID rounds while it has a valid one, sum them all when it has none
// (and say so), count the rounds that fell BEHIND the offered rate, and
// give the per core-second ratios from the rounds they hold.
func TestSummarizeEqualLoad(t *testing.T) {
	round := func(name string, n int, calls int64, service time.Duration, invalid bool) result {
		return result{name: name, round: n, offered: 1000, calls: calls, duration: time.Second,
			procs: [3]time.Duration{service}, busy: []float64{0.5, 0.5}, invalid: invalid}
	}
	results := []result{
		round("envoy ratelimit", 1, 1000, 50*time.Millisecond, false),
		round("floodgate", 1, 1000, 10*time.Millisecond, false),
		round(floorName, 1, 900, 9*time.Millisecond, true),
		round(floorName, 2, 900, 9*time.Millisecond, true),
		round("floodgate", 2, 1000, 40*time.Millisecond, true), // left out: round 1 was valid
		round("envoy ratelimit", 2, 1000, 50*time.Millisecond, false),
	}
	targets := []target{{name: "envoy ratelimit"}, {name: "floodgate"}, {name: floorName}}
	g := regime{rate: 1000, callers: 8, conns: 4, users: 10, d: time.Second}
	c := summarize("grpc", targets, g, results)

	require.Equal(t, 1000.0, c.Offered)
	fg := c.Services[1]
	require.Equal(t, int64(1000), fg.Calls, "the INVALID round 2 is left out")
	require.Equal(t, 1, fg.Invalid)
	require.False(t, fg.AllInvalid)
	require.InDelta(t, 10.0, fg.CPU.Service, 1e-9)
	require.InDelta(t, 5.0, c.ServiceCPURatio, 1e-9, "50 µs against 10 µs a call")

	floor := c.Services[2]
	require.True(t, floor.AllInvalid)
	require.Equal(t, int64(1800), floor.Calls, "every round INVALID: all are summed")
	require.Equal(t, 2, floor.Behind, "900 of 1,000 calls/s offered")
	require.InDelta(t, 1.0, c.FloorCPURatio, 1e-9)
	require.Zero(t, c.Services[0].Behind)

	queued := round("envoy ratelimit", 3, 1000, 50*time.Millisecond, false)
	require.False(t, queued.behind(), "no latencies: none late")
	queued.lat = []time.Duration{time.Millisecond, 150 * time.Millisecond, 200 * time.Millisecond}
	require.True(t, queued.behind(), "every call made, the median 150 ms after its due time")

	tallies := map[string]*tally{"envoy ratelimit": {rounds: 2, used: []int{1, 2}}, "floodgate": {rounds: 2, invalid: 1, used: []int{1}},
		floorName: {rounds: 2, invalid: 2, used: []int{1, 2}}}
	require.Equal(t, "figures and ratios NOT all from valid rounds: envoy ratelimit 1,2; floodgate 1; floor (does nothing) 1,2 (every one INVALID)",
		sources(targets, tallies))
	delete(tallies, floorName)
	require.Equal(t, "figures and ratios from valid rounds only: envoy ratelimit 1,2; floodgate 1", sources(targets[:2], tallies))
}

// TestShortOfItsQuota: a round under -quota whose service used under 85 %
// of it is SHORT, and its line says so; one that used its quota, or ran
// with none, is not.
func TestShortOfItsQuota(t *testing.T) {
	r := result{name: "floodgate", calls: 1000, duration: 10 * time.Second, quota: 0.3, throttled: 2000,
		procs: [3]time.Duration{2400 * time.Millisecond}}
	require.True(t, r.short(), "24 % of a core under 0.3")
	require.Contains(t, roundMarks(r, placement{}), "SHORT of its quota: used 80 % of it")
	require.Contains(t, roundMarks(r, placement{}), "quota 0.30 core, throttled in 2000 periods")
	r.procs[0] = 2900 * time.Millisecond
	require.False(t, r.short(), "29 % of a core under 0.3")
	require.NotContains(t, roundMarks(r, placement{}), "SHORT")
	r.quota = 0
	require.False(t, r.short())
	require.NotContains(t, roundMarks(r, placement{}), "quota")
}

// TestRoundMarksTheProbe: a pinned round's line says what the speed probe
// took just before it; a round without one says nothing of it.
func TestRoundMarksTheProbe(t *testing.T) {
	r := result{name: "floodgate", calls: 1000, duration: 10 * time.Second, probe: 212400 * time.Microsecond}
	require.Contains(t, roundMarks(r, placement{}), "speed probe before it 212 ms CPU")
	r.probe = 0
	require.NotContains(t, roundMarks(r, placement{}), "probe")
}
