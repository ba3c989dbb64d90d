package redisx_test

import (
	"bytes"
	"context"
	"log/slog"
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
		m := map[string]string{}
		for k, v := range good {
			m[k] = v
		}
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
