package web

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"net/http"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/floodgate-dev/floodgate/migrations/migrationstest"
	"github.com/floodgate-dev/floodgate/pkg/config"
	"github.com/floodgate-dev/floodgate/pkg/events"
	"github.com/floodgate-dev/floodgate/pkg/stacktest"
	"github.com/floodgate-dev/floodgate/pkg/stream"
	"github.com/floodgate-dev/floodgate/services/console/internal/consoletest"
	"github.com/floodgate-dev/floodgate/services/console/internal/dlq"
	"github.com/floodgate-dev/floodgate/services/console/internal/quota"
	"github.com/floodgate-dev/floodgate/services/console/internal/store"
)

// TestDeadLetters runs the real dlq-auditor and quota service (binaries) on an
// in-process broker: a dead letter of the quota service is summarised,
// inspected and replayed from the console, and the quota service then counts it.
func TestDeadLetters(t *testing.T) {
	dl := startDeadLetters(t)
	e, direct, d, goodID, poisonID := dl.env, dl.direct, dl.decision, dl.goodID, dl.poisonID
	topic := config.DefaultDecisionsTopic
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	sre := e.signedIn(t, "sre1")
	code, page := sre.get("/sre/dlq")
	require.Equal(t, http.StatusOK, code, page)
	require.Contains(t, page, poisonID)
	require.Contains(t, page, goodID)

	t.Run("summary counts by topic, service and class", func(t *testing.T) {
		require.Contains(t, page, `<td><code>floodgate.decisions.v1</code></td><td>quota</td><td>poison</td><td class="num">1</td>`)
		require.Contains(t, page, `<td><code>floodgate.decisions.v1</code></td><td>quota</td><td>transient_exhausted</td><td class="num">1</td>`)
		require.Contains(t, page, `<td class="num">2</td></tr></tfoot>`)
	})
	t.Run("inspect", func(t *testing.T) {
		code, body := sre.get("/sre/dlq/record?id=" + url.QueryEscape(goodID))
		require.Equal(t, http.StatusOK, code, body)
		require.Contains(t, body, "update ledger: throttled")
		require.Contains(t, body, d.ID)
		require.Contains(t, body, `id="replay-one"`)
		code, _ = sre.get("/sre/dlq/record?id=" + url.QueryEscape(topic+".dlq:0:999"))
		require.Equal(t, http.StatusNotFound, code)
	})
	t.Run("viewer cannot replay", func(t *testing.T) {
		c := e.signedIn(t, "analyst1")
		code, body := c.get("/sre/dlq")
		require.Equal(t, http.StatusOK, code)
		require.NotContains(t, body, `name="id"`)
		csrf := csrfRE.FindStringSubmatch(body)[1]
		res, _ := c.post("/sre/dlq/replay", url.Values{"csrf": {csrf}, "id": {goodID}, "reason": {"x"}})
		require.Equal(t, http.StatusForbidden, res.StatusCode)
	})
	t.Run("replay needs a reason and a selection", func(t *testing.T) {
		csrf := sre.csrf("/sre/dlq")
		res, body := sre.post("/sre/dlq/replay", url.Values{"csrf": {csrf}, "id": {goodID}})
		require.Equal(t, http.StatusUnprocessableEntity, res.StatusCode)
		require.Contains(t, body, "a reason is required")
		res, _ = sre.post("/sre/dlq/replay", url.Values{"csrf": {csrf}, "reason": {"x"}})
		require.Equal(t, http.StatusUnprocessableEntity, res.StatusCode)
	})
	t.Run("replay: canary consumed, counted by the quota service, audited", func(t *testing.T) {
		csrf := sre.csrf("/sre/dlq")
		res, body := sre.post("/sre/dlq/replay", url.Values{"csrf": {csrf}, "id": {goodID}, "reason": {"INC-9: ledger throttling fixed"}})
		require.Equal(t, http.StatusOK, res.StatusCode, body)
		require.Contains(t, body, "Published 1, failed 0.")
		rows, err := e.st.AuditOf(ctx, store.SubjectDLQ, 5)
		require.NoError(t, err)
		require.Len(t, rows, 1)
		require.Equal(t, "sre1", rows[0].Actor)
		require.Equal(t, "INC-9: ledger throttling fixed", rows[0].Reason)
		require.NotEmpty(t, rows[0].AbuseID, "the replay id")
		require.Eventually(t, func() bool {
			_, body := sre.get("/principals/bot/" + d.Principal.ID)
			return strings.Contains(body, "Today 3 units")
		}, 30*time.Second, 300*time.Millisecond, "the quota service counts the replayed decision")
	})
	t.Run("purge: analyst refused, reason and confirmation required, audited", func(t *testing.T) {
		c := e.signedIn(t, "analyst1")
		code, body := c.get("/sre/dlq/record?id=" + url.QueryEscape(poisonID))
		require.Equal(t, http.StatusOK, code)
		require.NotContains(t, body, `id="purge-one"`)
		res, _ := c.post("/sre/dlq/purge", url.Values{"csrf": {csrfRE.FindStringSubmatch(body)[1]}, "id": {poisonID}, "reason": {"x"}, "confirm": {"yes"}})
		require.Equal(t, http.StatusForbidden, res.StatusCode)

		code, body = sre.get("/sre/dlq/record?id=" + url.QueryEscape(poisonID))
		require.Equal(t, http.StatusOK, code)
		require.Contains(t, body, `id="purge-one"`)
		csrf := csrfRE.FindStringSubmatch(body)[1]
		res, body = sre.post("/sre/dlq/purge", url.Values{"csrf": {csrf}, "id": {poisonID}, "confirm": {"yes"}})
		require.Equal(t, http.StatusUnprocessableEntity, res.StatusCode)
		require.Contains(t, body, "a reason is required")
		res, body = sre.post("/sre/dlq/purge", url.Values{"csrf": {csrf}, "id": {poisonID}, "reason": {"INC-9: poison test traffic"}})
		require.Equal(t, http.StatusOK, res.StatusCode, body)
		require.Contains(t, body, `id="purge-confirm"`)
		require.Contains(t, body, `name="confirm" value="yes"`)
		require.Contains(t, body, poisonID)
		_, err := direct.Inspect(ctx, poisonID)
		require.NoError(t, err, "nothing purged before the confirmation")

		res, body = sre.post("/sre/dlq/purge", url.Values{"csrf": {csrf}, "id": {poisonID}, "reason": {"INC-9: poison test traffic"}, "confirm": {"yes"}})
		require.Equal(t, http.StatusOK, res.StatusCode, body)
		require.Contains(t, body, "Purged 1 of 1.")
		_, err = direct.Inspect(ctx, poisonID)
		var de *dlq.Error
		require.ErrorAs(t, err, &de)
		require.Equal(t, http.StatusNotFound, de.Status, "the auditor no longer has the record")
		rows, err := e.st.AuditOf(ctx, store.SubjectDLQ, 5)
		require.NoError(t, err)
		require.Equal(t, "dlq.purge", rows[0].Action)
		require.Equal(t, "sre1", rows[0].Actor)
		require.Equal(t, "INC-9: poison test traffic", rows[0].Reason)
		require.Contains(t, rows[0].Before, poisonID)
		require.Contains(t, rows[0].After, `"purged":1`)

		res, body = sre.post("/sre/dlq/purge", url.Values{"csrf": {csrf}, "id": {poisonID}, "reason": {"again"}, "confirm": {"yes"}})
		require.Equal(t, http.StatusOK, res.StatusCode, body)
		require.Contains(t, body, "Purged 0 of 1.", "already gone: not_found")
	})
}

// deadLetters is a console wired to a real dlq-auditor and quota service
// (binaries) on an in-process broker, with two dead letters of the quota
// service on the decisions topic's DLQ, both stored by the auditor.
type deadLetters struct {
	env      *testEnv
	direct   *dlq.Client     // the auditor's API with the console's (sre) token
	decision events.Decision // the valid decision the quota service failed to write
	goodID   string          // its dead letter (transient_exhausted)
	poisonID string          // the poison message's dead letter
}

// startDeadLetters starts the auditor and the quota service, produces the two
// dead letters and waits until the auditor stores both.
func startDeadLetters(t *testing.T) *deadLetters {
	t.Helper()
	b := consoletest.Broker(t)
	dlqAddr, quotaAddr := consoletest.FreeAddr(t), consoletest.FreeAddr(t)
	raw := make([]byte, 32)
	_, err := rand.Read(raw)
	require.NoError(t, err)
	token := "fgdlq_" + base64.RawURLEncoding.EncodeToString(raw)
	sum := sha256.Sum256([]byte(token))
	tokens := filepath.Join(t.TempDir(), "tokens")
	require.NoError(t, os.WriteFile(tokens, []byte("console:sre:"+hex.EncodeToString(sum[:])+"\n"), 0o600))

	var prefix string
	e := newEnvWith(t, func(cfg *Config, p string) {
		prefix = p
		c, err := dlq.New("http://"+dlqAddr, token, nil)
		require.NoError(t, err)
		cfg.DLQ = c
		q, err := quota.New("http://"+quotaAddr, "", nil)
		require.NoError(t, err)
		cfg.Quota = q
	})
	group := "quota-" + e.run
	stacktest.Exec(t, serviceBinary(t, "quota"), []string{
		"FLOODGATE_QUOTA_ADDR=" + quotaAddr, "FLOODGATE_KAFKA_BROKERS=" + b, "FLOODGATE_QUOTA_GROUP=" + group,
		"FLOODGATE_DYNAMODB_TABLE_PREFIX=" + prefix, "FLOODGATE_DYNAMODB_ENDPOINT=" + migrationstest.DynamoEndpoint(),
	})
	stacktest.Exec(t, serviceBinary(t, "dlq-auditor"), []string{
		"FLOODGATE_DLQ_ADDR=" + dlqAddr, "FLOODGATE_KAFKA_BROKERS=" + b, "FLOODGATE_DLQ_GROUP=auditor-" + e.run,
		"FLOODGATE_DLQ_DISCOVER_INTERVAL=1s", "FLOODGATE_DLQ_TOKENS_FILE=" + tokens, "FLOODGATE_DLQ_CANARY_TIMEOUT=30s",
		"FLOODGATE_DYNAMODB_TABLE_PREFIX=" + prefix, "FLOODGATE_DYNAMODB_ENDPOINT=" + migrationstest.DynamoEndpoint(),
	})
	consoletest.WaitReady(t, "http://"+quotaAddr+"/readyz")
	consoletest.WaitReady(t, "http://"+dlqAddr+"/healthz")

	// Two dead letters of the quota service: a valid decision it failed to
	// write (transient) and a poison message.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	now := time.Now().UTC()
	d := events.Decision{ID: "ev_" + e.run, TS: now, Principal: events.Principal{Kind: events.PrincipalBot, ID: e.run + "_dlq"},
		IP: netip.MustParseAddr("203.0.113.7"), Method: "POST", Route: "/channels/{channel_id}/messages",
		Allowed: true, Tier: events.TierPrincipal, Cost: 3, Limit: 50, Remaining: 10, Gateway: "test"}
	v, err := events.EncodeDecision(&d)
	require.NoError(t, err)
	topic := config.DefaultDecisionsTopic
	good := stream.DLQRecord{Key: []byte(d.Key()), Value: v, Headers: stream.CloudEventHeaders(events.CETypeDecision, d.ID, "/test", d.TS),
		SourceTopic: topic, Partition: 0, Offset: 41, Timestamp: now, ConsumerGroup: group, Service: "quota",
		ErrorClass: stream.ClassTransientExhausted, ErrorMessage: "update ledger: throttled", Attempts: 8, FirstFailure: now}
	poison := stream.DLQRecord{Key: []byte("bot:x"), Value: []byte(`{"type":"decision.v1","id":"p1"`), SourceTopic: topic, Partition: 0, Offset: 42,
		Timestamp: now, ConsumerGroup: group, Service: "quota", ErrorClass: stream.ClassPoison, ErrorMessage: "decode decision: unexpected EOF", Attempts: 1, FirstFailure: now}
	p := stream.NewProducer(stream.ProducerConfig{Brokers: []string{b}})
	t.Cleanup(func() { _ = p.Close() })
	require.NoError(t, p.Publish(ctx, good.Message(topic+".dlq"), poison.Message(topic+".dlq")))
	direct, err := dlq.New("http://"+dlqAddr, token, nil)
	require.NoError(t, err)
	var goodID, poisonID string
	require.Eventually(t, func() bool {
		recs, _, err := direct.List(ctx, topic, "", now.Add(-time.Hour), time.Now().Add(time.Minute), 100)
		if err != nil || len(recs) < 2 {
			return false
		}
		for _, r := range recs {
			if r.Class == string(stream.ClassPoison) {
				poisonID = r.ID
			} else {
				goodID = r.ID
			}
		}
		return true
	}, 60*time.Second, 300*time.Millisecond, "the auditor stores both dead letters")
	return &deadLetters{env: e, direct: direct, decision: d, goodID: goodID, poisonID: poisonID}
}
