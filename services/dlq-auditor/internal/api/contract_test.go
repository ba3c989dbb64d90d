package api

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/floodgate-dev/floodgate/migrations/migrationstest"
	"github.com/floodgate-dev/floodgate/pkg/dlqapi"
	"github.com/floodgate-dev/floodgate/pkg/dynamo"
	"github.com/floodgate-dev/floodgate/pkg/httpapi"
	"github.com/floodgate-dev/floodgate/services/dlq-auditor/internal/auditor"
)

// TestConsoleDecodesWhatTheAuditorEncodes serves the auditor's real API
// handler (records stored on DynamoDB Local) and reads it as the console
// does: pkg/httpapi's client decoding into pkg/dlqapi's documents, which are
// the console's dlq client types (aliases). Every field the auditor stores
// comes back equal, so a field renamed on one side fails here.
func TestConsoleDecodesWhatTheAuditorEncodes(t *testing.T) {
	ctx := context.Background()
	ddb, prefix := migrationstest.DynamoTables(t, "dlqapi", dynamo.TableDLQRecords, dynamo.TableAuditLog)
	store := auditor.NewStore(ddb, prefix)
	now := time.Now().UTC().Truncate(time.Millisecond)
	rec := auditor.Record{
		ID: auditor.RecordID("floodgate.decisions.v1.dlq", 2, 77), DLQTopic: "floodgate.decisions.v1.dlq", DLQPartition: 2, DLQOffset: 77,
		DeadLetteredAt: now.Add(-time.Minute), SourceTopic: "floodgate.decisions.v1", SourcePartition: 1, SourceOffset: 41,
		SourceTime: now.Add(-2 * time.Minute), ConsumerGroup: "floodgate-quota", Service: "quota", Class: "transient_exhausted",
		ErrorMessage: "update ledger: throttled", Attempts: 8, FirstFailure: now.Add(-90 * time.Second),
		Key: []byte("bot:abc"), Value: []byte(`{"type":"decision.v1","id":"ev_1"}`),
		Headers:   []auditor.Header{{Key: "ce_type", Value: "decision.v1"}},
		Redaction: "decision", EventType: "decision.v1", EventID: "ev_1", StoredAt: now, ExpiresAt: now.Add(24 * time.Hour),
	}
	_, err := store.Put(ctx, &rec)
	require.NoError(t, err)
	require.NoError(t, store.Audit(ctx, auditor.AuditEntry{ID: "a1", At: now, Actor: "sam", Role: RoleSRE, Action: auditor.ActionReplay,
		Subject: auditor.SubjectOf(rec.ID), Reason: "ledger back", CorrelationID: "corr-1", Details: map[string]string{"replay_id": "r1"}}))
	stored, err := store.Get(ctx, rec.ID)
	require.NoError(t, err)

	token, entry, err := NewToken("console", RoleSRE)
	require.NoError(t, err)
	tokens, _, err := ParseTokens(entry)
	require.NoError(t, err)
	srv := NewServer(Server{Store: store, Tokens: tokens, Now: time.Now,
		Purger: &auditor.Purger{Store: store, Max: 10, Now: time.Now, NewID: func() string { return "p1" }, Metrics: auditor.NewMetrics(prometheus.NewRegistry())}})
	mux := httpapi.NewMux()
	srv.Register(mux)
	hs := httptest.NewServer(httpapi.RequestIDs(mux))
	t.Cleanup(hs.Close)
	console, err := httpapi.NewClient(httpapi.ClientConfig{Name: "dlq-auditor", BaseURL: hs.URL, Token: token})
	require.NoError(t, err)

	var page dlqapi.Page
	q := url.Values{"topic": {rec.SourceTopic}, "from": {now.Add(-time.Hour).Format(time.RFC3339Nano)}, "to": {now.Add(time.Hour).Format(time.RFC3339Nano)}}
	_, err = console.Do(ctx, httpapi.Call{Method: http.MethodGet, Path: "/v1/records?" + q.Encode(), Out: &page})
	require.NoError(t, err)
	require.Equal(t, []dlqapi.Record{stored}, page.Records, "a listed record decodes to what the auditor stored")
	require.Empty(t, page.Cursor)
	q.Set("topic", "floodgate.none.v1")
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, hs.URL+"/v1/records?"+q.Encode(), nil)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+token)
	res, err := hs.Client().Do(req)
	require.NoError(t, err)
	body, err := io.ReadAll(res.Body)
	res.Body.Close()
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, res.StatusCode, string(body))
	require.JSONEq(t, `{"records": []}`, string(body), "no records: an empty list, not null")

	var ins dlqapi.Inspection
	_, err = console.Do(ctx, httpapi.Call{Method: http.MethodGet, Path: "/v1/records/" + url.PathEscape(rec.ID), Out: &ins})
	require.NoError(t, err)
	require.Equal(t, stored, ins.Record)
	require.Equal(t, "bot:abc", ins.KeyText)
	require.JSONEq(t, string(rec.Value), string(ins.Payload))
	require.Len(t, ins.Audit, 1)
	a := ins.Audit[0]
	require.Equal(t, dlqapi.AuditEntry{ID: "a1", At: now, Actor: "sam", Role: RoleSRE, Action: auditor.ActionReplay,
		Subject: auditor.SubjectOf(rec.ID), Reason: "ledger back", CorrelationID: "corr-1", Details: map[string]string{"replay_id": "r1"}}, a)

	var purged dlqapi.PurgeResult
	_, err = console.Do(ctx, httpapi.Call{Method: http.MethodPost, Path: "/v1/purges",
		Body: dlqapi.PurgeBody{IDs: []string{rec.ID, auditor.RecordID("floodgate.decisions.v1.dlq", 2, 78)}, Reason: "contract test"}, Out: &purged})
	require.NoError(t, err)
	require.Equal(t, dlqapi.PurgeResult{Purged: 1, Items: []dlqapi.PurgeItem{{ID: rec.ID, Status: "purged"},
		{ID: auditor.RecordID("floodgate.decisions.v1.dlq", 2, 78), Status: auditor.StatusNotFound}}}, purged)

	_, err = console.Do(ctx, httpapi.Call{Method: http.MethodGet, Path: "/v1/records/" + url.PathEscape(rec.ID), Out: &ins})
	var pe *httpapi.Error
	require.ErrorAs(t, err, &pe, "a refusal decodes as a problem")
	require.Equal(t, http.StatusNotFound, pe.Status)
	require.Equal(t, "not-found", pe.Code())
}
