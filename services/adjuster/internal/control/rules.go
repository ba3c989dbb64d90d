// Package control is the adjuster's pure decision logic: the tunable rules and
// the controller that turns signals into limit-scale changes. It does no I/O
// and reads no clock; the caller passes the time of every step.
package control

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

// Rules are every tunable threshold of the adjuster. Thresholds and signals
// are fractions in [0, 1] (0.85 is 85 %); factors multiply a scale.
type Rules struct {
	// Tick is how often the loop reads signals and steps the controller.
	Tick Duration `yaml:"tick" json:"tick"`
	// Window is how far back each signal query aggregates.
	Window Duration `yaml:"window" json:"window"`
	// StaleAfter: a signal whose newest point is older than this is stale.
	StaleAfter Duration `yaml:"stale_after" json:"stale_after"`
	// MaxStep is the largest absolute change of a scale in one adjustment.
	MaxStep float64 `yaml:"max_step" json:"max_step"`
	// Cooldown is the least time between two loop changes of one scope.
	Cooldown Duration `yaml:"cooldown" json:"cooldown"`
	// RecoveryDelay is the least time after a cut before a scope may be raised.
	RecoveryDelay Duration `yaml:"recovery_delay" json:"recovery_delay"`
	// Scopes are the scales the loop manages and their bounds.
	Scopes map[string]Bounds `yaml:"scopes" json:"scopes"`

	CPUHigh       CutRule     `yaml:"cpu_high" json:"cpu_high"`
	ErrorRateHigh CutRule     `yaml:"error_rate_high" json:"error_rate_high"`
	AbuseHigh     CutRule     `yaml:"abuse_high" json:"abuse_high"`
	Recover       RecoverRule `yaml:"recover" json:"recover"`
	// Shed sets the priority shed level the limiters apply (see ShedRule).
	Shed ShedRule `yaml:"shed" json:"shed"`
}

// Bounds limit one scope's scale; the scale starts at Max.
type Bounds struct {
	Min float64 `yaml:"min" json:"min"`
	Max float64 `yaml:"max" json:"max"`
}

// CutRule multiplies the scales of Scopes by Factor while its signal is above
// Above. Once it has fired, the rule stays engaged — blocking recovery of its
// scopes — until the signal falls below ClearBelow (the hysteresis band).
type CutRule struct {
	Disabled   bool     `yaml:"disabled,omitempty" json:"disabled,omitempty"`
	Above      float64  `yaml:"above" json:"above"`
	ClearBelow float64  `yaml:"clear_below" json:"clear_below"`
	Factor     float64  `yaml:"factor" json:"factor"`
	Scopes     []string `yaml:"scopes" json:"scopes"`
}

// RecoverRule multiplies the scales of Scopes by Factor, up to their Max, while
// CPU and memory are below their thresholds and no cut rule of the scope is engaged.
type RecoverRule struct {
	Disabled bool     `yaml:"disabled,omitempty" json:"disabled,omitempty"`
	CPUBelow float64  `yaml:"cpu_below" json:"cpu_below"`
	MemBelow float64  `yaml:"mem_below" json:"mem_below"`
	Factor   float64  `yaml:"factor" json:"factor"`
	Scopes   []string `yaml:"scopes" json:"scopes"`
}

// Rule names, as they appear in adjustment events.
const (
	RuleCPUHigh       = "cpu_high"
	RuleErrorRateHigh = "error_rate_high"
	RuleAbuseHigh     = "abuse_high"
	RuleRecover       = "recover"
	RuleBounds        = "bounds"
	RuleOverride      = "override"
)

// Defaults returns the built-in rules; services/adjuster/adjuster.yaml spells
// out the same values (a test keeps the two equal).
func Defaults() Rules {
	return Rules{
		Tick:          Duration(30 * time.Second),
		Window:        Duration(time.Minute),
		StaleAfter:    Duration(2 * time.Minute),
		MaxStep:       0.5,
		Cooldown:      Duration(time.Minute),
		RecoveryDelay: Duration(5 * time.Minute),
		Scopes: map[string]Bounds{
			"global":  {Min: 0.1, Max: 1},
			"tier:ip": {Min: 0.1, Max: 1},
		},
		CPUHigh:       CutRule{Above: 0.85, ClearBelow: 0.80, Factor: 0.7, Scopes: []string{"global"}},
		ErrorRateHigh: CutRule{Above: 0.05, ClearBelow: 0.04, Factor: 0.8, Scopes: []string{"global"}},
		AbuseHigh:     CutRule{Above: 0.10, ClearBelow: 0.08, Factor: 0.5, Scopes: []string{"tier:ip"}},
		Recover:       RecoverRule{CPUBelow: 0.50, MemBelow: 0.60, Factor: 1.1, Scopes: []string{"global", "tier:ip"}},
		Shed:          defaultShed(),
	}
}

// ParseRules decodes YAML (or JSON, a subset of YAML) rules, refusing unknown
// fields, and validates them. Fields left out keep their Defaults.
func ParseRules(data []byte) (Rules, error) {
	r := Defaults()
	r.Scopes = nil
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&r); err != nil {
		return Rules{}, fmt.Errorf("parse rules: %w", err)
	}
	if r.Scopes == nil {
		r.Scopes = Defaults().Scopes
	}
	if err := r.Validate(); err != nil {
		return Rules{}, err
	}
	return r, nil
}

// Tiers a tier scope may name.
var tiers = []string{"ip", "principal", "endpoint", "resource", "quota"}

// ValidScope checks a scope name: global, tier:<ip|principal|endpoint|resource|quota>
// or route:<class> (class 1–250 printable characters).
func ValidScope(s string) error {
	switch {
	case s == "global":
		return nil
	case strings.HasPrefix(s, "tier:"):
		if slices.Contains(tiers, s[len("tier:"):]) {
			return nil
		}
		return fmt.Errorf("scope %q: tier must be one of %s", s, strings.Join(tiers, "|"))
	case strings.HasPrefix(s, "route:"):
		class := s[len("route:"):]
		if class == "" || len(class) > 250 {
			return fmt.Errorf("scope %q: route class must be 1-250 characters", s)
		}
		for _, c := range class {
			if c < 0x20 || (c >= 0x7f && c <= 0x9f) {
				return fmt.Errorf("scope %q: route class has a control character", s)
			}
		}
		return nil
	}
	return fmt.Errorf("scope %q: want global, tier:<tier> or route:<class>", s)
}

// Validate checks every field and how they relate; each error names the field.
func (r Rules) Validate() error {
	var errs []error
	bad := func(field, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%s: %s", field, fmt.Sprintf(format, args...)))
	}
	if r.Tick.D() < time.Second || r.Tick.D() > time.Hour {
		bad("tick", "%s: must be in 1s..1h", r.Tick)
	}
	if r.Window.D() < time.Second || r.Window.D() > 24*time.Hour {
		bad("window", "%s: must be in 1s..24h", r.Window)
	}
	if r.StaleAfter.D() < r.Tick.D() {
		bad("stale_after", "%s: must be at least tick (%s)", r.StaleAfter, r.Tick)
	}
	if !(r.MaxStep > 0 && r.MaxStep <= 10) {
		bad("max_step", "%g: must be in (0, 10]", r.MaxStep)
	}
	if r.Cooldown.D() < 0 || r.RecoveryDelay.D() < 0 {
		bad("cooldown/recovery_delay", "must not be negative")
	}
	if len(r.Scopes) == 0 {
		bad("scopes", "at least one scope is required")
	}
	for name, b := range r.Scopes {
		if err := ValidScope(name); err != nil {
			bad("scopes", "%v", err)
		}
		if !(b.Min > 0 && b.Min <= b.Max && b.Max <= 10) {
			bad("scopes."+name, "min %g, max %g: want 0 < min <= max <= 10", b.Min, b.Max)
		}
	}
	cut := func(field string, c CutRule, maxAbove float64) {
		if c.Disabled {
			return
		}
		if !(c.Above > 0 && c.Above <= maxAbove) {
			bad(field+".above", "%g: must be in (0, %g]", c.Above, maxAbove)
		}
		if !(c.ClearBelow >= 0 && c.ClearBelow <= c.Above) {
			bad(field+".clear_below", "%g: must be in [0, above=%g]", c.ClearBelow, c.Above)
		}
		if !(c.Factor > 0 && c.Factor < 1) {
			bad(field+".factor", "%g: a cut must be in (0, 1)", c.Factor)
		}
		r.checkScopes(field, c.Scopes, bad)
	}
	cut(RuleCPUHigh, r.CPUHigh, 1)
	cut(RuleErrorRateHigh, r.ErrorRateHigh, 1)
	cut(RuleAbuseHigh, r.AbuseHigh, 1)
	if rc := r.Recover; !rc.Disabled {
		if !(rc.CPUBelow > 0 && rc.CPUBelow <= 1) || !(rc.MemBelow > 0 && rc.MemBelow <= 1) {
			bad("recover.cpu_below/mem_below", "%g, %g: must be in (0, 1]", rc.CPUBelow, rc.MemBelow)
		}
		if !(rc.Factor > 1 && rc.Factor <= 2) {
			bad("recover.factor", "%g: a raise must be in (1, 2]", rc.Factor)
		}
		if !r.CPUHigh.Disabled && rc.CPUBelow*rc.Factor >= r.CPUHigh.ClearBelow {
			// A raise from just under cpu_below must not push CPU into the cut band,
			// or the loop cuts and raises forever.
			bad("recover.cpu_below", "%g × factor %g must stay below cpu_high.clear_below %g, or the loop oscillates",
				rc.CPUBelow, rc.Factor, r.CPUHigh.ClearBelow)
		}
		r.checkScopes("recover", rc.Scopes, bad)
	}
	r.Shed.validate(bad)
	return errors.Join(errs...)
}

func (r Rules) checkScopes(field string, scopes []string, bad func(string, string, ...any)) {
	if len(scopes) == 0 {
		bad(field+".scopes", "at least one scope is required")
	}
	for _, s := range scopes {
		if _, ok := r.Scopes[s]; !ok {
			bad(field+".scopes", "%q is not declared under scopes", s)
		}
	}
}

// Clone returns a deep copy.
func (r Rules) Clone() Rules {
	c := r
	c.Scopes = make(map[string]Bounds, len(r.Scopes))
	for k, v := range r.Scopes {
		c.Scopes[k] = v
	}
	c.CPUHigh.Scopes = slices.Clone(r.CPUHigh.Scopes)
	c.ErrorRateHigh.Scopes = slices.Clone(r.ErrorRateHigh.Scopes)
	c.AbuseHigh.Scopes = slices.Clone(r.AbuseHigh.Scopes)
	c.Recover.Scopes = slices.Clone(r.Recover.Scopes)
	c.Shed = r.Shed.clone()
	return c
}

// Duration is a time.Duration written as "30s" in YAML and JSON.
type Duration time.Duration

// D returns the time.Duration.
func (d Duration) D() time.Duration { return time.Duration(d) }

func (d Duration) String() string { return time.Duration(d).String() }

// MarshalText implements encoding.TextMarshaler.
func (d Duration) MarshalText() ([]byte, error) { return []byte(d.String()), nil }

// UnmarshalText implements encoding.TextUnmarshaler.
func (d *Duration) UnmarshalText(b []byte) error {
	v, err := time.ParseDuration(string(b))
	if err != nil {
		return fmt.Errorf("duration %q: want a Go duration such as 30s", b)
	}
	*d = Duration(v)
	return nil
}

// MarshalYAML implements yaml.Marshaler.
func (d Duration) MarshalYAML() (any, error) { return d.String(), nil }

// UnmarshalYAML implements yaml.Unmarshaler.
func (d *Duration) UnmarshalYAML(n *yaml.Node) error { return d.UnmarshalText([]byte(n.Value)) }

// round keeps scales to four decimals so stored values stay short and stable.
func round(v float64) float64 { return math.Round(v*1e4) / 1e4 }
