package signals

import (
	"bufio"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/floodgate-dev/floodgate/pkg/config"
	"github.com/floodgate-dev/floodgate/pkg/series/seriestest"
	"github.com/floodgate-dev/floodgate/pkg/stacktest"
	"github.com/floodgate-dev/floodgate/services/adjuster/internal/control"
)

// TestTelegrafWritesWhatTheAdjusterReads runs the real Telegraf (built by
// `deploy/local/stack.sh install telegraf`, which `make test` runs) with the
// repository's deploy/telegraf/telegraf.conf against the local InfluxDB,
// tagged with a fleet of its own, and reads the adjuster's cpu and mem
// signals narrowed to that fleet: the configuration writes the measurement,
// tags and fields the queries read, in the units they expect.
func TestTelegrafWritesWhatTheAdjusterReads(t *testing.T) {
	client, bucket := seriestest.Influx(t)
	root := stacktest.Root(t)
	bin := filepath.Join(root, ".local/bin/telegraf")
	_, err := os.Stat(bin)
	require.NoError(t, err, "Telegraf is not built: deploy/local/stack.sh install telegraf")

	fleet := "tgtest_" + strconv.FormatInt(time.Now().UnixNano(), 36)
	env := config.NewEnv(os.Getenv)
	cmd := exec.Command(bin, "--strict-env-handling", "--config", filepath.Join(root, "deploy/telegraf/telegraf.conf"))
	cmd.Env = append(os.Environ(), "FLOODGATE_TELEGRAF_FLEET="+fleet, "FLOODGATE_TELEGRAF_INTERVAL=1s",
		"FLOODGATE_INFLUX_URL="+env.String("FLOODGATE_INFLUX_URL", config.DefaultInfluxURL), "FLOODGATE_INFLUX_BUCKET="+bucket)
	var log stacktest.Log
	cmd.Stdout, cmd.Stderr = &log, &log
	require.NoError(t, cmd.Start())
	t.Cleanup(func() {
		_ = cmd.Process.Signal(os.Interrupt)
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("telegraf:\n%s", log.String())
		}
	})

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	src := &Influx{Query: client.QueryAPI(""), Bucket: bucket, Filters: Filters{Hosts: map[string]string{"fleet": fleet}}}
	var s control.Signals
	var readErr error
	ok := false
	for deadline := time.Now().Add(45 * time.Second); !ok && time.Now().Before(deadline); time.Sleep(500 * time.Millisecond) {
		s, readErr = src.Read(ctx, time.Now(), time.Minute)
		ok = readErr == nil && s.CPU.OK && s.Mem.OK && s.CPU.Points >= 3
	}
	require.NoError(t, readErr)
	require.True(t, ok, "cpu and mem of fleet %s never read fresh: %+v", fleet, s)
	require.GreaterOrEqual(t, s.CPU.Value, 0.0)
	require.LessOrEqual(t, s.CPU.Value, 1.0)
	require.WithinDuration(t, time.Now(), s.CPU.At, 10*time.Second)
	// mem: used_percent = (total − available) / total, as /proc/meminfo has it now.
	require.InDelta(t, memUsed(t), s.Mem.Value, 0.05, "mem as a fraction of 1, not a percentage")

	// Another fleet's hosts are not these.
	other := &Influx{Query: client.QueryAPI(""), Bucket: bucket, Filters: Filters{Hosts: map[string]string{"fleet": fleet + "_other"}}}
	o, err := other.Read(ctx, time.Now(), time.Minute)
	require.NoError(t, err)
	require.False(t, o.CPU.OK || o.Mem.OK, "%+v", o)
}

// memUsed is 1 − MemAvailable / MemTotal from /proc/meminfo.
func memUsed(t *testing.T) float64 {
	t.Helper()
	f, err := os.Open("/proc/meminfo")
	require.NoError(t, err)
	defer f.Close()
	kb := map[string]float64{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		name, rest, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		if v, err := strconv.ParseFloat(strings.Fields(rest)[0], 64); err == nil {
			kb[name] = v
		}
	}
	require.NotZero(t, kb["MemTotal"])
	return 1 - kb["MemAvailable"]/kb["MemTotal"]
}
