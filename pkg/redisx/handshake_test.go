package redisx_test

import (
	"context"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/floodgate-dev/floodgate/pkg/config"
	"github.com/floodgate-dev/floodgate/pkg/redisx"
	"github.com/floodgate-dev/floodgate/pkg/redisx/redistest"
	"github.com/floodgate-dev/floodgate/pkg/tlstest"
)

// firstUse makes rdb's pool dial connections ahead behind a link of rtt and
// returns the slowest first command on them: a burst of one, a pause (the
// pool dials ahead), a burst of six (it grows and dials ahead again), a
// pause, then a burst as large as its idle connections, which dials nothing.
func firstUse(t *testing.T, rdb redis.UniversalClient, rtt time.Duration) (fastest, slowest time.Duration) {
	t.Helper()
	burst := func(n int) (fastest, slowest time.Duration) {
		var mu sync.Mutex
		var wg sync.WaitGroup
		fastest = time.Hour
		for range n {
			wg.Go(func() {
				start := time.Now()
				require.NoError(t, rdb.Ping(context.Background()).Err())
				mu.Lock()
				fastest, slowest = min(fastest, time.Since(start)), max(slowest, time.Since(start))
				mu.Unlock()
			})
		}
		wg.Wait()
		return fastest, slowest
	}
	burst(1)
	time.Sleep(4 * rtt)
	burst(6)
	time.Sleep(6 * rtt)
	stats := rdb.PoolStats()
	require.GreaterOrEqual(t, int(stats.IdleConns), 6)
	return burst(int(stats.IdleConns))
}

// TestDialedAheadConnectionsAreReadyOnFirstUse: go-redis initialises a
// connection on its first command, so a connection its pool dialed ahead
// (MinIdleConns) takes two round trips on first use (HELLO, then the
// command) — the "plain go-redis" case pins that behaviour; when it fails,
// go-redis initialises as it dials and handshakeAhead can go. A redisx
// client's connections send HELLO as they are dialed: one round trip (under
// 1.8, against 2 for the handshake), over plaintext and over TLS with an ACL
// user.
func TestDialedAheadConnectionsAreReadyOnFirstUse(t *testing.T) {
	if testing.Short() {
		t.Skip("needs redis-server")
	}
	const rtt = 100 * time.Millisecond
	opts := redisx.Options{DialTimeout: time.Second, ReadTimeout: 2 * time.Second, WriteTimeout: time.Second, PoolSize: 32, MinIdleConns: 2}

	t.Run("plain go-redis", func(t *testing.T) {
		redistest.Client(t)
		px := redistest.NewProxy(t, "127.0.0.1:6379")
		px.SetDelay(rtt)
		rdb := redis.NewClient(&redis.Options{Addr: px.Addr, DialTimeout: opts.DialTimeout, ReadTimeout: opts.ReadTimeout,
			WriteTimeout: opts.WriteTimeout, PoolSize: opts.PoolSize, MinIdleConns: opts.MinIdleConns, DisableIdentity: true})
		t.Cleanup(func() { _ = rdb.Close() })
		fastest, slowest := firstUse(t, rdb, rtt)
		require.Less(t, fastest, rtt*17/10, "a command on a connection in use takes one round trip")
		require.GreaterOrEqual(t, slowest, rtt*19/10, "a connection dialed ahead takes its handshake on its first command")
	})
	t.Run("redisx", func(t *testing.T) {
		redistest.Client(t)
		px := redistest.NewProxy(t, "127.0.0.1:6379")
		px.SetDelay(rtt)
		o := opts
		o.Addrs = []string{px.Addr}
		rdb := redisx.NewClient(o)
		t.Cleanup(func() { _ = rdb.Close() })
		_, slowest := firstUse(t, rdb, rtt)
		require.Less(t, slowest, rtt*18/10, "a connection dialed ahead is ready: one round trip")
	})
	t.Run("redisx over TLS as an ACL user", func(t *testing.T) {
		ca := tlstest.NewCA(t, "redis-handshake")
		srv := redistest.NewSecure(t, redistest.SecureOptions{CA: ca, Users: map[string]string{aclUser: aclPass}})
		px := redistest.NewProxy(t, srv.Addr)
		px.SetDelay(rtt)
		e := config.NewEnv(func(k string) string {
			return map[string]string{"FLOODGATE_REDIS_TLS": "true", "FLOODGATE_REDIS_TLS_CA_FILE": ca.CertFile,
				"FLOODGATE_REDIS_USERNAME": aclUser, "FLOODGATE_REDIS_PASSWORD": aclPass}[k]
		})
		o := opts
		o.Addrs, o.Security = []string{px.Addr}, config.ReadRedisSecurity(e)
		require.NoError(t, e.Err())
		rdb := redisx.NewClient(o)
		t.Cleanup(func() { _ = rdb.Close() })
		_, slowest := firstUse(t, rdb, rtt)
		require.Less(t, slowest, rtt*18/10, "a TLS connection dialed ahead is ready: one round trip")
	})
}

// TestHandshakeNeverAnsweredFailsTheDial: a server that accepts and never
// answers HELLO makes the dial fail within the dial timeout (the pool then
// backs off as for any dial error), not a command later.
func TestHandshakeNeverAnsweredFailsTheDial(t *testing.T) {
	silent := tlstest.Peer(t, func(c net.Conn) { t.Cleanup(func() { _ = c.Close() }) })
	rdb := redisx.NewClient(redisx.Options{Addrs: []string{silent}, DialTimeout: 200 * time.Millisecond,
		ReadTimeout: 5 * time.Second, PoolSize: 1})
	t.Cleanup(func() { _ = rdb.Close() })
	start := time.Now()
	err := rdb.Ping(context.Background()).Err()
	require.ErrorContains(t, err, "HELLO on a new connection")
	require.Less(t, time.Since(start), 5*time.Second, "bounded by the dial timeout (with go-redis's dial retries), not the read timeout")
}

// TestConnectionsSpeakRESP2: every redisx connection is a RESP2 one (the
// HELLO sent ahead at dial and go-redis's own Protocol agree): on RESP3
// go-redis peeks for a push notification before every reply, and
// Floodgate uses no RESP3 feature (redisx.NewClient, issue 34).
func TestConnectionsSpeakRESP2(t *testing.T) {
	redistest.Client(t)
	rdb := redisx.NewClient(redisx.Options{Addrs: []string{"127.0.0.1:6379"}, DialTimeout: time.Second, ReadTimeout: 2 * time.Second, PoolSize: 2})
	t.Cleanup(func() { _ = rdb.Close() })
	info, err := rdb.Do(context.Background(), "CLIENT", "INFO").Text()
	require.NoError(t, err)
	require.Contains(t, strings.Fields(info), "resp=2", info)
}
