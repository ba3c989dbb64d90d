package influxresponses

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/floodgate-dev/floodgate/pkg/series/seriestest"
	"github.com/stretchr/testify/require"
)

// TestCounterWritesTheAdjusterContract writes through the real InfluxDB and
// reads back what the adjuster's error-rate query sums: count by code_class.
func TestCounterWritesTheAdjusterContract(t *testing.T) {
	client, bucket := seriestest.Influx(t)
	service := fmt.Sprintf("gwtest_%d", time.Now().UnixNano())
	start := time.Now().Add(-time.Minute)
	r := New(client, "", bucket, service, time.Now)
	for _, status := range []int{200, 200, 204, 404, 429, 500, 503, 503, 42} {
		r.Count(status)
	}
	r.Flush()
	r.Count(502)
	r.Flush() // a delta per flush: the second point carries only the new 5xx

	q := fmt.Sprintf(`from(bucket: %q) |> range(start: %s) |> filter(fn: (r) => r._measurement == "http_responses" and r._field == "count" and r.service == %q) |> group(columns: ["code_class"]) |> sum()`,
		bucket, start.UTC().Format(time.RFC3339), service)
	got := map[string]int64{}
	require.Eventually(t, func() bool {
		res, err := client.QueryAPI("").Query(context.Background(), q)
		require.NoError(t, err)
		clear(got)
		for res.Next() {
			got[fmt.Sprint(res.Record().ValueByKey("code_class"))] = res.Record().Value().(int64)
		}
		require.NoError(t, res.Err())
		return len(got) == 3
	}, 10*time.Second, 100*time.Millisecond)
	// 5xx: 3 in the first point, 1 in the second; running totals would sum to 7.
	require.Equal(t, map[string]int64{"2xx": 3, "4xx": 2, "5xx": 4}, got, "deltas per flush; the out-of-range status is ignored")
}
