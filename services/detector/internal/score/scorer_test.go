package score

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/floodgate-dev/floodgate/pkg/events"
)

var t0 = time.Date(2026, 11, 22, 10, 0, 0, 0, time.UTC)

func dec(p events.Principal, at time.Time, ip, route string) *events.Decision {
	return &events.Decision{ID: "d", TS: at, Principal: p, IP: netip.MustParseAddr(ip), Method: "POST", Route: route,
		Allowed: true, Tier: events.TierPrincipal, Cost: 1, Limit: 50, Remaining: 10, Gateway: "t"}
}

func newScorer(mod func(*Config)) *Scorer {
	cfg := DefaultConfig()
	if mod != nil {
		mod(&cfg)
	}
	if err := cfg.Validate(); err != nil {
		panic(err)
	}
	return New(cfg, NewIPStore(cfg))
}

// feed sends n events spread evenly over d and returns the detections.
func feed(s *Scorer, p events.Principal, start time.Time, d time.Duration, n int, ip func(i int) string, route string) []Detection {
	var out []Detection
	for i := 0; i < n; i++ {
		at := start.Add(time.Duration(int64(d) * int64(i) / int64(n)))
		out = s.Observe(dec(p, at, ip(i), route), out)
	}
	return out
}

func oneIP(string) func(int) string { return func(int) string { return "203.0.113.9" } }

func only(ds []Detection, p events.Pattern) []Detection {
	var out []Detection
	for _, d := range ds {
		if d.Pattern == p {
			out = append(out, d)
		}
	}
	return out
}

func TestConfigValidateNamesTheVariable(t *testing.T) {
	cases := []struct {
		name string
		mod  func(*Config)
		env  string
	}{
		{"window not whole seconds", func(c *Config) { c.Window = 1500 * time.Millisecond }, "FLOODGATE_DETECTOR_WINDOW"},
		{"threshold at most 1", func(c *Config) { c.Threshold = 1 }, "FLOODGATE_DETECTOR_RAPID_FIRE_THRESHOLD"},
		{"floor zero", func(c *Config) { c.Floor = 0 }, "FLOODGATE_DETECTOR_RAPID_FIRE_RATE"},
		{"half-life shorter than window", func(c *Config) { c.BaselineHalfLife = time.Second }, "FLOODGATE_DETECTOR_BASELINE_HALF_LIFE"},
		{"quantile 1", func(c *Config) { c.RouteQuantile = 1 }, "FLOODGATE_DETECTOR_ROUTE_QUANTILE"},
		{"diversity above 1", func(c *Config) { c.MinDiversity = 1.5 }, "FLOODGATE_DETECTOR_IP_MIN_DIVERSITY"},
		{"shared at 1", func(c *Config) { c.SharedIPPrincipals = 1 }, "FLOODGATE_DETECTOR_SHARED_IP_PRINCIPALS"},
		{"cv 0", func(c *Config) { c.BotLikeMaxCV = 0 }, "FLOODGATE_DETECTOR_BOT_LIKE_MAX_CV"},
		{"denial ratio 0", func(c *Config) { c.AutomatedDenialRatio = 0 }, "FLOODGATE_DETECTOR_AUTOMATED_DENIAL_RATIO"},
		{"fan-out above the distinct minimum", func(c *Config) { c.FanoutMinNetworks = 30 }, "FLOODGATE_DETECTOR_FANOUT_MIN_NETWORKS"},
		{"fan-out interval longer than the IP window", func(c *Config) { c.FanoutInterval = time.Hour }, "FLOODGATE_DETECTOR_FANOUT_INTERVAL"},
		{"a person's sustain over a minute", func(c *Config) { c.PersonSustain = 2 * time.Minute }, "FLOODGATE_DETECTOR_PERSON_SUSTAIN"},
		{"no denials needed", func(c *Config) { c.PersonMinDenials = 0 }, "FLOODGATE_DETECTOR_PERSON_MIN_DENIALS"},
		{"every call refused", func(c *Config) { c.PersonDenialRatio = 1 }, "FLOODGATE_DETECTOR_PERSON_DENIAL_RATIO"},
	}
	require.NoError(t, DefaultConfig().Validate())
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := DefaultConfig()
			tc.mod(&c)
			require.ErrorContains(t, c.Validate(), tc.env)
		})
	}
}

func TestRapidFireAgainstTheFloor(t *testing.T) {
	bot := events.Principal{Kind: events.PrincipalUser, ID: "b"} // people are held to the floor; automation is not (TestAutomation*)
	cases := []struct {
		name   string
		events int
		over   time.Duration
		want   int
	}{
		{"human pace", 30, 30 * time.Second, 0},
		{"burst of 40 in a second is 4/s over the window: score 2", 40, time.Second, 0},
		{"just under floor × threshold (10/s)", 95, 10 * time.Second, 0},
		{"50/s sustained", 1000, 20 * time.Second, 1},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := only(feed(newScorer(nil), bot, t0, tc.over, tc.events, oneIP(""), "/a"), RapidFire)
			require.Len(t, got, tc.want)
			for _, d := range got {
				require.Greater(t, d.Score, 5.0)
				require.InDelta(t, d.ObservedRate/d.ExpectedRate, d.Score, 1e-9)
				require.Equal(t, 2.0, d.ExpectedRate, "a new principal on a new route is held to the floor")
				require.False(t, d.FirstEventAt.After(d.At))
				require.Equal(t, "/a", d.TopRoutes[0].Route)
				require.Equal(t, int64(1), d.DistinctIPs)
			}
		})
	}
}

func TestRapidFireBaselineRaisesTheBarForAHeavyUser(t *testing.T) {
	heavy := events.Principal{Kind: events.PrincipalUser, ID: "k"}
	s := newScorer(func(c *Config) { c.BaselineHalfLife = time.Minute })
	// 8/s for 10 minutes teaches an EWMA of ~8/s: expected becomes 24/s.
	require.Empty(t, only(feed(s, heavy, t0, 10*time.Minute, 4800, oneIP(""), "/a"), RapidFire))
	// 60/s is 30 × the floor but only 2.5 × its own baseline × k: no detection.
	require.Empty(t, only(feed(s, heavy, t0.Add(10*time.Minute), 10*time.Second, 600, oneIP(""), "/a"), RapidFire))
	// A fresh principal at the same 60/s is rapid fire.
	fresh := events.Principal{Kind: events.PrincipalUser, ID: "f"}
	got := only(feed(s, fresh, t0.Add(10*time.Minute), 10*time.Second, 600, oneIP(""), "/a"), RapidFire)
	require.Len(t, got, 1)
	// The heavy user at 200/s is detected, with its baseline in the evidence.
	got = only(feed(s, heavy, t0.Add(11*time.Minute), 10*time.Second, 2000, oneIP(""), "/a"), RapidFire)
	require.Len(t, got, 1)
	require.Greater(t, got[0].Baseline, 4.0, "learned, then decayed over the idle minute")
	require.InDelta(t, got[0].Baseline*3, got[0].ExpectedRate, 1e-6)
}

func TestRapidFireRouteQuantileRaisesTheBarOnABusyRoute(t *testing.T) {
	s := newScorer(nil)
	rng := rand.New(rand.NewPCG(1, 2))
	// 300 principals polling /feed at ~15/s: the route's p99 is ~15/s.
	for sec := 0; sec < 30; sec++ {
		for i := 0; i < 300; i++ {
			p := events.Principal{Kind: events.PrincipalUser, ID: fmt.Sprintf("u%d", i)}
			for k := 0; k < 15; k++ {
				at := t0.Add(time.Duration(sec)*time.Second + time.Duration(rng.IntN(1000))*time.Millisecond)
				s.Observe(dec(p, at, "198.51.100.1", "/feed"), nil)
			}
		}
	}
	rt := s.routes[0]["/feed"]
	require.InDelta(t, 15, rt.q, 3, "route quantile")
	// 40/s is 20 × the floor but under 5 × the route's p99: not rapid fire there...
	p := events.Principal{Kind: events.PrincipalUser, ID: "x"}
	require.Empty(t, only(feed(s, p, t0.Add(30*time.Second), 10*time.Second, 400, oneIP(""), "/feed"), RapidFire))
	// ...but it is on a quiet route.
	require.Len(t, only(feed(s, p, t0.Add(30*time.Second), 10*time.Second, 400, oneIP(""), "/quiet"), RapidFire), 1)
}

func TestRapidFireCooldownLateEventsAndReplay(t *testing.T) {
	bot := events.Principal{Kind: events.PrincipalUser, ID: "b"}
	s := newScorer(func(c *Config) { c.Cooldown = 30 * time.Second })
	require.Len(t, only(feed(s, bot, t0, 20*time.Second, 2000, oneIP(""), "/a"), RapidFire), 1, "one detection per cool-down")
	require.Len(t, only(feed(s, bot, t0.Add(31*time.Second), 10*time.Second, 1000, oneIP(""), "/a"), RapidFire), 1, "again after it")

	// Events older than the window do not count.
	late := newScorer(nil)
	other := events.Principal{Kind: events.PrincipalBot, ID: "c"}
	late.Observe(dec(other, t0.Add(100*time.Second), "203.0.113.9", "/a"), nil)
	require.Empty(t, feed(late, other, t0, time.Second, 500, oneIP(""), "/a"))

	// Replaying the same events yields the same detections.
	a := only(feed(newScorer(nil), bot, t0, 10*time.Second, 1000, oneIP(""), "/a"), RapidFire)
	b := only(feed(newScorer(nil), bot, t0, 10*time.Second, 1000, oneIP(""), "/a"), RapidFire)
	require.Len(t, a, 1)
	require.Equal(t, a, b)
}

func TestAnonymousOnASharedIPIsNotRapidFire(t *testing.T) {
	s := newScorer(nil)
	for i := 0; i < 10; i++ {
		s.Observe(dec(events.Principal{Kind: events.PrincipalUser, ID: fmt.Sprint(i)}, t0, "100.64.0.1", "/a"), nil)
	}
	anon := events.Principal{Kind: events.PrincipalAnonymous, ID: "100.64.0.1"}
	require.Empty(t, feed(s, anon, t0, 10*time.Second, 1000, func(int) string { return "100.64.0.1" }, "/a"))
	anon2 := events.Principal{Kind: events.PrincipalAnonymous, ID: "203.0.113.50"}
	require.Len(t, only(feed(s, anon2, t0, 10*time.Second, 1000, func(int) string { return "203.0.113.50" }, "/a"), RapidFire), 1)
}

func TestDistributedIP(t *testing.T) {
	botnetIP := func(i int) string { return fmt.Sprintf("198.%d.%d.%d", 18+i%7, i%200, 1+i%250) }
	cases := []struct {
		name    string
		events  int
		over    time.Duration
		ip      func(i int) string
		setup   func(s *Scorer)
		want    int
		wantIPs int64
	}{
		{"botnet: 60 IPs, one request each, one every 4 s (slower than the fan-out line)", 60, 4 * time.Minute, botnetIP, nil, 1, 21},
		{"roaming mobile: 6 IPs over 5 minutes", 300, 5 * time.Minute, func(i int) string { return fmt.Sprintf("100.64.%d.7", i/50) }, nil, 0, 0},
		{"25 new IPs, one every 3 s, after 200 requests from home (diversity 0.25, slower than the fan-out line)", 225, 225 * 3 * time.Second, func(i int) string { return fmt.Sprintf("203.0.%d.1", max(0, i-200)) }, nil, 0, 0},
		{"takeover: 25 new networks at ~1/s after 200 requests from home (fan-out)", 225, 4 * time.Minute, func(i int) string { return fmt.Sprintf("203.0.%d.1", max(0, i-200)) }, nil, 1, 0},
		{"IPv6 privacy addresses in one /64 are one IP", 100, time.Minute, func(i int) string { return fmt.Sprintf("2001:db8:1:2::%x", i+1) }, nil, 0, 0},
		{"IPv6 botnet over 30 /64s, one every 5 s", 30, 150 * time.Second, func(i int) string { return fmt.Sprintf("2001:db8:%x::1", i+1) }, nil, 1, 21},
		{"25 IPs all shared (carrier NAT) never penalize", 25, time.Minute, func(i int) string { return fmt.Sprintf("100.65.0.%d", i+1) },
			func(s *Scorer) {
				for ip := 1; ip <= 25; ip++ {
					for u := 0; u < 6; u++ {
						s.Observe(dec(events.Principal{Kind: events.PrincipalUser, ID: fmt.Sprintf("nat%d-%d", ip, u)}, t0, fmt.Sprintf("100.65.0.%d", ip), "/a"), nil)
					}
				}
			}, 0, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := newScorer(nil)
			if tc.setup != nil {
				tc.setup(s)
			}
			p := events.Principal{Kind: events.PrincipalUser, ID: "p"}
			got := only(feed(s, p, t0, tc.over, tc.events, tc.ip, "/a"), DistributedIP)
			require.Equal(t, tc.want > 0, len(got) > 0, "%d detections", len(got))
			if tc.want > 0 && tc.wantIPs == 0 {
				d := got[0]
				require.GreaterOrEqual(t, d.NewNetworks, int64(DefaultConfig().FanoutMinNetworks), "fired by new-network velocity")
				require.Less(t, d.DistinctIPs, int64(21), "before diversity over the window could")
				require.True(t, d.Penalize)
			}
			if tc.want > 0 && tc.wantIPs > 0 {
				d := got[0]
				require.Equal(t, tc.wantIPs, d.DistinctIPs, "detected as the 21st distinct IP arrives")
				require.Equal(t, d.DistinctIPs, d.UnsharedIPs)
				require.Greater(t, d.Diversity, 0.8)
				require.Greater(t, d.Score, 1.0)
				require.NotEmpty(t, d.TopIPs)
			}
		})
	}
}

func TestDistributedIPTopIPsCarrySharedPrincipals(t *testing.T) {
	s := newScorer(nil)
	for u := 0; u < 7; u++ {
		s.Observe(dec(events.Principal{Kind: events.PrincipalUser, ID: fmt.Sprint("o", u)}, t0, "100.64.9.9", "/a"), nil)
	}
	p := events.Principal{Kind: events.PrincipalUser, ID: "p"}
	var got []Detection
	for i := 0; i < 40; i++ {
		ip := fmt.Sprintf("198.51.%d.1", i)
		if i < 15 {
			ip = "100.64.9.9"
		}
		got = s.Observe(dec(p, t0.Add(time.Duration(i)*3*time.Second), ip, "/a"), got)
	}
	got = only(got, DistributedIP)
	require.Len(t, got, 0, "15 of 40 requests on one IP: diversity 26/40 is below 0.8, and one new network per 3 s is no fan-out")

	s2 := newScorer(nil)
	for u := 0; u < 7; u++ {
		s2.Observe(dec(events.Principal{Kind: events.PrincipalUser, ID: fmt.Sprint("o", u)}, t0, "100.64.9.9", "/a"), nil)
	}
	got = nil
	for i := 0; i < 40; i++ {
		ip := fmt.Sprintf("198.51.%d.1", i)
		if i == 0 {
			ip = "100.64.9.9"
		}
		got = s2.Observe(dec(p, t0.Add(time.Duration(i)*3*time.Second), ip, "/a"), got)
	}
	got = only(got, DistributedIP)
	require.Len(t, got, 1)
	require.Equal(t, int64(22), got[0].DistinctIPs, "the shared IP is evidence but does not count")
	require.Equal(t, int64(21), got[0].UnsharedIPs)
	shared := false
	for _, ip := range got[0].TopIPs {
		if ip.IP == netip.MustParseAddr("100.64.9.9") {
			shared = true
			require.Equal(t, int64(7), ip.SharedPrincipals)
		}
	}
	require.True(t, shared, "the shared IP is in the evidence: %+v", got[0].TopIPs)
}

func TestDistributedIPSwitchesToHyperLogLog(t *testing.T) {
	s := newScorer(func(c *Config) { c.Cooldown = 0 })
	p := events.Principal{Kind: events.PrincipalBot, ID: "big"}
	got := feed(s, p, t0, time.Minute, 3000, func(i int) string { return fmt.Sprintf("10.%d.%d.1", i/250, i%250) }, "/a")
	got = only(got, DistributedIP)
	require.NotEmpty(t, got)
	last := got[len(got)-1]
	require.InEpsilon(t, 3000, last.DistinctIPs, 0.05, "HyperLogLog estimate")
	require.Nil(t, s.big[s.principalHash(p)].exact, "switched to HyperLogLog")
}

func TestBotLike(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	regular := func(period time.Duration, jitter float64) func(i int) time.Duration {
		return func(i int) time.Duration {
			return time.Duration(float64(i)*float64(period) + (rng.Float64()*2-1)*jitter*float64(period))
		}
	}
	human := func(i int) time.Duration { // bursts of clicks, pauses of seconds to a minute
		return time.Duration(i/8)*20*time.Second + time.Duration(i%8)*time.Duration(200+rng.IntN(2000))*time.Millisecond
	}
	cases := []struct {
		name string
		kind events.PrincipalKind
		at   func(i int) time.Duration
		want int
	}{
		{"script every 2s ±3%", events.PrincipalUser, regular(2*time.Second, 0.03), 1},
		{"person", events.PrincipalUser, human, 0},
		{"app polling every 30s is slower than the max mean gap", events.PrincipalUser, regular(30*time.Second, 0.01), 0},
		{"bots are automated by definition", events.PrincipalBot, regular(2*time.Second, 0.03), 0},
		{"jitter ±40% is not flagged", events.PrincipalUser, regular(2*time.Second, 0.4), 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := newScorer(func(c *Config) { c.Cooldown = time.Hour })
			p := events.Principal{Kind: tc.kind, ID: "p"}
			var got []Detection
			for i := 0; i < 200; i++ {
				got = s.Observe(dec(p, t0.Add(tc.at(i)), "198.51.100.4", "/a"), got)
			}
			got = only(got, BotLike)
			require.Len(t, got, tc.want)
			if tc.want > 0 {
				require.Less(t, got[0].GapCV, 0.1)
				require.InDelta(t, 2, got[0].GapMean, 0.1)
			}
		})
	}
}

func TestSweepForgetsIdlePrincipals(t *testing.T) {
	s := newScorer(func(c *Config) { c.Cooldown = 0 })
	for i := 0; i < 100; i++ {
		s.Observe(dec(events.Principal{Kind: events.PrincipalUser, ID: fmt.Sprint(i)}, t0, "198.51.100.1", "/a"), nil)
	}
	require.Equal(t, 100, s.Stats().Principals)
	s.Observe(dec(events.Principal{Kind: events.PrincipalUser, ID: "late"}, t0.Add(time.Minute), "198.51.100.2", "/a"), nil)
	require.Equal(t, 101, s.Stats().Principals, "inside the IP window")
	require.Equal(t, 1, s.Stats().Windows, "rate windows of idle principals without a baseline go")
	s.Observe(dec(events.Principal{Kind: events.PrincipalUser, ID: "later"}, t0.Add(10*time.Minute), "198.51.100.3", "/a"), nil)
	require.Equal(t, 1, s.Stats().Principals)
	require.Equal(t, 1, s.ips.Sweep(t0.Add(10*time.Minute).UnixMilli()))
}

// The unspecified address is a gateway's "client address unknown" (an Envoy
// call that carries none): no address at all. Principals sending from it do
// not share an address, and an anonymous principal behind it (named by a
// session key) is judged on its own, not exempted as if on a shared one.
func TestUnknownAddressIsNoAddress(t *testing.T) {
	s := newScorer(nil)
	for i := 0; i < 10; i++ {
		s.Observe(dec(events.Principal{Kind: events.PrincipalUser, ID: fmt.Sprint(i)}, t0, "0.0.0.0", "/a"), nil)
		s.Observe(dec(events.Principal{Kind: events.PrincipalUser, ID: fmt.Sprint(i)}, t0, "::", "/a"), nil)
	}
	sec := seconds(t0.UnixMilli())
	require.Zero(t, s.ips.principals(ipKeyOnly(netip.MustParseAddr("0.0.0.0")), sec), "not one address shared by all")
	anon := events.Principal{Kind: events.PrincipalAnonymous, ID: "session-1"}
	require.Len(t, only(feed(s, anon, t0, 10*time.Second, 1000, func(int) string { return "0.0.0.0" }, "/a"), RapidFire), 1)
}
