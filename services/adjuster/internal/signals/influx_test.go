package signals

import (
	"context"
	"strings"
	"testing"
	"time"

	influxdb2 "github.com/influxdata/influxdb-client-go/v2"
	"github.com/influxdata/influxdb-client-go/v2/api/write"
	"github.com/stretchr/testify/require"

	"github.com/floodgate-dev/floodgate/pkg/series/seriestest"
)

// TestInfluxReadsSignals writes Telegraf-shaped and Floodgate points tagged
// with a value no other run uses into the real InfluxDB, then reads them back
// through the Flux queries.
func TestInfluxReadsSignals(t *testing.T) {
	client, bucket := seriestest.Influx(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	run := "adjtest_" + strings.ReplaceAll(time.Now().UTC().Format("150405.000000000"), ".", "_")
	now := time.Now().UTC().Truncate(time.Second)
	at := func(ago time.Duration) time.Time { return now.Add(-ago) }
	hosts := map[string]string{"fleet": run}
	limiterPoint := func(scope, tier string, allowed, blocked, shadow int64, ts time.Time) *write.Point {
		return influxdb2.NewPoint(MeasurementDecisions, map[string]string{"gateway": run, "scope": scope, "tier": tier},
			map[string]any{"allowed": allowed, "blocked": blocked, "shadow": shadow}, ts)
	}
	redisPoint := func(gateway string, used float64, ts time.Time) *write.Point {
		return influxdb2.NewPoint(MeasurementRedis, map[string]string{"gateway": gateway},
			map[string]any{"pipelines": int64(1000), "p50_ms": 1.0, "p99_ms": used * 50, "max_ms": used * 60, "budget_used": used}, ts)
	}
	detectorPoint := func(pattern, mode string, events int64, ts time.Time) *write.Point {
		return influxdb2.NewPoint(MeasurementAbuseDetections,
			map[string]string{"pattern": pattern, "severity": "high", "mode": mode, "principal_kind": "user", "detector_version": run},
			map[string]any{
				"score": 7.5, "observed_rate": 40.0, "threshold": 10.0, "event_count": events, "distinct_ips": int64(1),
				"multiplier": 0.1, "level": 1, "latency_ms": 12.5, "count": 1,
			}, ts)
	}
	pts := []*write.Point{
		influxdb2.NewPoint("cpu", map[string]string{"fleet": run, "cpu": "cpu-total", "host": "a"}, map[string]any{"usage_idle": 20.0}, at(40*time.Second)),
		influxdb2.NewPoint("cpu", map[string]string{"fleet": run, "cpu": "cpu-total", "host": "b"}, map[string]any{"usage_idle": 10.0}, at(20*time.Second)),
		// A per-core series must not count.
		influxdb2.NewPoint("cpu", map[string]string{"fleet": run, "cpu": "cpu0", "host": "a"}, map[string]any{"usage_idle": 99.0}, at(10*time.Second)),
		influxdb2.NewPoint("mem", map[string]string{"fleet": run, "host": "a"}, map[string]any{"used_percent": 50.0}, at(30*time.Second)),
		influxdb2.NewPoint(MeasurementHTTPResponses, map[string]string{"fleet": run, "code_class": "2xx"}, map[string]any{"count": int64(880)}, at(30*time.Second)),
		influxdb2.NewPoint(MeasurementHTTPResponses, map[string]string{"fleet": run, "code_class": "4xx"}, map[string]any{"count": int64(20)}, at(30*time.Second)),
		influxdb2.NewPoint(MeasurementHTTPResponses, map[string]string{"fleet": run, "code_class": "5xx"}, map[string]any{"count": int64(100)}, at(15*time.Second)),
		// limiter_decisions as services/limiter's ScopeCounts writes them: one point per
		// gateway, scope and tier per flush. allowed + blocked = 1000; shadow must not count.
		limiterPoint("rule_a", "principal", 500, 100, 40, at(50*time.Second)),
		limiterPoint("rule_b", "ip", 250, 50, 0, at(30*time.Second)),
		limiterPoint("none", "penalty", 0, 100, 0, at(5*time.Second)),
		// Another gateway's decisions must not count.
		influxdb2.NewPoint(MeasurementDecisions, map[string]string{"gateway": run + "_other", "scope": "rule_a", "tier": "principal"},
			map[string]any{"allowed": int64(9000), "blocked": int64(0), "shadow": int64(0)}, at(10*time.Second)),
		// abuse_detections as services/detector's InfluxRecorder writes them: 150 + 50
		// enforced; the simulated detection must not count.
		detectorPoint("rapid_fire", "enforced", 150, at(25*time.Second)),
		detectorPoint("bot_like", "enforced", 50, at(24*time.Second)),
		detectorPoint("distributed_ip", "simulated", 700, at(23*time.Second)),
		// limiter_redis as ScopeCounts.TrackRedis writes them: the median of the
		// window's points counts, so the one noisy flush (0.98) moves nothing;
		// another gateway's points must not count.
		redisPoint(run, 0.3, at(45*time.Second)),
		redisPoint(run, 0.98, at(40*time.Second)),
		redisPoint(run, 0.62, at(35*time.Second)),
		redisPoint(run+"_other", 0.99, at(30*time.Second)),
	}
	require.NoError(t, client.WriteAPIBlocking("", bucket).WritePoint(ctx, pts...))

	src := &Influx{
		Query: client.QueryAPI(""), Bucket: bucket,
		Filters: Filters{Hosts: hosts, HTTP: map[string]string{"fleet": run}, Abuse: map[string]string{"detector_version": run}, Decisions: map[string]string{"gateway": run}},
	}
	t.Run("fresh window", func(t *testing.T) {
		s, err := src.Read(ctx, now.Add(time.Second), time.Minute)
		require.NoError(t, err)
		require.True(t, s.CPU.OK && s.Mem.OK && s.ErrorRate.OK && s.AbuseRate.OK, "%+v", s)
		require.InDelta(t, 0.85, s.CPU.Value, 1e-9, "1 - median(20, 10)/100: the mean of the two middle points")
		require.Equal(t, at(20*time.Second), s.CPU.At)
		require.InDelta(t, 0.5, s.Mem.Value, 1e-9)
		require.InDelta(t, 0.1, s.ErrorRate.Value, 1e-9, "100 of 1000")
		require.Equal(t, at(15*time.Second), s.ErrorRate.At)
		require.InDelta(t, 0.2, s.AbuseRate.Value, 1e-9, "200 enforced events of 1000 decisions")
		require.Equal(t, at(5*time.Second), s.AbuseRate.At)
		require.InDelta(t, 2.0/60, s.AbusePerSec, 1e-9, "two enforced detections a minute")
		require.True(t, s.RedisLatency.OK)
		require.InDelta(t, 0.62, s.RedisLatency.Value, 1e-9, "the median of 0.3, 0.98, 0.62: one noisy flush cannot move it")
		require.Equal(t, at(35*time.Second), s.RedisLatency.At)
		require.Equal(t, 3, s.RedisLatency.Points, "counted: fewer than three points may not raise the shed level")
		require.Equal(t, 2, s.CPU.Points)

		shed, err := src.ReadShed(ctx, now.Add(time.Second), time.Minute)
		require.NoError(t, err)
		require.Equal(t, s.CPU, shed.CPU, "the shed read agrees with the full one")
		require.Equal(t, s.ErrorRate, shed.ErrorRate)
		require.Equal(t, s.RedisLatency, shed.RedisLatency)
		require.False(t, shed.Mem.OK || shed.AbuseRate.OK, "and reads nothing else")
	})
	t.Run("decisions without detections read an abuse rate of zero", func(t *testing.T) {
		s, err := src.Read(ctx, now.Add(time.Second), 20*time.Second)
		require.NoError(t, err)
		require.True(t, s.AbuseRate.OK, "%+v", s)
		require.InDelta(t, 0.0, s.AbuseRate.Value, 1e-9, "only the penalty-tier point (100 blocked) is in the last 20 s")
		require.Equal(t, at(5*time.Second), s.AbuseRate.At)
		require.Zero(t, s.AbusePerSec)
		require.True(t, s.RedisLatency.OK, "decisions without a pipeline: an idle Redis, not a missing signal")
		require.Zero(t, s.RedisLatency.Value)
	})
	t.Run("detections without limiter decisions read a missing abuse rate", func(t *testing.T) {
		other := *src
		other.Filters.Decisions = map[string]string{"gateway": run + "_none"}
		s, err := other.Read(ctx, now.Add(time.Second), time.Minute)
		require.NoError(t, err)
		require.False(t, s.AbuseRate.OK, "%+v", s)
		require.False(t, s.RedisLatency.OK, "no limiter seen: Redis latency unknown")
	})
	t.Run("a window past every point reads missing signals", func(t *testing.T) {
		s, err := src.Read(ctx, now.Add(5*time.Minute), time.Minute)
		require.NoError(t, err)
		require.False(t, s.CPU.OK || s.Mem.OK || s.ErrorRate.OK || s.AbuseRate.OK, "%+v", s)
	})
	t.Run("a filter nothing matches reads missing signals", func(t *testing.T) {
		other := *src
		other.Filters = Filters{Hosts: map[string]string{"fleet": run + "_none"}, HTTP: map[string]string{"fleet": `x" or true or "`}}
		s, err := other.Read(ctx, now.Add(time.Second), time.Minute)
		require.NoError(t, err)
		require.False(t, s.CPU.OK || s.Mem.OK || s.ErrorRate.OK, "%+v", s)
	})
	t.Run("a query error is returned", func(t *testing.T) {
		other := *src
		other.Bucket = "no_such_db_" + run + "/rp"
		_, err := other.Read(ctx, now, time.Minute)
		require.Error(t, err)
		require.Contains(t, err.Error(), "read cpu")
	})
}

func TestQuote(t *testing.T) {
	cases := []struct{ in, want string }{
		{"floodgate/d30", `"floodgate/d30"`},
		{`a"b`, `"a\"b"`},
		{`back\slash`, `"back\\slash"`},
		{"${x}", `"\${x}"`},
		{"$5", `"$5"`},
		{"line\nbreak", `"line\nbreak"`},
	}
	for _, tc := range cases {
		t.Run(tc.in, func(t *testing.T) { require.Equal(t, tc.want, Quote(tc.in)) })
	}
}

// FuzzQuote: the literal never ends early and never opens an interpolation.
func FuzzQuote(f *testing.F) {
	for _, s := range []string{"", `"`, `\`, "${", `\${`, `$\{`, "a\"b${c}"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		q := Quote(s)
		body := q[1 : len(q)-1]
		for i := 0; i < len(body); i++ {
			switch body[i] {
			case '\\':
				i++ // escaped byte
				require.Less(t, i, len(body), "dangling backslash in %q", q)
			case '"':
				t.Fatalf("unescaped quote in %q", q)
			case '$':
				require.False(t, i+1 < len(body) && body[i+1] == '{', "interpolation in %q", q)
			}
		}
	})
}
