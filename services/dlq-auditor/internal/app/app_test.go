package app

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	influxdb2 "github.com/influxdata/influxdb-client-go/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/require"

	"github.com/floodgate-dev/floodgate/migrations"
	"github.com/floodgate-dev/floodgate/migrations/migrationstest"
	"github.com/floodgate-dev/floodgate/pkg/config"
	"github.com/floodgate-dev/floodgate/pkg/dlqapi"
	"github.com/floodgate-dev/floodgate/pkg/dynamo"
	"github.com/floodgate-dev/floodgate/pkg/events"
	"github.com/floodgate-dev/floodgate/pkg/httpapi"
	"github.com/floodgate-dev/floodgate/pkg/httpapi/openapitest"
	svc "github.com/floodgate-dev/floodgate/pkg/service"
	"github.com/floodgate-dev/floodgate/pkg/stacktest"
	"github.com/floodgate-dev/floodgate/pkg/stream"
	"github.com/floodgate-dev/floodgate/schemas/openapi"
	"github.com/floodgate-dev/floodgate/services/dlq-auditor/internal/api"
	"github.com/floodgate-dev/floodgate/services/dlq-auditor/internal/auditor"
)

// stack is one test's infrastructure: a fresh broker whose topics come from
// the migrations, DynamoDB Local tables under a unique prefix, InfluxDB.
type stack struct {
	broker    string
	prefix    string
	ddb       *dynamodb.Client
	influxURL string
	endpoint  string // DynamoDB's
}

func newStack(t *testing.T) *stack {
	t.Helper()
	local := stacktest.Local()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	s := &stack{
		prefix:    fmt.Sprintf("dlqt%d_", time.Now().UnixNano()),
		influxURL: local.InfluxURL,
		endpoint:  local.DynamoEndpoint,
	}
	var err error
	s.ddb, err = dynamo.NewClient(ctx, dynamo.Options{Endpoint: s.endpoint})
	require.NoError(t, err)
	t.Cleanup(func() { stacktest.DropTables(t, s.ddb, s.prefix) })
	s.broker = migrationstest.Broker(t, ctx, migrations.Runner{
		Dynamo: &migrations.Dynamo{Client: s.ddb, Prefix: s.prefix}, Influx: &migrations.Influx{URL: s.influxURL}})
	return s
}

func testLogger(t *testing.T) *slog.Logger {
	if testing.Verbose() {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

// countingSink is a consumer whose effect is counting event ids, idempotently
// by id, like the quota ledger: it stands in for any idempotent consumer.
type countingSink struct {
	mu      sync.Mutex
	counts  map[string]int // effects applied per id: must never exceed 1
	seen    map[string]int // deliveries per id
	broken  map[string]bool
	healthy bool
}

func (s *countingSink) handle(_ context.Context, msg kafka.Message) error {
	d, err := events.DecodeDecision(msg.Value)
	if err != nil {
		return stream.Permanent(err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.seen[d.ID]++
	if s.broken[d.ID] && !s.healthy {
		return stream.Permanent(fmt.Errorf("ledger rejects %s", d.ID))
	}
	if s.counts[d.ID] == 0 {
		s.counts[d.ID] = 1
	}
	return nil
}

func (s *countingSink) snapshot() (counts, seen map[string]int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	counts, seen = map[string]int{}, map[string]int{}
	for k, v := range s.counts {
		counts[k] = v
	}
	for k, v := range s.seen {
		seen[k] = v
	}
	return counts, seen
}

func fastTimings(c *stream.ConsumerConfig) {
	c.InitialBackoff, c.MaxBackoff = 5*time.Millisecond, 50*time.Millisecond
	c.CommitInterval, c.DrainTimeout = 50*time.Millisecond, 2*time.Second
	c.HeartbeatInterval, c.SessionTimeout, c.RebalanceTimeout = 100*time.Millisecond, time.Second, time.Second
	c.JoinGroupBackoff, c.MaxWait = 100*time.Millisecond, 100*time.Millisecond
}

func eventually(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestDeadLettersAreAuditedReplayedAndAccountedFor runs the whole auditor
// against the real stack: a consumer dead-letters through pkg/stream, the
// auditor stores, counts and pages, the API enforces tokens and roles, a
// replay (through the CLI) is counted once by an idempotent consumer, a
// poison canary stops its replay, a purge is audited, and the completeness
// check accounts for every event.
func TestDeadLettersAreAuditedReplayedAndAccountedFor(t *testing.T) {
	ctx := stacktest.Context(t, 4*time.Minute, "needs the local stack; run `make test`")
	st := newStack(t)
	run := time.Now().UnixNano()
	group := fmt.Sprintf("ledger-test-%d", run)
	service := fmt.Sprintf("ledger-%d", run)
	topic := config.DefaultDecisionsTopic
	start := time.Now().Add(-time.Second)

	// A consumer of the decisions topic that rejects some events for now.
	sink := &countingSink{counts: map[string]int{}, seen: map[string]int{}, broken: map[string]bool{}}
	const total = 20
	var ids, brokenIDs []string
	var msgs []kafka.Message
	for i := range total {
		id := fmt.Sprintf("ev_%d_%02d", run, i)
		ids = append(ids, id)
		if i%5 == 0 {
			sink.broken[id] = true
			brokenIDs = append(brokenIDs, id)
		}
		d := events.Decision{
			ID: id, TS: time.Now().UTC(), Principal: events.Principal{Kind: events.PrincipalUser, ID: fmt.Sprintf("u%d", i%7)},
			IP: netip.MustParseAddr(fmt.Sprintf("203.0.113.%d", 10+i)), Method: "POST", Route: "/channels/{channel_id}/messages",
			Allowed: true, Tier: events.TierPrincipal, Cost: 1, Limit: 50, Remaining: 10, Gateway: "test",
		}
		v, err := events.EncodeDecision(&d)
		require.NoError(t, err)
		hs := stream.CloudEventHeaders(events.CETypeDecision, d.ID, "/test", d.TS)
		msgs = append(msgs, kafka.Message{Topic: topic, Key: []byte(d.Key()), Value: v, Headers: hs})
	}
	poison := kafka.Message{Topic: topic, Key: []byte("user:u1"), Value: []byte(`{"type":"decision.v1","id":"p1","ip":"198.51.100.99"}`)}
	msgs = append(msgs, poison)
	producer := stream.NewProducer(stream.ProducerConfig{Brokers: []string{st.broker}})
	defer producer.Close()
	require.NoError(t, producer.Publish(ctx, msgs...))

	cc := stream.ConsumerConfig{Brokers: []string{st.broker}, Topic: topic, GroupID: group, Service: service,
		Logger: testLogger(t), Registerer: prometheus.NewRegistry()}
	fastTimings(&cc)
	consumer, err := stream.NewConsumer(cc, sink.handle)
	require.NoError(t, err)
	consumerCtx, stopConsumer := context.WithCancel(ctx)
	consumerDone := make(chan error, 1)
	go func() { consumerDone <- consumer.Run(consumerCtx) }()
	defer func() { stopConsumer(); <-consumerDone }()

	// The auditor, with tokens for a viewer and an SRE.
	viewerToken, viewerLine, err := api.NewToken("vera", api.RoleViewer)
	require.NoError(t, err)
	sreToken, sreLine, err := api.NewToken("sam", api.RoleSRE)
	require.NoError(t, err)
	tokensFile := filepath.Join(t.TempDir(), "tokens")
	require.NoError(t, os.WriteFile(tokensFile, []byte("# test tokens\n"+viewerLine+"\n"+sreLine+"\n"), 0o600))
	pages := stacktest.PagerDutyFor(t)
	env := map[string]string{
		"FLOODGATE_DLQ_ADDR": "127.0.0.1:0", "FLOODGATE_KAFKA_BROKERS": st.broker,
		"FLOODGATE_DLQ_GROUP": "auditor-" + group, "FLOODGATE_DLQ_DISCOVER_INTERVAL": "1s",
		"FLOODGATE_DYNAMODB_ENDPOINT": st.endpoint, "FLOODGATE_DYNAMODB_TABLE_PREFIX": st.prefix,
		"FLOODGATE_INFLUX_URL": st.influxURL, "FLOODGATE_PAGERDUTY_ROUTING_KEY": "rk-test", "FLOODGATE_PAGERDUTY_URL": pages.URL,
		"FLOODGATE_DLQ_ALERT_THRESHOLD": "3", "FLOODGATE_DLQ_ALERT_WINDOW": "1m",
		"FLOODGATE_DLQ_TOKENS_FILE": tokensFile, "FLOODGATE_DLQ_REPLAY_RATE": "200", "FLOODGATE_DLQ_CANARY_TIMEOUT": "20s",
	}
	getenv := stacktest.Getenv(env)
	addrCh := make(chan string, 1)
	auditorCtx, stopAuditor := context.WithCancel(ctx)
	auditorDone := make(chan error, 1)
	go func() {
		auditorDone <- Serve(auditorCtx, svc.NewEnv("dlq-auditor", svc.Stdio{Getenv: getenv}, testLogger(t)), &Hooks{
			Listening: func(a string) { addrCh <- a }, Consumer: fastTimings, AlertInterval: 100 * time.Millisecond,
		})
	}()
	stopped := false
	stopAuditorNow := func() {
		if !stopped {
			stopped = true
			stopAuditor()
			require.NoError(t, <-auditorDone)
		}
	}
	defer stopAuditorNow()
	// Every call below, the CLI's included, goes through a proxy that holds
	// the answers to schemas/openapi/dlq-auditor.yaml.
	doc, err := openapi.JSON(openapi.DLQAuditor)
	require.NoError(t, err)
	oas := openapitest.Load(t, doc)
	var base, direct string
	select {
	case a := <-addrCh:
		direct, base = "http://"+a, oas.Proxy(t, "http://"+a)
	case err := <-auditorDone:
		t.Fatalf("auditor did not start: %v", err)
	}
	env["FLOODGATE_DLQ_URL"] = base

	call := func(method, path, token string, body any, out any) (int, http.Header) {
		var rd io.Reader
		if body != nil {
			raw, _ := json.Marshal(body)
			rd = bytes.NewReader(raw)
		}
		req, err := http.NewRequestWithContext(ctx, method, base+path, rd)
		require.NoError(t, err)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		if out != nil {
			require.NoError(t, json.NewDecoder(resp.Body).Decode(out))
		}
		return resp.StatusCode, resp.Header
	}
	listPath := "/v1/records?topic=" + topic + "&limit=1000&from=" + start.UTC().Format(time.RFC3339)
	list := func() []auditor.Record {
		var page auditor.Page
		code, _ := call(http.MethodGet, listPath, viewerToken, nil, &page)
		require.Equal(t, http.StatusOK, code)
		var mine []auditor.Record
		for _, r := range page.Records {
			if r.Service == service {
				mine = append(mine, r)
			}
		}
		return mine
	}
	wantDead := len(brokenIDs) + 1

	t.Run("dead letters are stored, classified and redacted", func(t *testing.T) {
		eventually(t, 60*time.Second, "the dead letters to be stored", func() bool { return len(list()) == wantDead })
		classes := map[string]int{}
		for _, r := range list() {
			classes[r.Class]++
			require.Equal(t, group, r.ConsumerGroup)
			require.NotContains(t, string(r.Value), "203.0.113.1", "stored copies carry no full client IP")
			require.NotContains(t, string(r.Value), "198.51.100.99")
		}
		require.Equal(t, map[string]int{"poison": wantDead}, classes)

		var byService auditor.Page
		code, _ := call(http.MethodGet, "/v1/records?service="+service+"&class=poison&limit=1000&from="+start.UTC().Format(time.RFC3339), viewerToken, nil, &byService)
		require.Equal(t, http.StatusOK, code)
		require.Len(t, byService.Records, wantDead, "listing by service and class")

		r := list()[0]
		var ins api.Inspection
		code, _ = call(http.MethodGet, "/v1/records/"+r.ID, viewerToken, nil, &ins)
		require.Equal(t, http.StatusOK, code)
		require.NotEmpty(t, ins.Payload)
		var payload struct {
			IP string `json:"ip"`
		}
		require.NoError(t, json.Unmarshal(ins.Payload, &payload))
		require.Equal(t, "203.0.113.0", payload.IP, "the stored copy's IP is cut to its /24")
		require.Equal(t, stream.HeaderCEID, ins.Record.Headers[0].Key)
	})

	t.Run("counted in influxdb", func(t *testing.T) {
		client := influxdb2.NewClient(st.influxURL, "")
		defer client.Close()
		q := fmt.Sprintf(`from(bucket: %q) |> range(start: %s) |> filter(fn: (r) => r._measurement == "dlq_records" and r._field == "count" and r.service == %q) |> group() |> sum()`,
			config.DefaultInfluxBucket, start.Add(-time.Minute).UTC().Format(time.RFC3339), service)
		eventually(t, 30*time.Second, "the dead letters in InfluxDB", func() bool {
			res, err := client.QueryAPI("").Query(ctx, q)
			require.NoError(t, err)
			var sum int64
			for res.Next() {
				if v, ok := res.Record().Value().(int64); ok {
					sum = v
				}
			}
			require.NoError(t, res.Err())
			return sum == int64(wantDead)
		})
	})

	t.Run("the dead-letter rate pages", func(t *testing.T) {
		eventually(t, 10*time.Second, "a PagerDuty trigger", func() bool {
			return len(pages.Actions(auditor.DedupKey(topic))) > 0
		})
		require.Equal(t, []string{"trigger"}, pages.Actions(auditor.DedupKey(topic)))
	})

	t.Run("tokens and roles", func(t *testing.T) {
		someID := list()[0].ID
		cases := []struct {
			name, method, path, token string
			body                      any
			want                      int
			code                      string
		}{
			{"no token", http.MethodGet, listPath, "", nil, http.StatusUnauthorized, "unauthenticated"},
			{"unknown token", http.MethodGet, listPath, api.TokenPrefix + "nope", nil, http.StatusUnauthorized, "unauthenticated"},
			{"viewer cannot replay", http.MethodPost, "/v1/replays", viewerToken, api.ReplayBody{IDs: []string{someID}, Reason: "x"}, http.StatusForbidden, "forbidden"},
			{"viewer cannot purge", http.MethodPost, "/v1/purges", viewerToken, api.PurgeBody{IDs: []string{someID}, Reason: "x"}, http.StatusForbidden, "forbidden"},
			{"sre may read", http.MethodGet, "/v1/records/" + someID, sreToken, nil, http.StatusOK, ""},
			{"unknown record", http.MethodGet, "/v1/records/" + topic + ".dlq:0:999999", viewerToken, nil, http.StatusNotFound, "not-found"},
			{"bad id", http.MethodGet, "/v1/records/nope", viewerToken, nil, http.StatusBadRequest, "invalid-request"},
			{"replay needs a reason", http.MethodPost, "/v1/replays", sreToken, api.ReplayBody{IDs: []string{someID}}, http.StatusBadRequest, "invalid-request"},
			{"list needs topic or service", http.MethodGet, "/v1/records", viewerToken, nil, http.StatusBadRequest, "invalid-request"},
		}
		for _, tc := range cases {
			t.Run(tc.name, func(t *testing.T) {
				var eb httpapi.Problem
				var out any = &eb
				if tc.code == "" {
					out = nil
				}
				code, hdr := call(tc.method, tc.path, tc.token, tc.body, out)
				require.Equal(t, tc.want, code)
				require.NotEmpty(t, hdr.Get(httpapi.HeaderRequestID))
				if tc.code != "" { // an RFC 9457 problem
					require.Equal(t, httpapi.ContentTypeProblem, hdr.Get("Content-Type"))
					require.Equal(t, tc.code, eb.Code())
					require.Equal(t, tc.want, eb.Status)
					require.Equal(t, hdr.Get(httpapi.HeaderRequestID), eb.CorrelationID)
					require.NotEmpty(t, eb.Detail)
				}
			})
		}
	})

	completeness := func() auditor.CompletenessReport {
		var rep auditor.CompletenessReport
		path := fmt.Sprintf("/v1/completeness?topic=%s&group=%s&from=%s", topic, group, start.UTC().Format(time.RFC3339Nano))
		code, _ := call(http.MethodGet, path, viewerToken, nil, &rep)
		require.Equal(t, http.StatusOK, code)
		return rep
	}

	t.Run("completeness before the replay", func(t *testing.T) {
		var rep auditor.CompletenessReport
		eventually(t, 20*time.Second, "the group to commit everything", func() bool {
			rep = completeness()
			return rep.Pending == 0
		})
		require.Equal(t, int64(total+1), rep.Produced)
		require.Equal(t, int64(wantDead), rep.DeadLettered)
		require.Equal(t, int64(total-len(brokenIDs)), rep.Processed)
		require.Zero(t, rep.Unaccounted)
		require.True(t, rep.Complete)
	})

	var poisonID string
	var brokenRecordIDs []string
	for _, r := range list() {
		if r.EventID == "" {
			poisonID = r.ID
		} else {
			brokenRecordIDs = append(brokenRecordIDs, r.ID)
		}
	}
	require.NotEmpty(t, poisonID)
	require.Len(t, brokenRecordIDs, len(brokenIDs))

	t.Run("a replay through the CLI is counted once", func(t *testing.T) {
		sink.mu.Lock()
		sink.healthy = true // the ledger is fixed
		sink.mu.Unlock()
		var out bytes.Buffer
		env["FLOODGATE_DLQ_TOKEN"] = sreToken
		args := append([]string{"replay", "-reason", "ledger fixed", "-canary", "1"}, brokenRecordIDs...)
		require.NoError(t, Run(ctx, cliEnv(t, getenv, &out, args)), out.String())
		var res dlqapi.ReplayResult
		require.NoError(t, json.Unmarshal(out.Bytes(), &res))
		require.False(t, res.Aborted, res.AbortReason)
		require.Equal(t, len(brokenIDs), res.Published)
		require.True(t, res.Items[0].Canary)

		// Replay the same records again: the consumer sees them twice, counts once.
		out.Reset()
		require.NoError(t, Run(ctx, cliEnv(t, getenv, &out, append([]string{"replay", "-reason", "again, to prove idempotence"}, brokenRecordIDs...))))
		eventually(t, 20*time.Second, "the second replay to be consumed", func() bool {
			_, seen := sink.snapshot()
			for _, id := range brokenIDs {
				if seen[id] < 3 {
					return false
				}
			}
			return true
		})
		counts, _ := sink.snapshot()
		for _, id := range ids {
			require.Equal(t, 1, counts[id], "event %s counted exactly once", id)
		}

		// The replayed copies are the originals byte for byte, plus replay headers.
		var ins api.Inspection
		code, _ := call(http.MethodGet, "/v1/records/"+brokenRecordIDs[0], viewerToken, nil, &ins)
		require.Equal(t, http.StatusOK, code)
		require.Equal(t, 2, ins.Record.Replays)
		require.Len(t, ins.Audit, 2)
		require.Equal(t, "sam", ins.Audit[0].Actor)
		require.Equal(t, auditor.ActionReplay, ins.Audit[0].Action)
		orig := originalOf(t, st.broker, ins.Record)
		replayed := readAt(t, st.broker, topic, res.Items[0].SourcePartition, res.Items[0].NewOffset)
		require.Equal(t, orig.Key, replayed.Key)
		require.Equal(t, orig.Value, replayed.Value)
		require.Equal(t, res.ReplayID, header(replayed, auditor.HeaderReplayID))
		require.Equal(t, brokenRecordIDs[0], header(replayed, auditor.HeaderReplayOf))
		require.Equal(t, header(orig, stream.HeaderCEID), header(replayed, stream.HeaderCEID))
		// The API call that caused the copy: the replay's correlation id.
		corrs := []string{ins.Audit[0].CorrelationID, ins.Audit[1].CorrelationID}
		require.True(t, httpapi.ValidRequestID(header(replayed, httpapi.KafkaHeaderRequestID)), "x-request-id set")
		require.Contains(t, corrs, header(replayed, httpapi.KafkaHeaderRequestID))
		require.NotEqual(t, corrs[0], corrs[1], "each replay call its own id")
	})

	t.Run("a poison canary stops its replay", func(t *testing.T) {
		var out bytes.Buffer
		err := Run(ctx, cliEnv(t, getenv, &out, []string{"replay", "-reason", "try the poison", poisonID, brokenRecordIDs[0]}))
		require.ErrorContains(t, err, "aborted")
		var res dlqapi.ReplayResult
		require.NoError(t, json.Unmarshal(out.Bytes(), &res))
		require.True(t, res.Aborted)
		require.Contains(t, res.AbortReason, "dead-lettered again")
		require.Equal(t, 1, res.Published, "only the canary went out")
		require.Equal(t, auditor.StatusNotAttempted, res.Items[1].Status)
	})

	t.Run("purge is audited", func(t *testing.T) {
		env["FLOODGATE_DLQ_TOKEN"] = viewerToken
		var out bytes.Buffer
		err := Run(ctx, cliEnv(t, getenv, &out, []string{"purge", "-reason", "x", poisonID}))
		var apiErr *APIError
		require.ErrorAs(t, err, &apiErr)
		require.Equal(t, "forbidden", apiErr.Code())

		env["FLOODGATE_DLQ_TOKEN"] = sreToken
		out.Reset()
		require.NoError(t, Run(ctx, cliEnv(t, getenv, &out, []string{"purge", "-reason", "known bad test event", poisonID})))
		var res dlqapi.PurgeResult
		require.NoError(t, json.Unmarshal(out.Bytes(), &res))
		require.Equal(t, 1, res.Purged)
		code, _ := call(http.MethodGet, "/v1/records/"+poisonID, viewerToken, nil, nil)
		require.Equal(t, http.StatusNotFound, code)
		entries, err := auditor.NewStore(st.ddb, st.prefix).AuditOf(ctx, auditor.SubjectOf(poisonID))
		require.NoError(t, err)
		var purge *auditor.AuditEntry
		for i := range entries {
			if entries[i].Action == auditor.ActionPurge {
				purge = &entries[i]
			}
		}
		require.NotNil(t, purge)
		require.Equal(t, "sam", purge.Actor)
		require.Equal(t, api.RoleSRE, purge.Role)
		require.Equal(t, "known bad test event", purge.Reason)
	})

	t.Run("completeness after replays and a purge", func(t *testing.T) {
		var rep auditor.CompletenessReport
		eventually(t, 20*time.Second, "the group to commit the replays and the auditor to store their dead letters", func() bool {
			rep = completeness()
			unaudited := int64(0) // on the DLQ topic, not yet read back by the auditor (it consumes it apart)
			for _, p := range rep.Partitions {
				unaudited += p.Unaudited
			}
			return rep.Pending == 0 && unaudited == 0
		})
		// 21 originals + 2×4 replays + the poison canary, and its second dead letter.
		require.Equal(t, int64(total+1+2*len(brokenIDs)+1), rep.Produced)
		require.Equal(t, int64(wantDead+1), rep.DeadLettered)
		require.GreaterOrEqual(t, rep.Purged, int64(1))
		require.Zero(t, rep.Unaccounted, "%+v", rep)
	})

	t.Run("the API is its OpenAPI document", func(t *testing.T) {
		mux := httpapi.NewMux()
		api.NewServer(api.Server{}).Register(mux)
		oas.CheckRoutes(t, svc.NewRunnerWith(svc.Env{}, svc.RunnerConfig{}).Mount(svc.API{Handler: mux, Health: true, OpenAPI: doc}).Routes())
		for _, p := range []string{"/healthz", "/readyz", "/metrics", httpapi.OpenAPIPath} {
			code, _ := call(http.MethodGet, p, "", nil, nil)
			require.Equal(t, http.StatusOK, code, p)
		}
		openapitest.CheckUnmatched(t, direct, "/v1/records") // straight to the auditor: the proxy knows only the document's paths
		code, _ := call(http.MethodGet, "/v1/completeness?topic="+topic+"&group="+group+"&from=yesterday", viewerToken, nil, nil)
		require.Equal(t, http.StatusBadRequest, code)
		oas.CheckCovered(t)
	})

	t.Run("a dead letter the auditor missed is unaccounted for", func(t *testing.T) {
		stopAuditorNow()
		sink.mu.Lock()
		sink.healthy = false
		sink.mu.Unlock()
		require.NoError(t, producer.Publish(ctx, msgs[0])) // a broken id: dead-lettered again
		checker := &auditor.Checker{Store: auditor.NewStore(st.ddb, st.prefix), Kafka: &kafka.Client{Addr: kafka.TCP(st.broker)}}
		var rep auditor.CompletenessReport
		eventually(t, 20*time.Second, "the new dead letter", func() bool {
			var err error
			rep, err = checker.Check(ctx, topic, group, start, time.Now())
			require.NoError(t, err)
			return rep.Pending == 0 && rep.Unaccounted > 0
		})
		require.Equal(t, int64(1), rep.Unaccounted)
		require.False(t, rep.Complete)
	})
}

func header(m kafka.Message, key string) string {
	for _, h := range m.Headers {
		if h.Key == key {
			return string(h.Value)
		}
	}
	return ""
}

func readAt(t *testing.T, broker, topic string, partition int, offset int64) kafka.Message {
	t.Helper()
	r := kafka.NewReader(kafka.ReaderConfig{Brokers: []string{broker}, Topic: topic, Partition: partition, MaxWait: 100 * time.Millisecond})
	defer r.Close()
	require.NoError(t, r.SetOffset(offset))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	m, err := r.FetchMessage(ctx)
	require.NoError(t, err)
	require.Equal(t, offset, m.Offset)
	return m
}

// originalOf reads the record's original message from the source topic.
func originalOf(t *testing.T, broker string, r auditor.Record) kafka.Message {
	t.Helper()
	m := readAt(t, broker, r.SourceTopic, r.SourcePartition, r.SourceOffset)
	_, err := stream.ParseDLQRecord(m)
	require.True(t, errors.Is(err, stream.ErrNotDLQRecord), "the source message has no dlq headers")
	return m
}

// cliEnv is the Env of one command-line call.
func cliEnv(t *testing.T, getenv func(string) string, out io.Writer, args []string) svc.Env {
	return svc.NewEnv("dlq-auditor", svc.Stdio{Args: args, Getenv: getenv, Stdout: out}, testLogger(t))
}
