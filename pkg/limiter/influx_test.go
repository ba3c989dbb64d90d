package limiter

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"testing"
	"time"

	influxdb2 "github.com/influxdata/influxdb-client-go/v2"
	"github.com/stretchr/testify/require"

	"github.com/floodgate-dev/floodgate/pkg/config"
	"github.com/floodgate-dev/floodgate/pkg/events"
	"github.com/floodgate-dev/floodgate/pkg/redisx/redistest"
)

func TestScopeCountsReachInfluxDB(t *testing.T) {
	if testing.Short() {
		t.Skip("needs the local stack: `make test` runs it (`make test-unit` is -short, no stack)")
	}
	env := config.NewEnv(os.Getenv)
	url := env.String("FLOODGATE_INFLUX_URL", config.DefaultInfluxURL)
	bucket := env.String("FLOODGATE_INFLUX_BUCKET", config.DefaultInfluxBucket)
	client := influxdb2.NewClient(url, env.String("FLOODGATE_INFLUX_TOKEN", ""))
	defer client.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	ok, err := client.Ping(ctx)
	require.NoError(t, err)
	require.True(t, ok, "InfluxDB at %s must be running (make up)", url)

	gateway := redistest.Unique(t, "gw")
	start := time.Now().Add(-time.Second)
	c := NewScopeCounts(client, "", bucket, gateway, time.Now, slog.New(slog.DiscardHandler))
	for range 3 {
		c.Observe("bot-global", events.TierPrincipal, true, false)
	}
	c.Observe("bot-global", events.TierPrincipal, false, false)
	c.Observe("trial", events.TierPrincipal, true, true)
	c.Flush()

	q := fmt.Sprintf(`from(bucket: %q) |> range(start: %s) |> filter(fn: (r) => r._measurement == "limiter_decisions" and r.gateway == %q)`,
		bucket, start.UTC().Format(time.RFC3339), gateway)
	got := map[string]int64{}
	for deadline := time.Now().Add(15 * time.Second); time.Now().Before(deadline) && len(got) < 6; time.Sleep(200 * time.Millisecond) {
		res, err := client.QueryAPI("").Query(ctx, q)
		require.NoError(t, err)
		for res.Next() {
			rec := res.Record()
			got[fmt.Sprintf("%s.%s", rec.ValueByKey("scope"), rec.Field())] = rec.Value().(int64)
			_, hasPrincipal := rec.Values()["principal"]
			require.False(t, hasPrincipal, "no principal ids in tags")
		}
		require.NoError(t, res.Err())
	}
	require.Equal(t, map[string]int64{
		"bot-global.allowed": 3, "bot-global.blocked": 1, "bot-global.shadow": 0,
		"trial.allowed": 0, "trial.blocked": 0, "trial.shadow": 1,
	}, got)
}
