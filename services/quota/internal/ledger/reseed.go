package ledger

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/floodgate-dev/floodgate/pkg/redisx"
)

// reseedScript raises a day counter to the ledger's total and never lowers
// it: the limiter counts in real time and the ledger trails it, so after a
// Redis loss the counter comes back as max(current, ledger). ARGV[2] is the
// expiry (unix ms): the end of the day plus a margin.
const reseedScript = `
local cur = tonumber(redis.call('GET', KEYS[1]) or '0') or 0
local v = tonumber(ARGV[1])
if v > cur then
  redis.call('SET', KEYS[1], ARGV[1], 'PXAT', ARGV[2])
  return v
end
if redis.call('PTTL', KEYS[1]) == -1 then
  redis.call('PEXPIREAT', KEYS[1], ARGV[2])
end
return cur
`

// Seed is one day counter to raise to the ledger's total.
type Seed struct {
	Kind, ID, Day string
	Total         int64
}

// Reseeder writes ledger totals back to the limiter's Redis day counters
// (redisx.DayUsageKey). It is safe for concurrent use.
type Reseeder struct {
	rdb    redis.UniversalClient
	script *redis.Script
	margin time.Duration
	now    func() time.Time
}

// NewReseeder returns a Reseeder; counters expire margin after their day ends.
func NewReseeder(rdb redis.UniversalClient, margin time.Duration, now func() time.Time) *Reseeder {
	return &Reseeder{rdb: rdb, script: redis.NewScript(reseedScript), margin: margin, now: now}
}

// Reseed raises every counter in seeds, in one pipeline. Days whose counter
// would already have expired are skipped.
func (r *Reseeder) Reseed(ctx context.Context, seeds []Seed) (int, error) {
	now := r.now()
	type call struct {
		key  string
		args []any
		cmd  *redis.Cmd
	}
	calls := make([]call, 0, len(seeds))
	for _, s := range seeds {
		day, err := time.Parse(DayLayout, s.Day)
		if err != nil {
			continue
		}
		exp := day.Add(24*time.Hour + r.margin)
		if !exp.After(now) {
			continue
		}
		calls = append(calls, call{key: redisx.DayUsageKey(s.Kind, s.ID, s.Day), args: []any{s.Total, exp.UnixMilli()}})
	}
	if len(calls) == 0 {
		return 0, nil
	}
	run := func(useSHA bool, idx []int) ([]int, error) {
		pipe := r.rdb.Pipeline()
		for _, i := range idx {
			if useSHA {
				calls[i].cmd = r.script.EvalSha(ctx, pipe, []string{calls[i].key}, calls[i].args...)
			} else {
				calls[i].cmd = r.script.Eval(ctx, pipe, []string{calls[i].key}, calls[i].args...)
			}
		}
		_, _ = pipe.Exec(ctx)
		var retry []int
		var firstErr error
		for _, i := range idx {
			err := calls[i].cmd.Err()
			switch {
			case err == nil:
			case useSHA && strings.HasPrefix(err.Error(), "NOSCRIPT"):
				retry = append(retry, i)
			case firstErr == nil:
				firstErr = fmt.Errorf("reseed %s: %w", calls[i].key, err)
			}
		}
		return retry, firstErr
	}
	all := make([]int, len(calls))
	for i := range all {
		all[i] = i
	}
	retry, err := run(true, all)
	if err == nil && len(retry) > 0 {
		_, err = run(false, retry)
	}
	return len(calls), err
}
