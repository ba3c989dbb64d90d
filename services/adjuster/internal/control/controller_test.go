package control

import (
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

var t0 = time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)

// sig builds fresh signals at now.
func sig(now time.Time, cpu, mem, errRate, abuse float64) Signals {
	r := func(v float64) Reading { return Reading{Value: v, At: now.Add(-10 * time.Second), OK: true} }
	return Signals{CPU: r(cpu), Mem: r(mem), ErrorRate: r(errRate), AbuseRate: r(abuse), RedisLatency: r(0.1)}
}

// fresh is a step's input of nothing but fresh signals (sig) at its now.
func fresh(cpu, mem, errRate, abuse float64) func(now time.Time) Input {
	return func(now time.Time) Input { return Input{Now: now, Signals: sig(now, cpu, mem, errRate, abuse)} }
}

func TestAdjusterYAMLIsTheDefaults(t *testing.T) {
	data, err := os.ReadFile("../../adjuster.yaml")
	require.NoError(t, err)
	r, err := ParseRules(data)
	require.NoError(t, err)
	require.Equal(t, Defaults(), r)
	require.NoError(t, Defaults().Validate())
}

func TestParseRulesRejects(t *testing.T) {
	cases := []struct {
		name, yaml, want string
	}{
		{"unknown field", "cpu_hgh: {above: 0.9}", "field cpu_hgh not found"},
		{"bad duration", "tick: soon", `duration "soon"`},
		{"tick too short", "tick: 10ms", "tick: 10ms"},
		{"cut factor above one", "cpu_high: {above: 0.85, clear_below: 0.8, factor: 1.2, scopes: [global]}", "cpu_high.factor"},
		{"clear above threshold", "error_rate_high: {above: 0.05, clear_below: 0.06, factor: 0.8, scopes: [global]}", "error_rate_high.clear_below"},
		{"undeclared scope", "abuse_high: {above: 0.1, clear_below: 0.08, factor: 0.5, scopes: ['tier:principal']}", `"tier:principal" is not declared`},
		{"bad scope name", "scopes: {'tier:nope': {min: 0.1, max: 1}}", "tier must be one of"},
		{"min above max", "scopes: {global: {min: 0.9, max: 0.5}, 'tier:ip': {min: 0.1, max: 1}}", "scopes.global"},
		{"recover into cut band", "recover: {cpu_below: 0.8, mem_below: 0.6, factor: 1.1, scopes: [global]}", "oscillates"},
		{"stale shorter than tick", "tick: 1m\nstale_after: 30s", "stale_after"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseRules([]byte(tc.yaml))
			require.Error(t, err)
			require.Contains(t, err.Error(), tc.want)
		})
	}
}

func TestValidScope(t *testing.T) {
	for _, ok := range []string{"global", "tier:ip", "tier:quota", "route:POST /channels/{channel_id}/messages"} {
		require.NoError(t, ValidScope(ok), ok)
	}
	for _, bad := range []string{"", "Global", "tier:", "tier:bot", "route:", "route:a\nb", "kind:bot"} {
		require.Error(t, ValidScope(bad), bad)
	}
}

func TestStep(t *testing.T) {
	tests := []struct {
		name    string
		initial map[string]float64
		in      func(now time.Time) Input
		want    []Change
		stale   []string
	}{
		{name: "cpu high cuts global by 0.7", in: fresh(0.9, 0.5, 0, 0), want: []Change{{Scope: "global", Old: 1, New: 0.7, Rule: RuleCPUHigh}}},
		{name: "error rate high cuts global by 0.8", in: fresh(0.6, 0.5, 0.08, 0), want: []Change{{Scope: "global", Old: 1, New: 0.8, Rule: RuleErrorRateHigh}}},
		{name: "the strongest firing cut wins", in: fresh(0.95, 0.5, 0.08, 0), want: []Change{{Scope: "global", Old: 1, New: 0.7, Rule: RuleCPUHigh}}},
		{name: "abuse high halves the ip tier only", in: fresh(0.6, 0.5, 0, 0.2), want: []Change{{Scope: "tier:ip", Old: 1, New: 0.5, Rule: RuleAbuseHigh}}},
		{
			name:    "low cpu and memory recover toward max",
			initial: map[string]float64{"global": 0.5, "tier:ip": 0.95},
			in:      fresh(0.3, 0.4, 0, 0),
			want: []Change{
				{Scope: "global", Old: 0.5, New: 0.55, Rule: RuleRecover},
				{Scope: "tier:ip", Old: 0.95, New: 1, Rule: RuleRecover},
			},
		},
		{
			name:    "high memory blocks recovery",
			initial: map[string]float64{"global": 0.5},
			in:      fresh(0.3, 0.7, 0, 0),
		},
		{
			name:    "a stale signal never raises",
			initial: map[string]float64{"global": 0.5, "tier:ip": 0.5},
			in: func(now time.Time) Input {
				s := sig(now, 0.3, 0.4, 0, 0)
				s.ErrorRate.At = now.Add(-10 * time.Minute)
				return Input{Now: now, Signals: s}
			},
			want:  []Change{{Scope: "tier:ip", Old: 0.5, New: 0.55, Rule: RuleRecover}},
			stale: []string{SignalErrorRate},
		},
		{
			name:    "a missing signal never raises",
			initial: map[string]float64{"global": 0.5, "tier:ip": 0.5},
			in: func(now time.Time) Input {
				s := sig(now, 0.3, 0.4, 0, 0)
				s.Mem = Reading{}
				return Input{Now: now, Signals: s}
			},
			stale: []string{SignalMem},
		},
		{
			name: "a fresh overload still cuts while another signal is stale",
			in: func(now time.Time) Input {
				s := sig(now, 0.95, 0.4, 0, 0)
				s.AbuseRate = Reading{}
				return Input{Now: now, Signals: s}
			},
			want:  []Change{{Scope: "global", Old: 1, New: 0.7, Rule: RuleCPUHigh}},
			stale: []string{SignalAbuseRate},
		},
		{
			name:    "cut stops at the minimum",
			initial: map[string]float64{"global": 0.12},
			in:      fresh(0.95, 0.4, 0, 0),
			want:    []Change{{Scope: "global", Old: 0.12, New: 0.1, Rule: RuleCPUHigh}},
		},
		{
			name:    "a scale outside its bounds is clamped",
			initial: map[string]float64{"global": 3},
			in:      fresh(0.6, 0.5, 0, 0),
			want:    []Change{{Scope: "global", Old: 3, New: 1, Rule: RuleBounds}},
		},
		{
			name: "an override pins its scope",
			in: func(now time.Time) Input {
				return Input{Now: now, Signals: sig(now, 0.95, 0.5, 0, 0), Overrides: map[string]float64{"global": 2}}
			},
			want: []Change{{Scope: "global", Old: 1, New: 2, Rule: RuleOverride}},
		},
		{
			name: "frozen: rules stop",
			in: func(now time.Time) Input {
				return Input{Now: now, Signals: sig(now, 0.95, 0.5, 0.5, 0.5), Frozen: true}
			},
		},
		{
			name: "frozen: overrides still apply",
			in: func(now time.Time) Input {
				return Input{Now: now, Signals: sig(now, 0.95, 0.5, 0, 0), Frozen: true, Overrides: map[string]float64{"tier:ip": 0.3}}
			},
			want: []Change{{Scope: "tier:ip", Old: 1, New: 0.3, Rule: RuleOverride}},
		},
		{
			name: "a signal from the future is not trusted",
			in: func(now time.Time) Input {
				s := sig(now, 0.95, 0.5, 0, 0)
				s.CPU.At = now.Add(time.Hour)
				return Input{Now: now, Signals: s}
			},
			stale: []string{SignalCPU},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := NewController(Defaults(), tc.initial)
			out := c.Step(tc.in(t0))
			for i := range out.Changes {
				require.NotEmpty(t, out.Changes[i].Why)
				out.Changes[i].Why = ""
			}
			require.Equal(t, tc.want, out.Changes)
			require.Equal(t, tc.stale, out.Stale)
		})
	}
}

func TestMaxStepCapsAChange(t *testing.T) {
	r := Defaults()
	r.MaxStep = 0.2
	c := NewController(r, map[string]float64{"tier:ip": 1})
	out := c.Step(Input{Now: t0, Signals: sig(t0, 0.6, 0.5, 0, 0.5)})
	require.Len(t, out.Changes, 1)
	require.Equal(t, 0.8, out.Changes[0].New, "abuse wants ×0.5, max_step allows -0.2")
}

func TestTimersAndHysteresis(t *testing.T) {
	// One scope's history, tick by tick: each step's signals and the scale expected after it.
	type tick struct {
		at                time.Duration
		cpu, mem, errRate float64
		wantScale         float64
		wantHeldSubstring string
	}
	cases := []struct {
		name  string
		ticks []tick
	}{
		{"cooldown spaces consecutive cuts", []tick{
			{at: 0, cpu: 0.95, mem: 0.5, wantScale: 0.7},
			{at: 30 * time.Second, cpu: 0.95, mem: 0.5, wantScale: 0.7, wantHeldSubstring: "cooldown"},
			{at: 60 * time.Second, cpu: 0.95, mem: 0.5, wantScale: 0.49},
		}},
		{"recovery waits recovery_delay after a cut", []tick{
			{at: 0, cpu: 0.95, mem: 0.5, wantScale: 0.7},
			{at: 2 * time.Minute, cpu: 0.3, mem: 0.3, wantScale: 0.7, wantHeldSubstring: "waiting until"},
			{at: 5 * time.Minute, cpu: 0.3, mem: 0.3, wantScale: 0.77},
			{at: 5*time.Minute + 30*time.Second, cpu: 0.3, mem: 0.3, wantScale: 0.77, wantHeldSubstring: "cooldown"},
			{at: 6 * time.Minute, cpu: 0.3, mem: 0.3, wantScale: 0.847},
		}},
		{"error rate in the hysteresis band blocks recovery", []tick{
			{at: 0, cpu: 0.3, mem: 0.3, errRate: 0.06, wantScale: 0.8},
			// 4.5 % is under the 5 % threshold but above clear_below (4 %): still engaged.
			{at: 10 * time.Minute, cpu: 0.3, mem: 0.3, errRate: 0.045, wantScale: 0.8, wantHeldSubstring: "error_rate_high engaged"},
			// Below clear_below: the rule clears and the scope recovers.
			{at: 11 * time.Minute, cpu: 0.3, mem: 0.3, errRate: 0.035, wantScale: 0.88},
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := Defaults()
			r.Scopes = map[string]Bounds{"global": {Min: 0.1, Max: 1}}
			r.AbuseHigh.Disabled = true
			r.Recover.Scopes = []string{"global"}
			c := NewController(r, nil)
			for i, tk := range tc.ticks {
				now := t0.Add(tk.at)
				out := c.Step(Input{Now: now, Signals: sig(now, tk.cpu, tk.mem, tk.errRate, 0)})
				for _, ch := range out.Changes {
					c.Commit(now, ch)
				}
				require.InDelta(t, tk.wantScale, c.Scales()["global"], 1e-9, "tick %d", i)
				if tk.wantHeldSubstring != "" {
					require.True(t, strings.Contains(out.Held["global"], tk.wantHeldSubstring), "tick %d held %q", i, out.Held["global"])
				}
			}
		})
	}
}

func TestSetRulesKeepsStateAndAddsScopes(t *testing.T) {
	c := NewController(Defaults(), map[string]float64{"global": 0.5})
	r := Defaults()
	r.Scopes["route:search"] = Bounds{Min: 0.2, Max: 2}
	r.Scopes["global"] = Bounds{Min: 0.1, Max: 0.4}
	c.SetRules(r, map[string]float64{"route:search": 1.5})
	require.Equal(t, map[string]float64{"global": 0.5, "tier:ip": 1, "route:search": 1.5}, c.Scales())
	out := c.Step(Input{Now: t0, Signals: sig(t0, 0.6, 0.5, 0, 0)})
	require.Equal(t, []Change{{Scope: "global", Old: 0.5, New: 0.4, Rule: RuleBounds, Why: "scale 0.5 outside bounds [0.1, 0.4]"}}, out.Changes)
}
