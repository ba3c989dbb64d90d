package app

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/floodgate-dev/floodgate/pkg/config"
	"github.com/floodgate-dev/floodgate/pkg/httpapi/openapitest"
	"github.com/floodgate-dev/floodgate/pkg/kafkatest"
	"github.com/floodgate-dev/floodgate/pkg/service"
	"github.com/floodgate-dev/floodgate/pkg/stacktest"
)

// TestDetectorEndsWhenAPartDies: the detector's parts run on the service
// runner, so when one of them stops (here one added beside the detector's
// own, failing once the detector is serving) the others are drained — not
// ready, the consumers stop and leave their group, the health port closes —
// and Run returns the failure naming the part, which ends the process.
func TestDetectorEndsWhenAPartDies(t *testing.T) {
	ctx := stacktest.Context(t, 2*time.Minute, "the local stack's Redis; run `make test`")
	broker := kafkatest.Start(t, map[string]int32{config.DefaultDecisionsTopic: 3, config.DefaultDecisionsTopic + ".dlq": 1,
		config.DefaultAbuseTopic: 3})
	addr := stacktest.FreeAddr(t)
	env := map[string]string{
		"FLOODGATE_KAFKA_BROKERS":         broker,
		"FLOODGATE_REDIS_ADDRS":           strings.Join(stacktest.Local().RedisAddrs, ","),
		"FLOODGATE_DETECTOR_ADDR":         addr,
		"FLOODGATE_DETECTOR_GROUP":        "dies-detector",
		"FLOODGATE_DETECTOR_RECORDS":      "off",
		"FLOODGATE_PAGERDUTY_ROUTING_KEY": "",
		"FLOODGATE_INFLUX_URL":            "http://127.0.0.1:1", // points dropped: not what this test is about
	}
	var logs stacktest.Log
	run, err := Build(ctx, service.NewEnv("detector", service.Stdio{Getenv: stacktest.Getenv(env)}, logs.Logger(slog.LevelInfo)))
	require.NoError(t, err)

	lost := errors.New("lost its store")
	serving := make(chan struct{})
	run.Worker("broken", func(ctx context.Context) error {
		select {
		case <-serving:
			return lost
		case <-ctx.Done():
			return nil
		}
	})
	done := make(chan error, 1)
	go func() { done <- run.Run(ctx) }()

	stacktest.WaitOK(t, "http://"+addr+"/readyz", 30*time.Second, "the detector's /readyz, from the runner")
	openapitest.CheckUnmatched(t, "http://"+addr, "/healthz")
	res, err := http.Get("http://" + addr + "/metrics")
	require.NoError(t, err)
	res.Body.Close()
	require.Equal(t, http.StatusOK, res.StatusCode, "the runner serves the detector's metrics")
	close(serving)

	select {
	case err = <-done:
	case <-ctx.Done():
		t.Fatalf("the detector kept running after a part died\n%s", logs.String())
	}
	require.ErrorIs(t, err, lost)
	require.ErrorContains(t, err, "broken stopped")
	_, err = http.Get("http://" + addr + "/healthz")
	require.Error(t, err, "the health port is closed once Run returned")
	out := logs.String()
	require.Contains(t, out, "part stopped; shutting down")
	require.Contains(t, out, "consumer stopped", "the decisions consumer drained and left its group")
}
