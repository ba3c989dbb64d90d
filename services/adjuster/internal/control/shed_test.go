package control

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// shares of the offered load by priority: critical, degraded, best_effort, bulk.
var shares = [4]float64{0.4, 0.3, 0.2, 0.1}

// admittedShare is the share of the offered load a shed level lets through.
func admittedShare(level int) float64 {
	a := 0.0
	for i, s := range shares {
		if i < len(shares)-level || i == 0 {
			a += s
		}
	}
	return a
}

type shedSample struct {
	at         time.Duration
	cpu, scale float64
	level      int
}

// runShedLoop steps the scale controller and the shedder against the plant:
// the limiter admits offered × scale × the share of the priorities not shed.
func runShedLoop(t *testing.T, r Rules, d time.Duration, offered func(time.Duration) float64) []shedSample {
	t.Helper()
	c := NewController(r, nil)
	var sh Shedder
	p := &plant{cpu: offered(0)}
	var out []shedSample
	for at := time.Duration(0); at <= d; at += r.Tick.D() {
		now := t0.Add(at)
		cpu, mem, errs := p.step(offered(at)*admittedShare(sh.Level()), c.Scales()["global"])
		s := sig(now, cpu, mem, errs, 0)
		o := c.Step(Input{Now: now, Signals: s})
		for _, ch := range o.Changes {
			c.Commit(now, ch)
		}
		sh.Step(r.Shed, now, s, func(rd Reading) bool { return c.fresh(now, rd) }, false)
		out = append(out, shedSample{at: at, cpu: cpu, scale: c.Scales()["global"], level: sh.Level()})
	}
	return out
}

func levelReversals(s []shedSample) int {
	n, last := 0, 0
	for i := 1; i < len(s); i++ {
		d := s[i].level - s[i-1].level
		if d == 0 {
			continue
		}
		if d > 0 {
			d = 1
		} else {
			d = -1
		}
		if last != 0 && d != last {
			n++
		}
		last = d
	}
	return n
}

func trajectory(s []shedSample) string {
	var b strings.Builder
	for _, x := range s {
		fmt.Fprintf(&b, "%s L%d cpu %.2f scale %.3g; ", x.at, x.level, x.cpu, x.scale)
	}
	return b.String()
}

// TestShedStepResponse extends the step test with priority shedding: under a
// step in load, shedding engages within a tick or two (bulk first), never
// touches critical, settles (the scales take over the lasting excess, and the
// level holds still for the last 20 minutes of the step) with few reversals,
// and after the load drops comes down one level at a time to 0 without
// turning back.
func TestShedStepResponse(t *testing.T) {
	const (
		stepUp   = 10 * time.Minute
		stepDown = 70 * time.Minute
		end      = 130 * time.Minute
	)
	for _, high := range []float64{0.7, 1.2, 1.6, 2.5} {
		t.Run(fmt.Sprintf("load %gx capacity", high), func(t *testing.T) {
			shedding := high > 1
			offered := func(at time.Duration) float64 {
				if at >= stepUp && at < stepDown {
					return high
				}
				return 0.4
			}
			r := Defaults()
			s := runShedLoop(t, r, end, offered)
			var before, during, after []shedSample
			for _, x := range s {
				switch {
				case x.at < stepUp:
					before = append(before, x)
				case x.at < stepDown:
					during = append(during, x)
				default:
					after = append(after, x)
				}
			}
			for _, x := range before {
				require.Zero(t, x.level, "nothing shed before the step")
			}
			if !shedding {
				for _, x := range s {
					require.Zero(t, x.level, "a load inside capacity is never shed: %s", trajectory(during))
				}
				return
			}
			engaged := -1
			for i, x := range during {
				if x.level > 0 {
					engaged = i
					break
				}
			}
			require.GreaterOrEqual(t, engaged, 0, "shedding engaged: %s", trajectory(during))
			require.LessOrEqual(t, engaged, 2, "within two ticks of the step")
			tail := during[len(during)-40:] // the last 20 minutes of the step
			for _, x := range tail {
				require.Equal(t, tail[0].level, x.level, "the level holds still once settled: %s", trajectory(during))
				require.Less(t, x.cpu, r.Shed.CPUAbove[ShedLevels-1], "settled below the last line")
			}
			require.LessOrEqual(t, levelReversals(during), 4, "few probes before settling: %s", trajectory(during))
			require.Zero(t, levelReversals(after), "after the load drops the level only comes down: %s", trajectory(after))
			require.Zero(t, after[len(after)-1].level)
			t.Logf("engaged after %d ticks; settled at level %d, cpu %.2f, scale %.3g; %d reversals under load",
				engaged, tail[0].level, tail[0].cpu, tail[0].scale, levelReversals(during))
		})
	}
}

func TestShedderMechanics(t *testing.T) {
	r := Defaults().Shed // hold 5s, max_hold 20s, tick 3s
	fresh := func(rd Reading) bool { return rd.OK }
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	var sh Shedder
	step := func(s int, cpu, errs float64) ShedStep {
		return sh.Step(r, at(s), sig(at(s), cpu, 0.3, errs, 0), fresh, false)
	}

	require.Equal(t, 0, step(0, 0.85, 0.01).Level, "under every line")
	st := step(5, 0.96, 0.01)
	require.Equal(t, 2, st.Level, "straight to the highest level crossed")
	require.Contains(t, st.Why, "cpu 0.96 > 0.95")
	require.Equal(t, 3, step(10, 0.5, 0.45).Level, "either signal raises")
	st = step(12, 0.5, 0.01)
	require.Equal(t, 3, st.Level)
	require.Contains(t, st.Held, "holding level 3 until", "a level holds for hold (5s) after a raise")
	require.Equal(t, at(15), *st.StepDownAt, "says when it steps down")
	require.Equal(t, at(21), *st.ZeroAt, "and when it reaches 0: one level a tick (3s)")
	st = step(15, 0.5, 0.01)
	require.Equal(t, 2, st.Level, "then comes down one level a tick")
	require.Equal(t, at(18), *st.StepDownAt)
	st = step(20, 0.94, 0.01)
	require.Equal(t, 2, st.Level, "0.94 is above level 2's release line 0.95 × 0.95")
	require.Contains(t, st.Held, "cpu 0.94 not below its release line 0.9025")
	require.Nil(t, st.StepDownAt, "a signal over the line: no time can be promised")
	require.Equal(t, 1, step(25, 0.80, 0.01).Level)
	require.Equal(t, 0, step(30, 0.80, 0.01).Level)

	// A relapse right after a release doubles the hold, up to max_hold.
	require.Equal(t, 2, step(35, 0.951, 0.01).Level)
	st = step(40, 0.5, 0.01)
	require.Equal(t, 2, st.Level, "hold is now 10s")
	require.Contains(t, st.Held, "hold 10s since the last raise")
	require.Equal(t, 1, step(45, 0.5, 0.01).Level)
	require.Equal(t, 2, step(50, 0.96, 0.01).Level, "a second relapse: 20s")
	require.Equal(t, 2, step(65, 0.5, 0.01).Level)
	require.Equal(t, 1, step(70, 0.5, 0.01).Level)
	require.Equal(t, 2, step(75, 0.96, 0.01).Level, "a third: 40s, but max_hold is 20s")
	st = step(90, 0.5, 0.01)
	require.Contains(t, st.Held, "hold 20s since the last raise")
	require.Equal(t, 1, step(95, 0.5, 0.01).Level, "max_hold bounds the damping")

	// The kill switch releases everything at once.
	require.Equal(t, 2, step(155, 0.96, 0.01).Level)
	require.Equal(t, 0, sh.Step(r, at(160), sig(at(160), 0.99, 0.3, 0.5, 0), fresh, true).Level)
	r.Disabled = true
	require.Equal(t, 0, sh.Step(r, at(165), sig(at(165), 0.99, 0.3, 0.5, 0), fresh, false).Level)
}

// TestShedderLetsGoOfUnknownSignals: a missing or stale signal neither raises
// nor holds a level — it is named unknown, and the level steps down on the
// signals that are known, or on none.
func TestShedderLetsGoOfUnknownSignals(t *testing.T) {
	r := Defaults().Shed
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	fresh := func(now time.Time) func(Reading) bool {
		return func(rd Reading) bool { return Defaults().Fresh(now, rd) }
	}
	redisOnly := func(now time.Time, v float64) Signals {
		return Signals{RedisLatency: Reading{Value: v, At: now, OK: true}}
	}
	var sh Shedder
	st := sh.Step(r, at(0), redisOnly(at(0), 0.95), fresh(at(0)), false)
	require.Equal(t, 3, st.Level, "Redis latency alone raises, with cpu and error_rate missing")
	require.Equal(t, []string{SignalCPU, SignalErrorRate}, st.Unknown)
	require.Contains(t, st.Why, "cpu, error_rate unknown")
	for s := 5; s <= 15; s += 5 {
		st = sh.Step(r, at(s), redisOnly(at(s), 0.1), fresh(at(s)), false)
	}
	require.Equal(t, 0, st.Level, "released on the one known signal, one level a tick: %+v", st)

	// Every signal gone (the metrics pipeline broke at level 3): nothing
	// says the fleet is overloaded, so the level comes down.
	st = sh.Step(r, at(20), redisOnly(at(20), 0.95), fresh(at(20)), false)
	require.Equal(t, 3, st.Level)
	last := at(20)
	for s := 25; s <= 35; s += 5 {
		// the last points stay in the window but age past stale_after (2m)
		now := at(s).Add(2 * time.Minute)
		st = sh.Step(r, now, Signals{RedisLatency: Reading{Value: 0.95, At: last, OK: true}}, fresh(now), false)
		require.ElementsMatch(t, []string{SignalCPU, SignalErrorRate, SignalRedisLatency}, st.Unknown)
	}
	require.Equal(t, 0, st.Level, "a stale signal holds nothing: %+v", st)
	require.Contains(t, st.Why, "no known signal")
}

// TestShedReleaseTime: overload (Redis latency at 0.95 of the budget), then
// calm, read as the loop reads it — a limiter flushing a point every 5 s, the
// median of the shed window's points, a shed tick every 5 s, no CPU or error
// rate writer — with one noisy flush in the calm. The level engages within
// two flushes, a noisy point neither raises nor holds it, and it is back to 0
// within ReleaseBound(5s) (24 s) of the overload's end, whatever the phase
// of the flushes against the ticks.
func TestShedReleaseTime(t *testing.T) {
	r := Defaults().Shed
	const flush = 5 * time.Second
	bound := r.ReleaseBound(flush)
	require.LessOrEqual(t, bound, 30*time.Second, "the documented release time")
	for phase := time.Duration(0); phase < flush; phase += time.Second {
		t.Run(fmt.Sprintf("flush phase %s", phase), func(t *testing.T) {
			start, end := 60*time.Second, 180*time.Second
			noisy := end + 40*time.Second + phase
			value := func(flushAt time.Duration) float64 {
				// a flush covers (flushAt-flush, flushAt]: high if any of it was overloaded
				if flushAt > start && flushAt-flush < end || flushAt == noisy {
					return 0.95
				}
				return 0.1
			}
			var sh Shedder
			engaged, zeroAt := time.Duration(-1), time.Duration(-1)
			for now := time.Duration(0); now <= 5*time.Minute; now += r.Tick.D() {
				var pts []float64
				var newest time.Duration
				for f := phase; f <= now; f += flush {
					if f > now-r.Window.D() {
						pts = append(pts, value(f))
						newest = f
					}
				}
				var s Signals
				if len(pts) > 0 {
					s.RedisLatency = Reading{Value: median(pts), At: t0.Add(newest), OK: true, Points: len(pts)}
				}
				st := sh.Step(r, t0.Add(now), s, func(rd Reading) bool { return Defaults().Fresh(t0.Add(now), rd) }, false)
				switch {
				case now < start:
					require.Zero(t, st.Level)
				case now >= end && st.Level == 0 && zeroAt < 0:
					zeroAt = now - end
				case now > end+bound:
					require.Zero(t, st.Level, "at %s: %+v", now, st)
				}
				if st.Level > 0 && engaged < 0 {
					engaged = now - start
				}
			}
			require.LessOrEqual(t, engaged, 2*flush+r.Tick.D(), "engaged within two flushes and a tick")
			require.GreaterOrEqual(t, zeroAt, time.Duration(0))
			require.LessOrEqual(t, zeroAt, bound)
			t.Logf("engaged %s after the overload began; level 0 %s after it ended (bound %s)", engaged, zeroAt, bound)
		})
	}
}

// TestShedderThinWindow: a window of fewer than MinShedPoints points — a
// limiter's first flush after a cold start reads the whole budget — cannot
// raise the level; three points can, and a thin window still keeps a level.
func TestShedderThinWindow(t *testing.T) {
	r := Defaults().Shed
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	fresh := func(rd Reading) bool { return rd.OK }
	redis := func(s int, v float64, n int) Signals {
		return Signals{RedisLatency: Reading{Value: v, At: at(s), OK: true, Points: n}}
	}
	var sh Shedder
	require.Equal(t, 0, sh.Step(r, at(0), redis(0, 1, 1), fresh, false).Level, "one point raises nothing")
	require.Equal(t, 0, sh.Step(r, at(3), redis(3, 1, 2), fresh, false).Level, "nor two")
	require.Equal(t, 3, sh.Step(r, at(6), redis(6, 1, 3), fresh, false).Level, "three do")
	st := sh.Step(r, at(20), redis(20, 0.95, 2), fresh, false)
	require.Equal(t, 3, st.Level, "a thin window over the line keeps the level: %+v", st)
}

func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	if n := len(s); n%2 == 1 {
		return s[n/2]
	} else {
		return (s[n/2-1] + s[n/2]) / 2
	}
}

func TestShedderOnRedisLatency(t *testing.T) {
	r := Defaults().Shed // redis_latency_above 0.5, 0.7, 0.9 of the budget
	fresh := func(rd Reading) bool { return rd.OK }
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	var sh Shedder
	step := func(s int, redis float64) ShedStep {
		sg := sig(at(s), 0.5, 0.3, 0.01, 0)
		sg.RedisLatency.Value = redis
		return sh.Step(r, at(s), sg, fresh, false)
	}
	require.Equal(t, 0, step(0, 0.45).Level, "p99 at 45 % of the budget sheds nothing")
	st := step(5, 0.75)
	require.Equal(t, 2, st.Level, "a slow Redis sheds with CPU and errors calm")
	require.Contains(t, st.Why, "redis_latency 0.75 > 0.7")
	require.Equal(t, 2, step(10, 0.68).Level, "0.68 is above level 2's release line 0.7 × 0.95")
	require.Equal(t, 1, step(15, 0.6).Level)
	require.Equal(t, 1, step(20, 0.48).Level, "0.48 is above level 1's release line 0.5 × 0.95")
	require.Equal(t, 0, step(25, 0.2).Level)

	r.RedisLatencyAbove = nil
	require.Equal(t, 0, step(30, 0.99).Level, "without thresholds Redis latency does not shed")
	rules := Defaults()
	rules.Shed = r
	require.NoError(t, rules.Validate(), "redis_latency_above may be empty")
}

func TestShedRuleValidation(t *testing.T) {
	for _, tc := range []struct {
		name  string
		edit  func(*ShedRule)
		field string
	}{
		{"two thresholds", func(s *ShedRule) { s.CPUAbove = []float64{0.9, 0.95} }, "shed.cpu_above"},
		{"not ascending", func(s *ShedRule) { s.ErrorRateAbove = []float64{0.2, 0.1, 0.4} }, "shed.error_rate_above"},
		{"redis latency past the budget", func(s *ShedRule) { s.RedisLatencyAbove = []float64{0.5, 0.9, 1.5} }, "shed.redis_latency_above"},
		{"one redis latency threshold", func(s *ShedRule) { s.RedisLatencyAbove = []float64{0.5} }, "shed.redis_latency_above"},
		{"no signal", func(s *ShedRule) { s.CPUAbove, s.ErrorRateAbove, s.RedisLatencyAbove = nil, nil, nil }, "shed.cpu_above"},
		{"tick", func(s *ShedRule) { s.Tick = Duration(time.Hour) }, "shed.tick"},
		{"window shorter than the tick", func(s *ShedRule) { s.Window = Duration(time.Second) }, "shed.window"},
		{"max hold", func(s *ShedRule) { s.MaxHold = Duration(2 * time.Hour) }, "shed.max_hold"},
		{"hysteresis", func(s *ShedRule) { s.Hysteresis = 1 }, "shed.hysteresis"},
		{"retry after", func(s *ShedRule) { s.RetryAfter = 0 }, "shed.retry_after"},
	} {
		r := Defaults()
		tc.edit(&r.Shed)
		require.ErrorContains(t, r.Validate(), tc.field, tc.name)
	}
	r := Defaults()
	r.Shed = ShedRule{Disabled: true}
	require.NoError(t, r.Validate(), "a disabled rule needs no thresholds")
}
