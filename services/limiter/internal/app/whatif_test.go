package app

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/require"

	"github.com/floodgate-dev/floodgate/pkg/events"
	"github.com/floodgate-dev/floodgate/pkg/kafkatest"
	"github.com/floodgate-dev/floodgate/pkg/redisx/redistest"
	"github.com/floodgate-dev/floodgate/pkg/service"
	"github.com/floodgate-dev/floodgate/pkg/stacktest"
	"github.com/floodgate-dev/floodgate/pkg/whatif"
)

// `limiter whatif` reads the range from the configured decisions topic,
// replays it through the candidate and prints the report; a reject verdict
// is an error (exit status 1), so a pipeline can gate on it.
func TestWhatIfCommand(t *testing.T) {
	redistest.Client(t)
	const topic = "whatif-cmd"
	broker := kafkatest.Start(t, map[string]int32{topic: 2})
	now := time.Now().UTC().Truncate(time.Millisecond)
	p := events.Principal{Kind: events.PrincipalBot, ID: redistest.Unique(t, "cmd")}
	w := &kafka.Writer{Addr: kafka.TCP(broker), Topic: topic, RequiredAcks: kafka.RequireAll, BatchTimeout: time.Millisecond}
	var msgs []kafka.Message
	for i := range 10 {
		ts := now.Add(time.Duration(i-20) * time.Second)
		d := events.Decision{ID: fmt.Sprintf("cmd%d", i), TS: ts, Principal: p, IP: netip.MustParseAddr("192.0.2.9"),
			Method: "POST", Route: "/v1/charges", Allowed: true, Tier: events.TierPrincipal, Cost: 1, Gateway: "t",
			Plan: "pro", Priority: events.PriorityCritical}
		v, err := events.EncodeDecision(&d)
		require.NoError(t, err)
		msgs = append(msgs, kafka.Message{Key: []byte(p.Key()), Value: v, Time: ts})
	}
	require.NoError(t, w.WriteMessages(context.Background(), msgs...))
	require.NoError(t, w.Close())

	dir := t.TempDir()
	write := func(name, body string) string {
		f := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(f, []byte(body), 0o600))
		return f
	}
	strict := write("strict.yaml", "version: 1\nrules:\n  - {id: charges, tier: endpoint, method: POST, route: /v1/charges, limit: 9, period: 1h}\n")
	loose := write("loose.yaml", "version: 1\nrules:\n  - {id: charges, tier: endpoint, method: POST, route: /v1/charges, limit: 100, period: 1h}\n")
	env := map[string]string{"FLOODGATE_KAFKA_BROKERS": broker, "FLOODGATE_DECISIONS_TOPIC": topic, "FLOODGATE_LIMITER_INFLUX_INTERVAL": "0"}
	run := func(args ...string) (string, error) {
		var out bytes.Buffer
		e := service.NewEnv("limiter", service.Stdio{Args: append([]string{"whatif"}, args...), Getenv: stacktest.Getenv(env),
			Stdout: &out, Stderr: io.Discard}, slog.New(slog.DiscardHandler))
		err := Run(context.Background(), e)
		return out.String(), err
	}

	out, err := run("-rules", loose, "-from", "1m", "-format", "json", "-baseline", "none")
	require.NoError(t, err, out)
	var rep whatif.Report
	require.NoError(t, json.Unmarshal([]byte(out), &rep))
	require.Equal(t, 10, rep.Replayed)
	require.Equal(t, 0, rep.Total.BlockedCandidate)
	require.Equal(t, whatif.VerdictSafe, rep.Verdict, rep.Reasons)
	require.Equal(t, topic, rep.Topic)

	out, err = run("-rules", strict, "-from", "1m", "-to", "now")
	require.ErrorContains(t, err, "what-if verdict: reject")
	require.Contains(t, out, "verdict: REJECT")
	require.Contains(t, out, "blocks 10.00 % of the critical traffic that was allowed (1 of 10)")
	require.Contains(t, out, "pro: newly blocked 1, newly allowed 0")

	t.Run("flags are checked, naming the flag", func(t *testing.T) {
		_, err := run("-from", "yesterday", "-format", "xml", "-reject-critical", "2")
		require.ErrorContains(t, err, "-rules: required")
		require.ErrorContains(t, err, "-from: ")
		require.ErrorContains(t, err, "-format \"xml\"")
		require.ErrorContains(t, err, "-reject-critical")
		_, err = run("-rules", loose, "-from", "1m", "-to", "2h")
		require.ErrorContains(t, err, "must be before -to")
		_, err = run("-rules", filepath.Join(dir, "missing.yaml"), "-from", "1m")
		require.ErrorContains(t, err, "-rules: ")
	})
}
