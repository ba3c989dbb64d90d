package web

import (
	"context"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"

	"github.com/floodgate-dev/floodgate/pkg/dynamo"
	"github.com/floodgate-dev/floodgate/pkg/events"
	"github.com/floodgate-dev/floodgate/pkg/rollout"
	"github.com/floodgate-dev/floodgate/pkg/rollout/rollouttest"
)

// proposalFixture is a proposal as `detector propose` stores it (the
// detector builds it: services/detector/internal/tuning; services never
// import each other, so the console's test stores one of the same shape):
// the multi-device family of people, rapid_fire on users, built from the
// false-positive verdicts, with the replay figures of the tuning test.
func proposalFixture(id string, now time.Time) dynamo.Proposal {
	return dynamo.Proposal{ID: id, CreatedAt: now, CreatedBy: "detector-propose@test", Pattern: "rapid_fire", Kind: "user", FromVerdicts: 10,
		Changes: []dynamo.ProposalChange{{Param: "person_sustain", From: "1s", To: "5s"}},
		Params:  "overrides:\n    - kind: user\n      person_sustain: 5s\n", SpanFrom: now.Add(-time.Hour), SpanTo: now, Decisions: 896911,
		Evidence: dynamo.Evidence{Confirmed: 200, ConfirmedKept: 200, FalsePositives: 18, FPAvoided: 18, ClassFPs: 18, ClassFPAvoided: 18}, Meets: true}
}

// TestBrowserProposal drives the console in headless Chromium: a reviewer
// marks a detection a false positive on its alert page (the one way to say
// it: the verdict); an SRE opens the proposals page, reads the proposal's
// replay evidence (confirmed detections kept, false positives avoided) and
// applies it. The detector parameters topic then holds the configured
// parameters as version 1 (enforced) and the proposal's document as version
// 2, a candidate in shadow with its steps — what every detector instance
// follows — the rollout is audited, and the proposal shows as applied. An
// analyst cannot apply (sre only), nor apply twice.
func TestBrowserProposal(t *testing.T) {
	bin, shots := browserSetup(t)
	topic, _ := rollouttest.OpenTopic(t)
	pub := &memVerdicts{}
	var audit *rollout.DynamoAudit
	e := newEnvWith(t, func(cfg *Config, prefix string) {
		cfg.Verdicts = pub
		audit = &rollout.DynamoAudit{Table: prefix + dynamo.TableAuditLog, Subject: rollout.ParamsAuditSubject}
		claims := &rollout.DynamoClaims{Table: prefix + dynamo.TableAuditLog}
		cfg.Proposals = &Proposals{Table: prefix + dynamo.TableRuntimeConfig, Audit: audit,
			Operator: &rollout.Operator{Topic: topic, Audit: audit, Claims: claims, Validate: ValidateParams}}
	})
	audit.Client, e.web.cfg.Proposals.DDB = e.ddb, e.ddb
	e.web.cfg.Proposals.Operator.Claims.(*rollout.DynamoClaims).Client = e.ddb
	now := time.Now().UTC().Truncate(time.Millisecond)
	a := e.seed(t, "bp_fp", now.Add(-time.Minute), events.PatternRapidFire, events.SeverityHigh, true)
	id := "bp-" + e.run
	require.NoError(t, dynamo.PutProposal(t.Context(), e.ddb, e.web.cfg.Proposals.Table, proposalFixture(id, now)))

	ctx := startBrowser(t, bin)
	text := func(sel string) string { t.Helper(); return textOf(t, ctx, sel) }
	require.NoError(t, chromedp.Do(ctx,
		fillFalsePositive(e.srv.URL, a, "7d", "TS-81: one person, three devices"),
		chromedp.Click(chromedp.ID("verdict-submit")),
		chromedp.WaitVisible(chromedp.CSS(`p.ok`)),
	))
	require.Contains(t, text("p.ok"), "Verdict recorded: false positive")
	fpForms, err := chromedp.Run(ctx, chromedp.Evaluate[int](`document.querySelectorAll('form[action="/alert/false-positive"]').length`))
	require.NoError(t, err)
	require.Zero(t, fpForms, "the old false-positive button is gone: the verdict is the one way")
	require.Len(t, pub.all(), 1)
	require.Equal(t, events.VerdictFalsePositive, pub.all()[0].Verdict)

	// An analyst sees the proposal but cannot apply it.
	require.NoError(t, chromedp.Do(ctx,
		chromedp.Navigate(e.srv.URL+"/sre/proposals"),
		chromedp.WaitVisible(chromedp.ID("proposals")),
	))
	applyForms, err := chromedp.Run(ctx, chromedp.Evaluate[int](`document.querySelectorAll('form[action="/sre/proposals/apply"]').length`))
	require.NoError(t, err)
	require.Zero(t, applyForms, "no Apply for an analyst")
	res, _ := e.apiPost(t, "analyst", "/api/v1/proposals/apply", url.Values{"id": {id}, "reason": {"x"}})
	require.Equal(t, http.StatusForbidden, res.StatusCode)

	// The SRE applies it.
	row := "#proposal-" + id
	require.NoError(t, chromedp.Do(ctx,
		signIn(e.srv.URL, "sre1"),
		chromedp.Navigate(e.srv.URL+"/sre/proposals"),
		chromedp.WaitVisible(chromedp.ID("apply-"+id)),
	))
	r := text(row)
	require.Contains(t, r, "rapid_fire/user")
	require.Contains(t, r, "10 false-positive verdicts")
	require.Contains(t, r, "person_sustain 1s → 5s")
	require.Contains(t, r, "200 / 200 (100.0 %)", "confirmed detections kept")
	require.Contains(t, r, "18 / 18 (100.0 %)", "the class's false positives avoided")
	require.Contains(t, r, "meets the targets")
	require.NoError(t, chromedp.Do(ctx,
		chromedp.SetValue(chromedp.ID("steps-"+id), "1,10,50,100"),
		chromedp.SendKeys(chromedp.ID("reason-"+id), "TS-81 family: people with several devices"),
		screenshot(shots, "console-proposals"),
		chromedp.Click(chromedp.CSS("#apply-"+id+" button.apply")),
		chromedp.WaitVisible(chromedp.CSS(`p.ok`)),
	))
	require.Contains(t, text("p.ok"), "Proposal applied")
	require.Contains(t, text(row), "applied as version 2 by sre1")
	require.Contains(t, text("#params-candidate"), "Candidate version 2 (shadow)")
	require.Contains(t, text("#params-enforced"), "Version 1")

	cctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	st, err := topic.Read(cctx)
	require.NoError(t, err)
	enf, ok := st.Enforced()
	require.True(t, ok)
	require.EqualValues(t, 1, enf.Version)
	require.Equal(t, "defaults: {}\n", enf.Rules, "the configured parameters, the parent")
	c, ok := st.Candidate()
	require.True(t, ok)
	require.EqualValues(t, 2, c.Version)
	require.EqualValues(t, 1, c.ParentVersion)
	require.Equal(t, proposalFixture(id, now).Params, c.Rules)
	require.Equal(t, "1,10,50,100", c.Steps)
	require.Equal(t, "sre1", c.Author)
	require.Contains(t, c.Reason, "proposal "+id)
	require.Contains(t, c.Whatif, "confirmed kept 200/200")
	rows, err := audit.History(cctx, 10)
	require.NoError(t, err)
	require.NotEmpty(t, rows)
	require.Equal(t, "sre1", rows[0].Actor)
	require.Equal(t, "sre", rows[0].Role)
	require.Equal(t, rollout.ParamsActionPropose, rows[0].Action)

	// Applied once: a second apply is refused.
	req, err := http.NewRequest(http.MethodPost, e.srv.URL+"/api/v1/proposals/apply", strings.NewReader(`{"id":"`+id+`","reason":"again"}`))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+e.tokens["sre"])
	res, err = http.DefaultClient.Do(req)
	require.NoError(t, err)
	res.Body.Close()
	require.Equal(t, http.StatusConflict, res.StatusCode)
}
