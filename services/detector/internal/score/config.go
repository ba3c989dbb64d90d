// Package score holds the detector's scorers: per-partition, event-time state
// that turns decision events into detections (rapid_fire, distributed_ip,
// bot_like). It has no I/O: the detector package turns detections into
// penalties, abuse events, records and pages.
package score

import (
	"errors"
	"fmt"
	"time"
)

// Config tunes every pattern. Zero fields take the defaults of DefaultConfig
// through WithDefaults; Validate names the environment variable of each field.
type Config struct {
	// Window is rapid_fire's sliding window (FLOODGATE_DETECTOR_WINDOW), whole
	// seconds in 1s..10m, held as NumBuckets buckets.
	Window time.Duration
	// Threshold is the rapid_fire score (observed / expected rate) above which
	// a principal is detected (FLOODGATE_DETECTOR_RAPID_FIRE_THRESHOLD).
	Threshold float64
	// Floor is the lowest expected rate in events/s per principal and route
	// (FLOODGATE_DETECTOR_RAPID_FIRE_RATE): nobody is rapid fire below
	// Floor × Threshold whatever their baseline.
	Floor float64
	// BaselineK multiplies the principal's own EWMA rate on a route
	// (FLOODGATE_DETECTOR_BASELINE_K); BaselineHalfLife is the EWMA's half-life
	// (FLOODGATE_DETECTOR_BASELINE_HALF_LIFE).
	BaselineK        float64
	BaselineHalfLife time.Duration
	// RouteQuantile is the quantile of the route's population of per-principal
	// window rates used as an expected rate (FLOODGATE_DETECTOR_ROUTE_QUANTILE);
	// it counts once RouteMinPrincipals distinct principals fed the route's
	// sketch (FLOODGATE_DETECTOR_ROUTE_MIN_PRINCIPALS), so no single principal
	// sets its own bar.
	RouteQuantile      float64
	RouteMinPrincipals int
	// Cooldown: after a detection the principal is not detected again for the
	// same pattern for this long (FLOODGATE_DETECTOR_COOLDOWN).
	Cooldown time.Duration

	// IPWindow is distributed_ip's window (FLOODGATE_DETECTOR_IP_WINDOW).
	IPWindow time.Duration
	// MinDistinctIPs: more unshared distinct IPs (IPv6 by /64) than this in
	// IPWindow (FLOODGATE_DETECTOR_IP_MIN_DISTINCT), with a diversity
	// (distinct / requests) above MinDiversity (FLOODGATE_DETECTOR_IP_MIN_DIVERSITY).
	MinDistinctIPs int
	MinDiversity   float64
	// SharedIPPrincipals: an IP used by at least this many principals in
	// IPWindow is shared (carrier NAT, proxy) and never counts towards
	// distributed_ip (FLOODGATE_DETECTOR_SHARED_IP_PRINCIPALS).
	SharedIPPrincipals int

	// BotLikeMinGaps: bot_like needs this many inter-arrival gaps
	// (FLOODGATE_DETECTOR_BOT_LIKE_MIN_GAPS) with a coefficient of variation
	// below BotLikeMaxCV (FLOODGATE_DETECTOR_BOT_LIKE_MAX_CV) and a mean gap
	// of at most BotLikeMaxMeanGap (FLOODGATE_DETECTOR_BOT_LIKE_MAX_MEAN_GAP).
	// Only user and anonymous principals are scored: bots and API keys are
	// automated by definition.
	BotLikeMinGaps    int
	BotLikeMaxCV      float64
	BotLikeMaxMeanGap time.Duration

	// AutomatedDenialRatio: a bot or API key is rapid fire only while at
	// least this share of its requests on a route is denied by the limiter
	// (FLOODGATE_DETECTOR_AUTOMATED_DENIAL_RATIO), or half of it together
	// with a jump of Threshold × its own history. Inside its limits,
	// automation is never rapid fire.
	AutomatedDenialRatio float64
	// FanoutMinNetworks new networks (IPv4 /24 runs, IPv6 /64s) within
	// FanoutInterval, all unshared, is distributed_ip at once
	// (FLOODGATE_DETECTOR_FANOUT_MIN_NETWORKS, FLOODGATE_DETECTOR_FANOUT_INTERVAL).
	FanoutMinNetworks int
	FanoutInterval    time.Duration

	// People (user, anonymous) are bursty: rate alone never makes a person
	// rapid fire while they stay inside their limits. Their rapid_fire needs
	// sustained pressure: at least PersonMinDenials denials making up
	// PersonDenialRatio of their decisions in about one window
	// (FLOODGATE_DETECTOR_PERSON_MIN_DENIALS,
	// FLOODGATE_DETECTOR_PERSON_DENIAL_RATIO), or a rate above the line held
	// for longer than PersonSustain (FLOODGATE_DETECTOR_PERSON_SUSTAIN): a
	// burst that ends within PersonSustain, whatever its size, never counts.
	PersonSustain     time.Duration
	PersonMinDenials  int
	PersonDenialRatio float64
}

// sustainBuckets is how many of the window's buckets a person's rate must
// hold in: a burst lasting PersonSustain touches at most
// ceil(PersonSustain / bucket width) + 1 buckets, so one more than that —
// at most the whole window (a short window holds less than PersonSustain;
// over all routes the hold that follows makes up the rest).
func (c Config) sustainBuckets() int {
	width := max(c.Window/NumBuckets, 1)
	return min(int((c.PersonSustain+width-1)/width)+2, NumBuckets)
}

// NumBuckets is how many buckets rapid_fire's window is held in.
const NumBuckets = 8

// DefaultConfig is what the detector runs with when nothing is set.
func DefaultConfig() Config {
	return Config{
		Window: 10 * time.Second, Threshold: 5, Floor: 2, BaselineK: 3, BaselineHalfLife: 10 * time.Minute,
		RouteQuantile: 0.99, RouteMinPrincipals: 100, Cooldown: time.Minute,
		IPWindow: 5 * time.Minute, MinDistinctIPs: 20, MinDiversity: 0.8, SharedIPPrincipals: 5,
		BotLikeMinGaps: 64, BotLikeMaxCV: 0.1, BotLikeMaxMeanGap: 10 * time.Second,
		AutomatedDenialRatio: 0.5, FanoutMinNetworks: 5, FanoutInterval: 10 * time.Second,
		PersonSustain: 5 * time.Second, PersonMinDenials: 20, PersonDenialRatio: 1.0 / 3,
	}
}

// Validate checks ranges and how fields relate; errors name the variable.
func (c Config) Validate() error {
	var errs []error
	bad := func(env, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%s: %s", env, fmt.Sprintf(format, args...)))
	}
	if c.Window < time.Second || c.Window > 10*time.Minute || c.Window%time.Second != 0 {
		bad("FLOODGATE_DETECTOR_WINDOW", "%s: whole seconds in 1s..10m", c.Window)
	}
	if c.Threshold <= 1 {
		bad("FLOODGATE_DETECTOR_RAPID_FIRE_THRESHOLD", "%g: must be above 1 (a score is observed / expected)", c.Threshold)
	}
	if c.Floor <= 0 {
		bad("FLOODGATE_DETECTOR_RAPID_FIRE_RATE", "%g: must be positive (events per second)", c.Floor)
	}
	if c.BaselineK <= 0 {
		bad("FLOODGATE_DETECTOR_BASELINE_K", "%g: must be positive", c.BaselineK)
	}
	if c.BaselineHalfLife < c.Window {
		bad("FLOODGATE_DETECTOR_BASELINE_HALF_LIFE", "%s: must be at least FLOODGATE_DETECTOR_WINDOW (%s)", c.BaselineHalfLife, c.Window)
	}
	if c.RouteQuantile < 0.5 || c.RouteQuantile >= 1 {
		bad("FLOODGATE_DETECTOR_ROUTE_QUANTILE", "%g: must be in [0.5, 1)", c.RouteQuantile)
	}
	if c.RouteMinPrincipals < 10 {
		bad("FLOODGATE_DETECTOR_ROUTE_MIN_PRINCIPALS", "%d: at least 10", c.RouteMinPrincipals)
	}
	if c.Cooldown < 0 {
		bad("FLOODGATE_DETECTOR_COOLDOWN", "must not be negative")
	}
	if c.IPWindow < time.Second || c.IPWindow > 24*time.Hour || c.IPWindow%time.Second != 0 {
		bad("FLOODGATE_DETECTOR_IP_WINDOW", "%s: whole seconds in 1s..24h", c.IPWindow)
	}
	if c.MinDistinctIPs < 2 || c.MinDistinctIPs > maxExactIPs/2 {
		bad("FLOODGATE_DETECTOR_IP_MIN_DISTINCT", "%d: must be in 2..%d", c.MinDistinctIPs, maxExactIPs/2)
	}
	if c.MinDiversity <= 0 || c.MinDiversity > 1 {
		bad("FLOODGATE_DETECTOR_IP_MIN_DIVERSITY", "%g: must be in (0, 1]", c.MinDiversity)
	}
	if c.SharedIPPrincipals < 2 {
		bad("FLOODGATE_DETECTOR_SHARED_IP_PRINCIPALS", "%d: at least 2", c.SharedIPPrincipals)
	}
	if c.BotLikeMinGaps < 8 || c.BotLikeMinGaps > 60000 {
		bad("FLOODGATE_DETECTOR_BOT_LIKE_MIN_GAPS", "%d: must be in 8..60000", c.BotLikeMinGaps)
	}
	if c.BotLikeMaxCV <= 0 || c.BotLikeMaxCV >= 1 {
		bad("FLOODGATE_DETECTOR_BOT_LIKE_MAX_CV", "%g: must be in (0, 1)", c.BotLikeMaxCV)
	}
	if c.BotLikeMaxMeanGap < time.Second {
		bad("FLOODGATE_DETECTOR_BOT_LIKE_MAX_MEAN_GAP", "%s: at least 1s", c.BotLikeMaxMeanGap)
	}
	if c.AutomatedDenialRatio <= 0 || c.AutomatedDenialRatio > 1 {
		bad("FLOODGATE_DETECTOR_AUTOMATED_DENIAL_RATIO", "%g: must be in (0, 1]", c.AutomatedDenialRatio)
	}
	if c.FanoutMinNetworks < 3 || c.FanoutMinNetworks > min(c.MinDistinctIPs, maxFanGaps+1) {
		bad("FLOODGATE_DETECTOR_FANOUT_MIN_NETWORKS", "%d: must be in 3..%d and at most FLOODGATE_DETECTOR_IP_MIN_DISTINCT (%d)", c.FanoutMinNetworks, maxFanGaps+1, c.MinDistinctIPs)
	}
	if c.FanoutInterval < time.Second || c.FanoutInterval > min(c.IPWindow, (maxFanGap-1)*time.Second) || c.FanoutInterval%time.Second != 0 {
		bad("FLOODGATE_DETECTOR_FANOUT_INTERVAL", "%s: whole seconds in 1s..%ds and at most FLOODGATE_DETECTOR_IP_WINDOW (%s)", c.FanoutInterval, maxFanGap-1, c.IPWindow)
	}
	if c.PersonSustain < 0 || c.PersonSustain > time.Minute || c.PersonSustain%time.Second != 0 {
		bad("FLOODGATE_DETECTOR_PERSON_SUSTAIN", "%s: whole seconds in 0s..1m", c.PersonSustain)
	}
	if c.PersonMinDenials < 1 {
		bad("FLOODGATE_DETECTOR_PERSON_MIN_DENIALS", "%d: at least 1", c.PersonMinDenials)
	}
	if c.PersonDenialRatio <= 0 || c.PersonDenialRatio >= 1 {
		bad("FLOODGATE_DETECTOR_PERSON_DENIAL_RATIO", "%g: must be in (0, 1)", c.PersonDenialRatio)
	}
	return errors.Join(errs...)
}
