package score

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"sort"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/floodgate-dev/floodgate/pkg/events"
)

// Detector parameters (docs/detector.md, Parameters and their versions): the
// thresholds and floors that decide whether a principal's scored behaviour
// is a detection, per principal kind and route template, as a versioned
// document. Everything else in Config (windows, half-lives, quantiles) shapes
// the state the scorers keep and stays the process's configuration; a
// parameters document only moves where a detection fires.

// Knobs are the tunable parameters of a document; a nil field is not set
// (it takes the value of the level below it).
type Knobs struct {
	RapidFireThreshold   *float64 `yaml:"rapid_fire_threshold,omitempty" json:"rapid_fire_threshold,omitempty"`
	RapidFireRate        *float64 `yaml:"rapid_fire_rate,omitempty" json:"rapid_fire_rate,omitempty"`
	AutomatedDenialRatio *float64 `yaml:"automated_denial_ratio,omitempty" json:"automated_denial_ratio,omitempty"`
	PersonSustain        string   `yaml:"person_sustain,omitempty" json:"person_sustain,omitempty"` // a duration, whole seconds
	PersonMinDenials     *int     `yaml:"person_min_denials,omitempty" json:"person_min_denials,omitempty"`
	PersonDenialRatio    *float64 `yaml:"person_denial_ratio,omitempty" json:"person_denial_ratio,omitempty"`
	IPMinDistinct        *int     `yaml:"ip_min_distinct,omitempty" json:"ip_min_distinct,omitempty"`
	FanoutMinNetworks    *int     `yaml:"fanout_min_networks,omitempty" json:"fanout_min_networks,omitempty"`
}

// KnobEnv maps a document's parameter name to the environment variable of
// the same Config field (whose value is the level under the document).
var KnobEnv = map[string]string{
	"rapid_fire_threshold":   "FLOODGATE_DETECTOR_RAPID_FIRE_THRESHOLD",
	"rapid_fire_rate":        "FLOODGATE_DETECTOR_RAPID_FIRE_RATE",
	"automated_denial_ratio": "FLOODGATE_DETECTOR_AUTOMATED_DENIAL_RATIO",
	"person_sustain":         "FLOODGATE_DETECTOR_PERSON_SUSTAIN",
	"person_min_denials":     "FLOODGATE_DETECTOR_PERSON_MIN_DENIALS",
	"person_denial_ratio":    "FLOODGATE_DETECTOR_PERSON_DENIAL_RATIO",
	"ip_min_distinct":        "FLOODGATE_DETECTOR_IP_MIN_DISTINCT",
	"fanout_min_networks":    "FLOODGATE_DETECTOR_FANOUT_MIN_NETWORKS",
}

// fields are the knobs' fields by document name: the numbers and the
// integers (person_sustain, a duration as text, is the one string).
func (k *Knobs) fields() (numbers map[string]**float64, integers map[string]**int) {
	numbers = map[string]**float64{
		"rapid_fire_threshold":   &k.RapidFireThreshold,
		"rapid_fire_rate":        &k.RapidFireRate,
		"automated_denial_ratio": &k.AutomatedDenialRatio,
		"person_denial_ratio":    &k.PersonDenialRatio,
	}
	integers = map[string]**int{
		"person_min_denials":  &k.PersonMinDenials,
		"ip_min_distinct":     &k.IPMinDistinct,
		"fanout_min_networks": &k.FanoutMinNetworks,
	}
	return numbers, integers
}

// Set moves one parameter by its document name to the text value v.
func (k *Knobs) Set(name, v string) error {
	numbers, integers := k.fields()
	if p, ok := numbers[name]; ok {
		var x float64
		if _, err := fmt.Sscan(v, &x); err != nil {
			return fmt.Errorf("%s: %q is not a number", name, v)
		}
		*p = &x
		return nil
	}
	if p, ok := integers[name]; ok {
		var x int
		if _, err := fmt.Sscan(v, &x); err != nil {
			return fmt.Errorf("%s: %q is not an integer", name, v)
		}
		*p = &x
		return nil
	}
	if name == "person_sustain" {
		k.PersonSustain = v
		return nil
	}
	return fmt.Errorf("%q is not a detector parameter", name)
}

// apply lays the set knobs over c.
func (k Knobs) apply(c Config) (Config, error) {
	set := func(dst *float64, src *float64) {
		if src != nil {
			*dst = *src
		}
	}
	seti := func(dst *int, src *int) {
		if src != nil {
			*dst = *src
		}
	}
	set(&c.Threshold, k.RapidFireThreshold)
	set(&c.Floor, k.RapidFireRate)
	set(&c.AutomatedDenialRatio, k.AutomatedDenialRatio)
	set(&c.PersonDenialRatio, k.PersonDenialRatio)
	seti(&c.PersonMinDenials, k.PersonMinDenials)
	seti(&c.MinDistinctIPs, k.IPMinDistinct)
	seti(&c.FanoutMinNetworks, k.FanoutMinNetworks)
	if k.PersonSustain != "" {
		d, err := time.ParseDuration(k.PersonSustain)
		if err != nil {
			return c, fmt.Errorf("person_sustain: %q is not a duration (e.g. 5s)", k.PersonSustain)
		}
		c.PersonSustain = d
	}
	return c, nil
}

// Override is one level of a document: the knobs for a principal kind, a
// route template, or both ("" = every kind, every route).
type Override struct {
	Kind  events.PrincipalKind `yaml:"kind,omitempty" json:"kind,omitempty"`
	Route string               `yaml:"route,omitempty" json:"route,omitempty"`
	Knobs `yaml:",inline" json:",inline"`
}

// Params is a detector parameters document: defaults for everyone, then
// overrides by kind, by route and by both. The most specific level wins,
// field by field: kind and route, then route, then kind, then the defaults,
// then the process's configuration.
type Params struct {
	Defaults  Knobs      `yaml:"defaults,omitempty" json:"defaults,omitempty"`
	Overrides []Override `yaml:"overrides,omitempty" json:"overrides,omitempty"`
}

// MaxOverrides bounds a document's overrides.
const MaxOverrides = 256

// MaxParamsBytes bounds a document's size.
const MaxParamsBytes = 64 << 10

// ParseParams reads a parameters document (YAML; unknown fields refused).
// It checks the document's shape; Compile checks its values against a base.
func ParseParams(data []byte) (Params, error) {
	var p Params
	if len(data) > MaxParamsBytes {
		return p, fmt.Errorf("detector parameters: %d bytes, at most %d", len(data), MaxParamsBytes)
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&p); err != nil && !errors.Is(err, io.EOF) {
		return Params{}, fmt.Errorf("detector parameters: %w", err)
	}
	if len(p.Overrides) > MaxOverrides {
		return Params{}, fmt.Errorf("detector parameters: %d overrides, at most %d", len(p.Overrides), MaxOverrides)
	}
	seen := map[tunedKey]int{}
	var errs []error
	for i, o := range p.Overrides {
		where := fmt.Sprintf("overrides[%d]", i)
		if o.Kind == "" && o.Route == "" {
			errs = append(errs, fmt.Errorf("%s: a kind, a route or both (the defaults are for everyone)", where))
		}
		if o.Kind != "" && !o.Kind.Valid() {
			errs = append(errs, fmt.Errorf("%s: kind %q: one of user, bot, api_key, anonymous", where, o.Kind))
		}
		if o.Route != "" {
			if err := events.ValidRoute(o.Route); err != nil {
				errs = append(errs, fmt.Errorf("%s: route: %w", where, err))
			}
		}
		k := tunedKey{o.Kind, o.Route}
		if j, dup := seen[k]; dup {
			errs = append(errs, fmt.Errorf("%s: the same kind and route as overrides[%d]", where, j))
		}
		seen[k] = i
	}
	return p, errors.Join(errs...)
}

// Marshal writes the document as ParseParams reads it.
func (p Params) Marshal() []byte {
	b, err := yaml.Marshal(p)
	if err != nil { // plain structs of numbers and strings
		panic(err)
	}
	return b
}

// Describe lists the document's settings, "kind=user route=/x: person_sustain 4s".
func (p Params) Describe() string {
	var parts []string
	add := func(where string, k Knobs) {
		var kv []string
		for name := range KnobEnv {
			if v, ok := k.get(name); ok {
				kv = append(kv, name+" "+v)
			}
		}
		if len(kv) > 0 {
			sort.Strings(kv)
			parts = append(parts, where+": "+strings.Join(kv, ", "))
		}
	}
	add("defaults", p.Defaults)
	for _, o := range p.Overrides {
		var w []string
		if o.Kind != "" {
			w = append(w, "kind="+string(o.Kind))
		}
		if o.Route != "" {
			w = append(w, "route="+o.Route)
		}
		add(strings.Join(w, " "), o.Knobs)
	}
	return strings.Join(parts, "; ")
}

func (k Knobs) get(name string) (string, bool) {
	numbers, integers := k.fields()
	if p, ok := numbers[name]; ok && *p != nil {
		return fmt.Sprintf("%.4g", **p), true
	}
	if p, ok := integers[name]; ok && *p != nil {
		return fmt.Sprint(**p), true
	}
	if name == "person_sustain" {
		return k.PersonSustain, k.PersonSustain != ""
	}
	return "", false
}

// tunedKey names one level of a document: a kind, a route or both.
type tunedKey struct {
	kind  events.PrincipalKind
	route string
}

// knobs are the decision parameters one event is judged with.
type knobs struct {
	Config
	sustainBuckets int
}

func newKnobs(c Config) *knobs { return &knobs{Config: c, sustainBuckets: c.sustainBuckets()} }

// kinds are the principal kinds, in the order of a Tuned's per-kind arrays.
var kinds = [...]events.PrincipalKind{events.PrincipalUser, events.PrincipalBot, events.PrincipalAPIKey, events.PrincipalAnonymous}

// kindIndex is kind's place in kinds; false for none of them. (A switch on
// the constants: it runs for every event.)
func kindIndex(kind events.PrincipalKind) (int, bool) {
	switch kind {
	case events.PrincipalUser:
		return 0, true
	case events.PrincipalBot:
		return 1, true
	case events.PrincipalAPIKey:
		return 2, true
	case events.PrincipalAnonymous:
		return 3, true
	}
	return 0, false
}

// Tuned is a parameters document compiled over a base configuration: the
// decision parameters of every kind and route it names. Immutable; safe for
// concurrent use.
type Tuned struct {
	Version int64 // the parameters version (0: the process's configuration)
	base    *knobs
	byKind  [len(kinds)]*knobs // nil: the kind has no level of its own
	// byRoute holds the routes the document names, each with its kinds'
	// levels there (kind and route, or the route's for every kind without
	// its own; nil: none). Looked up for every event: one string key,
	// where a kind-and-route key cost two string hashes.
	byRoute map[string]*[len(kinds)]*knobs
}

// Compile lays p over base for every level it names and validates each
// result (the errors name the level and the variable).
func Compile(base Config, p Params, version int64) (*Tuned, error) {
	var errs []error
	level := func(where string, c Config, ks ...Knobs) *knobs {
		var err error
		for _, k := range ks {
			if c, err = k.apply(c); err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", where, err))
				return nil
			}
		}
		if err := c.Validate(); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", where, err))
			return nil
		}
		return newKnobs(c)
	}
	t := &Tuned{Version: version, byRoute: map[string]*[len(kinds)]*knobs{}}
	t.base = level("defaults", base, p.Defaults)
	kindKnobs := map[events.PrincipalKind]Knobs{}
	routeKnobs := map[string]Knobs{}
	for _, o := range p.Overrides {
		switch {
		case o.Route == "":
			kindKnobs[o.Kind] = o.Knobs
		case o.Kind == "":
			routeKnobs[o.Route] = o.Knobs
		}
	}
	for i, kind := range kinds {
		if k, ok := kindKnobs[kind]; ok {
			t.byKind[i] = level("kind="+string(kind), base, p.Defaults, k)
		}
	}
	for _, o := range p.Overrides {
		if o.Route == "" {
			continue
		}
		r := t.byRoute[o.Route]
		if r == nil {
			r = new([len(kinds)]*knobs)
			t.byRoute[o.Route] = r
		}
		if o.Kind == "" {
			for i, kind := range kinds {
				if _, own := p.find(kind, o.Route); own {
					continue
				}
				r[i] = level("route="+o.Route+" kind="+string(kind), base, p.Defaults, kindKnobs[kind], o.Knobs)
			}
			continue
		}
		i, _ := kindIndex(o.Kind) // ParseParams checked the kind
		r[i] = level("kind="+string(o.Kind)+" route="+o.Route, base, p.Defaults, kindKnobs[o.Kind], routeKnobs[o.Route], o.Knobs)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return t, nil
}

// find reports whether p has an override for exactly kind and route.
func (p Params) find(kind events.PrincipalKind, route string) (Knobs, bool) {
	for _, o := range p.Overrides {
		if o.Kind == kind && o.Route == route {
			return o.Knobs, true
		}
	}
	return Knobs{}, false
}

// Untuned is base as a Tuned with no document (version 0).
func Untuned(base Config) *Tuned {
	return &Tuned{base: newKnobs(base)}
}

// ParseTuned parses and compiles a document in one call.
func ParseTuned(base Config, data []byte, version int64) (*Tuned, error) {
	p, err := ParseParams(data)
	if err != nil {
		return nil, err
	}
	return Compile(base, p, version)
}

// For returns the parameters an event of kind on route is judged with
// (route AllRoutes or "": the kind's).
func (t *Tuned) For(kind events.PrincipalKind, route string) *knobs {
	i, ok := kindIndex(kind)
	if !ok {
		return t.base
	}
	if len(t.byRoute) > 0 && route != "" && route != AllRoutes {
		if r := t.byRoute[route]; r != nil && r[i] != nil {
			return r[i]
		}
	}
	if k := t.byKind[i]; k != nil {
		return k
	}
	return t.base
}

// Config returns the configuration an event of kind on route is judged with.
func (t *Tuned) Config(kind events.PrincipalKind, route string) Config {
	return t.For(kind, route).Config
}
