package control

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/floodgate-dev/floodgate/pkg/adjusterapi"
)

// ShedLevels is the number of shed levels above 0: level 1 sheds BULK, 2 also
// BEST_EFFORT, 3 also DEGRADED; CRITICAL is never shed (see limiter.Shedding).
const ShedLevels = 3

// ShedRule sets the shed level the limiters apply from the CPU, error-rate and
// Redis-latency signals. Level n engages as soon as any signal is above its n-th
// threshold; the level comes down one step at a time, only when every
// signal is below that level's threshold × (1 − Hysteresis), and only after
// the level has held for Hold — so a load that sheds its way back under the
// line does not flip the level every tick.
//
// Shedding is the reflex, the scales the lasting answer: the default
// thresholds sit above the band the scale rules cut in, so once the scales
// have cut the lasting excess, shedding lets go. With level 1's release line
// below cpu_high's clear_below (an SRE running the fleet hot), level 1 may
// hold while the scales are content: stable, but bulk stays shed longer.
type ShedRule struct {
	Disabled bool `yaml:"disabled,omitempty" json:"disabled,omitempty"`
	// CPUAbove and ErrorRateAbove are the thresholds of levels 1, 2 and 3,
	// ascending fractions in (0, 1].
	CPUAbove       []float64 `yaml:"cpu_above" json:"cpu_above"`
	ErrorRateAbove []float64 `yaml:"error_rate_above" json:"error_rate_above"`
	// RedisLatencyAbove are the thresholds of the limiters' p99 Redis round
	// trip as a share of their Redis budget; empty: Redis latency does not
	// shed (and cannot hold a level).
	RedisLatencyAbove []float64 `yaml:"redis_latency_above,omitempty" json:"redis_latency_above,omitempty"`
	// Hysteresis is how far below a level's threshold, as a fraction of it,
	// every signal must be before the level is released.
	Hysteresis float64 `yaml:"hysteresis" json:"hysteresis"`
	// Hold is the least time a level stays before it is lowered.
	Hold Duration `yaml:"hold" json:"hold"`
	// RetryAfter is what a shed answer tells clients.
	RetryAfter Duration `yaml:"retry_after" json:"retry_after"`
}

// RuleShed names shed-level changes in logs and the status.
const RuleShed = "shed"

func defaultShed() ShedRule {
	return ShedRule{CPUAbove: []float64{0.90, 0.95, 0.98}, ErrorRateAbove: []float64{0.10, 0.20, 0.40},
		RedisLatencyAbove: []float64{0.50, 0.70, 0.90}, Hysteresis: 0.05, Hold: Duration(time.Minute), RetryAfter: Duration(5 * time.Second)}
}

func (s ShedRule) validate(bad func(field, format string, args ...any)) {
	if s.Disabled {
		return
	}
	for _, th := range []struct {
		field    string
		v        []float64
		optional bool
	}{{"shed.cpu_above", s.CPUAbove, false}, {"shed.error_rate_above", s.ErrorRateAbove, false},
		{"shed.redis_latency_above", s.RedisLatencyAbove, true}} {
		if th.optional && len(th.v) == 0 {
			continue
		}
		if len(th.v) != ShedLevels {
			bad(th.field, "%v: want %d thresholds, one per level", th.v, ShedLevels)
			continue
		}
		for i, v := range th.v {
			if !(v > 0 && v <= 1) || (i > 0 && v <= th.v[i-1]) {
				bad(th.field, "%v: want ascending fractions in (0, 1]", th.v)
				break
			}
		}
	}
	if !(s.Hysteresis >= 0 && s.Hysteresis < 1) {
		bad("shed.hysteresis", "%g: must be in [0, 1)", s.Hysteresis)
	}
	if s.Hold.D() < 0 || s.Hold.D() > time.Hour {
		bad("shed.hold", "%s: must be in 0s..1h", s.Hold)
	}
	if s.RetryAfter.D() < time.Second || s.RetryAfter.D() > time.Hour {
		bad("shed.retry_after", "%s: must be in 1s..1h", s.RetryAfter)
	}
}

// shedLine is one signal's thresholds.
type shedLine struct {
	name string
	th   []float64
}

// lines returns the signals the rule sheds on, with their thresholds.
func (s ShedRule) lines() []shedLine {
	out := []shedLine{{SignalCPU, s.CPUAbove}, {SignalErrorRate, s.ErrorRateAbove}}
	if len(s.RedisLatencyAbove) > 0 {
		out = append(out, shedLine{SignalRedisLatency, s.RedisLatencyAbove})
	}
	return out
}

// ShedStep is one tick's shed decision (the admin API's status document shows it).
type ShedStep = adjusterapi.ShedStep

// Shedder holds the shed level and when it last changed. It is not safe for
// concurrent use.
//
// Releasing a level lets its priority's load back in, which can push the
// signal straight back over the line it was shed for (a level that sheds a
// fifth of the load cannot be released while the other four fifths keep CPU
// near the line). Each such relapse — a raise soon after a release — doubles
// the time a level must hold before it is released again (up to
// maxHoldBackoff × Hold), as flap damping does for routes; the scales, cut
// meanwhile by their own rules, take over the lasting excess, and the next
// release holds. A quiet spell at level 0 resets the damping.
type Shedder struct {
	level      int
	since      time.Time // when the level last changed
	releasedAt time.Time // when a level was last released
	backoff    int       // Hold multiplier, ≥ 1
}

// maxHoldBackoff bounds the flap damping's Hold multiplier.
const maxHoldBackoff = 32

func (s *Shedder) hold(r ShedRule) time.Duration {
	return r.Hold.D() * time.Duration(max(s.backoff, 1))
}

// Level returns the current level.
func (s *Shedder) Level() int { return s.level }

// Step decides the level at now. Frozen (the kill switch) and a disabled rule
// release every level at once: the kill switch must stop shedding, not keep
// it. A stale signal can neither raise nor release a level.
func (s *Shedder) Step(r ShedRule, now time.Time, sig Signals, fresh func(Reading) bool, frozen bool) ShedStep {
	st := ShedStep{Old: s.level}
	if r.Disabled || frozen {
		st.Why = "shedding off (rule disabled or kill switch)"
		s.set(0, now)
		st.Level = 0
		return st
	}
	want, why := 0, ""
	var stale []string
	for _, in := range r.lines() {
		rd := sig.Get(in.name)
		if !fresh(rd) {
			stale = append(stale, in.name)
			continue
		}
		for lvl := ShedLevels; lvl >= 1; lvl-- {
			if rd.Value > in.th[lvl-1] {
				if lvl > want {
					want, why = lvl, fmt.Sprintf("%s %.4g > %g", in.name, rd.Value, in.th[lvl-1])
				}
				break
			}
		}
	}
	if s.level == 0 && s.backoff > 1 && now.Sub(s.since) >= 10*r.Hold.D() {
		s.backoff = 1
	}
	switch {
	case want > s.level:
		if !s.releasedAt.IsZero() && now.Sub(s.releasedAt) < 2*s.hold(r) {
			s.backoff = min(max(s.backoff, 1)*2, maxHoldBackoff)
		}
		s.set(want, now)
		st.Why = why
	case want == s.level:
		st.Why = why
	case len(stale) > 0:
		st.Held = "holding: signal " + strings.Join(stale, ", ") + " is missing or stale"
	case now.Sub(s.since) < s.hold(r):
		st.Held = fmt.Sprintf("holding level %d until %s", s.level, s.since.Add(s.hold(r)).UTC().Format(time.RFC3339))
	default:
		// One level down, once every signal is clear of this level's line.
		lvl := s.level
		for _, in := range r.lines() {
			if line := in.th[lvl-1] * (1 - r.Hysteresis); sig.Get(in.name).Value >= line {
				st.Held = fmt.Sprintf("holding level %d: %s %.4g not below %.4g", lvl, in.name, sig.Get(in.name).Value, line)
				st.Level = s.level
				return st
			}
		}
		s.set(lvl-1, now)
		s.releasedAt = now
		st.Why = fmt.Sprintf("every signal below level %d's line × (1 − %g)", lvl, r.Hysteresis)
	}
	st.Level = s.level
	return st
}

func (s *Shedder) set(level int, now time.Time) {
	if level != s.level {
		s.level, s.since = level, now
	}
}

// cloneShed deep-copies the threshold slices.
func (s ShedRule) clone() ShedRule {
	s.CPUAbove = slices.Clone(s.CPUAbove)
	s.ErrorRateAbove = slices.Clone(s.ErrorRateAbove)
	s.RedisLatencyAbove = slices.Clone(s.RedisLatencyAbove)
	return s
}
