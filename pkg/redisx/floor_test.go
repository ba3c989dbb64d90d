package redisx_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/floodgate-dev/floodgate/pkg/redisx"
	"github.com/floodgate-dev/floodgate/pkg/redisx/redistest"
)

// TestRoundTripFloorFollowsRedis: the floor is Redis's round trip, fast or
// slowed by 30 ms, within two buckets of a change; a command that got no
// answer (a timeout) is not a round trip, an error reply is.
func TestRoundTripFloorFollowsRedis(t *testing.T) {
	if testing.Short() {
		t.Skip("needs Redis")
	}
	redistest.Client(t) // fails loudly when the stack is not up
	px := redistest.NewProxy(t, "127.0.0.1:6379")
	rdb := redis.NewClient(&redis.Options{Addr: px.Addr, ReadTimeout: 200 * time.Millisecond, MaxRetries: -1})
	t.Cleanup(func() { _ = rdb.Close() })
	const bucket = 50 * time.Millisecond
	floor := redisx.NewRoundTripFloor(bucket)
	rdb.AddHook(floor)
	ctx := context.Background()
	require.Zero(t, floor.Floor(), "nothing recorded yet")

	// calls for two buckets and a bit: pings, a pipeline, an error reply
	calls := func() {
		for end := time.Now().Add(2*bucket + 10*time.Millisecond); time.Now().Before(end); {
			require.NoError(t, rdb.Ping(ctx).Err())
			pipe := rdb.Pipeline()
			pipe.Ping(ctx)
			pipe.Ping(ctx)
			_, err := pipe.Exec(ctx)
			require.NoError(t, err)
			var reply redis.Error
			require.ErrorAs(t, rdb.Do(ctx, "NO-SUCH-COMMAND").Err(), &reply)
		}
	}
	calls()
	fast := floor.Floor()
	require.Positive(t, fast)
	require.Less(t, fast, 10*time.Millisecond)

	px.SetDelay(30 * time.Millisecond)
	calls()
	require.GreaterOrEqual(t, floor.Floor(), 30*time.Millisecond, "slowed: every round trip of the last two buckets took the delay")

	// Floodgate's client dials connections ahead and answers their HELLO
	// in the dial: go-redis's HELLO then comes back at once, which is no
	// round trip.
	dialed := redisx.NewClient(redisx.Options{Addrs: []string{px.Addr}, DialTimeout: time.Second, MinIdleConns: 4})
	t.Cleanup(func() { _ = dialed.Close() })
	ahead := redisx.NewRoundTripFloor(bucket)
	dialed.AddHook(ahead)
	var wg sync.WaitGroup
	for range 8 { // more connections than were dialed ahead
		wg.Go(func() { require.NoError(t, dialed.Ping(ctx).Err()) })
	}
	wg.Wait()
	require.GreaterOrEqual(t, ahead.Floor(), 30*time.Millisecond, "new connections' handshakes are not round trips")

	px.SetDelay(0)
	calls()
	require.Less(t, floor.Floor(), 10*time.Millisecond, "fast again")

	px.SetDelay(time.Second) // no answer within the read timeout
	time.Sleep(2 * bucket)
	for range 3 {
		require.Error(t, rdb.Ping(ctx).Err())
	}
	require.Zero(t, floor.Floor(), "timeouts are not round trips; the old ones have aged out")
}
