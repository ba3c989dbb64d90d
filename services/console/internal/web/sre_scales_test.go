package web

import (
	"context"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	influxdb2 "github.com/influxdata/influxdb-client-go/v2"
	"github.com/influxdata/influxdb-client-go/v2/api/write"
	"github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/require"

	"github.com/floodgate-dev/floodgate/pkg/config"
	"github.com/floodgate-dev/floodgate/pkg/events"
	"github.com/floodgate-dev/floodgate/pkg/series"
	"github.com/floodgate-dev/floodgate/pkg/stream"
	"github.com/floodgate-dev/floodgate/services/console/internal/adjuster"
	"github.com/floodgate-dev/floodgate/services/console/internal/consoletest"
)

// adjusterPoint writes one adjuster_scales point the way the adjuster's
// effects.InfluxSeries.Record does (docs/adjuster.md, pkg/series): tags scope
// and dry_run, fields scale and frozen.
func adjusterPoint(scope string, scale float64, dry bool, at time.Time) *write.Point {
	return influxdb2.NewPoint(series.AdjusterScales,
		map[string]string{series.TagScope: scope, series.TagDryRun: map[bool]string{true: "true", false: "false"}[dry]},
		map[string]any{series.FieldScale: scale, series.FieldFrozen: false}, at)
}

// publishAdjustments publishes adjustment.v1 events the way the adjuster's
// effects.KafkaAdjustments does: keyed by scope, CloudEvents headers.
func publishAdjustments(t *testing.T, broker string, adj ...events.Adjustment) {
	t.Helper()
	p := stream.NewProducer(stream.ProducerConfig{Brokers: []string{broker}})
	t.Cleanup(func() { _ = p.Close() })
	var msgs []kafka.Message
	for i := range adj {
		a := &adj[i]
		require.NoError(t, a.Validate())
		b, err := events.EncodeAdjustment(a)
		require.NoError(t, err)
		msgs = append(msgs, kafka.Message{Topic: config.DefaultAdjustmentsTopic, Key: []byte(a.Key()), Value: b,
			Headers: stream.CloudEventHeaders(events.CETypeAdjustment, a.ID, "floodgate/adjuster", a.TS)})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	require.NoError(t, p.Publish(ctx, msgs...))
}

// TestScaleHistory writes adjuster_scales points to the real InfluxDB and
// adjustment.v1 events to a broker as the adjuster does, and reads the scale
// history on the scales page.
func TestScaleHistory(t *testing.T) {
	env := config.NewEnv(os.Getenv)
	influxURL, bucket := env.String("FLOODGATE_INFLUX_URL", config.DefaultInfluxURL), env.String("FLOODGATE_INFLUX_BUCKET", config.DefaultInfluxBucket)
	influx := influxdb2.NewClient(influxURL, env.String("FLOODGATE_INFLUX_TOKEN", ""))
	t.Cleanup(influx.Close)
	b := consoletest.Broker(t)
	e := newEnvWith(t, func(cfg *Config, _ string) {
		cfg.ScaleSeries = &adjuster.Series{Query: influx.QueryAPI(""), Bucket: bucket}
		cfg.Adjustments = &adjuster.Adjustments{Client: &kafka.Client{Addr: kafka.TCP(b), Timeout: 10 * time.Second}, Topic: config.DefaultAdjustmentsTopic}
	})
	prefix := "route:" + e.run + "/"
	a, bb := prefix+"a", prefix+"b"
	now := time.Now().UTC().Truncate(time.Millisecond)
	wr := influx.WriteAPIBlocking("", bucket)
	for _, p := range []*write.Point{
		adjusterPoint(a, 1, false, now.Add(-50*time.Minute)), adjusterPoint(a, 0.7, false, now.Add(-40*time.Minute)),
		adjusterPoint(a, 0.7, false, now.Add(-30*time.Minute)), adjusterPoint(a, 0.49, false, now.Add(-10*time.Minute)),
		adjusterPoint(a, 0.1, true, now.Add(-5*time.Minute)), // a dry-run tick: computed, never applied
		adjusterPoint(bb, 1, false, now.Add(-45*time.Minute)), adjusterPoint(bb, 0.5, false, now.Add(-20*time.Minute)),
	} {
		require.NoError(t, wr.WritePoint(context.Background(), p), "write to InfluxDB at %s (is the local stack up?)", influxURL)
	}
	loop := events.Actor{Kind: events.ActorLoop, ID: "adjuster@test"}
	sig := events.Signals{CPU: 0.91, ErrorRate: 0.01, AbuseRate: 0.2}
	ev := func(scope string, ago time.Duration, old, new float64, rule, reason string, dry bool, actor events.Actor) events.Adjustment {
		return events.Adjustment{ID: uuid.NewString(), TS: now.Add(-ago), Scope: scope, OldScale: old, NewScale: new,
			Signals: sig, Rule: rule, DryRun: dry, Actor: actor, Reason: reason}
	}
	publishAdjustments(t, b,
		ev(a, 3*time.Hour, 0.8, 1, "recover", "cpu 0.31 < 0.5 and mem 0.4 < 0.6", false, loop),
		ev(a, 40*time.Minute, 1, 0.7, "cpu_high", "cpu 0.91 > 0.85", false, loop),
		ev(bb, 20*time.Minute, 1, 0.5, "override", "operator override to 0.5 until 2026-11-23T10:00:00Z: INC-7 bot flood", false,
			events.Actor{Kind: events.ActorOperator, ID: "alice"}),
		ev(a, 10*time.Minute, 0.7, 0.49, "cpu_high", "cpu 0.93 > 0.85", false, loop),
		ev(a, 5*time.Minute, 0.49, 0.1, "cpu_high", "cpu 0.97 > 0.85", true, loop),
		ev("global", 2*time.Minute, 1, 0.7, "cpu_high", "cpu 0.9 > 0.85", false, loop), // another scope
	)
	c := e.signedIn(t, "viewer1")

	t.Run("chart and changes with their causes", func(t *testing.T) {
		code, body := c.get("/scales?window=1h&scope=" + url.QueryEscape(prefix))
		require.Equal(t, http.StatusOK, code, body)
		require.Contains(t, body, `id="scale-chart"`)
		require.Contains(t, body, `role="img" aria-label="applied limit scale per scope over time, 2 scopes, 4 changes`)
		require.Equal(t, 2, strings.Count(body, "<polyline"))
		require.Contains(t, body, "<title>"+a+": scale 0.49 at the end</title>", "the dry-run tick is not drawn")
		require.Contains(t, body, "<title>"+bb+": scale 0.5 at the end</title>")
		require.Equal(t, 3, strings.Count(body, `<circle class="marker`), "a marker per applied change")
		table := between(t, body, `<table id="scale-changes">`, `</table>`)
		require.Equal(t, 4, strings.Count(table, "<tr class=\"change-scale\">"), "4 changes of the prefix in the last hour")
		require.Contains(t, table, `<td class="num">1 → 0.7</td><td>cpu_high</td><td>cpu 0.91 &gt; 0.85</td><td>loop adjuster@test</td><td>cpu 0.91 · errors 0.01 · abuse 0.2/s</td>`)
		require.Contains(t, table, `<td class="num">1 → 0.5</td><td>override</td><td>operator override to 0.5 until 2026-11-23T10:00:00Z: INC-7 bot flood</td><td>SRE alice</td>`)
		require.Contains(t, table, `0.49 → 0.1</td><td>cpu_high <span class="tag">dry run, not applied</span>`)
		require.NotContains(t, table, "<code>global</code>")
		require.Less(t, strings.Index(table, "0.49 → 0.1"), strings.Index(table, "1 → 0.7"), "newest first")
	})
	t.Run("a longer range reaches older changes", func(t *testing.T) {
		code, body := c.get("/scales?window=6h&scope=" + url.QueryEscape(prefix))
		require.Equal(t, http.StatusOK, code)
		require.Contains(t, body, "cpu 0.31 &lt; 0.5 and mem 0.4 &lt; 0.6")
	})
	t.Run("empty range", func(t *testing.T) {
		code, body := c.get("/scales?window=1h&scope=" + url.QueryEscape(prefix+"none"))
		require.Equal(t, http.StatusOK, code)
		require.Contains(t, body, "The adjuster recorded no applied scale in this range.")
		require.Contains(t, body, "No scale changed in this range.")
	})
	t.Run("bad input", func(t *testing.T) {
		code, body := c.get("/scales?window=5y")
		require.Equal(t, http.StatusBadRequest, code)
		require.Contains(t, body, "window must be one of")
		code, body = c.get("/scales?window=1h&scope=" + url.QueryEscape(`") or true`))
		require.Equal(t, http.StatusOK, code)
		require.Contains(t, body, "not a scope")
	})
	t.Run("InfluxDB and Kafka down are error states", func(t *testing.T) {
		e2 := newEnvWith(t, func(cfg *Config, _ string) {
			cfg.ScaleSeries = &adjuster.Series{Query: deadInflux(t), Bucket: bucket}
			cfg.Adjustments = &adjuster.Adjustments{Client: &kafka.Client{Addr: kafka.TCP(consoletest.FreeAddr(t)), Timeout: 2 * time.Second}, Topic: config.DefaultAdjustmentsTopic}
		})
		require.NoError(t, e2.rdb.HSet(context.Background(), "fg:test:"+e2.run+":scales", "global", "0.7").Err())
		t.Cleanup(func() { e2.rdb.Del(context.Background(), "fg:test:"+e2.run+":scales") })
		c2 := e2.signedIn(t, "viewer1")
		code, body := c2.get("/scales?window=1h")
		require.Equal(t, http.StatusOK, code, "the current scales still render")
		require.Contains(t, body, `<td><code>global</code></td><td class="num">0.7</td>`)
		require.Contains(t, body, "The scale history could not be read (InfluxDB)")
		require.Contains(t, body, "The scale changes could not be read (Kafka floodgate.adjustments.v1)")
		require.NotContains(t, body, `id="scale-chart"`)
	})
	t.Run("not configured", func(t *testing.T) {
		e3 := newEnv(t)
		c3 := e3.signedIn(t, "viewer1")
		code, body := c3.get("/scales")
		require.Equal(t, http.StatusOK, code)
		require.Contains(t, body, "No InfluxDB is configured")
		require.NotContains(t, body, `role="alert"`)
	})
}

// TestScaleSeriesContract checks that the adjuster writes its scale series
// under the names the console reads (pkg/series): services never import each
// other, so this reads the adjuster's source.
func TestScaleSeriesContract(t *testing.T) {
	src, err := os.ReadFile(filepath.Join("..", "..", "..", "adjuster", "internal", "effects", "effects.go"))
	require.NoError(t, err)
	s := string(src)
	for _, re := range []string{
		`MeasurementScales\s*=\s*series\.AdjusterScales\b`,
		`influxdb2\.NewPoint\(MeasurementScales,\s*map\[string\]string\{series\.TagScope:\s*scope,\s*series\.TagDryRun:\s*dry\},\s*map\[string\]any\{series\.FieldScale:\s*p\.Scales\[scope\]`,
		`dry\s*:=\s*strconv\.FormatBool\(p\.DryRun\)`, // dry_run is "true" / "false", as the console filters
	} {
		require.Regexp(t, regexp.MustCompile(re), s, "the adjuster's effects.go no longer writes the scale series the console reads (pkg/series)")
	}
}

func between(t *testing.T, s, from, to string) string {
	t.Helper()
	i := strings.Index(s, from)
	require.GreaterOrEqual(t, i, 0, "no %s", from)
	j := strings.Index(s[i:], to)
	require.GreaterOrEqual(t, j, 0, "no %s after %s", to, from)
	return s[i : i+j]
}
