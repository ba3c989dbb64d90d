package series

import "github.com/floodgate-dev/floodgate/pkg/config"

// Influx is where a service writes or reads its series. Service configs embed
// it, so its fields read as cfg.InfluxURL and so on.
type Influx struct {
	InfluxURL    string // FLOODGATE_INFLUX_URL
	InfluxToken  string // FLOODGATE_INFLUX_TOKEN
	InfluxOrg    string // FLOODGATE_INFLUX_ORG (InfluxDB 2; ignored by InfluxDB 1.8)
	InfluxBucket string // FLOODGATE_INFLUX_BUCKET ("db/rp" on InfluxDB 1.8)
}

// ReadInflux reads the FLOODGATE_INFLUX_* variables; URL and bucket default
// to the local stack's InfluxDB (config.DefaultInfluxURL, DefaultInfluxBucket).
func ReadInflux(e *config.Env) Influx {
	return Influx{
		InfluxURL:    e.String("FLOODGATE_INFLUX_URL", config.DefaultInfluxURL),
		InfluxToken:  e.String("FLOODGATE_INFLUX_TOKEN", ""),
		InfluxOrg:    e.String("FLOODGATE_INFLUX_ORG", ""),
		InfluxBucket: e.String("FLOODGATE_INFLUX_BUCKET", config.DefaultInfluxBucket),
	}
}
