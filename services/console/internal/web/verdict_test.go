package web

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/floodgate-dev/floodgate/pkg/config"
	"github.com/floodgate-dev/floodgate/pkg/events"
	"github.com/floodgate-dev/floodgate/pkg/kafkatest"
	"github.com/floodgate-dev/floodgate/pkg/limiter"
	"github.com/floodgate-dev/floodgate/pkg/precision"
	"github.com/floodgate-dev/floodgate/pkg/redisx/redistest"
	"github.com/floodgate-dev/floodgate/pkg/stacktest"
	"github.com/floodgate-dev/floodgate/pkg/stream"
	"github.com/floodgate-dev/floodgate/services/console/internal/consoletest"
	"github.com/floodgate-dev/floodgate/services/console/internal/store"
)

// memVerdicts keeps what the console published (failing while fail is set).
type memVerdicts struct {
	mu   sync.Mutex
	got  []events.Verdict
	fail error
}

func (m *memVerdicts) Publish(_ context.Context, v *events.Verdict) error {
	if err := v.Validate(); err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.fail != nil {
		return m.fail
	}
	m.got = append(m.got, *v)
	return nil
}

func (m *memVerdicts) all() []events.Verdict {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]events.Verdict(nil), m.got...)
}

func newVerdictEnv(t *testing.T) (*testEnv, *memVerdicts) {
	t.Helper()
	pub := &memVerdicts{}
	e := newEnvWith(t, func(cfg *Config, _ string) { cfg.Verdicts = pub })
	return e, pub
}

// postVerdict posts a verdict as JSON with the role's API token.
func (e *testEnv) postVerdict(t *testing.T, role string, body map[string]string) (int, map[string]any) {
	t.Helper()
	b, err := json.Marshal(body)
	require.NoError(t, err)
	req, err := http.NewRequest(http.MethodPost, e.srv.URL+"/api/v1/verdicts", bytes.NewReader(b))
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+e.tokens[role])
	req.Header.Set("Content-Type", "application/json")
	res, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer res.Body.Close()
	raw, err := io.ReadAll(res.Body)
	require.NoError(t, err)
	var out map[string]any
	require.NoError(t, json.Unmarshal(raw, &out), string(raw))
	return res.StatusCode, out
}

// testEngine is the real limiter engine on the test's Redis, reading the
// penalties the detector writes and the console lifts.
func testEngine(t *testing.T, e *testEnv) *limiter.Engine {
	t.Helper()
	rs, err := limiter.ParseRules("test.yaml", []byte("version: 1\nrules:\n  - {id: p, tier: principal, limit: 50, period: 1h}\n"))
	require.NoError(t, err)
	rt := limiter.NewRuntime(e.rdb, slog.New(slog.DiscardHandler), prometheus.NewRegistry())
	rt.ScalesKey, rt.OverridesKey = redistest.Unique(t, "fg:test:scales"), redistest.Unique(t, "fg:test:overrides")
	rt.ShedKey = redistest.Unique(t, "fg:test:shed")
	eng, err := limiter.NewEngine(limiter.EngineConfig{Redis: e.rdb, Rules: limiter.NewRuleStore(rs), Runtime: rt, Budget: 2 * time.Second})
	require.NoError(t, err)
	return eng
}

func checkAs(t *testing.T, eng *limiter.Engine, a store.Alert) limiter.Result {
	t.Helper()
	kind, id := a.PrincipalParts()
	r, err := eng.Check(context.Background(), limiter.Request{Principal: events.Principal{Kind: events.PrincipalKind(kind), ID: id}, Method: "GET", Route: "/x", Cost: 1})
	require.NoError(t, err)
	return r
}

// TestVerdictFalsePositiveLiftsThePenaltyInTheLimiter: a false-positive
// verdict through the API lifts the penalty before it answers, so the real
// limiter engine's very next check has the full limit; the verdict is on
// the record, the principal allowlisted, the change audited and verdict.v1
// published.
func TestVerdictFalsePositiveLiftsThePenaltyInTheLimiter(t *testing.T) {
	stacktest.Needs(t, "needs Redis, DynamoDB Local and a broker")
	e, pub := newVerdictEnv(t)
	a := e.seed(t, "fp", time.Now().Add(-time.Minute), events.PatternRapidFire, events.SeverityHigh, true)
	eng := testEngine(t, e)
	r := checkAs(t, eng, a)
	require.Equal(t, 5, r.Limit, "the penalty (×0.1) applies before the verdict")

	start := time.Now()
	code, body := e.postVerdict(t, "analyst", map[string]string{"principal": a.Principal, "key": a.SK,
		"verdict": "false_positive", "reason": "a carrier NAT's reconnect storm", "allowlist_for": "7d"})
	require.Equal(t, http.StatusOK, code, body)
	r = checkAs(t, eng, a)
	lifted := time.Since(start)
	require.Equal(t, 50, r.Limit, "the limiter's first check after the answer has no penalty")
	require.InDelta(t, 1, r.Penalty, 1e-9, "multiplier 1: no penalty")
	t.Logf("verdict posted to penalty gone in the limiter: %s (one request + one check; not asserted)", lifted)
	require.Equal(t, true, body["penalty_lifted"])
	require.False(t, e.penaltyExists(t, a))

	got, err := e.st.Get(context.Background(), a.Principal, a.SK)
	require.NoError(t, err)
	require.Equal(t, events.VerdictFalsePositive, got.Verdict.Value)
	require.Equal(t, "analyst-bot", got.Verdict.Reviewer)
	require.Equal(t, "a carrier NAT's reconnect storm", got.Verdict.Reason)
	require.Equal(t, "/channels/{channel_id}/messages", got.Verdict.Route)
	require.Equal(t, precision.NetworkIPv4, got.Verdict.Network)
	require.Equal(t, store.StatusFalsePositive, got.Status)
	allow, ok, err := e.st.GetAllow(context.Background(), a.Principal)
	require.NoError(t, err)
	require.True(t, ok, "the principal is allowlisted")
	require.InDelta(t, time.Now().Add(7*24*time.Hour).Unix(), allow.ExpiresAt, 60)
	audit, err := e.st.AuditLog(context.Background(), a.Principal, 5)
	require.NoError(t, err)
	require.NotEmpty(t, audit)
	require.Equal(t, store.ActionVerdict, audit[0].Action)
	require.Equal(t, "analyst", audit[0].Role)
	require.Contains(t, audit[0].After, `"penalty_lifted":true`)
	require.Contains(t, audit[0].Before, `"m":"0.1"`, "the lifted penalty is in the audit row")

	evs := pub.all()
	require.Len(t, evs, 1)
	require.Equal(t, a.ID, evs[0].AbuseID)
	require.Equal(t, events.VerdictFalsePositive, evs[0].Verdict)
	require.True(t, evs[0].PenaltyLifted)
	require.Equal(t, got.Verdict.ID, evs[0].ID)
	require.Equal(t, "detector-test-1", evs[0].DetectorVersion)
	require.False(t, evs[0].AllowlistedUntil.IsZero())

	// A later verdict replaces it; only a false positive lifts or allowlists.
	code, body = e.postVerdict(t, "analyst", map[string]string{"principal": a.Principal, "key": a.SK, "verdict": "confirmed", "reason": "second look: a scraper"})
	require.Equal(t, http.StatusOK, code, body)
	got, err = e.st.Get(context.Background(), a.Principal, a.SK)
	require.NoError(t, err)
	require.Equal(t, events.VerdictConfirmed, got.Verdict.Value)
	require.NotEqual(t, store.StatusFalsePositive, got.Status)
	require.False(t, got.Verdict.PenaltyLifted, "what the false positive set is gone")
	require.True(t, got.Verdict.AllowUntil.IsZero())
	require.Len(t, pub.all(), 2)
}

// TestVerdictRefusals: roles, bad input and missing alerts are refused as
// problems, and nothing is stored or published.
func TestVerdictRefusals(t *testing.T) {
	stacktest.Needs(t, "needs Redis, DynamoDB Local and a broker")
	e, pub := newVerdictEnv(t)
	a := e.seed(t, "refuse", time.Now().Add(-time.Minute), events.PatternRapidFire, events.SeverityHigh, true)
	ok := map[string]string{"principal": a.Principal, "key": a.SK, "verdict": "false_positive", "reason": "r", "allowlist_for": "1d"}
	with := func(k, v string) map[string]string {
		m := maps.Clone(ok)
		m[k] = v
		return m
	}
	tests := []struct {
		name string
		role string
		body map[string]string
		code int
		want string
	}{
		{"a viewer may not judge", "viewer", ok, http.StatusForbidden, "analyst"},
		{"unknown verdict", "analyst", with("verdict", "maybe"), http.StatusUnprocessableEntity, "confirmed|false_positive|unsure"},
		{"no reason", "analyst", with("reason", " "), http.StatusUnprocessableEntity, "reason"},
		{"false positive without a duration", "analyst", with("allowlist_for", ""), http.StatusUnprocessableEntity, "allowlist"},
		{"bad duration", "analyst", with("allowlist_for", "forever"), http.StatusUnprocessableEntity, "duration"},
		{"too long an allowlist", "analyst", with("allowlist_for", "400d"), http.StatusUnprocessableEntity, "days"},
		{"no such alert", "analyst", with("key", "2020-01-01T00:00:00.000Z#nope"), http.StatusNotFound, "no such alert"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, body := e.postVerdict(t, tt.role, tt.body)
			require.Equal(t, tt.code, code, body)
			require.Contains(t, body["detail"], tt.want)
			require.NotEmpty(t, body["correlation_id"], "a problem carries the correlation id")
		})
	}
	require.True(t, e.penaltyExists(t, a), "nothing refused lifted the penalty")
	got, err := e.st.Get(context.Background(), a.Principal, a.SK)
	require.NoError(t, err)
	require.Empty(t, got.Verdict.Value)
	require.Empty(t, pub.all())

	// A verdict whose event cannot be published says so (the verdict itself is stored).
	pub.fail = io.ErrClosedPipe
	code, body := e.postVerdict(t, "analyst", with("verdict", "unsure"))
	require.Equal(t, http.StatusServiceUnavailable, code, body)
	require.Contains(t, body["detail"], "could not be published")
}

// TestVerdictFromTheAlertPage: the alert page's form records a verdict for
// a signed-in analyst (CSRF-checked) and shows it; a viewer has no form.
func TestVerdictFromTheAlertPage(t *testing.T) {
	stacktest.Needs(t, "needs Redis, DynamoDB Local and a broker")
	e, pub := newVerdictEnv(t)
	a := e.seed(t, "page", time.Now().Add(-time.Minute), events.PatternRapidFire, events.SeverityHigh, true)
	viewer := e.signedIn(t, "viewer1")
	_, page := viewer.get(alertPath(a))
	require.NotContains(t, page, `id="verdict-form"`)
	require.Contains(t, page, "not judged yet")

	b := e.signedIn(t, "analyst1")
	csrf := b.csrf(alertPath(a))
	b.act(t, "/alert/verdict", "bad-csrf", a, http.StatusForbidden, "verdict", "false_positive", "reason", "x", "duration", "1d")
	res, body := b.post("/alert/verdict", actionForm(csrf, a, "verdict", "false_positive", "reason", "known app poller", "duration", "1d"))
	require.Equal(t, http.StatusSeeOther, res.StatusCode, body)
	require.Contains(t, res.Header.Get("Location"), "done=verdict_false_positive")
	_, page = b.get(res.Header.Get("Location"))
	require.Contains(t, page, "Verdict recorded: false positive")
	require.Contains(t, page, "known app poller")
	require.False(t, e.penaltyExists(t, a))
	require.Len(t, pub.all(), 1)
	require.Equal(t, "analyst1", pub.all()[0].Reviewer)
}

// TestKafkaVerdictsPublishes: verdict.v1 reaches the migrations' verdicts
// topic on a real broker, keyed by principal, with CloudEvents headers.
func TestKafkaVerdictsPublishes(t *testing.T) {
	stacktest.Needs(t, "needs Redis, DynamoDB Local and a broker")
	broker := consoletest.Broker(t)
	p := stream.NewProducer(stream.ProducerConfig{Brokers: []string{broker}, Topic: config.DefaultVerdictsTopic})
	t.Cleanup(func() { _ = p.Close() })
	k := &KafkaVerdicts{Producer: p, Source: "floodgate/console"}
	at := time.Now().UTC().Truncate(time.Millisecond)
	v := events.Verdict{ID: "v-1", TS: at, AbuseID: "ab-1", DetectedAt: at.Add(-time.Hour), Principal: events.Principal{Kind: events.PrincipalUser, ID: "u1"},
		Pattern: events.PatternRapidFire, Verdict: events.VerdictConfirmed, Reason: "seen", Reviewer: "alice"}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	require.NoError(t, k.Publish(ctx, &v))
	bad := v
	bad.Reason = ""
	require.ErrorIs(t, k.Publish(ctx, &bad), events.ErrInvalid, "an invalid verdict is never published")

	parts := kafkatest.Partitions(t, broker)[config.DefaultVerdictsTopic]
	require.Equal(t, 3, parts)
	var found bool
	for i, end := range kafkatest.EndOffsets(t, broker, config.DefaultVerdictsTopic, parts) {
		if end == 0 {
			continue
		}
		msgs := kafkatest.ReadPartition(t, broker, config.DefaultVerdictsTopic, i, 1)
		require.Equal(t, "user:u1", string(msgs[0].Key))
		h := kafkatest.Headers(msgs[0].Headers)
		require.Equal(t, events.CETypeVerdict, h["ce_type"])
		got, err := events.DecodeVerdict(msgs[0].Value)
		require.NoError(t, err)
		require.Equal(t, v.ID, got.ID)
		found = true
	}
	require.True(t, found)
}

func TestPrecisionPageRenders(t *testing.T) {
	stacktest.Needs(t, "needs Redis and DynamoDB Local")
	e, _ := newVerdictEnv(t)
	a := e.seed(t, "pp", time.Now().Add(-time.Minute), events.PatternRapidFire, events.SeverityHigh, false)
	code, body := e.postVerdict(t, "analyst", map[string]string{"principal": a.Principal, "key": a.SK, "verdict": "confirmed", "reason": "r"})
	require.Equal(t, http.StatusOK, code, body)
	c := e.signedIn(t, "viewer1")
	code, page := c.get("/precision")
	require.Equal(t, http.StatusOK, code, page)
	require.Contains(t, page, "100.00 %")
}

// TestPrecisionGauges: the refresh sets the gauges the Prometheus rule and
// the Grafana panel read, from the stored verdicts.
func TestPrecisionGauges(t *testing.T) {
	stacktest.Needs(t, "needs Redis and DynamoDB Local")
	e, _ := newVerdictEnv(t)
	e.web.cfg.Precision.Thresholds = precision.Thresholds{Default: 0.9, ByPattern: map[string]float64{"rapid_fire": 0.99}, MinJudged: 2}
	now := time.Now()
	for i, v := range []string{"confirmed", "confirmed", "false_positive", "unsure"} {
		a := e.seed(t, "g"+strconv.Itoa(i), now.Add(-time.Duration(i+1)*time.Minute), events.PatternRapidFire, events.SeverityHigh, false)
		code, body := e.postVerdict(t, "analyst", map[string]string{"principal": a.Principal, "key": a.SK, "verdict": v, "reason": "r", "allowlist_for": "1h"})
		require.Equal(t, http.StatusOK, code, body)
	}
	e.web.refreshPrecision(context.Background())
	m := e.web.precision
	require.InDelta(t, 2.0/3, testutil.ToFloat64(m.pattern.WithLabelValues("rapid_fire")), 1e-9)
	require.Equal(t, 3.0, testutil.ToFloat64(m.judged.WithLabelValues("rapid_fire")))
	require.Equal(t, 0.99, testutil.ToFloat64(m.threshold.WithLabelValues("rapid_fire")))
	require.Equal(t, 2.0, testutil.ToFloat64(m.minJudged))
	g := []string{"rapid_fire", "bot", "/channels/{channel_id}/messages", precision.NetworkIPv4}
	require.InDelta(t, 2.0/3, testutil.ToFloat64(m.group.WithLabelValues(g...)), 1e-9)
	require.Equal(t, 1.0, testutil.ToFloat64(m.verdicts.WithLabelValues(append(g, "unsure")...)))
	v, code := e.web.precisionTable(httptest.NewRequest(http.MethodGet, "/precision", nil))
	require.Equal(t, http.StatusOK, code)
	require.Len(t, v.Breaches, 1, "rapid_fire at 67 % over 3 judged is below 99 %")
}
