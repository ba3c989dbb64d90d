// Package consoletest holds what the console's integration tests need
// around its neighbours, which run as real processes (stacktest.GoBuild and
// stacktest.Exec; services never import each other) on loopback addresses
// of their own: a broker with the migrations' topics, a free address, a
// readiness wait.
package consoletest

import (
	"context"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/floodgate-dev/floodgate/migrations"
	"github.com/floodgate-dev/floodgate/pkg/kafkatest"
)

// Broker starts an in-process Kafka-protocol broker (pkg/kafkatest) with
// the migrations' topics and returns its address.
func Broker(t testing.TB) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	b := kafkatest.Start(t, nil)
	ms, err := migrations.Load()
	require.NoError(t, err)
	for _, m := range ms {
		require.NoError(t, migrations.NewKafka([]string{b}, 1, nil).Apply(ctx, m.Kafka.Topics, func(string) {}))
	}
	return b
}

// FreeAddr returns a loopback address ("127.0.0.1:port") nothing listens on now.
func FreeAddr(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	return ln.Addr().String()
}

// WaitReady waits up to 30 s for url to answer 200 and fails the test when it does not.
func WaitReady(t testing.TB, url string) {
	t.Helper()
	require.Eventually(t, func() bool {
		res, err := http.Get(url)
		if err != nil {
			return false
		}
		res.Body.Close()
		return res.StatusCode == http.StatusOK
	}, 30*time.Second, 50*time.Millisecond, "%s never became ready", url)
}
