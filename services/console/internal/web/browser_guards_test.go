package web

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	influxdb2 "github.com/influxdata/influxdb-client-go/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/require"

	"github.com/floodgate-dev/floodgate/pkg/config"
	"github.com/floodgate-dev/floodgate/pkg/events"
	"github.com/floodgate-dev/floodgate/pkg/httpapi"
	"github.com/floodgate-dev/floodgate/pkg/limiter"
	"github.com/floodgate-dev/floodgate/pkg/limiter/admission"
	"github.com/floodgate-dev/floodgate/pkg/limiter/checkapi"
	"github.com/floodgate-dev/floodgate/pkg/limiter/server"
	"github.com/floodgate-dev/floodgate/pkg/redisx/redistest"
	"github.com/floodgate-dev/floodgate/pkg/rollout"
	"github.com/floodgate-dev/floodgate/pkg/stream"
	"github.com/floodgate-dev/floodgate/pkg/whatif"
	"github.com/floodgate-dev/floodgate/pkg/whatif/whatiftest"
	"github.com/floodgate-dev/floodgate/services/console/internal/adjuster"
	"github.com/floodgate-dev/floodgate/services/console/internal/consoletest"
)

// guardRules are the rules the limiter records the traffic under: generous.
const guardRules = `version: 1
priorities:
  - {method: POST, route: /v1/charges, priority: critical}
  - {method: GET, route: /v1/export, priority: bulk}
rules:
  - {id: charges, tier: endpoint, method: POST, route: /v1/charges, limit: 100000, period: 1m}
  - {id: principal, tier: principal, limit: 100000, period: 1m}
`

// guardCandidate is the what-if's candidate: 10 charges a minute (GCRA), and
// a burst rule of 30 a second per principal.
const guardCandidate = `version: 1
priorities:
  - {method: POST, route: /v1/charges, priority: critical}
  - {method: GET, route: /v1/export, priority: bulk}
rules:
  - {id: charges, tier: endpoint, method: POST, route: /v1/charges, algorithm: gcra, limit: 10, period: 1m}
  - {id: burst, tier: principal, limit: 30, period: 1s}
`

// TestBrowserShedWhatIfRollout is the three guards of issue 16 on the real
// stack, driven in headless Chromium through the console:
//
//  1. Shedding: a CPU signal written to InfluxDB (96 % busy, on a host tag
//     of the test's own) makes the real adjuster binary raise the shed level
//     to 2; the adjuster page shows it and why; a real limiter (HTTP API,
//     reading the adjuster's shed key) refuses BULK and BEST_EFFORT checks
//     as shed — the problem type for reduced capacity, Retry-After, the
//     utilization status — while CRITICAL and DEGRADED checks are allowed.
//  2. What-if: the traffic that limiter recorded on the decisions topic is
//     replayed from the /sre/whatif page through a tighter candidate; the
//     page's blocked counts agree within 1 % with enforcing the candidate for
//     real on the same requests at their recorded times, and shed requests
//     are counted apart, not replayed.
//  3. Rollouts: a rollout that would block CRITICAL traffic is rolled back by
//     the controller by itself, and a good one is promoted; the rollouts page
//     shows both.
func TestBrowserShedWhatIfRollout(t *testing.T) {
	bin, shots := browserSetup(t)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	env := config.NewEnv(os.Getenv)
	influx := influxdb2.NewClient(env.String("FLOODGATE_INFLUX_URL", config.DefaultInfluxURL), env.String("FLOODGATE_INFLUX_TOKEN", ""))
	t.Cleanup(influx.Close)
	bucket := env.String("FLOODGATE_INFLUX_BUCKET", config.DefaultInfluxBucket)
	kb := consoletest.Broker(t)
	ro := newRolloutRig(t)
	tag := redistest.Unique(t, "console-guards")
	var adj adjusterProc
	e := newEnvWith(t, func(cfg *Config, prefix string) {
		// The adjuster reads CPU from this test's host tag only, and no
		// other signal of the shared InfluxDB (decisions, Redis latency,
		// HTTP responses of other tests) can move its shed level.
		adj = startAdjusterProc(t, prefix, kb, "FLOODGATE_ADJUSTER_HOST_TAGS=host="+tag,
			"FLOODGATE_ADJUSTER_DECISION_TAGS=gateway="+tag, "FLOODGATE_ADJUSTER_HTTP_TAGS=service="+tag)
		c, err := adjuster.New(adj.URL, adj.Token, nil)
		require.NoError(t, err)
		cfg.Adjuster = c
		cfg.WhatIf = &WhatIf{Timeout: 20 * time.Second, Source: &whatif.Source{Client: &kafka.Client{Addr: kafka.TCP(kb), Timeout: 5 * time.Second},
			Topic: config.DefaultDecisionsTopic, MaxEvents: 100_000}}
		ro.configure(cfg, prefix)
	})
	e.web.cfg.WhatIf.Redis = e.rdb
	ro.start(t, e)

	// A real limiter on the adjuster's shed and scale keys, publishing its
	// decisions to the broker's decisions topic.
	rs, err := limiter.ParseRules("guards.yaml", []byte(guardRules))
	require.NoError(t, err)
	rt := limiter.NewRuntime(e.rdb, slog.New(slog.DiscardHandler), prometheus.NewRegistry())
	rt.ScalesKey, rt.ShedKey, rt.OverridesKey = adj.ScalesKey, adj.ShedKey, redistest.Unique(t, "fg:test:console:overrides")
	go func() { _ = rt.Run(ctx, 100*time.Millisecond) }()
	eng, err := limiter.NewEngine(limiter.EngineConfig{Redis: e.rdb, Rules: limiter.NewRuleStore(rs), Runtime: rt, Budget: 2 * time.Second,
		Registry: prometheus.NewRegistry()})
	require.NoError(t, err)
	require.NoError(t, eng.Load(ctx))
	prod := stream.NewAsyncProducer(stream.AsyncProducerConfig{Brokers: []string{kb}, Topic: config.DefaultDecisionsTopic})
	pctx, stopProd := context.WithCancel(context.Background())
	pdone := make(chan error, 1)
	go func() { pdone <- prod.Run(pctx) }()
	t.Cleanup(func() { stopProd(); <-pdone })
	srv := server.New(server.Config{Engine: eng, Publisher: prod, Topic: config.DefaultDecisionsTopic, Gateway: tag,
		Logger: slog.New(slog.DiscardHandler), Registry: prometheus.NewRegistry()})
	srv.SetReady(true)
	lim := httptest.NewServer(srv.Handler())
	t.Cleanup(lim.Close)
	// Every check's original request, by its decision id (for enforcement).
	byID := map[string]limiter.Request{}
	check := func(p events.Principal, method, route, prio string) checkapi.CheckResponse {
		t.Helper()
		body, err := json.Marshal(map[string]any{"principal": p, "ip": "198.51.100.7", "method": method, "route": route, "cost": 1, "priority": prio})
		require.NoError(t, err)
		res, err := http.Post(lim.URL+"/v1/check", "application/json", bytes.NewReader(body))
		require.NoError(t, err)
		defer res.Body.Close()
		raw, err := io.ReadAll(res.Body)
		require.NoError(t, err)
		require.Equal(t, http.StatusOK, res.StatusCode, string(raw))
		var out checkapi.CheckResponse
		require.NoError(t, json.Unmarshal(raw, &out), string(raw))
		req := limiter.Request{Principal: p, IP: netip.MustParseAddr("198.51.100.7"), Method: method, Route: route, Cost: 1}
		if prio != "" {
			req.Priority, err = admission.ParsePriority(prio)
			require.NoError(t, err)
		}
		byID[out.ID] = req
		return out
	}

	// 1. Shedding. The host is 97 % busy (usage_idle 3) from now on.
	wr := influx.WriteAPIBlocking("", bucket)
	cpu := func() error {
		return wr.WritePoint(ctx, influxdb2.NewPoint("cpu", map[string]string{"cpu": "cpu-total", "host": tag},
			map[string]any{"usage_idle": 3.0}, time.Now()))
	}
	require.NoError(t, cpu(), "write the CPU signal to InfluxDB (is the local stack up?)")
	go func() {
		for ctx.Err() == nil {
			_ = cpu()
			time.Sleep(500 * time.Millisecond)
		}
	}()
	direct, err := adjuster.New(adj.URL, adj.Token, nil)
	require.NoError(t, err)
	_, etag, err := direct.Settings(ctx)
	require.NoError(t, err)
	_, err = direct.PutRules(ctx, etag, "", json.RawMessage(`{"tick": "1s", "window": "5s", "stale_after": "30s"}`), "CHG-16: tick every second in the test")
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		st, err := direct.Status(ctx)
		return err == nil && st.Shed.Level == 2
	}, 45*time.Second, 250*time.Millisecond, "the adjuster raises the shed level to 2 on CPU 0.97")
	require.Eventually(t, func() bool { return rt.Shedding().Level == 2 }, 10*time.Second, 50*time.Millisecond, "the limiter reads the level")

	b := startBrowser(t, bin)
	shot := func(name string) chromedp.Action[chromedp.Void] { return screenshot(shots, name) }
	require.NoError(t, chromedp.Do(b,
		signIn(e.srv.URL, "sre1"),
		chromedp.Click(chromedp.CSS(`nav a[href="/sre/adjuster"]`)),
		chromedp.WaitVisible(chromedp.ID("shed-level")),
		shot("console-adjuster-shedding"),
	))
	shedding := textOf(t, b, "#shedding")
	require.Contains(t, shedding, "2 — bulk and best_effort shed")
	// The page explains the level by CPU: the raise's reason, or, once a
	// later shed tick has held the level, the hold's ("cpu 0.97 not below
	// its release line"); which one depends on how long the browser took.
	require.Regexp(t, `cpu 0\.97 > 0\.95|holding level 2: cpu 0\.97 not below its release line`, shedding)

	// The limiter's real answers: BULK and BEST_EFFORT shed, CRITICAL and
	// DEGRADED served, every answer saying the platform is degraded. They are
	// recorded too: the what-if below reads them back.
	recordFrom := time.Now().UTC().Add(-time.Second)
	caller := events.Principal{Kind: events.PrincipalAPIKey, ID: tag + "_shed"}
	for _, prio := range []string{"bulk", "best_effort"} {
		r := check(caller, "GET", "/v1/items", prio)
		require.False(t, r.Allowed, prio)
		require.True(t, r.Shed, prio)
		require.Equal(t, admission.StatusDegraded, r.Utilization)
		require.NotNil(t, r.Problem, prio)
		require.Equal(t, http.StatusServiceUnavailable, r.Problem.Status)
		require.Equal(t, httpapi.ProblemReducedCapacity, r.Problem.Type)
		require.NotEmpty(t, r.Headers["Retry-After"])
	}
	for _, prio := range []string{"critical", "degraded"} {
		r := check(caller, "POST", "/v1/charges", prio)
		require.True(t, r.Allowed, prio)
		require.False(t, r.Shed, prio)
		require.Equal(t, admission.StatusDegraded, r.Utilization, "an admitted answer says so too")
	}

	// 2. What-if. Four callers' traffic through the limiter, one check at a
	// time: 40 charges each (CRITICAL, never shed) and 5 exports (BULK, shed).
	for i := range 4 {
		p := events.Principal{Kind: events.PrincipalBot, ID: fmt.Sprintf("%s_w%d", tag, i)}
		for j := range 45 {
			method, route := "POST", "/v1/charges"
			if j%9 == 8 {
				method, route = "GET", "/v1/export"
			}
			check(p, method, route, "")
		}
	}
	recordTo := time.Now().UTC().Add(time.Second)
	src := e.web.cfg.WhatIf.Source
	var recs []whatif.Recorded
	require.Eventually(t, func() bool {
		recs, _, err = src.Read(ctx, recordFrom, recordTo)
		return err == nil && len(recs) >= len(byID)
	}, 20*time.Second, 200*time.Millisecond, "the decisions reach the topic")
	var order []whatiftest.Timed
	shed := 0
	for _, r := range recs {
		req, ok := byID[r.ID]
		require.True(t, ok, "decision %s is not one of this test's", r.ID)
		if r.Shed {
			shed++
			continue
		}
		order = append(order, whatiftest.Timed{At: r.TS, Req: req})
	}
	require.Equal(t, 2+20, shed, "the shed checks and every export")
	require.Len(t, order, 2+160)
	candidate, err := limiter.ParseRules("candidate", []byte(guardCandidate))
	require.NoError(t, err)
	enf := whatiftest.Enforce(t, e.rdb, candidate, order)
	require.Positive(t, enf.ByRule["charges"], "the candidate blocks charges: the comparison has teeth")

	require.NoError(t, chromedp.Do(b,
		chromedp.Click(chromedp.CSS(`nav a[href="/sre/whatif"]`)),
		chromedp.WaitVisible(chromedp.ID("whatif-form")),
		chromedp.SetValue(chromedp.ID("wi-rules"), guardCandidate),
		chromedp.SetValue(chromedp.ID("wi-from"), recordFrom.Format(time.RFC3339Nano)),
		chromedp.SetValue(chromedp.ID("wi-to"), recordTo.Format(time.RFC3339Nano)),
		chromedp.SendKeys(chromedp.ID("wi-reason"), "CHG-16: tighter charges"),
		chromedp.Submit(chromedp.ID("wi-reason")),
		chromedp.WaitVisible(chromedp.ID("whatif-report")),
		shot("console-whatif-vs-enforcement"),
	))
	require.Equal(t, "reject", textOf(t, b, "#whatif-verdict"), "the candidate blocks CRITICAL traffic that was allowed")
	require.Contains(t, textOf(t, b, "#whatif-report"), strconv.Itoa(shed)+" shed")
	cells, err := chromedp.Run(b, chromedp.Evaluate[map[string][]string](`Object.fromEntries([...document.querySelectorAll('#whatif-rules tbody tr')]
		.map(tr => [tr.cells[0].textContent.trim(), [...tr.cells].slice(1).map(c => c.textContent.trim())]))`))
	require.NoError(t, err)
	blocked := func(row string) int {
		t.Helper()
		c, ok := cells[row]
		require.True(t, ok, "row %q in %v", row, cells)
		n, err := strconv.Atoi(c[2]) // blocked (candidate)
		require.NoError(t, err)
		return n
	}
	require.Equal(t, strconv.Itoa(len(order)), cells["all"][0], "every recorded decision but the shed ones replayed")
	whatiftest.Within(t, 0.01, "total", blocked("all"), enf.Blocked)
	whatiftest.Within(t, 0.01, "rule charges", blocked("charges"), enf.ByRule["charges"])
	whatiftest.Within(t, 0.01, "rule burst", blocked("burst"), enf.ByRule["burst"])

	// 3. Rollouts: a bad one rolled back by the controller, a good one promoted.
	require.NoError(t, chromedp.Do(b, ro.propose(e, rolloutV2, "INC-16 one an hour")))
	ro.waitState(t, 2, events.RulesStateRolledBack)
	ro.waitAudit(t, 2, rollout.ActionAbort)
	require.NoError(t, chromedp.Do(b, chromedp.Navigate(e.srv.URL+"/sre/rollouts"), chromedp.WaitVisible(chromedp.ID("versions")),
		shot("console-guards-rolled-back")))
	versions := textOf(t, b, "#versions")
	require.Contains(t, versions, "rolled back")
	require.Contains(t, versions, "adjuster/rollout")
	require.Contains(t, versions, "CRITICAL would-block share")
	require.Contains(t, textOf(t, b, "#rollout-audit"), "rules.abort")
	require.NoError(t, chromedp.Do(b, ro.propose(e, rolloutV1+"  - {id: ips, tier: ip, limit: 100000, period: 1s}\n", "INC-17 an IP ceiling")))
	ro.waitState(t, 3, events.RulesStateEnforced)
	ro.waitAudit(t, 3, rollout.ActionPromote)
	require.NoError(t, chromedp.Do(b, chromedp.Navigate(e.srv.URL+"/sre/rollouts"), chromedp.WaitVisible(chromedp.ID("enforced-version")),
		shot("console-guards-promoted")))
	require.Contains(t, textOf(t, b, "#enforced"), "Version 3")
	require.True(t, strings.Contains(textOf(t, b, "#rollout-audit"), "rules.promote"))
}
