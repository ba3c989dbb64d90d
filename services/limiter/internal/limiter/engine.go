// Package limiter decides whether a request may proceed: token buckets in Redis,
// evaluated for every tier of a principal in one Lua round trip, with the
// principal's penalty multiplier applied to every limit.
package limiter

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/floodgate-dev/floodgate/pkg/events"
	"github.com/floodgate-dev/floodgate/pkg/redisx"
)

//go:embed check.lua
var checkSource string

// Rule is one tier's token bucket: Limit tokens, refilled over Period.
type Rule struct {
	Tier   events.Tier
	Limit  int
	Period time.Duration
}

// Request is what a gateway asks about.
type Request struct {
	Principal events.Principal
	Cost      int
}

// Result is the engine's answer for one request.
type Result struct {
	Allowed    bool
	Tier       events.Tier // denying tier, or when allowed the tier with the least room left
	Limit      int         // effective limit of that tier (rule × penalty)
	Remaining  int
	ResetAfter time.Duration // until that tier's bucket is full again
	RetryAfter time.Duration // zero when allowed
	Penalty    float64       // multiplier in (0,1]; 1 means none
	Now        time.Time     // Redis time of the decision
}

// Engine runs the check script. It is safe for concurrent use.
type Engine struct {
	rdb    redis.Scripter
	script *redis.Script
	rules  []Rule
	args   []any // per-rule limit and period, prebuilt: they never change per request
}

// NewEngine returns an engine evaluating rules in order.
func NewEngine(rdb redis.Scripter, rules []Rule) (*Engine, error) {
	if len(rules) == 0 {
		return nil, errors.New("limiter: at least one rule is required")
	}
	e := &Engine{rdb: rdb, script: redis.NewScript(checkSource), rules: rules}
	for _, r := range rules {
		if r.Limit < 1 || r.Period < time.Millisecond {
			return nil, fmt.Errorf("limiter: rule %s: limit %d per %s is not positive", r.Tier, r.Limit, r.Period)
		}
		e.args = append(e.args, r.Limit, r.Period.Milliseconds())
	}
	return e, nil
}

// Load puts the script in Redis's cache so the first checks skip the NOSCRIPT fallback.
func (e *Engine) Load(ctx context.Context) error {
	return e.script.Load(ctx, e.rdb).Err()
}

// Check evaluates every rule for req and consumes req.Cost from each when all allow.
// Script.Run sends EVALSHA and falls back to EVAL when Redis answers NOSCRIPT.
func (e *Engine) Check(ctx context.Context, req Request) (Result, error) {
	kind, id := string(req.Principal.Kind), req.Principal.ID
	keys := make([]string, 0, len(e.rules)+1)
	keys = append(keys, redisx.PenaltyKey(kind, id))
	for _, r := range e.rules {
		keys = append(keys, redisx.BucketKey(kind, id, string(r.Tier)))
	}
	args := make([]any, 0, len(e.args)+1)
	args = append(args, req.Cost)
	args = append(args, e.args...)

	raw, err := e.script.Run(ctx, e.rdb, keys, args...).Slice()
	if err != nil {
		return Result{}, fmt.Errorf("check %s: %w", req.Principal.Key(), err)
	}
	return parseResult(raw, e.rules)
}

func parseResult(raw []any, rules []Rule) (Result, error) {
	if len(raw) != 8 {
		return Result{}, fmt.Errorf("check script: %d values, want 8", len(raw))
	}
	ints := make([]int64, 7)
	for i := range ints {
		v, ok := raw[i].(int64)
		if !ok {
			return Result{}, fmt.Errorf("check script: value %d is %T", i, raw[i])
		}
		ints[i] = v
	}
	mult, err := strconv.ParseFloat(fmt.Sprint(raw[7]), 64)
	if err != nil {
		return Result{}, fmt.Errorf("check script: multiplier: %w", err)
	}
	idx := int(ints[1]) - 1
	if idx < 0 || idx >= len(rules) {
		return Result{}, fmt.Errorf("check script: tier index %d out of range", ints[1])
	}
	r := Result{
		Allowed:    ints[0] == 1,
		Tier:       rules[idx].Tier,
		Limit:      int(ints[2]),
		Remaining:  int(ints[3]),
		ResetAfter: time.Duration(ints[4]) * time.Millisecond,
		RetryAfter: time.Duration(ints[5]) * time.Millisecond,
		Penalty:    mult,
		Now:        time.UnixMilli(ints[6]).UTC(),
	}
	// A denial while a penalty shrinks the limits is the penalty's doing: the
	// 429 says "abnormal usage detected", not "slow down".
	if !r.Allowed && r.Penalty < 1 {
		r.Tier = events.TierPenalty
	}
	return r, nil
}
