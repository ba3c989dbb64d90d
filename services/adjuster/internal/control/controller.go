package control

import (
	"fmt"
	"maps"
	"math"
	"slices"
	"time"

	"github.com/floodgate-dev/floodgate/pkg/adjusterapi"
)

// Signal names.
const (
	SignalCPU       = "cpu"
	SignalMem       = "mem"
	SignalErrorRate = "error_rate"
	SignalAbuseRate = "abuse_rate"
	// SignalRedisLatency is the limiters' p99 Redis round trip as a share of
	// their Redis budget (the worst limiter's, 1 = the budget spent).
	SignalRedisLatency = "redis_latency"
)

// Reading is one signal's value and the time of its newest point.
type Reading struct {
	Value float64
	At    time.Time
	// OK is false when the signal had no data in the window.
	OK bool
	// Points is how many points the window's value was taken from (0: not
	// counted). A median of fewer than MinShedPoints is not robust: such a
	// signal may not raise the shed level.
	Points int
}

// Signals are the controller's inputs: utilisations and rates as fractions in [0, 1].
type Signals struct {
	CPU       Reading // CPU utilisation
	Mem       Reading // memory utilisation
	ErrorRate Reading // 5xx responses / all responses
	AbuseRate Reading // decisions attributed to detected abuse / all decisions
	// RedisLatency is the worst limiter's p99 Redis pipeline round trip over
	// its Redis budget (limiter_redis budget_used); 0 when the limiters
	// decided without a pipeline.
	RedisLatency Reading
	// AbusePerSec is abuse detections per second over the window (informational;
	// it is the abuse_rate of adjustment.v1 events).
	AbusePerSec float64
}

// Get returns the reading named by one of the Signal* constants.
func (s Signals) Get(name string) Reading {
	switch name {
	case SignalCPU:
		return s.CPU
	case SignalMem:
		return s.Mem
	case SignalErrorRate:
		return s.ErrorRate
	case SignalAbuseRate:
		return s.AbuseRate
	case SignalRedisLatency:
		return s.RedisLatency
	}
	return Reading{}
}

// AllSignals lists the signal names the scale rules read, in a stable order:
// each pages when it goes stale. SignalRedisLatency is not among them — only
// shedding reads it (ShedRule), and a fleet that does not shed on it must not
// be paged for it.
var AllSignals = []string{SignalCPU, SignalMem, SignalErrorRate, SignalAbuseRate}

// Input is everything one step decides on.
type Input struct {
	Now     time.Time
	Signals Signals
	// Overrides pin scopes to a scale (operator overrides that have not expired).
	Overrides map[string]float64
	// Frozen stops the rules (the kill switch); overrides still apply.
	Frozen bool
}

// Change is one proposed scale change (the admin API's status document shows it).
type Change = adjusterapi.Change

// Outcome is a step's result.
type Outcome struct {
	Changes []Change
	// Stale names the signals that were missing or stale at this step.
	Stale []string
	// Held explains, per scope, why a scope that a rule wanted to move did not move.
	Held map[string]string
}

type scopeState struct {
	scale        float64
	lastChange   time.Time
	lastDecrease time.Time
	engaged      map[string]bool // cut rule → engaged
}

// Controller holds the scales and the rules' memory (cooldowns, hysteresis).
// It is not safe for concurrent use.
type Controller struct {
	rules  Rules
	scopes map[string]*scopeState
}

// NewController starts every scope of rules at initial[scope], or at its Max
// when initial has none.
func NewController(rules Rules, initial map[string]float64) *Controller {
	c := &Controller{scopes: map[string]*scopeState{}}
	c.SetRules(rules, initial)
	return c
}

// SetRules replaces the rules, keeping the state of scopes that remain. New
// scopes start at initial[scope] or their Max. A scope outside its new bounds
// is moved inside them by the next Step.
func (c *Controller) SetRules(rules Rules, initial map[string]float64) {
	c.rules = rules.Clone()
	for name := range c.scopes {
		if _, ok := rules.Scopes[name]; !ok {
			delete(c.scopes, name)
		}
	}
	for name, b := range rules.Scopes {
		if _, ok := c.scopes[name]; ok {
			continue
		}
		s, ok := initial[name]
		if !ok || !(s > 0 && s <= 10) {
			s = b.Max
		}
		c.scopes[name] = &scopeState{scale: s, engaged: map[string]bool{}}
	}
}

// Rules returns a copy of the current rules.
func (c *Controller) Rules() Rules { return c.rules.Clone() }

// Scales returns a copy of every scope's scale.
func (c *Controller) Scales() map[string]float64 {
	out := make(map[string]float64, len(c.scopes))
	for name, s := range c.scopes {
		out[name] = s.scale
	}
	return out
}

// Engaged returns, per scope, the cut rules currently engaged.
func (c *Controller) Engaged() map[string][]string {
	out := map[string][]string{}
	for name, s := range c.scopes {
		for rule, on := range s.engaged {
			if on {
				out[name] = append(out[name], rule)
			}
		}
		slices.Sort(out[name])
	}
	return out
}

// Reset sets a scope's scale without touching its timers (used to resync with
// the store, and to return to the applied scales after a dry run).
func (c *Controller) Reset(scope string, scale float64) {
	if s, ok := c.scopes[scope]; ok && scale > 0 && scale <= 10 {
		s.scale = scale
	}
}

type cut struct {
	name   string
	rule   CutRule
	signal string
}

func (c *Controller) cuts() []cut {
	return []cut{
		{RuleCPUHigh, c.rules.CPUHigh, SignalCPU},
		{RuleErrorRateHigh, c.rules.ErrorRateHigh, SignalErrorRate},
		{RuleAbuseHigh, c.rules.AbuseHigh, SignalAbuseRate},
	}
}

// Fresh reports whether a reading is recent enough to act on at now.
func (c *Controller) Fresh(now time.Time, r Reading) bool { return c.fresh(now, r) }

func (c *Controller) fresh(now time.Time, r Reading) bool { return c.rules.Fresh(now, r) }

// Fresh reports whether a reading is known at now: it has a point in the
// window, no newer than a minute ahead of now (clock skew) and no older than
// StaleAfter.
func (r Rules) Fresh(now time.Time, rd Reading) bool {
	return rd.OK && !rd.At.After(now.Add(time.Minute)) && now.Sub(rd.At) <= r.StaleAfter.D()
}

// Step decides this tick's changes and updates the rules' memory (hysteresis).
// It does not change any scale: call Commit for each change that was applied
// (or recorded, in a dry run).
func (c *Controller) Step(in Input) Outcome {
	out := Outcome{Held: map[string]string{}}
	freshness := map[string]bool{}
	for _, name := range AllSignals {
		freshness[name] = c.fresh(in.Now, in.Signals.Get(name))
		if !freshness[name] {
			out.Stale = append(out.Stale, name)
		}
	}
	cuts := c.cuts()
	// Hysteresis: a rule engages above its threshold and clears below clear_below.
	// A stale signal leaves the engagement as it was.
	for name, st := range c.scopes {
		for _, k := range cuts {
			if k.rule.Disabled || !slices.Contains(k.rule.Scopes, name) {
				st.engaged[k.name] = false
				continue
			}
			if !freshness[k.signal] {
				continue
			}
			v := in.Signals.Get(k.signal).Value
			st.engaged[k.name] = v > k.rule.Above || (st.engaged[k.name] && v >= k.rule.ClearBelow)
		}
	}
	for _, name := range slices.Sorted(maps.Keys(c.scopes)) {
		st := c.scopes[name]
		b := c.rules.Scopes[name]
		if ov, ok := in.Overrides[name]; ok {
			if ov != st.scale {
				out.Changes = append(out.Changes, Change{Scope: name, Old: st.scale, New: ov, Rule: RuleOverride,
					Why: fmt.Sprintf("operator override to %g", ov)})
			}
			continue
		}
		if in.Frozen {
			continue
		}
		if st.scale > b.Max || st.scale < b.Min {
			nv := math.Min(math.Max(st.scale, b.Min), b.Max)
			out.Changes = append(out.Changes, Change{Scope: name, Old: st.scale, New: nv, Rule: RuleBounds,
				Why: fmt.Sprintf("scale %g outside bounds [%g, %g]", st.scale, b.Min, b.Max)})
			continue
		}
		if ch, held := c.decide(in, name, st, b, cuts, freshness); ch != nil {
			out.Changes = append(out.Changes, *ch)
		} else if held != "" {
			out.Held[name] = held
		}
	}
	return out
}

// decide applies the rules to one scope: the strongest firing cut wins over
// everything; otherwise the scope recovers when every signal it depends on is
// fresh and healthy.
func (c *Controller) decide(in Input, name string, st *scopeState, b Bounds, cuts []cut, fresh map[string]bool) (*Change, string) {
	var best *cut
	for i := range cuts {
		k := &cuts[i]
		if k.rule.Disabled || !slices.Contains(k.rule.Scopes, name) || !fresh[k.signal] {
			continue
		}
		if in.Signals.Get(k.signal).Value > k.rule.Above && (best == nil || k.rule.Factor < best.rule.Factor) {
			best = k
		}
	}
	sinceChange := in.Now.Sub(st.lastChange)
	if best != nil {
		nv := round(math.Max(math.Max(st.scale*best.rule.Factor, b.Min), st.scale-c.rules.MaxStep))
		if nv >= st.scale {
			return nil, fmt.Sprintf("%s fired but the scale is at its minimum %g", best.name, b.Min)
		}
		if !st.lastChange.IsZero() && sinceChange < c.rules.Cooldown.D() {
			return nil, fmt.Sprintf("%s fired; cooldown until %s", best.name, st.lastChange.Add(c.rules.Cooldown.D()).UTC().Format(time.RFC3339))
		}
		return &Change{Scope: name, Old: st.scale, New: nv, Rule: best.name,
			Why: fmt.Sprintf("%s %.4g > %g", best.signal, in.Signals.Get(best.signal).Value, best.rule.Above)}, ""
	}
	rc := c.rules.Recover
	if rc.Disabled || !slices.Contains(rc.Scopes, name) || st.scale >= b.Max {
		return nil, ""
	}
	// Every signal this scope depends on must be fresh before it may rise.
	need := []string{SignalCPU, SignalMem}
	for _, k := range cuts {
		if !k.rule.Disabled && slices.Contains(k.rule.Scopes, name) && !slices.Contains(need, k.signal) {
			need = append(need, k.signal)
		}
	}
	for _, sig := range need {
		if !fresh[sig] {
			return nil, fmt.Sprintf("holding: signal %s is missing or stale", sig)
		}
	}
	for _, k := range cuts {
		if st.engaged[k.name] {
			return nil, fmt.Sprintf("holding: %s engaged until %s < %g", k.name, k.signal, k.rule.ClearBelow)
		}
	}
	cpu, mem := in.Signals.CPU.Value, in.Signals.Mem.Value
	if !(cpu < rc.CPUBelow && mem < rc.MemBelow) {
		return nil, ""
	}
	if !st.lastChange.IsZero() && sinceChange < c.rules.Cooldown.D() {
		return nil, "recover: cooldown"
	}
	if !st.lastDecrease.IsZero() && in.Now.Sub(st.lastDecrease) < c.rules.RecoveryDelay.D() {
		return nil, fmt.Sprintf("recover: waiting until %s after the last cut", st.lastDecrease.Add(c.rules.RecoveryDelay.D()).UTC().Format(time.RFC3339))
	}
	nv := round(math.Min(math.Min(st.scale*rc.Factor, b.Max), st.scale+c.rules.MaxStep))
	if nv <= st.scale {
		return nil, ""
	}
	return &Change{Scope: name, Old: st.scale, New: nv, Rule: RuleRecover,
		Why: fmt.Sprintf("cpu %.4g < %g and mem %.4g < %g", cpu, rc.CPUBelow, mem, rc.MemBelow)}, ""
}

// Commit records that ch took effect at now.
func (c *Controller) Commit(now time.Time, ch Change) {
	st, ok := c.scopes[ch.Scope]
	if !ok {
		return
	}
	st.scale = ch.New
	// Every change, an operator's included, restarts the cooldown.
	st.lastChange = now
	if ch.Rule != RuleOverride && ch.New < ch.Old {
		st.lastDecrease = now
	}
}
