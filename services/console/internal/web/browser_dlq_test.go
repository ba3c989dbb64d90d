package web

import (
	"context"
	"net/http"
	"net/url"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"

	"github.com/floodgate-dev/floodgate/services/console/internal/dlq"
	"github.com/floodgate-dev/floodgate/services/console/internal/store"
)

// TestBrowserDeadLetters drives the dead-letter pages in headless Chromium
// against the real dlq-auditor (see startDeadLetters): an SRE opens the page
// from the navigation, reads the summary and a record (redacted payload and
// error), selects the poison record, asks to purge it with a reason, confirms
// on the next page, and the auditor no longer has it; then a viewer finds no
// replay or purge form. Screenshots as in TestBrowser.
func TestBrowserDeadLetters(t *testing.T) {
	bin, shots := browserSetup(t)

	dl := startDeadLetters(t)
	e := dl.env
	ctx := startBrowser(t, bin)
	shot := func(name string) chromedp.Action[chromedp.Void] { return screenshot(shots, name) }
	text := func(sel string) string { t.Helper(); return textOf(t, ctx, sel) }
	count := func(sel string) int {
		t.Helper()
		n, err := chromedp.Run(ctx, chromedp.Evaluate[int](`document.querySelectorAll(`+jsString(sel)+`).length`))
		require.NoError(t, err, "count %s", sel)
		return n
	}
	// html/template escapes the id's colons as %3a, url.QueryEscape as %3A:
	// the attribute is matched case-insensitively.
	recordLink := func(id string) chromedp.CSS {
		return chromedp.CSS(`#dlq-records a[href="/sre/dlq/record?id=` + url.QueryEscape(id) + `" i]`)
	}

	// SRE: sign in → Dead letters (nav) → summary and records.
	require.NoError(t, chromedp.Do(ctx,
		signIn(e.srv.URL, "sre1"),
		chromedp.Click(chromedp.CSS(`nav a[href="/sre/dlq"]`)),
		chromedp.WaitVisible(chromedp.ID("dlq-summary")),
		chromedp.WaitVisible(recordLink(dl.poisonID)),
		shot("console-dlq"),
	))
	summary := text("#dlq-summary")
	require.Contains(t, summary, "transient_exhausted")
	require.Contains(t, summary, "poison")
	total := text("#dlq-summary tfoot")
	require.Contains(t, total, "Total")
	require.Contains(t, total, "2")
	records := text("#dlq-records")
	require.Contains(t, records, dl.goodID)
	require.Contains(t, records, dl.poisonID)
	require.Contains(t, records, "update ledger: throttled")
	require.Contains(t, records, "decode decision: unexpected EOF")

	// The valid decision's record: its error, its payload with the IP truncated.
	require.NoError(t, chromedp.Do(ctx,
		chromedp.Click(recordLink(dl.goodID)),
		chromedp.WaitVisible(chromedp.ID("dlq-record")),
		chromedp.WaitVisible(chromedp.ID("dlq-payload")),
		chromedp.WaitVisible(chromedp.ID("purge-one")),
		shot("console-dlq-record"),
	))
	require.Contains(t, text("main h1"), dl.goodID)
	facts := text("#dlq-record")
	require.Contains(t, facts, "update ledger: throttled")
	require.Contains(t, facts, "transient_exhausted after 8 attempt(s)")
	require.Contains(t, facts, dl.decision.ID)
	payload := text("#dlq-payload")
	require.Contains(t, payload, dl.decision.ID)
	require.Contains(t, payload, "203.0.113.0", "the client IP truncated to its /24")
	require.NotContains(t, payload, "203.0.113.7", "the client IP redacted")
	require.Equal(t, 1, count("#replay-one"), "an SRE may replay")

	// Back to the list: select the poison record, ask to purge it with a reason.
	const reason = "INC-9: poison test traffic"
	require.NoError(t, chromedp.Do(ctx,
		chromedp.Click(chromedp.CSS(`main a[href="/sre/dlq"]`)),
		chromedp.WaitVisible(chromedp.ID("purge-selected")),
		chromedp.Click(chromedp.CSS(`#dlq-records input[name=id][value="`+dl.poisonID+`"]`)),
		chromedp.SendKeys(chromedp.ID("replay-reason"), reason),
		chromedp.Click(chromedp.ID("purge-selected")),
		chromedp.WaitVisible(chromedp.ID("purge-confirm")),
		shot("console-dlq-purge"),
	))
	require.Contains(t, text("main h1"), "Purge 1 dead letter(s)?")
	ids := text("#purge-ids")
	require.Contains(t, ids, dl.poisonID)
	require.NotContains(t, ids, dl.goodID, "only the selected record")
	kept, err := chromedp.Run(ctx, chromedp.Value(chromedp.ID("purge-reason")))
	require.NoError(t, err)
	require.Equal(t, reason, kept, "the reason carried to the confirmation")
	apiCtx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	_, err = dl.direct.Inspect(apiCtx, dl.poisonID)
	require.NoError(t, err, "nothing purged before the confirmation")

	// Confirm: the record is gone from the list and from the auditor.
	require.NoError(t, chromedp.Do(ctx,
		chromedp.Click(chromedp.CSS(`#purge-confirm button[type=submit]`)),
		chromedp.WaitVisible(chromedp.ID("purge-result")),
	))
	result := text("#purge-result")
	require.Contains(t, result, "Purged 1 of 1.")
	require.Contains(t, result, dl.poisonID)
	require.NotContains(t, text("#dlq-records"), dl.poisonID)
	require.Contains(t, text("#dlq-records"), dl.goodID)
	require.Contains(t, text("#console-audit"), reason)
	_, err = dl.direct.Inspect(apiCtx, dl.poisonID)
	var de *dlq.Error
	require.ErrorAs(t, err, &de)
	require.Equal(t, http.StatusNotFound, de.Status, "the auditor no longer has the record")
	rows, err := e.st.AuditOf(apiCtx, store.SubjectDLQ, 5)
	require.NoError(t, err)
	require.Len(t, rows, 1)
	require.Equal(t, "dlq.purge", rows[0].Action)
	require.Equal(t, "sre1", rows[0].Actor)
	require.Equal(t, reason, rows[0].Reason)

	// Viewer: the list without selection, the record without a replay or purge
	// form, and a forged purge is refused.
	require.NoError(t, chromedp.Do(ctx,
		chromedp.Click(chromedp.CSS(`button.link`)), chromedp.WaitVisible(chromedp.ID("username")),
		signIn(e.srv.URL, "viewer1"),
		chromedp.Click(chromedp.CSS(`nav a[href="/sre/dlq"]`)),
		chromedp.WaitVisible(recordLink(dl.goodID)),
	))
	require.Zero(t, count(`#dlq-records input[name=id], #purge-selected`), "no selection or purge button for a viewer")
	require.NoError(t, chromedp.Do(ctx,
		chromedp.Click(recordLink(dl.goodID)),
		chromedp.WaitVisible(chromedp.ID("dlq-payload")),
	))
	require.Contains(t, text("#dlq-record"), "update ledger: throttled")
	require.Zero(t, count(`#replay-one, #purge-one, form[action^="/sre/dlq/"]`), "no replay or purge form for a viewer")
	status, err := chromedp.Run(ctx, chromedp.Evaluate[int](`(async () => {
		const csrf = document.querySelector('input[name=csrf]').value;
		const body = new URLSearchParams({csrf, id: `+jsString(dl.goodID)+`, reason: "try", confirm: "yes"});
		const res = await fetch("/sre/dlq/purge", {method: "POST", body, redirect: "manual"});
		return res.status;
	})()`, chromedp.EvalAwaitPromise))
	require.NoError(t, err)
	require.Equal(t, http.StatusForbidden, status)
	_, err = dl.direct.Inspect(apiCtx, dl.goodID)
	require.NoError(t, err, "the viewer's forged purge changed nothing")
}
