package web

import (
	"context"
	"net/http"
	"net/url"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"

	"github.com/floodgate-dev/floodgate/loadtest/labeled"
	"github.com/floodgate-dev/floodgate/migrations/migrationstest"
	"github.com/floodgate-dev/floodgate/pkg/config"
	"github.com/floodgate-dev/floodgate/pkg/dynamo"
	"github.com/floodgate-dev/floodgate/pkg/events"
	"github.com/floodgate-dev/floodgate/pkg/kafkatest"
	"github.com/floodgate-dev/floodgate/pkg/rollout"
	"github.com/floodgate-dev/floodgate/pkg/stacktest"
	"github.com/floodgate-dev/floodgate/services/console/internal/consoletest"
	"github.com/floodgate-dev/floodgate/services/console/internal/store"
)

// TestBrowserAppliesAProposalBuiltFromVerdicts closes the loop with real
// parts only: held-out labeled traffic recorded on the decisions topic; the
// detector (its own binary, mistuned: a 1 s burst counts as sustained for a
// person) detects on it and writes the abuse records; reviewers give every
// detection the verdict its label says — the first false positive in the
// browser on its alert page, the others through the API; `detector
// propose` (the same binary) builds a proposal from those verdicts and the
// recording and stores it; an SRE reads its replay evidence on
// /sre/proposals and applies it, then stops the rollout by hand. The
// parameters topic holds the stored proposal's document as the candidate,
// then as aborted; both steps are audited as params.*.
func TestBrowserAppliesAProposalBuiltFromVerdicts(t *testing.T) {
	bin, shots := browserSetup(t)
	detector := filepath.Join(stacktest.Build(t, "detector"), "detector")
	broker := consoletest.Broker(t)
	topic := rollout.NewTopic([]string{broker}, nil, config.DefaultDetectorParamsTopic, nil)
	t.Cleanup(func() { _ = topic.Close() })
	var audit *rollout.DynamoAudit
	var claims *rollout.DynamoClaims
	e := newEnvWith(t, func(cfg *Config, prefix string) {
		cfg.Verdicts = &memVerdicts{}
		audit = &rollout.DynamoAudit{Table: prefix + dynamo.TableAuditLog, Subject: rollout.ParamsAuditSubject}
		claims = &rollout.DynamoClaims{Table: prefix + dynamo.TableAuditLog}
		cfg.Proposals = &Proposals{Table: prefix + dynamo.TableRuntimeConfig, Audit: audit,
			Operator: &rollout.Operator{Topic: topic, Audit: audit, Claims: claims, Validate: ValidateParams}}
	})
	audit.Client, claims.Client, e.web.cfg.Proposals.DDB = e.ddb, e.ddb, e.ddb
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()

	now := time.Now().UTC()
	labels := recordLabeled(t, ctx, broker, now.Add(-4*time.Minute), e.run+"_")
	env := []string{
		"FLOODGATE_KAFKA_BROKERS=" + broker, "FLOODGATE_DYNAMODB_ENDPOINT=" + migrationstest.DynamoEndpoint(),
		"FLOODGATE_DYNAMODB_TABLE_PREFIX=" + e.prefix, "FLOODGATE_DETECTOR_RECORDS=dynamodb",
		"FLOODGATE_DETECTOR_PERSON_SUSTAIN=1s", // mistuned: the default is 5s
	}
	group := "detector-" + e.run
	addr := consoletest.FreeAddr(t)
	stacktest.Exec(t, detector, append([]string{"FLOODGATE_DETECTOR_ADDR=" + addr, "FLOODGATE_DETECTOR_GROUP=" + group,
		"FLOODGATE_DETECTOR_MODE=simulate", "FLOODGATE_DETECTOR_SHARED_IPS=off", "FLOODGATE_PAGERDUTY_ROUTING_KEY=",
		"FLOODGATE_INFLUX_URL=http://127.0.0.1:1"}, env...))
	consoletest.WaitReady(t, "http://"+addr+"/readyz")
	ends := kafkatest.EndOffsets(t, broker, config.DefaultDecisionsTopic, 12)
	require.Eventually(t, func() bool {
		got := kafkatest.CommittedOffsets(t, broker, group, config.DefaultDecisionsTopic, 12)
		for i := range ends {
			if got[i] < ends[i] {
				return false
			}
		}
		return true
	}, 2*time.Minute, 250*time.Millisecond, "the detector consumes the recording")
	var alerts []store.Alert
	require.Eventually(t, func() bool {
		prev := len(alerts)
		alerts = listAlerts(t, ctx, e.st, now.Add(-10*time.Minute), now.Add(time.Minute))
		return len(alerts) > 0 && len(alerts) == prev
	}, time.Minute, time.Second, "the abuse records are written")

	// The verdicts the labels give.
	var fps, confirmed []store.Alert
	abusive := map[string]bool{}
	for _, a := range alerts {
		l, ok := labels[a.Principal]
		require.True(t, ok, "a detection of a recorded principal: %s", a.Principal)
		if l.Abusive {
			confirmed = append(confirmed, a)
			abusive[a.Principal] = true
		} else {
			fps = append(fps, a)
		}
	}
	t.Logf("%d detections: %d of %d abusive principals, %d false positives", len(alerts), len(confirmed), len(abusive), len(fps))
	require.GreaterOrEqual(t, len(fps), 3, "the mistuned detector penalizes people")

	browser := startBrowser(t, bin)
	text := func(sel string) string { t.Helper(); return textOf(t, browser, sel) }
	require.NoError(t, chromedp.Do(browser,
		signIn(e.srv.URL, "analyst1"),
		chromedp.Navigate(e.srv.URL+alertPath(fps[0])),
		chromedp.WaitVisible(chromedp.ID("verdict-form")),
		chromedp.Click(chromedp.ID("verdict-false-positive")),
		chromedp.SetValue(chromedp.ID("verdict-duration"), "1d"),
		chromedp.SendKeys(chromedp.ID("verdict-reason"), "TS-90: one person, several devices"),
		chromedp.Click(chromedp.ID("verdict-submit")),
		chromedp.WaitVisible(chromedp.CSS(`p.ok`)),
	))
	require.Contains(t, text("p.ok"), "Verdict recorded: false positive")
	judge := func(a store.Alert, verdict string) {
		t.Helper()
		form := url.Values{"p": {a.Principal}, "k": {a.SK}, "verdict": {verdict}, "reason": {"labeled " + labels[a.Principal].Family}}
		if verdict == string(events.VerdictFalsePositive) {
			form.Set("duration", "1d")
		}
		req, err := http.NewRequest(http.MethodPost, e.srv.URL+"/api/v1/verdicts", strings.NewReader(form.Encode()))
		require.NoError(t, err)
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		req.Header.Set("Authorization", "Bearer "+e.tokens["analyst"])
		res, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		res.Body.Close()
		require.Equal(t, http.StatusOK, res.StatusCode, a.Principal)
	}
	for _, a := range fps[1:] {
		judge(a, string(events.VerdictFalsePositive))
	}
	for _, a := range confirmed {
		judge(a, string(events.VerdictConfirmed))
	}

	// `detector propose`, as an SRE runs it.
	cmd := exec.CommandContext(ctx, detector, "propose", "-span", "15m", "-min-fps", "3", "-as", "detector-propose@test")
	cmd.Env = append(append(cmd.Environ(), env...), "FLOODGATE_DETECTOR_PARAMS_TOPIC="+config.DefaultDetectorParamsTopic)
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)
	t.Logf("detector propose:\n%s", out)
	list, err := dynamo.ListProposals(ctx, e.ddb, e.web.cfg.Proposals.Table)
	require.NoError(t, err)
	require.Len(t, list, 1, "one class has false positives")
	p := list[0]
	require.Equal(t, "rapid_fire/user", p.Class())
	require.True(t, p.Meets, "%+v", p.Evidence)
	require.Equal(t, len(abusive), p.Evidence.Confirmed, "every principal judged confirmed is detected on replay")
	require.Equal(t, p.Evidence.Confirmed, p.Evidence.ConfirmedKept)
	require.NotEmpty(t, p.Changes)

	// The SRE applies it, then stops the rollout by hand.
	row := "#proposal-" + p.ID
	require.NoError(t, chromedp.Do(browser,
		signIn(e.srv.URL, "sre1"),
		chromedp.Navigate(e.srv.URL+"/sre/proposals"),
		chromedp.WaitVisible(chromedp.ID("apply-"+p.ID)),
	))
	r := text(row)
	require.Contains(t, r, "rapid_fire/user")
	require.Contains(t, r, p.Changes[0].Param+" "+p.Changes[0].From+" → "+p.Changes[0].To)
	require.Contains(t, r, "meets the targets")
	require.NoError(t, chromedp.Do(browser,
		chromedp.SendKeys(chromedp.ID("reason-"+p.ID), "TS-90 family: people with several devices"),
		chromedp.Click(chromedp.CSS("#apply-"+p.ID+" button.apply")),
		chromedp.WaitVisible(chromedp.CSS(`p.ok`)),
		screenshot(shots, "console-proposal-from-verdicts"),
	))
	require.Contains(t, text("p.ok"), "Proposal applied")
	st, err := topic.Read(ctx)
	require.NoError(t, err)
	c, ok := st.Candidate()
	require.True(t, ok)
	require.Equal(t, p.Params, c.Rules, "the candidate is the document detector propose built")
	require.NoError(t, chromedp.Do(browser,
		chromedp.Navigate(e.srv.URL+"/sre/proposals"),
		chromedp.WaitVisible(chromedp.ID("params-rollback")),
		chromedp.SendKeys(chromedp.ID("params-rollback-reason"), "INC-94: stopping to compare by hand"),
		chromedp.Click(chromedp.CSS("#params-rollback button")),
		chromedp.WaitVisible(chromedp.CSS(`p.ok`)),
	))
	require.Contains(t, text("p.ok"), "Parameters rollout stopped")
	st, err = topic.Read(ctx)
	require.NoError(t, err)
	_, ok = st.Candidate()
	require.False(t, ok, "the candidate is aborted")
	rows, err := audit.History(ctx, 3)
	require.NoError(t, err)
	require.Len(t, rows, 3)
	require.Equal(t, []string{rollout.ParamsActionAbort, rollout.ParamsActionPropose, rollout.ParamsActionBootstrap},
		[]string{rows[0].Action, rows[1].Action, rows[2].Action})
	require.Equal(t, "sre1", rows[0].Actor)
}

// recordLabeled produces three minutes of held-out labeled traffic from
// start onto the decisions topic of broker — keyed by principal and stamped
// with each decision's time, as the limiter's producer does — and returns
// the labels by principal key.
func recordLabeled(t *testing.T, ctx context.Context, broker string, start time.Time, prefix string) map[string]*labeled.Label {
	t.Helper()
	s, err := labeled.NewHeldOut(labeled.HeldOut{Seed: 7, Start: start, Duration: 3 * time.Minute, Legit: 1000, Abusive: 60, Prefix: prefix})
	require.NoError(t, err)
	kafkatest.ProduceDecisions(t, ctx, broker, config.DefaultDecisionsTopic, s.All())
	return s.Labels()
}

// listAlerts lists every alert detected in [since, until), in key order.
func listAlerts(t *testing.T, ctx context.Context, st *store.Store, since, until time.Time) []store.Alert {
	t.Helper()
	var out []store.Alert
	cur := ""
	seen := map[string]bool{}
	for {
		page, next, err := st.List(ctx, store.Filter{Since: since, Until: until, PageSize: 100, Cursor: cur})
		require.NoError(t, err)
		out = append(out, page...)
		if next == "" {
			break
		}
		require.False(t, seen[next], "the alert list repeats a cursor after %d alerts", len(out))
		seen[next] = true
		cur = next
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Principal+out[i].SK < out[j].Principal+out[j].SK })
	return out
}
