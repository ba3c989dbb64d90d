// Package seriestest gives integration tests the local stack's InfluxDB,
// where the series of package series are written and read.
package seriestest

import (
	"context"
	"os"
	"testing"
	"time"

	influxdb2 "github.com/influxdata/influxdb-client-go/v2"
	"github.com/stretchr/testify/require"

	"github.com/floodgate-dev/floodgate/pkg/config"
)

// Influx returns a client of the InfluxDB at FLOODGATE_INFLUX_URL (the local
// stack's by default, with FLOODGATE_INFLUX_TOKEN) and the bucket
// FLOODGATE_INFLUX_BUCKET names; the client is closed when the test ends. It
// skips under -short (`make test-unit` runs without the stack) and fails,
// loudly, when InfluxDB does not answer a ping.
func Influx(t testing.TB) (influxdb2.Client, string) {
	t.Helper()
	if testing.Short() {
		t.Skip("needs the local stack's InfluxDB: `make test` runs it (`make test-unit` is -short, no stack)")
	}
	env := config.NewEnv(os.Getenv)
	url := env.String("FLOODGATE_INFLUX_URL", config.DefaultInfluxURL)
	client := influxdb2.NewClient(url, env.String("FLOODGATE_INFLUX_TOKEN", ""))
	t.Cleanup(client.Close)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ok, err := client.Ping(ctx)
	require.NoError(t, err, "InfluxDB at %s is not reachable: start the local stack (make up)", url)
	require.True(t, ok, "InfluxDB at %s must be running (make up)", url)
	return client, env.String("FLOODGATE_INFLUX_BUCKET", config.DefaultInfluxBucket)
}
