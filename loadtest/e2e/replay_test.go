package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/require"

	"github.com/floodgate-dev/floodgate/migrations"
	"github.com/floodgate-dev/floodgate/migrations/migrationstest"
	"github.com/floodgate-dev/floodgate/pkg/config"
	"github.com/floodgate-dev/floodgate/pkg/dynamo"
	"github.com/floodgate-dev/floodgate/pkg/events"
	"github.com/floodgate-dev/floodgate/pkg/stacktest"
	"github.com/floodgate-dev/floodgate/pkg/stream"
)

// TestReplayedDeadLetterCountsOnceInTheLedger runs the real quota and dlq-auditor
// binaries: a decision the quota group dead-lettered is replayed by the auditor —
// twice — and the DynamoDB ledger counts its units exactly once.
func TestReplayedDeadLetterCountsOnceInTheLedger(t *testing.T) {
	ctx := stacktest.Context(t, 3*time.Minute, "end-to-end test needs the local stack; run `make test`")
	stack := stacktest.Local()
	ddbEndpoint := stack.DynamoEndpoint
	run := time.Now().UnixNano()
	prefix := fmt.Sprintf("e2e%d_", run)

	ddb, err := dynamo.NewClient(ctx, dynamo.Options{Endpoint: ddbEndpoint})
	require.NoError(t, err)
	// Its tables go when it ends: each run used to leave six behind, and
	// with eight or more TTL tables DynamoDB Local no longer expired items
	// within seconds, as it does with a few (2026-11-30).
	t.Cleanup(func() { stacktest.DropTables(t, ddb, prefix) })
	brokers := migrationstest.Broker(t, ctx, migrations.Runner{Dynamo: &migrations.Dynamo{Client: ddb, Prefix: prefix}})

	bin := buildServices(t)
	quotaGroup := fmt.Sprintf("e2e-quota-%d", run)
	p := events.Principal{Kind: events.PrincipalBot, ID: fmt.Sprintf("e2e_replay_%d", run)}
	now := time.Now().UTC().Truncate(time.Millisecond)
	decision := func(id string, cost int64) []byte {
		b, err := events.EncodeDecision(&events.Decision{ID: id, TS: now, Principal: p, IP: netip.MustParseAddr("203.0.113.9"),
			Method: "POST", Route: "/channels/{channel_id}/messages", Allowed: true, Tier: events.TierPrincipal,
			Cost: cost, Limit: 50, Remaining: 10, Gateway: "e2e"})
		require.NoError(t, err)
		return b
	}
	w := stream.NewProducer(stream.ProducerConfig{Brokers: []string{brokers}})
	defer w.Close()
	var msgs []kafka.Message
	for i := range 5 {
		msgs = append(msgs, kafka.Message{Topic: config.DefaultDecisionsTopic, Key: []byte(p.Key()), Value: decision(fmt.Sprintf("d%d", i), 1)})
	}
	// A decision the quota group failed on and dead-lettered: its 3 units are not
	// in the ledger until it is replayed.
	dead := stream.DLQRecord{Key: []byte(p.Key()), Value: decision("d-dead", 3), SourceTopic: config.DefaultDecisionsTopic,
		Partition: 0, Offset: 1_000_000, Timestamp: now, ConsumerGroup: quotaGroup, Service: "quota",
		ErrorClass: stream.ClassTransientExhausted, ErrorMessage: "dynamodb: throttled", Attempts: 5, FirstFailure: now}
	msgs = append(msgs, dead.Message(config.DefaultDecisionsTopic+".dlq"))
	require.NoError(t, w.Publish(ctx, msgs...))

	quotaAddr, auditorAddr := stacktest.FreeAddr(t), stacktest.FreeAddr(t)
	common := []string{"FLOODGATE_KAFKA_BROKERS=" + brokers, "FLOODGATE_DYNAMODB_ENDPOINT=" + ddbEndpoint, "FLOODGATE_DYNAMODB_TABLE_PREFIX=" + prefix}
	stacktest.Exec(t, filepath.Join(bin, "quota"), append(common, "FLOODGATE_QUOTA_ADDR="+quotaAddr, "FLOODGATE_QUOTA_GROUP="+quotaGroup,
		"FLOODGATE_QUOTA_FLUSH_INTERVAL=200ms"))
	token, tokensFile := auditorToken(t, filepath.Join(bin, "dlq-auditor"))
	stacktest.Exec(t, filepath.Join(bin, "dlq-auditor"), append(common, "FLOODGATE_DLQ_ADDR="+auditorAddr,
		fmt.Sprintf("FLOODGATE_DLQ_GROUP=e2e-auditor-%d", run), "FLOODGATE_DLQ_DISCOVER_INTERVAL=1s",
		"FLOODGATE_DLQ_TOKENS_FILE="+tokensFile, "FLOODGATE_DLQ_CANARY_TIMEOUT=30s", "FLOODGATE_INFLUX_URL="+stack.InfluxURL))
	waitReady(t, "http://"+quotaAddr+"/readyz")
	waitReady(t, "http://"+auditorAddr+"/readyz")

	today := func() int64 {
		resp, err := http.Get(fmt.Sprintf("http://%s/v1/usage/%s/%s?days=1", quotaAddr, p.Kind, p.ID))
		require.NoError(t, err)
		defer resp.Body.Close()
		var u struct {
			Today int64 `json:"today"`
		}
		require.NoError(t, json.NewDecoder(resp.Body).Decode(&u))
		return u.Today
	}
	require.Eventually(t, func() bool { return today() == 5 }, time.Minute, 200*time.Millisecond, "the five live decisions are in the ledger")

	// The auditor has stored the dead letter; find its id.
	var recordID string
	require.Eventually(t, func() bool {
		var page struct {
			Records []struct {
				ID            string `json:"id"`
				ConsumerGroup string `json:"consumer_group"`
			} `json:"records"`
		}
		code := auditorCall(t, http.MethodGet, "http://"+auditorAddr+"/v1/records?topic="+config.DefaultDecisionsTopic+"&limit=100", token, nil, &page)
		require.Equal(t, http.StatusOK, code)
		for _, r := range page.Records {
			if r.ConsumerGroup == quotaGroup {
				recordID = r.ID
			}
		}
		return recordID != ""
	}, time.Minute, 200*time.Millisecond, "the auditor stores the dead letter")

	for i := 1; i <= 2; i++ {
		var res struct {
			AbortReason string `json:"abort_reason"`
		}
		code := auditorCall(t, http.MethodPost, "http://"+auditorAddr+"/v1/replays", token,
			map[string]any{"ids": []string{recordID}, "reason": fmt.Sprintf("e2e replay %d", i)}, &res)
		require.Equal(t, http.StatusOK, code, "replay %d", i)
		require.Empty(t, res.AbortReason, "replay %d", i)
		require.Eventually(t, func() bool { return today() == 8 }, time.Minute, 200*time.Millisecond, "after replay %d", i)
	}
	// Give the second replay every chance to be double counted before the last look.
	time.Sleep(time.Second)
	require.Equal(t, int64(8), today(), "a replayed dead letter counts exactly once")
}

// auditorToken makes an SRE token with the auditor's own `token` command.
func auditorToken(t *testing.T, bin string) (token, file string) {
	t.Helper()
	out, err := exec.Command(bin, "token", "-name", "e2e", "-role", "sre").CombinedOutput()
	require.NoError(t, err, "%s", out)
	var line string
	for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(l)
		switch {
		case len(f) == 2 && f[0] == "token:":
			token = f[1]
		case len(f) == 1 && strings.HasPrefix(f[0], "e2e:sre:"): // its token-spec entry
			line = l
		}
	}
	require.NotEmpty(t, token, "token command output: %s", out)
	require.NotEmpty(t, line, "token command output: %s", out)
	file = filepath.Join(t.TempDir(), "tokens")
	require.NoError(t, os.WriteFile(file, []byte(line+"\n"), 0o600))
	return token, file
}

func auditorCall(t *testing.T, method, url, token string, body, out any) int {
	t.Helper()
	var rd *bytes.Reader
	if body != nil {
		b, err := json.Marshal(body)
		require.NoError(t, err)
		rd = bytes.NewReader(b)
	} else {
		rd = bytes.NewReader(nil)
	}
	req, err := http.NewRequest(method, url, rd)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	if out != nil && resp.StatusCode == http.StatusOK {
		require.NoError(t, json.NewDecoder(resp.Body).Decode(out))
	}
	return resp.StatusCode
}
