package web

import (
	"context"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	influxdb2 "github.com/influxdata/influxdb-client-go/v2"
	"github.com/influxdata/influxdb-client-go/v2/api"
	"github.com/stretchr/testify/require"

	"github.com/floodgate-dev/floodgate/pkg/config"
	"github.com/floodgate-dev/floodgate/services/console/internal/blockrate"
	"github.com/floodgate-dev/floodgate/services/console/internal/consoletest"
)

// TestBlockRate writes limiter_decisions points (as the limiter does) under a
// unique gateway to the real InfluxDB and reads the page filtered to it.
// deadInflux is the query API of an InfluxDB client whose server does not answer.
func deadInflux(t *testing.T) api.QueryAPI {
	dead := influxdb2.NewClientWithOptions("http://"+consoletest.FreeAddr(t), "", influxdb2.DefaultOptions().SetHTTPRequestTimeout(2))
	t.Cleanup(dead.Close)
	return dead.QueryAPI("")
}

func TestBlockRate(t *testing.T) {
	env := config.NewEnv(os.Getenv)
	url, bucket := env.String("FLOODGATE_INFLUX_URL", config.DefaultInfluxURL), env.String("FLOODGATE_INFLUX_BUCKET", config.DefaultInfluxBucket)
	client := influxdb2.NewClient(url, env.String("FLOODGATE_INFLUX_TOKEN", ""))
	t.Cleanup(client.Close)
	e := newEnvWith(t, func(cfg *Config, _ string) {
		cfg.BlockRate = &blockrate.Reader{Query: client.QueryAPI(""), Bucket: bucket}
	})
	gw := "console-test-" + e.run
	now := time.Now().UTC()
	wr := client.WriteAPIBlocking("", bucket)
	pt := func(at time.Time, scope string, allowed, blocked int64) {
		require.NoError(t, wr.WritePoint(context.Background(), influxdb2.NewPoint("limiter_decisions",
			map[string]string{"gateway": gw, "scope": scope, "tier": "principal"},
			map[string]any{"allowed": allowed, "blocked": blocked, "shadow": int64(0)}, at)),
			"write to InfluxDB at %s (is the local stack up?)", url)
	}
	pt(now.Add(-30*time.Minute), "messages.create", 90, 10)
	pt(now.Add(-10*time.Minute), "messages.create", 50, 50)
	pt(now.Add(-10*time.Minute), "global", 100, 0)
	c := e.signedIn(t, "viewer1")

	t.Run("rates per scope and chart", func(t *testing.T) {
		code, body := c.get("/sre/block-rate?window=1h&gateway=" + gw)
		require.Equal(t, http.StatusOK, code, body)
		require.Contains(t, body, `<td><code>messages.create</code></td><td class="num">140</td><td class="num">60</td><td class="num">30.0 %</td>`)
		require.Contains(t, body, `<td><code>global</code></td><td class="num">100</td><td class="num">0</td><td class="num">0.0 %</td>`)
		require.Less(t, strings.Index(body, "messages.create</code></td>"), strings.Index(body, "global</code></td>"), "busiest-blocking first")
		require.Contains(t, body, `id="block-chart"`)
		require.Equal(t, 2, strings.Count(body, "<polyline"))
		require.Contains(t, body, "<title>messages.create: 30.0% blocked</title>")
	})
	t.Run("empty range", func(t *testing.T) {
		code, body := c.get("/sre/block-rate?window=1h&gateway=" + gw + "-none")
		require.Equal(t, http.StatusOK, code)
		require.Contains(t, body, "No limiter decisions were recorded")
	})
	t.Run("bad input", func(t *testing.T) {
		code, _ := c.get("/sre/block-rate?window=5y")
		require.Equal(t, http.StatusBadRequest, code)
		code, body := c.get("/sre/block-rate?window=1h&gateway=" + "%22)%20or%20true")
		require.Equal(t, http.StatusServiceUnavailable, code)
		require.Contains(t, body, "not a tag value")
	})
	t.Run("InfluxDB down is an error state", func(t *testing.T) {
		e2 := newEnvWith(t, func(cfg *Config, _ string) {
			cfg.BlockRate = &blockrate.Reader{Query: deadInflux(t), Bucket: bucket}
		})
		c2 := e2.signedIn(t, "viewer1")
		code, body := c2.get("/sre/block-rate")
		require.Equal(t, http.StatusServiceUnavailable, code)
		require.Contains(t, body, "The block rate could not be read (InfluxDB)")
	})
}
