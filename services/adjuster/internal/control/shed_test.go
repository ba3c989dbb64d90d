package control

import (
	"fmt"
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
	r := Defaults().Shed
	fresh := func(rd Reading) bool { return rd.OK }
	at := func(m int) time.Time { return t0.Add(time.Duration(m) * 30 * time.Second) }
	var sh Shedder
	step := func(m int, cpu, errs float64) ShedStep {
		return sh.Step(r, at(m), sig(at(m), cpu, 0.3, errs, 0), fresh, false)
	}

	require.Equal(t, 0, step(0, 0.85, 0.01).Level, "under every line")
	st := step(1, 0.96, 0.01)
	require.Equal(t, 2, st.Level, "straight to the highest level crossed")
	require.Contains(t, st.Why, "cpu 0.96 > 0.95")
	require.Equal(t, 3, step(2, 0.5, 0.45).Level, "either signal raises")
	st = step(3, 0.5, 0.01)
	require.Equal(t, 3, st.Level)
	require.Contains(t, st.Held, "holding level 3 until", "a level holds for hold (1m)")
	require.Equal(t, 2, step(4, 0.5, 0.01).Level, "then comes down one level at a time")
	st = sh.Step(r, at(7), Signals{CPU: Reading{Value: 0.1, At: at(7), OK: true}}, fresh, false)
	require.Equal(t, 2, st.Level, "a stale signal neither raises nor releases")
	require.Contains(t, st.Held, "signal error_rate, redis_latency is missing or stale")
	require.Equal(t, 2, step(8, 0.94, 0.01).Level, "0.94 is above level 2's release line 0.95 × 0.95")
	require.Equal(t, 1, step(9, 0.80, 0.01).Level)

	// A relapse right after a release doubles the hold.
	require.Equal(t, 2, step(10, 0.951, 0.01).Level)
	require.Equal(t, 2, step(12, 0.5, 0.01).Level, "hold is now 2m")
	require.Equal(t, 2, step(13, 0.5, 0.01).Level)
	require.Equal(t, 1, step(14, 0.5, 0.01).Level)

	// The kill switch releases everything at once.
	require.Equal(t, 2, step(15, 0.96, 0.01).Level)
	require.Equal(t, 0, sh.Step(r, at(16), sig(at(16), 0.99, 0.3, 0.5, 0), fresh, true).Level)
	r.Disabled = true
	require.Equal(t, 0, sh.Step(r, at(17), sig(at(17), 0.99, 0.3, 0.5, 0), fresh, false).Level)
}

func TestShedderOnRedisLatency(t *testing.T) {
	r := Defaults().Shed // redis_latency_above 0.5, 0.7, 0.9 of the budget
	fresh := func(rd Reading) bool { return rd.OK }
	at := func(m int) time.Time { return t0.Add(time.Duration(m) * 30 * time.Second) }
	var sh Shedder
	step := func(m int, redis float64) ShedStep {
		s := sig(at(m), 0.5, 0.3, 0.01, 0)
		s.RedisLatency.Value = redis
		return sh.Step(r, at(m), s, fresh, false)
	}
	require.Equal(t, 0, step(0, 0.45).Level, "p99 at 45 % of the budget sheds nothing")
	st := step(1, 0.75)
	require.Equal(t, 2, st.Level, "a slow Redis sheds with CPU and errors calm")
	require.Contains(t, st.Why, "redis_latency 0.75 > 0.7")
	require.Equal(t, 2, step(3, 0.68).Level, "0.68 is above level 2's release line 0.7 × 0.95")
	require.Equal(t, 1, step(4, 0.6).Level)
	require.Equal(t, 1, step(5, 0.48).Level, "0.48 is above level 1's release line 0.5 × 0.95")
	require.Equal(t, 0, step(7, 0.2).Level)

	st = sh.Step(r, at(8), Signals{CPU: Reading{Value: 0.96, At: at(8), OK: true}, ErrorRate: Reading{At: at(8), OK: true}}, fresh, false)
	require.Equal(t, 2, st.Level)
	st = sh.Step(r, at(11), Signals{CPU: Reading{Value: 0.1, At: at(11), OK: true}, ErrorRate: Reading{At: at(11), OK: true}}, fresh, false)
	require.Equal(t, 2, st.Level, "a missing Redis latency holds the level like any other signal")
	require.Contains(t, st.Held, "redis_latency is missing or stale")

	r.RedisLatencyAbove = nil
	st = sh.Step(r, at(12), Signals{CPU: Reading{Value: 0.1, At: at(12), OK: true}, ErrorRate: Reading{At: at(12), OK: true}}, fresh, false)
	require.Equal(t, 1, st.Level, "without thresholds Redis latency neither sheds nor holds")
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
