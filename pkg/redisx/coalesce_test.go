package redisx_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/floodgate-dev/floodgate/pkg/redisx"
	"github.com/floodgate-dev/floodgate/pkg/redisx/redistest"
)

// pipelineCounter counts the pipelines a client sends.
type pipelineCounter struct{ n atomic.Int64 }

func (*pipelineCounter) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (*pipelineCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (p *pipelineCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		p.n.Add(1)
		return next(ctx, cmds)
	}
}

// TestCoalescerSharesPipelines: 400 concurrent callers each get their own
// answers, in fewer pipelines than callers.
func TestCoalescerSharesPipelines(t *testing.T) {
	if testing.Short() {
		t.Skip("needs Redis")
	}
	rdb := redistest.Client(t)
	hook := &pipelineCounter{}
	rdb.AddHook(hook)
	c := &redisx.Coalescer{Redis: rdb, Max: 32, Flushers: 2}
	key := redistest.Unique(t, "coalesce")
	t.Cleanup(func() { rdb.Del(context.Background(), key) })
	const callers = 400
	got := make([]int64, callers)
	var wg sync.WaitGroup
	for i := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var cmd *redis.IntCmd
			require.NoError(t, c.Do(context.Background(), func(ctx context.Context, pipe redis.Pipeliner) {
				cmd = pipe.IncrBy(ctx, key, int64(i+1))
			}))
			require.NoError(t, cmd.Err())
			got[i] = cmd.Val()
		}()
	}
	wg.Wait()
	total, err := rdb.Get(context.Background(), key).Int64()
	require.NoError(t, err)
	require.Equal(t, int64(callers*(callers+1)/2), total, "every increment applied once")
	seen := map[int64]bool{}
	for i, v := range got {
		require.False(t, seen[v], "caller %d got another caller's answer", i)
		seen[v] = true
		require.GreaterOrEqual(t, v, int64(i+1))
	}
	require.Less(t, hook.n.Load(), int64(callers), "callers shared pipelines")
	t.Logf("%d callers in %d pipelines", callers, hook.n.Load())
}

// TestCoalescerCommandErrors: a failing command is its caller's alone.
func TestCoalescerCommandErrors(t *testing.T) {
	if testing.Short() {
		t.Skip("needs Redis")
	}
	rdb := redistest.Client(t)
	c := &redisx.Coalescer{Redis: rdb}
	key := redistest.Unique(t, "coalesce-str")
	require.NoError(t, rdb.Set(context.Background(), key, "not a number", 0).Err())
	t.Cleanup(func() { rdb.Del(context.Background(), key) })
	var bad, good *redis.IntCmd
	require.NoError(t, c.Do(context.Background(), func(ctx context.Context, pipe redis.Pipeliner) {
		bad = pipe.IncrBy(ctx, key, 1)
		good = pipe.IncrBy(ctx, key+"-n", 1)
	}))
	t.Cleanup(func() { rdb.Del(context.Background(), key+"-n") })
	require.ErrorContains(t, bad.Err(), "not an integer", fmt.Sprint(bad))
	require.NoError(t, good.Err())
}
