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
// Redis-latency signals, decided every Tick (faster than the scale rules: it
// is the reflex) over Window. Level n engages as soon as any known signal is
// above its n-th threshold. Once the level has held for Hold since it was last
// raised, it comes down one level per Tick while every known signal is below
// that level's threshold × (1 − Hysteresis).
//
// A missing or stale signal is unknown: it can neither raise nor hold a level
// (a control loop must let go), and the loop counts it and alerts on it. With
// every signal unknown, nothing says the fleet is overloaded, and the level
// comes down.
//
// Shedding is the reflex, the scales the lasting answer: the default
// thresholds sit above the band the scale rules cut in, so once the scales
// have cut the lasting excess, shedding lets go. With level 1's release line
// below cpu_high's clear_below (an SRE running the fleet hot), level 1 may
// hold while the scales are content: stable, but bulk stays shed longer.
type ShedRule struct {
	Disabled bool `yaml:"disabled,omitempty" json:"disabled,omitempty"`
	// Tick is how often the shed level is decided and written; Window is how
	// far back each shed signal aggregates (the median of its points, so one
	// noisy point cannot move it: hold at least three points of each writer).
	Tick   Duration `yaml:"tick" json:"tick"`
	Window Duration `yaml:"window" json:"window"`
	// CPUAbove, ErrorRateAbove and RedisLatencyAbove are the thresholds of
	// levels 1, 2 and 3, ascending fractions in (0, 1]; RedisLatencyAbove is
	// of the limiters' p99 Redis round trip as a share of their Redis budget.
	// Empty: the signal does not shed (and is not alerted on). At least one
	// signal must shed.
	CPUAbove          []float64 `yaml:"cpu_above" json:"cpu_above"`
	ErrorRateAbove    []float64 `yaml:"error_rate_above" json:"error_rate_above"`
	RedisLatencyAbove []float64 `yaml:"redis_latency_above,omitempty" json:"redis_latency_above,omitempty"`
	// Hysteresis is how far below a level's threshold, as a fraction of it,
	// every known signal must be before the level is released.
	Hysteresis float64 `yaml:"hysteresis" json:"hysteresis"`
	// Hold is the least time after a raise before the level comes down.
	Hold Duration `yaml:"hold" json:"hold"`
	// MaxHold bounds the flap damping: after relapses the hold doubles, up to
	// MaxHold (never below Hold).
	MaxHold Duration `yaml:"max_hold" json:"max_hold"`
	// RetryAfter is what a shed answer tells clients.
	RetryAfter Duration `yaml:"retry_after" json:"retry_after"`
}

// MinShedPoints is the fewest points a signal's window needs before its
// value may raise the shed level: the median of three is the smallest one
// noisy point cannot move (a limiter's first flush after a cold start, its
// connections still dialing, reads the whole budget).
const MinShedPoints = 3

// RuleShed names shed-level changes in logs and the status.
const RuleShed = "shed"

func defaultShed() ShedRule {
	return ShedRule{Tick: Duration(3 * time.Second), Window: Duration(15 * time.Second),
		CPUAbove: []float64{0.90, 0.95, 0.98}, ErrorRateAbove: []float64{0.10, 0.20, 0.40},
		RedisLatencyAbove: []float64{0.50, 0.70, 0.90}, Hysteresis: 0.05,
		Hold: Duration(5 * time.Second), MaxHold: Duration(20 * time.Second), RetryAfter: Duration(5 * time.Second)}
}

// ReleaseBound is the longest the level takes to come back to 0 from level
// ShedLevels after an overload ends, when each signal's writers flush a point
// every interval: the window's median is clear once a majority of its
// points were flushed wholly after the end (the n-point window needs n/2+1
// of them, the last within (n/2+2) intervals of the end), the next tick sees
// it, and each further level takes a tick. A hold still running then (a
// relapse shortly before the end doubled it) adds up to MaxHold.
func (s ShedRule) ReleaseBound(interval time.Duration) time.Duration {
	n := int(s.Window.D() / interval)
	return time.Duration(n/2+2)*interval + time.Duration(ShedLevels)*s.Tick.D()
}

func (s ShedRule) validate(bad func(field, format string, args ...any)) {
	if s.Disabled {
		return
	}
	if s.Tick.D() < 500*time.Millisecond || s.Tick.D() > time.Minute {
		bad("shed.tick", "%s: must be in 500ms..1m", s.Tick)
	}
	if s.Window.D() < s.Tick.D() || s.Window.D() > 10*time.Minute {
		bad("shed.window", "%s: must be at least shed.tick (%s) and at most 10m", s.Window, s.Tick)
	}
	for _, th := range []struct {
		field string
		v     []float64
	}{{"shed.cpu_above", s.CPUAbove}, {"shed.error_rate_above", s.ErrorRateAbove}, {"shed.redis_latency_above", s.RedisLatencyAbove}} {
		if len(th.v) == 0 {
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
	if len(s.lines()) == 0 {
		bad("shed.cpu_above", "no signal sheds: give cpu_above, error_rate_above or redis_latency_above, or set disabled")
	}
	if !(s.Hysteresis >= 0 && s.Hysteresis < 1) {
		bad("shed.hysteresis", "%g: must be in [0, 1)", s.Hysteresis)
	}
	if s.Hold.D() < 0 || s.Hold.D() > time.Hour {
		bad("shed.hold", "%s: must be in 0s..1h", s.Hold)
	}
	if s.MaxHold.D() < 0 || s.MaxHold.D() > time.Hour {
		bad("shed.max_hold", "%s: must be in 0s..1h", s.MaxHold)
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
	var out []shedLine
	for _, l := range []shedLine{{SignalCPU, s.CPUAbove}, {SignalErrorRate, s.ErrorRateAbove}, {SignalRedisLatency, s.RedisLatencyAbove}} {
		if len(l.th) > 0 {
			out = append(out, l)
		}
	}
	return out
}

// Signals names the signals the rule sheds on (none when disabled).
func (s ShedRule) Signals() []string {
	if s.Disabled {
		return nil
	}
	var out []string
	for _, l := range s.lines() {
		out = append(out, l.name)
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
// near the line). Each such relapse — a raise within two MaxHolds of a
// release — doubles the hold (up to MaxHold), as flap damping does for
// routes; the scales, cut meanwhile by their own rules, take over the lasting
// excess, and the next release holds. A quiet spell at level 0 (four
// MaxHolds) resets the damping.
type Shedder struct {
	level      int
	since      time.Time // when the level last changed
	raisedAt   time.Time // when the level was last raised
	releasedAt time.Time // when a level was last released
	backoff    int       // Hold multiplier, ≥ 1
}

func (s *Shedder) hold(r ShedRule) time.Duration {
	h := r.Hold.D() * time.Duration(max(s.backoff, 1))
	return min(h, max(r.MaxHold.D(), r.Hold.D()))
}

// Level returns the current level.
func (s *Shedder) Level() int { return s.level }

// Step decides the level at now; fresh says whether a reading is known.
// Frozen (the kill switch) and a disabled rule release every level at once:
// the kill switch must stop shedding, not keep it. A signal that is not
// fresh is unknown: it neither raises nor holds a level.
func (s *Shedder) Step(r ShedRule, now time.Time, sig Signals, fresh func(Reading) bool, frozen bool) ShedStep {
	st := ShedStep{Old: s.level, At: now}
	if r.Disabled || frozen {
		st.Why = "shedding off (rule disabled or kill switch)"
		s.set(0, now)
		st.Level = 0
		return st
	}
	want, why := 0, ""
	var known []shedLine
	for _, in := range r.lines() {
		rd := sig.Get(in.name)
		if !fresh(rd) {
			st.Unknown = append(st.Unknown, in.name)
			continue
		}
		known = append(known, in)
		if st.Signals == nil {
			st.Signals = map[string]float64{}
		}
		st.Signals[in.name] = rd.Value
		thin := rd.Points > 0 && rd.Points < MinShedPoints
		for lvl := ShedLevels; lvl >= 1; lvl-- {
			if rd.Value > in.th[lvl-1] {
				if thin {
					lvl = min(lvl, s.level) // a thin window keeps a level, never raises one
				}
				if lvl > want {
					want, why = lvl, fmt.Sprintf("%s %.4g > %g", in.name, rd.Value, in.th[lvl-1])
				}
				break
			}
		}
	}
	quiet := 4 * max(r.MaxHold.D(), r.Hold.D())
	if s.level == 0 && s.backoff > 1 && now.Sub(s.since) >= quiet {
		s.backoff = 1
	}
	unknown := ""
	if len(st.Unknown) > 0 {
		unknown = fmt.Sprintf(" (%s unknown: missing or stale, ignored)", strings.Join(st.Unknown, ", "))
	}
	switch {
	case want > s.level:
		if !s.releasedAt.IsZero() && now.Sub(s.releasedAt) < 2*max(r.MaxHold.D(), r.Hold.D()) {
			s.backoff = min(max(s.backoff, 1)*2, 1<<10)
		}
		s.set(want, now)
		s.raisedAt = now
		st.Why = why + unknown
	case s.level == 0:
		st.Why = why + unknown
	default:
		lvl := s.level
		for _, in := range known {
			v := sig.Get(in.name).Value
			if line := in.th[lvl-1] * (1 - r.Hysteresis); v >= line {
				st.Held = fmt.Sprintf("holding level %d: %s %.4g not below its release line %.4g%s", lvl, in.name, v, line, unknown)
				st.Level = s.level
				return st
			}
		}
		if until := s.raisedAt.Add(s.hold(r)); now.Before(until) {
			st.Held = fmt.Sprintf("holding level %d until %s (hold %s since the last raise)%s", lvl, until.UTC().Format(time.RFC3339), s.hold(r), unknown)
			st.Level = s.level
			s.stepDownAt(&st, r, until)
			return st
		}
		s.set(lvl-1, now)
		s.releasedAt = now
		if len(known) == 0 {
			st.Why = fmt.Sprintf("no known signal (%s missing or stale): stepping down from level %d", strings.Join(st.Unknown, ", "), lvl)
		} else {
			st.Why = fmt.Sprintf("every known signal below level %d's line × (1 − %g)%s", lvl, r.Hysteresis, unknown)
		}
		s.stepDownAt(&st, r, now.Add(r.Tick.D()))
	}
	st.Level = s.level
	return st
}

// stepDownAt fills in when the level steps down next and reaches 0, if the
// known signals stay below their release lines.
func (s *Shedder) stepDownAt(st *ShedStep, r ShedRule, next time.Time) {
	if s.level == 0 {
		return
	}
	zero := next.Add(time.Duration(s.level-1) * r.Tick.D())
	st.StepDownAt, st.ZeroAt = &next, &zero
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
