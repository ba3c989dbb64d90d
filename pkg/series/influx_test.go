package series

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/floodgate-dev/floodgate/pkg/config"
)

func TestReadInflux(t *testing.T) {
	got := ReadInflux(config.NewEnv(func(string) string { return "" }))
	require.Equal(t, Influx{InfluxURL: config.DefaultInfluxURL, InfluxBucket: config.DefaultInfluxBucket}, got, "defaults: the local stack")

	vars := map[string]string{"FLOODGATE_INFLUX_URL": "http://influx:8086", "FLOODGATE_INFLUX_TOKEN": "tok",
		"FLOODGATE_INFLUX_ORG": "org", "FLOODGATE_INFLUX_BUCKET": "floodgate/autogen"}
	got = ReadInflux(config.NewEnv(func(k string) string { return vars[k] }))
	require.Equal(t, Influx{InfluxURL: "http://influx:8086", InfluxToken: "tok", InfluxOrg: "org", InfluxBucket: "floodgate/autogen"}, got)
}

func TestNumber(t *testing.T) {
	for _, tc := range []struct {
		in   any
		want float64
		ok   bool
	}{
		{0.25, 0.25, true},
		{int64(-3), -3, true},
		{uint64(1 << 40), 1 << 40, true},
		{"42", 42, true},
		{"0.5", 0.5, true},
		{"lots", 0, false},
		{true, 0, false},
		{nil, 0, false},
	} {
		got, ok := Number(tc.in)
		require.Equal(t, tc.ok, ok, "%#v", tc.in)
		require.Equal(t, tc.want, got, "%#v", tc.in)
	}
}
