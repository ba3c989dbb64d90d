package control

import (
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// plant is a simple model of a fleet behind the limiter: offered load is the
// CPU the traffic would need at scale 1; the limiter admits offered × scale;
// CPU follows the admitted load with a first-order lag (half the gap closes per
// tick); errors appear as CPU saturates; memory follows CPU.
type plant struct {
	cpu float64
}

func (p *plant) step(offered, scale float64) (cpu, mem, errRate float64) {
	target := math.Min(0.99, offered*scale)
	p.cpu += 0.5 * (target - p.cpu)
	errRate = math.Max(0, (p.cpu-0.88)*1.5)
	return p.cpu, 0.25 + 0.3*p.cpu, errRate
}

type sample struct {
	at                 time.Duration
	offered, cpu, errs float64
	scale              float64
}

// runClosedLoop steps the controller against the plant, tick by tick.
func runClosedLoop(t *testing.T, r Rules, d time.Duration, offered func(time.Duration) float64) []sample {
	t.Helper()
	c := NewController(r, nil)
	p := &plant{cpu: offered(0)}
	var out []sample
	for at := time.Duration(0); at <= d; at += r.Tick.D() {
		now := t0.Add(at)
		scale := c.Scales()["global"]
		cpu, mem, errs := p.step(offered(at), scale)
		o := c.Step(Input{Now: now, Signals: sig(now, cpu, mem, errs, 0)})
		for _, ch := range o.Changes {
			c.Commit(now, ch)
		}
		out = append(out, sample{at: at, offered: offered(at), cpu: cpu, errs: errs, scale: c.Scales()["global"]})
	}
	return out
}

// direction changes in a trajectory: a cut after a raise or a raise after a cut.
func reversals(s []sample) int {
	n, last := 0, 0
	for i := 1; i < len(s); i++ {
		d := 0
		switch {
		case s[i].scale > s[i-1].scale:
			d = 1
		case s[i].scale < s[i-1].scale:
			d = -1
		}
		if d != 0 {
			if last != 0 && d != last {
				n++
			}
			last = d
		}
	}
	return n
}

// lastChange is the time of the last scale change in s.
func lastChange(s []sample) time.Duration {
	var at time.Duration
	for i := 1; i < len(s); i++ {
		if s[i].scale != s[i-1].scale {
			at = s[i].at
		}
	}
	return at
}

// TestStepResponseSettlesWithoutOscillating applies a step in load to the
// closed loop with the default rules: the scale must cut monotonically,
// settle with CPU inside the dead band, stay there, and after the load drops
// again rise monotonically back to its maximum.
func TestStepResponseSettlesWithoutOscillating(t *testing.T) {
	cases := []struct {
		name string
		high float64 // offered load during the step, as CPU at scale 1
	}{
		{"load 1.2x capacity", 1.2},
		{"load 1.6x capacity", 1.6},
		{"load 2.5x capacity", 2.5},
		{"load 4x capacity", 4},
	}
	const (
		stepUp   = 10 * time.Minute
		stepDown = 70 * time.Minute
		end      = 130 * time.Minute
	)
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			offered := func(at time.Duration) float64 {
				if at >= stepUp && at < stepDown {
					return tc.high
				}
				return 0.4
			}
			r := Defaults()
			s := runClosedLoop(t, r, end, offered)
			var high, after []sample
			for _, x := range s {
				switch {
				case x.at >= stepUp && x.at < stepDown:
					high = append(high, x)
				case x.at >= stepDown:
					after = append(after, x)
				}
			}
			// Under the step: only cuts, settled within 10 minutes, CPU in the dead band.
			require.Zero(t, reversals(high), "scale reversed direction under constant load")
			settled := lastChange(high)
			require.Less(t, settled, stepUp+10*time.Minute, "still changing %s after the step", settled-stepUp)
			final := high[len(high)-1]
			require.Greater(t, final.cpu, r.Recover.CPUBelow, "settled over-cut: cpu %.3f", final.cpu)
			require.Less(t, final.cpu, r.CPUHigh.Above, "settled overloaded: cpu %.3f", final.cpu)
			require.Less(t, final.errs, r.ErrorRateHigh.Above)
			require.GreaterOrEqual(t, final.scale, Defaults().Scopes["global"].Min)
			t.Logf("settled %s after the step at scale %.4g, cpu %.3f, errors %.3f", settled-stepUp, final.scale, final.cpu, final.errs)
			// After the load drops: only raises, back to the maximum.
			require.Zero(t, reversals(after), "scale reversed direction after the load dropped")
			require.Equal(t, 1.0, after[len(after)-1].scale)
			require.Equal(t, 1, reversals(s), "exactly one turn: down under load, up after")
		})
	}
}

// TestStepResponseFlagsAnOscillatingCandidate shows the test above can fail:
// rules whose raise pushes CPU straight back over the cut threshold (validation
// would refuse them; here they are stepped without it) cycle forever.
func TestStepResponseFlagsAnOscillatingCandidate(t *testing.T) {
	r := Defaults()
	r.Recover.CPUBelow = 0.84
	r.Recover.Factor = 1.5
	r.CPUHigh.ClearBelow = 0.85
	r.RecoveryDelay = 0
	require.Error(t, r.Validate())
	s := runClosedLoop(t, r, 60*time.Minute, func(time.Duration) float64 { return 1.6 })
	require.Greater(t, reversals(s), 3, "expected a limit cycle")
}
