package web

import (
	"context"
	"encoding/json"
	"fmt"
	"html"
	"net/http"
	"net/netip"
	"net/url"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/require"

	"github.com/floodgate-dev/floodgate/pkg/events"
	"github.com/floodgate-dev/floodgate/pkg/httpapi/openapitest"
	"github.com/floodgate-dev/floodgate/pkg/kafkatest"
	"github.com/floodgate-dev/floodgate/pkg/whatif"
	"github.com/floodgate-dev/floodgate/schemas/openapi"
)

const whatIfCandidate = `version: 1
priorities:
  - {method: POST, route: /v1/charges, priority: critical}
rules:
  - {id: charges, tier: endpoint, method: POST, route: /v1/charges, limit: 4, period: 1h}
`

// TestWhatIfPage: an SRE pastes a candidate and a range and sees the report
// of a real replay of the decisions topic; the run is audited; viewers and
// analysts see the page but cannot run it; a form from elsewhere (no CSRF
// token) is refused; rules that do not parse are refused with the parser's
// line, and nothing is run or audited.
func TestWhatIfPage(t *testing.T) {
	const topic = "whatif-console"
	broker := kafkatest.Start(t, map[string]int32{topic: 2})
	now := time.Now().UTC().Truncate(time.Millisecond)
	w := &kafka.Writer{Addr: kafka.TCP(broker), Topic: topic, RequiredAcks: kafka.RequireAll, BatchTimeout: time.Millisecond}
	var msgs []kafka.Message
	for i := range 10 {
		p := events.Principal{Kind: events.PrincipalBot, ID: "b1"}
		ts := now.Add(time.Duration(i-30) * time.Second)
		d := events.Decision{ID: fmt.Sprintf("c%d", i), TS: ts, Principal: p, IP: netip.MustParseAddr("192.0.2.3"), Method: "POST",
			Route: "/v1/charges", Allowed: true, Tier: events.TierPrincipal, Cost: 1, Gateway: "t", Plan: "enterprise"}
		v, err := events.EncodeDecision(&d)
		require.NoError(t, err)
		msgs = append(msgs, kafka.Message{Key: []byte(p.Key()), Value: v, Time: ts})
	}
	require.NoError(t, w.WriteMessages(context.Background(), msgs...))
	require.NoError(t, w.Close())
	e := newEnvWith(t, func(cfg *Config, _ string) {
		cfg.WhatIf = &WhatIf{Timeout: 20 * time.Second,
			Source: &whatif.Source{Client: &kafka.Client{Addr: kafka.TCP(broker), Timeout: 5 * time.Second}, Topic: topic, MaxEvents: 1000}}
	})
	e.web.cfg.WhatIf.Redis = e.rdb
	audit := func(t *testing.T) int {
		rows, err := e.st.AuditOf(context.Background(), SubjectWhatIf, 10)
		require.NoError(t, err)
		return len(rows)
	}

	sre := e.signedIn(t, "sre1")
	form := func(rules string) url.Values {
		return url.Values{"csrf": {sre.csrf("/sre/whatif")}, "rules": {rules}, "from": {"2m"}, "to": {"now"},
			"reject_critical": {"5"}, "reason": {"INC-77: tighter charges"}}
	}
	t.Run("refused: rules that do not parse, no reason", func(t *testing.T) {
		res, body := sre.post("/sre/whatif", form("version: 1\nrules:\n  - {id: x, tier: nowhere, limit: 1, period: 1s}\n"))
		require.Equal(t, http.StatusUnprocessableEntity, res.StatusCode)
		require.Contains(t, html.UnescapeString(body), "candidate rules: candidate:3")
		f := form(whatIfCandidate)
		f.Del("reason")
		res, body = sre.post("/sre/whatif", f)
		require.Equal(t, http.StatusUnprocessableEntity, res.StatusCode)
		require.Contains(t, body, "reason: required")
		require.Zero(t, audit(t), "nothing run, nothing audited")
	})
	t.Run("run: the report, audited", func(t *testing.T) {
		res, body := sre.post("/sre/whatif", form(whatIfCandidate))
		require.Equal(t, http.StatusOK, res.StatusCode, body)
		require.Contains(t, body, `id="whatif-verdict">reject</span>`)
		require.Contains(t, html.UnescapeString(body), "blocks 60.00 % of the critical traffic that was allowed (6 of 10)")
		require.Contains(t, body, `<tr><td>enterprise</td><td>10</td><td>0</td><td>6</td><td>6</td><td>0</td></tr>`)
		require.Contains(t, body, `<a href="/principals/bot/b1">bot:b1</a>`)
		rows, err := e.st.AuditOf(context.Background(), SubjectWhatIf, 10)
		require.NoError(t, err)
		require.Len(t, rows, 1)
		require.Equal(t, ActionWhatIf, rows[0].Action)
		require.Equal(t, "sre1", rows[0].Actor)
		require.Equal(t, "INC-77: tighter charges", rows[0].Reason)
		require.Contains(t, rows[0].After, `"verdict":"reject"`)
		require.Contains(t, rows[0].Before, digest(whatIfCandidate))
	})
	t.Run("bearer API gets the report as JSON, as the OpenAPI document says", func(t *testing.T) {
		doc, err := openapi.JSON(openapi.Console)
		require.NoError(t, err)
		c := serveChecked(t, openapitest.Load(t, doc), e)
		res := c.call(t, "POST", "/sre/whatif", "sre", url.Values{"rules": {whatIfCandidate}, "from": {"2m"}, "to": {"now"}, "reason": {"api"}})
		require.Equal(t, http.StatusOK, res.Status, string(res.Body))
		var rep whatif.Report
		require.NoError(t, json.Unmarshal(res.Body, &rep))
		require.Equal(t, 6, rep.Total.NewlyBlocked)
		require.Equal(t, whatif.VerdictReject, rep.Verdict)
	})
	t.Run("viewer and analyst read only; no CSRF token, no run", func(t *testing.T) {
		e.readOnlyBelowSRE(t, "/sre/whatif", "", []string{`id="whatif-form"`},
			formPost{"/sre/whatif", url.Values{"rules": {whatIfCandidate}, "from": {"2m"}, "to": {"now"}, "reason": {"x"}}})
		f := form(whatIfCandidate)
		f.Del("csrf")
		res, _ := sre.post("/sre/whatif", f)
		require.Equal(t, http.StatusForbidden, res.StatusCode)
		require.Equal(t, 2, audit(t), "only the SRE's two runs")
	})
}
