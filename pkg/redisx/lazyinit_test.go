package redisx_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/floodgate-dev/floodgate/pkg/redisx"
	"github.com/floodgate-dev/floodgate/pkg/redisx/redistest"
)

// TestDialedAheadConnectionsPayAHandshakeOnFirstUse pins a go-redis
// behaviour the limiter's Redis budget depends on (docs/chaos.md,
// redis-slow): connections the pool dials ahead (MinIdleConns) are
// initialised lazily, so the first command on one sends HELLO first and
// takes two round trips. Behind a 100 ms link, after a burst made the pool
// grow and dial ahead, a burst as large as its idle connections has a
// command of two round trips. When go-redis initialises connections as it
// dials them, this fails: then the caveat in docs/chaos.md can go.
func TestDialedAheadConnectionsPayAHandshakeOnFirstUse(t *testing.T) {
	redistest.Client(t) // the local stack's Redis answers
	px := redistest.NewProxy(t, "127.0.0.1:6379")
	const rtt = 100 * time.Millisecond
	px.SetDelay(rtt)
	rdb := redisx.NewClient(redisx.Options{Addrs: []string{px.Addr}, DialTimeout: time.Second, ReadTimeout: 2 * time.Second,
		WriteTimeout: time.Second, PoolSize: 32, MinIdleConns: 2})
	t.Cleanup(func() { _ = rdb.Close() })
	burst := func(n int) (fastest, slowest time.Duration) {
		var mu sync.Mutex
		var wg sync.WaitGroup
		fastest = time.Hour
		for range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				start := time.Now()
				require.NoError(t, rdb.Ping(context.Background()).Err())
				mu.Lock()
				fastest, slowest = min(fastest, time.Since(start)), max(slowest, time.Since(start))
				mu.Unlock()
			}()
		}
		wg.Wait()
		return fastest, slowest
	}
	burst(1)
	time.Sleep(4 * rtt) // the pool dials ahead
	burst(6)            // it grows, and dials ahead again
	time.Sleep(6 * rtt)
	idle := int(rdb.PoolStats().IdleConns)
	require.GreaterOrEqual(t, idle, 6)
	fastest, slowest := burst(idle) // no dial: every command finds an idle connection
	require.Less(t, fastest, rtt*17/10, "a command on a connection in use takes one round trip")
	require.GreaterOrEqual(t, slowest, rtt*19/10, "a connection dialed ahead and never used took its handshake on its first command")
}
