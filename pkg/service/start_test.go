package service

import (
	"context"
	"crypto/tls"
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/floodgate-dev/floodgate/pkg/config"
	"github.com/floodgate-dev/floodgate/pkg/httpapi"
	"github.com/floodgate-dev/floodgate/pkg/kafkatest"
	"github.com/floodgate-dev/floodgate/pkg/stacktest"
	"github.com/floodgate-dev/floodgate/pkg/stream"
	"github.com/floodgate-dev/floodgate/pkg/tlstest"
)

func TestStartNamesWhichConfigurationIsWrong(t *testing.T) {
	type cfg struct{ Addr string }
	read := func(getenv config.Getenv) (cfg, error) {
		if v := getenv("FLOODGATE_TEST_ADDR"); v != "" {
			return cfg{Addr: v}, nil
		}
		return cfg{}, errors.New("FLOODGATE_TEST_ADDR: required")
	}
	env := func(vars map[string]string) Env { return Env{Name: "test", Getenv: stacktest.Getenv(vars)} }

	c, run, err := Start(env(map[string]string{"FLOODGATE_TEST_ADDR": "127.0.0.1:1"}), read, httpapi.DefaultServerConfig())
	require.NoError(t, err)
	require.Equal(t, "127.0.0.1:1", c.Addr)
	require.Equal(t, 10*time.Second, run.Config().ShutdownTimeout)

	_, run, err = Start(env(nil), read, httpapi.DefaultServerConfig())
	require.EqualError(t, err, "config: FLOODGATE_TEST_ADDR: required")
	require.Nil(t, run)

	_, run, err = Start(env(map[string]string{"FLOODGATE_TEST_ADDR": "x", "FLOODGATE_SHUTDOWN_TIMEOUT": "1h"}), read, httpapi.DefaultServerConfig())
	require.ErrorContains(t, err, "config: ")
	require.ErrorContains(t, err, "FLOODGATE_SHUTDOWN_TIMEOUT")
	require.Nil(t, run)
}

// TestConnectClosesRedisWithTheRunner: the client Connect returns answers,
// and the runner closes it when it stops; when the brokers refuse the Kafka
// settings the error says kafka and no client is left to close.
func TestConnectClosesRedisWithTheRunner(t *testing.T) {
	ctx := stacktest.Context(t, 30*time.Second, "the local Redis")
	b := config.Backends{RedisAddrs: stacktest.Local().RedisAddrs, KafkaBrokers: []string{kafkatest.Start(t, nil)}}

	run := testRunner(t, 5*time.Second)
	rdb, ksec, err := run.Connect(ctx, b)
	require.NoError(t, err)
	require.Nil(t, ksec, "plaintext without authentication: no settings")
	require.NoError(t, rdb.Ping(ctx).Err())
	stopped, stop := context.WithCancel(ctx)
	stop()
	require.NoError(t, run.Run(stopped))
	require.ErrorIs(t, rdb.Ping(ctx).Err(), redis.ErrClosed, "the runner closed the client")

	// A broker whose certificate the system roots do not trust.
	_, tlsBroker := kafkatest.StartCluster(t, nil, kfake.TLS(tlstest.ServerConfig(tlstest.NewCA(t, "service-test").Server("broker"), nil)))
	b.KafkaBrokers, b.KafkaSecurity = []string{tlsBroker}, config.KafkaSecurity{TLS: &tls.Config{}}
	run = testRunner(t, 5*time.Second)
	rdb, ksec, err = run.Connect(ctx, b)
	require.ErrorIs(t, err, stream.ErrKafkaAccess)
	require.ErrorContains(t, err, "kafka: ")
	require.Nil(t, rdb)
	require.Nil(t, ksec)
	require.Empty(t, run.closers, "nothing left for the runner to close")
}
