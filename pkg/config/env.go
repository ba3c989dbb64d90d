// Package config reads service configuration from environment variables.
//
// Every Floodgate service is configured the same way: a Config struct filled by
// an Env reader, then validated once at start-up. The reader collects every
// problem it meets and reports them together, each naming its variable, so an
// operator fixes a broken deployment in one pass instead of one restart per typo.
package config

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Local defaults shared by every service, tool and test (DESIGN.md "Local defaults").
const (
	DefaultKafkaBrokers     = "127.0.0.1:9092"
	DefaultRedisAddrs       = "127.0.0.1:6379"
	DefaultInfluxURL        = "http://127.0.0.1:8086"
	DefaultInfluxBucket     = "floodgate/d30"
	DefaultDecisionsTopic   = "floodgate.decisions.v1"
	DefaultAbuseTopic       = "floodgate.abuse.v1"
	DefaultAdjustmentsTopic = "floodgate.adjustments.v1"
	// DefaultRulesTopic is the compacted topic of limiter rules versions
	// (rule rollouts, docs/rollouts.md); nothing reads it unless
	// FLOODGATE_LIMITER_RULES_TOPIC names it.
	DefaultRulesTopic = "floodgate.rules.v1"
	// DefaultDetectorParamsTopic is the compacted topic of detector
	// parameters versions, in the rules topic's format (docs/detector.md);
	// nothing reads it unless FLOODGATE_DETECTOR_PARAMS_TOPIC names it.
	DefaultDetectorParamsTopic = "floodgate.detector-params.v1"
	// DefaultVerdictsTopic carries trust-and-safety verdicts on detections
	// (verdict.v1, written by the console; docs/console.md).
	DefaultVerdictsTopic = "floodgate.verdicts.v1"
)

// Getenv looks up one environment variable; os.Getenv satisfies it and tests pass a map lookup.
type Getenv func(string) string

// Env reads typed values and remembers every malformed one.
// It is not safe for concurrent use; services read their config once, in main.
type Env struct {
	get  Getenv
	errs []error
}

// NewEnv returns a reader over getenv.
func NewEnv(getenv Getenv) *Env { return &Env{get: getenv} }

// Err reports every variable that could not be parsed, or nil.
func (e *Env) Err() error { return errors.Join(e.errs...) }

func (e *Env) fail(name, value, want string) {
	e.errs = append(e.errs, fmt.Errorf("%s=%q: %s", name, value, want))
}

// String returns the variable or def when it is unset or empty.
func (e *Env) String(name, def string) string {
	if v := strings.TrimSpace(e.get(name)); v != "" {
		return v
	}
	return def
}

// List splits a comma-separated variable, dropping empty items.
func (e *Env) List(name, def string) []string {
	var out []string
	for _, item := range strings.Split(e.String(name, def), ",") {
		if item = strings.TrimSpace(item); item != "" {
			out = append(out, item)
		}
	}
	return out
}

// Int parses a base-10 integer.
func (e *Env) Int(name string, def int) int {
	return parse(e, name, def, strconv.Atoi, "want an integer")
}

// Float parses a decimal number.
func (e *Env) Float(name string, def float64) float64 {
	return parse(e, name, def, func(v string) (float64, error) { return strconv.ParseFloat(v, 64) }, "want a number")
}

// Bool parses true/false/1/0.
func (e *Env) Bool(name string, def bool) bool {
	return parse(e, name, def, strconv.ParseBool, "want true or false")
}

// Duration parses a Go duration such as 250ms or 10s.
func (e *Env) Duration(name string, def time.Duration) time.Duration {
	return parse(e, name, def, time.ParseDuration, "want a duration such as 250ms or 10s")
}

// parse reads variable name with fn: def when it is unset or empty, and def
// with an error saying what is wanted when fn cannot read it.
func parse[T any](e *Env, name string, def T, fn func(string) (T, error), want string) T {
	v := e.String(name, "")
	if v == "" {
		return def
	}
	x, err := fn(v)
	if err != nil {
		e.fail(name, v, want)
		return def
	}
	return x
}

// Check collects relation and range errors found by a Validate method:
// each names the field (its environment variable) and what is allowed.
type Check struct{ errs []error }

// Require records msg for field when ok is false.
func (c *Check) Require(ok bool, field, format string, args ...any) {
	if !ok {
		c.errs = append(c.errs, fmt.Errorf("%s: %s", field, fmt.Sprintf(format, args...)))
	}
}

// Err joins every failed requirement, or returns nil.
func (c *Check) Err() error { return errors.Join(c.errs...) }

// Validated finishes a config reader: the zero T and the errors met while
// reading (the Env's, a nested reader's) when there are any, otherwise c and
// c.Validate().
func Validated[T interface{ Validate() error }](c T, errs ...error) (T, error) {
	if err := errors.Join(errs...); err != nil {
		var zero T
		return zero, err
	}
	return c, c.Validate()
}

// Default sets *v to def when *v is not above zero: a config field left
// zero (or set negative) takes its default.
func Default[T ~int | ~int64 | ~float64](v *T, def T) {
	if *v <= 0 {
		*v = def
	}
}
