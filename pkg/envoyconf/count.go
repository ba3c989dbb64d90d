package envoyconf

// What a call counts in Redis beyond envoy ratelimit's defaults: the
// counters a call would not increment (StopIncrementOverLimit) and the
// jitter on their expiry (ExpirationJitter). The counters Redis need not be
// asked about are LocalCache's (localcache.go).

import (
	"context"
	"errors"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/redis/go-redis/v9"
)

// pending is a counted descriptor of a call on its way to Redis.
type pending struct {
	i      int
	hits   uint64
	key    string
	ttl    time.Duration
	cmd    *redis.IntCmd // fixed window
	incr   uint64        // fixed window: what cmd adds (hits, or 0: StopIncrementOverLimit)
	cached bool          // fixed window, over its limit in the LocalCache: no command
	algo   *AlgorithmCheck
	read   func(context.Context) (AlgorithmResult, error)
}

// fixed reports whether p is a fixed-window counter Redis is asked about.
func (p *pending) fixed() bool { return p.algo == nil && !p.cached }

// stopIncrements is StopIncrementOverLimit: it reads the fixed-window
// counters of todo and, when one of them would pass its limit (statuses
// hold each one's configured limit and scale) or one is in the LocalCache,
// leaves the others' increment at 0, as envoy ratelimit does.
func (e *Evaluator) stopIncrements(ctx context.Context, statuses []Status, todo []pending) error {
	if !slices.ContainsFunc(todo, func(p pending) bool { return p.fixed() }) {
		return nil // nothing to increment, or to stop
	}
	over := slices.ContainsFunc(todo, func(p pending) bool { return p.cached })
	var near []bool
	if !over {
		gets := make([]*redis.StringCmd, len(todo))
		read := func(ctx context.Context, pipe redis.Pipeliner) {
			for k := range todo {
				if todo[k].fixed() {
					gets[k] = pipe.Get(ctx, todo[k].key)
				}
			}
		}
		if e.Coalescer != nil {
			if err := e.Coalescer.Do(ctx, read); err != nil {
				return err
			}
		} else {
			pipe := e.Redis.Pipeline()
			read(ctx, pipe)
			_, _ = pipe.Exec(ctx) // errors per command, below
		}
		near = make([]bool, len(todo))
		for k, g := range gets {
			if g == nil {
				continue
			}
			n, err := g.Uint64()
			if err != nil && !errors.Is(err, redis.Nil) {
				return err
			}
			st := &statuses[todo[k].i]
			if near[k] = n+todo[k].hits > uint64(Effective(st.Configured(), st.Scale)); near[k] {
				over = true
			}
		}
	}
	if !over {
		return nil
	}
	for k := range todo {
		if todo[k].fixed() && (near == nil || !near[k]) {
			todo[k].incr = 0
		}
	}
	return nil
}

// jitter is a random whole number of seconds below ExpirationJitter (0
// without it).
func (e *Evaluator) jitter() time.Duration {
	if s := int64(e.ExpirationJitter / time.Second); s > 0 {
		return time.Duration(rand.Int64N(s)) * time.Second
	}
	return 0
}
