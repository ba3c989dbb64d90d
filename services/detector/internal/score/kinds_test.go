package score

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/floodgate-dev/floodgate/pkg/events"
)

// limiterBucket models the limiter's answer for one principal: a token
// bucket of limit per second with a burst of limit.
type limiterBucket struct {
	limit  float64
	tokens float64
	at     time.Time
}

func (b *limiterBucket) decide(d *events.Decision) *events.Decision {
	if b.at.IsZero() {
		b.tokens = b.limit
	} else {
		b.tokens = min(b.limit, b.tokens+d.TS.Sub(b.at).Seconds()*b.limit)
	}
	b.at = d.TS
	d.Limit = int64(b.limit)
	if b.tokens < 1 {
		d.Allowed, d.Remaining = false, 0
		return d
	}
	b.tokens--
	d.Allowed, d.Remaining = true, int64(b.tokens)
	d.NearLimit = d.Remaining*10 < d.Limit
	return d
}

// steady sends rate req/s (evenly spaced) for dur through a limiter bucket.
func steady(s *Scorer, p events.Principal, start time.Time, dur time.Duration, rate, limit float64, route string) []Detection {
	b := &limiterBucket{limit: limit}
	var out []Detection
	n := int(dur.Seconds() * rate)
	for i := 0; i < n; i++ {
		at := start.Add(time.Duration(float64(i) / rate * float64(time.Second)))
		out = s.Observe(b.decide(dec(p, at, "203.0.113.50", route)), out)
	}
	return out
}

// TestAutomationSteadyInsideItsLimitIsNotRapidFire: a declared bot at a
// steady 20/s on one route, far inside its limit of 50/s, from its first
// request on, is never detected (on main it was rapid fire within seconds).
func TestAutomationSteadyInsideItsLimitIsNotRapidFire(t *testing.T) {
	for _, kind := range []events.PrincipalKind{events.PrincipalBot, events.PrincipalAPIKey} {
		s := newScorer(nil)
		got := steady(s, events.Principal{Kind: kind, ID: "new"}, t0, 5*time.Minute, 20, 50, "/channels/{channel_id}/messages")
		require.Empty(t, got, "%s", kind)
	}
}

// TestAutomationRampingInsideItsLimitIsNotAbuse: a new integration ramping
// from nothing to 50/s over two minutes, inside a limit of 100/s.
func TestAutomationRampingInsideItsLimitIsNotAbuse(t *testing.T) {
	s := newScorer(nil)
	p := events.Principal{Kind: events.PrincipalAPIKey, ID: "ramp"}
	b := &limiterBucket{limit: 100}
	var out []Detection
	at := t0
	for at.Before(t0.Add(4 * time.Minute)) {
		rate := min(50, 0.5+50*at.Sub(t0).Seconds()/120)
		out = s.Observe(b.decide(dec(p, at, "203.0.113.51", "/v1/customers")), out)
		at = at.Add(time.Duration(float64(time.Second) / rate))
	}
	require.Empty(t, out)
}

// TestAutomationHammeringPastItsLimitIsRapidFire: a bot at 5× its limit
// (80 % of its requests denied) is rapid fire, graded by its rate against
// the limit, with the limit as its baseline.
func TestAutomationHammeringPastItsLimitIsRapidFire(t *testing.T) {
	s := newScorer(nil)
	got := only(steady(s, events.Principal{Kind: events.PrincipalBot, ID: "hammer"}, t0, 30*time.Second, 100, 20, "/a"), RapidFire)
	require.Len(t, got, 1)
	d := got[0]
	require.Equal(t, SourceLimit, d.BaselineSource)
	// A new bot has no history: its floor is its expectation, so running
	// past its limit from the start is a jump, and a quarter denied fires.
	require.GreaterOrEqual(t, d.DenialRatio, 0.25)
	require.InDelta(t, 1/(1-d.DenialRatio), d.Score, 1e-6, "the rate against what the limiter let through")
	require.InDelta(t, 1/(1-0.25), d.Threshold, 1e-9, "a jump fires past 4/3 of its limit (a quarter denied)")
	require.Greater(t, d.Score, d.Threshold)
	require.Contains(t, []events.Severity{events.SeverityMedium, events.SeverityHigh}, d.Severity)
	require.True(t, d.Penalize)
	require.Less(t, d.At.Sub(t0), 3*time.Second, "detected within the window of the start")

	// Just over its limit (1.2×: a sixth denied) is the limiter's business, not abuse.
	s2 := newScorer(nil)
	require.Empty(t, only(steady(s2, events.Principal{Kind: events.PrincipalBot, ID: "over"}, t0, time.Minute, 24, 20, "/a"), RapidFire))
}

// TestAutomationDeniedByItsPenaltyIsNotNewEvidence: denials by the
// detector's own penalty do not count, so a penalty is not its own evidence.
func TestAutomationDeniedByItsPenaltyIsNotNewEvidence(t *testing.T) {
	s := newScorer(nil)
	p := events.Principal{Kind: events.PrincipalBot, ID: "penalized"}
	var out []Detection
	for i := 0; i < 3000; i++ {
		d := dec(p, t0.Add(time.Duration(i)*10*time.Millisecond), "203.0.113.52", "/a")
		d.Allowed, d.Tier = i%10 == 0, events.TierPenalty
		out = s.Observe(d, out)
	}
	require.Empty(t, only(out, RapidFire))
}

// TestHumanAmongFastBotsIsRapidFire: people and automation are baselined
// apart, so a person posting 50 messages/s into a channel is caught even on
// a route where 100 established bots run at 20/s (on main the bots set the
// route's p99 and hid the person).
func TestHumanAmongFastBotsIsRapidFire(t *testing.T) {
	s := newScorer(func(c *Config) { c.BaselineHalfLife = time.Minute; c.RouteMinPrincipals = 50 })
	route := "/channels/{channel_id}/messages"
	rng := rand.New(rand.NewPCG(3, 4))
	buckets := map[int]*limiterBucket{}
	for ms := int64(0); ms < 4*60*1000; ms += 50 { // 100 bots × 20/s for 4 minutes
		for b := 0; b < 100; b++ {
			if buckets[b] == nil {
				buckets[b] = &limiterBucket{limit: 50}
			}
			at := t0.Add(time.Duration(ms+int64(b%50))*time.Millisecond + time.Duration(rng.IntN(10))*time.Millisecond)
			s.Observe(buckets[b].decide(dec(events.Principal{Kind: events.PrincipalBot, ID: fmt.Sprint("bot", b)}, at, fmt.Sprintf("198.51.100.%d", b+1), route)), nil)
		}
	}
	require.Greater(t, s.routes[1][route].q, 10.0, "the bots' population is fast")
	human := events.Principal{Kind: events.PrincipalUser, ID: "spammer"}
	got := only(feed(s, human, t0.Add(4*time.Minute), 10*time.Second, 500, oneIP(""), route), RapidFire)
	require.Len(t, got, 1)
	require.Less(t, got[0].RouteRate, 10.0, "held to people's rates, not the bots'")
	require.True(t, got[0].Penalize)
}

// TestFixedIntervalHumanIsNotPenalized: a person (or a script in their
// account) polling at exactly one request per 5 s is reported as bot_like at
// most, never with a penalty or a page (on main: critical, limits ×0.2).
func TestFixedIntervalHumanIsNotPenalized(t *testing.T) {
	s := newScorer(nil)
	p := events.Principal{Kind: events.PrincipalUser, ID: "clockwork"}
	got := feed(s, p, t0, 10*time.Minute, 120, oneIP(""), "/users/@me")
	require.NotEmpty(t, got, "the regularity is still reported for review")
	for _, d := range got {
		require.Equal(t, BotLike, d.Pattern)
		require.False(t, d.Penalize)
		require.Equal(t, events.SeverityLow, d.Severity)
	}
}

// TestTakeoverFanOutWithinTenSeconds: an account with ten minutes of normal
// history from home starts using a new network per request at 1 req/s; it
// is distributed_ip within 10 s of the first new network.
func TestTakeoverFanOutWithinTenSeconds(t *testing.T) {
	s := newScorer(nil)
	p := events.Principal{Kind: events.PrincipalUser, ID: "victim"}
	var out []Detection
	rng := rand.New(rand.NewPCG(5, 6))
	at := t0
	for at.Before(t0.Add(10 * time.Minute)) { // about one request every 2 s from home
		out = s.Observe(dec(p, at, "203.0.113.77", "/users/@me"), out)
		at = at.Add(time.Duration(500+rng.IntN(3000)) * time.Millisecond)
	}
	require.Empty(t, out)
	start := t0.Add(10 * time.Minute)
	for i := 0; i < 60 && len(only(out, DistributedIP)) == 0; i++ {
		ip := fmt.Sprintf("%d.%d.%d.9", 11+i, (i*37)%256, (i*11)%256)
		out = s.Observe(dec(p, start.Add(time.Duration(i)*time.Second), ip, "/users/@me"), out)
	}
	got := only(out, DistributedIP)
	require.Len(t, got, 1)
	require.LessOrEqual(t, got[0].At.Sub(start), 10*time.Second)
	require.GreaterOrEqual(t, got[0].NewNetworks, int64(DefaultConfig().FanoutMinNetworks))
	require.True(t, got[0].Penalize)
}

// TestLegitimateNetworkChangesAreNotFanOut: roaming phones, IPv6 privacy
// addresses and a carrier NAT pool inside one /24 are not fan-out.
func TestLegitimateNetworkChangesAreNotFanOut(t *testing.T) {
	cases := []struct {
		name string
		ip   func(i int) string
		gap  time.Duration
		n    int
	}{
		{"roaming: a new mobile network every 2 minutes", func(i int) string { return fmt.Sprintf("100.80.%d.7", i/60) }, 2 * time.Second, 600},
		{"IPv6 privacy: a new address per request inside one /64", func(i int) string { return fmt.Sprintf("2001:db8:5:6::%x", i+1) }, time.Second, 300},
		{"CGNAT pool: a new address per request inside one /24", func(i int) string { return fmt.Sprintf("100.64.3.%d", 1+i%200) }, time.Second, 300},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := newScorer(nil)
			// The carrier's other subscribers share its pool addresses.
			for a := 1; a <= 200; a++ {
				for u := 0; u < 6; u++ {
					s.Observe(dec(events.Principal{Kind: events.PrincipalUser, ID: fmt.Sprintf("sub%d-%d", a, u)}, t0, fmt.Sprintf("100.64.3.%d", a), "/users/@me"), nil)
				}
			}
			p := events.Principal{Kind: events.PrincipalUser, ID: "legit"}
			var out []Detection
			for i := 0; i < tc.n; i++ {
				out = s.Observe(dec(p, t0.Add(time.Duration(i)*tc.gap), tc.ip(i), "/users/@me"), out)
			}
			require.Empty(t, only(out, DistributedIP))
		})
	}
}

// TestFanOutAtOneRequestPerSecond: takeovers that send one request per second
// (Poisson), each from a new network, after ten minutes of normal history are
// all caught, 99 % of them within 10 s of the takeover: FanoutMinNetworks (5)
// new networks within FanoutInterval (10 s), counted exactly, is the 4th
// Poisson gap (Gamma(4, 1): p99 9.97 s). A fleet of a bot moving to new
// networks as fast is not fan-out (a deploy, an autoscaled fleet).
func TestFanOutAtOneRequestPerSecond(t *testing.T) {
	const victims = 400
	s := newScorer(nil)
	rng := rand.New(rand.NewPCG(11, 12))
	var lat []time.Duration
	for v := range victims {
		p := events.Principal{Kind: events.PrincipalUser, ID: fmt.Sprint("victim", v)}
		home := fmt.Sprintf("203.0.%d.%d", v/250, 1+v%250)
		at := t0
		for at.Before(t0.Add(10 * time.Minute)) {
			s.Observe(dec(p, at, home, "/users/@me"), nil)
			at = at.Add(time.Duration(5+rng.IntN(25)) * time.Second)
		}
		start := at
		var out []Detection
		for i := 0; i < 120 && len(only(out, DistributedIP)) == 0; i++ {
			ip := fmt.Sprintf("%d.%d.%d.9", 11+rng.IntN(150), rng.IntN(256), rng.IntN(256))
			out = s.Observe(dec(p, at, ip, "/users/@me"), out)
			at = at.Add(time.Duration(rng.ExpFloat64() * float64(time.Second)))
		}
		got := only(out, DistributedIP)
		require.Len(t, got, 1, "victim %d: caught", v)
		require.True(t, got[0].Penalize)
		lat = append(lat, got[0].At.Sub(start))
	}
	slices.Sort(lat)
	p99 := lat[len(lat)*99/100-1]
	t.Logf("fan-out at 1 req/s: p50 %s, p99 %s, max %s", lat[len(lat)/2], p99, lat[len(lat)-1])
	require.LessOrEqual(t, p99, 10*time.Second)

	// A bot scaled out to ten new pods within ten seconds, each on its own
	// network, then sending 10 req/s round robin over them.
	bot := newScorer(nil)
	b := events.Principal{Kind: events.PrincipalBot, ID: "fleet"}
	var out []Detection
	at := t0
	for i := range 600 {
		pod := i % 10
		out = bot.Observe(dec(b, at, fmt.Sprintf("%d.%d.7.9", 11+pod, pod), "/channels/{channel_id}/messages"), out)
		if at = at.Add(100 * time.Millisecond); i < 10 {
			at = at.Add(900 * time.Millisecond) // a new pod a second
		}
	}
	require.Empty(t, only(out, DistributedIP), "a bot's pods on new networks are no fan-out")
}

// TestFanOutSpanIsExact: five new networks within 10 s (whole seconds) fire;
// the same five spread over 11 s do not.
func TestFanOutSpanIsExact(t *testing.T) {
	for _, tc := range []struct {
		span time.Duration
		want int
	}{{10 * time.Second, 1}, {11 * time.Second, 0}} {
		s := newScorer(nil)
		p := events.Principal{Kind: events.PrincipalUser, ID: "p"}
		var out []Detection
		step := tc.span / 4
		for i := range 5 {
			out = s.Observe(dec(p, t0.Add(time.Duration(i)*step), fmt.Sprintf("%d.1.1.9", 11+i), "/a"), out)
		}
		require.Len(t, only(out, DistributedIP), tc.want, "five new networks over %s", tc.span)
	}
}
