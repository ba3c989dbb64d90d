package redisx_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"log/slog"
	"maps"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/floodgate-dev/floodgate/pkg/config"
	"github.com/floodgate-dev/floodgate/pkg/redisx"
	"github.com/floodgate-dev/floodgate/pkg/redisx/redistest"
	"github.com/floodgate-dev/floodgate/pkg/tlstest"
)

const (
	aclUser = "floodgate-app"
	aclPass = "acl-Pa55word-never-logged"
)

// secureClient reads FLOODGATE_REDIS_* from vars as services do and returns
// a client of addrs with them.
func secureClient(t *testing.T, addrs []string, vars map[string]string) *redisxClient {
	t.Helper()
	e := config.NewEnv(func(k string) string { return vars[k] })
	sec := config.ReadRedisSecurity(e)
	require.NoError(t, e.Err())
	c := redisx.NewClient(redisx.Options{Addrs: addrs, DialTimeout: time.Second, ReadTimeout: time.Second, Security: sec})
	t.Cleanup(func() { _ = c.Close() })
	return &redisxClient{c}
}

type redisxClient struct{ redis.UniversalClient }

// Unwrap says what the wrapper wraps (for redisx's start-up checks).
func (c *redisxClient) Unwrap() redis.UniversalClient { return c.UniversalClient }

// TestSecureRedis runs against its own redis-server that speaks only TLS,
// requires a client certificate, and has the default user off: the client
// built from FLOODGATE_REDIS_* authenticates as an ACL user over mutual TLS
// and runs commands and scripts; wrong credentials, a wrong CA or a missing
// client certificate make WaitReady fail at once, naming the variable, and
// never show the password.
func TestSecureRedis(t *testing.T) {
	if testing.Short() {
		t.Skip("starts redis-server")
	}
	ca := tlstest.NewCA(t, "redis-test")
	srv := redistest.NewSecure(t, redistest.SecureOptions{CA: ca, ClientCerts: true, Users: map[string]string{aclUser: aclPass}})
	client := ca.Client("floodgate-app")
	good := map[string]string{
		"FLOODGATE_REDIS_TLS": "true", "FLOODGATE_REDIS_TLS_CA_FILE": ca.CertFile,
		"FLOODGATE_REDIS_TLS_CERT_FILE": client.CertFile, "FLOODGATE_REDIS_TLS_KEY_FILE": client.KeyFile,
		"FLOODGATE_REDIS_USERNAME": aclUser, "FLOODGATE_REDIS_PASSWORD": aclPass,
	}
	with := func(changes ...string) map[string]string {
		m := maps.Clone(good)
		for i := 0; i < len(changes); i += 2 {
			if changes[i+1] == "" {
				delete(m, changes[i])
			} else {
				m[changes[i]] = changes[i+1]
			}
		}
		return m
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	t.Run("acl user over mutual tls", func(t *testing.T) {
		c := secureClient(t, []string{srv.Addr}, good)
		var logs bytes.Buffer
		require.NoError(t, redisx.WaitReady(ctx, c, slog.New(slog.NewTextHandler(&logs, nil))))
		require.NoError(t, c.Set(ctx, "k", "v", time.Minute).Err())
		require.Equal(t, "v", c.Get(ctx, "k").Val())
		n, err := c.Eval(ctx, "return redis.call('INCRBY', KEYS[1], ARGV[1])", []string{"n"}, 5).Int()
		require.NoError(t, err)
		require.Equal(t, 5, n)
		who, err := c.Do(ctx, "ACL", "WHOAMI").Text()
		require.NoError(t, err)
		require.Equal(t, aclUser, who)
	})

	const wrong = "Wr0ng-Redis-Password-never-logged"
	other := tlstest.NewCA(t, "not-redis-ca")
	for _, tc := range []struct {
		name  string
		vars  map[string]string
		names string
	}{
		{"wrong password", with("FLOODGATE_REDIS_PASSWORD", wrong), "FLOODGATE_REDIS_PASSWORD"},
		{"unknown user", with("FLOODGATE_REDIS_USERNAME", "mallory"), "FLOODGATE_REDIS_USERNAME"},
		{"no credentials (default user is off)", with("FLOODGATE_REDIS_USERNAME", "", "FLOODGATE_REDIS_PASSWORD", ""), "FLOODGATE_REDIS_PASSWORD"},
		{"wrong CA", with("FLOODGATE_REDIS_TLS_CA_FILE", other.CertFile), "FLOODGATE_REDIS_TLS_CA_FILE"},
		{"wrong server name", with("FLOODGATE_REDIS_TLS_SERVER_NAME", "redis.example.com"), "FLOODGATE_REDIS_TLS_SERVER_NAME"},
		{"no client certificate", with("FLOODGATE_REDIS_TLS_CERT_FILE", "", "FLOODGATE_REDIS_TLS_KEY_FILE", ""), "FLOODGATE_REDIS_TLS_CERT_FILE"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := secureClient(t, []string{srv.Addr}, tc.vars)
			var logs bytes.Buffer
			start := time.Now()
			err := redisx.WaitReady(ctx, c, slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug})))
			require.ErrorIs(t, err, redisx.ErrAccess)
			require.Contains(t, err.Error(), tc.names)
			require.Less(t, time.Since(start), 5*time.Second, "refused at once, not retried")
			for _, secret := range []string{wrong, aclPass} {
				require.NotContains(t, err.Error(), secret)
				require.NotContains(t, logs.String(), secret)
			}
			require.ErrorIs(t, redisx.CheckAccess(ctx, c), redisx.ErrAccess, "CheckAccess classifies the same way")
		})
	}

	t.Run("plaintext client against the TLS port is not ready", func(t *testing.T) {
		c := secureClient(t, []string{srv.Addr}, map[string]string{"FLOODGATE_REDIS_USERNAME": aclUser, "FLOODGATE_REDIS_PASSWORD": aclPass})
		wctx, wcancel := context.WithTimeout(ctx, 700*time.Millisecond)
		defer wcancel()
		require.Error(t, redisx.WaitReady(wctx, c, slog.New(slog.DiscardHandler)))
	})
}

// TestSecureRedisCluster: a three-master cluster that speaks only TLS (the
// cluster bus too) with the default user off; the cluster client from
// FLOODGATE_REDIS_* follows MOVED redirections to every node over TLS as
// the ACL user, and a wrong password is refused at start-up.
func TestSecureRedisCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("starts redis-server")
	}
	ca := tlstest.NewCA(t, "redis-cluster")
	nodes := redistest.NewSecureCluster(t, redistest.SecureOptions{CA: ca, Users: map[string]string{aclUser: aclPass}}, 3)
	addrs := []string{nodes[0].Addr, nodes[1].Addr, nodes[2].Addr}
	vars := map[string]string{"FLOODGATE_REDIS_TLS": "true", "FLOODGATE_REDIS_TLS_CA_FILE": ca.CertFile,
		"FLOODGATE_REDIS_USERNAME": aclUser, "FLOODGATE_REDIS_PASSWORD": aclPass}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c := secureClient(t, addrs, vars)
	require.NoError(t, redisx.WaitReady(ctx, c, slog.New(slog.DiscardHandler)))
	_, isCluster := c.UniversalClient.(*redis.ClusterClient)
	require.True(t, isCluster, "several addresses make a cluster client")
	owners := map[string]bool{}
	for i := range 30 {
		key := "k" + strconv.Itoa(i)
		require.NoError(t, c.Set(ctx, key, i, time.Minute).Err())
		require.Equal(t, strconv.Itoa(i), c.Get(ctx, key).Val())
		slot := redisx.Slot(key)
		for _, n := range nodes {
			nc := redis.NewClient(&redis.Options{Addr: n.Addr, Username: aclUser, Password: aclPass,
				TLSConfig: &tls.Config{RootCAs: ca.Pool(), MinVersion: tls.VersionTLS12}})
			if n, err := nc.ClusterCountKeysInSlot(ctx, int(slot)).Result(); err == nil && n == 1 {
				owners[nc.Options().Addr] = true
			}
			_ = nc.Close()
		}
	}
	require.Len(t, owners, 3, "the keys landed on all three masters, each reached over TLS")
	require.Zero(t, c.PoolStats().StaleConns, "idle TLS connections are reused, not taken for dead and dialed anew")

	var logs bytes.Buffer
	bad := secureClient(t, addrs, map[string]string{"FLOODGATE_REDIS_TLS": "true", "FLOODGATE_REDIS_TLS_CA_FILE": ca.CertFile,
		"FLOODGATE_REDIS_USERNAME": aclUser, "FLOODGATE_REDIS_PASSWORD": "Wr0ng-cluster-pass"})
	err := redisx.WaitReady(ctx, bad, slog.New(slog.NewTextHandler(&logs, nil)))
	require.ErrorIs(t, err, redisx.ErrAccess)
	require.Contains(t, err.Error(), "FLOODGATE_REDIS_PASSWORD")
	require.NotContains(t, err.Error()+logs.String(), "Wr0ng-cluster-pass")
}

// TestSecureRedisSentinel: a master and a sentinel that both speak only
// TLS; the sentinel has its own password and reaches the master as an ACL
// user. The failover client from FLOODGATE_REDIS_SENTINEL_* and
// FLOODGATE_REDIS_* asks the sentinel over TLS with the sentinel's password,
// then talks to the master over TLS as the ACL user. A wrong sentinel
// password is refused at start-up naming the sentinel's variables.
func TestSecureRedisSentinel(t *testing.T) {
	if testing.Short() {
		t.Skip("starts redis-server")
	}
	const sentinelPass = "sentinel-Pa55-never-logged"
	ca := tlstest.NewCA(t, "redis-sentinel")
	o := redistest.SecureOptions{CA: ca, Users: map[string]string{aclUser: aclPass}}
	master := redistest.NewSecure(t, o)
	name := "fgtls" + strconv.FormatInt(time.Now().UnixNano(), 36)
	sentinel := redistest.NewSecureSentinel(t, o, name, master, sentinelPass)
	read := func(vars map[string]string) redisx.Options {
		e := config.NewEnv(func(k string) string { return vars[k] })
		sec := config.ReadRedisSecurity(e)
		require.NoError(t, e.Err())
		return redisx.Options{SentinelMaster: name, SentinelAddrs: []string{sentinel.Addr}, DialTimeout: time.Second, Security: sec}
	}
	vars := map[string]string{"FLOODGATE_REDIS_TLS": "true", "FLOODGATE_REDIS_TLS_CA_FILE": ca.CertFile,
		"FLOODGATE_REDIS_USERNAME": aclUser, "FLOODGATE_REDIS_PASSWORD": aclPass,
		"FLOODGATE_REDIS_SENTINEL_PASSWORD": sentinelPass}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c := redisx.NewClient(read(vars))
	t.Cleanup(func() { _ = c.Close() })
	require.NoError(t, redisx.WaitReady(ctx, c, slog.New(slog.DiscardHandler)))
	require.Equal(t, "sentinel", c.(*redisx.Node).Mode())
	require.NoError(t, c.Set(ctx, "via-sentinel", "yes", time.Minute).Err())
	who, err := c.Do(ctx, "ACL", "WHOAMI").Text()
	require.NoError(t, err)
	require.Equal(t, aclUser, who)
	direct := redis.NewClient(&redis.Options{Addr: master.Addr, Username: aclUser, Password: aclPass,
		TLSConfig: &tls.Config{RootCAs: ca.Pool(), MinVersion: tls.VersionTLS12}})
	defer direct.Close()
	require.Equal(t, "yes", direct.Get(ctx, "via-sentinel").Val(), "the write reached the master Sentinel names")

	vars["FLOODGATE_REDIS_SENTINEL_PASSWORD"] = "Wr0ng-sentinel-pass"
	bad := redisx.NewClient(read(vars))
	t.Cleanup(func() { _ = bad.Close() })
	var logs bytes.Buffer
	start := time.Now()
	err = redisx.WaitReady(ctx, bad, slog.New(slog.NewTextHandler(&logs, nil)))
	require.ErrorIs(t, err, redisx.ErrAccess)
	require.Contains(t, err.Error(), "FLOODGATE_REDIS_SENTINEL_PASSWORD")
	require.Less(t, time.Since(start), 5*time.Second)
	for _, s := range []string{"Wr0ng-sentinel-pass", sentinelPass, aclPass} {
		require.NotContains(t, err.Error()+logs.String(), s)
	}
}
