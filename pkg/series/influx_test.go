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
