package server

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/floodgate-dev/floodgate/pkg/events"
	"github.com/floodgate-dev/floodgate/pkg/httpapi"
	"github.com/floodgate-dev/floodgate/pkg/kafkatest"
	"github.com/floodgate-dev/floodgate/pkg/limiter"
	"github.com/floodgate-dev/floodgate/pkg/limiter/checkapi"
	"github.com/floodgate-dev/floodgate/pkg/limiter/limitertest"
	"github.com/floodgate-dev/floodgate/pkg/redisx/redistest"
)

func newTestServer(t *testing.T, tr string, limit int) (testServer, *kafkatest.Capture) {
	return newTestServerRules(t, tr, fmt.Sprintf("version: 1\nrules:\n  - {id: principal, tier: principal, limit: %d, period: 1m}\n", limit), nil)
}

func newTestServerRules(t *testing.T, tr, rules string, obs Observer) (testServer, *kafkatest.Capture) {
	rdb := redistest.Client(t)
	e := limitertest.Engine(t, rdb, rules, nil)
	pub := &kafkatest.Capture{}
	s := New(Config{Engine: e, Publisher: pub, Observer: obs, Topic: "decisions", Gateway: "test",
		Logger: slog.New(slog.DiscardHandler), Registry: prometheus.NewRegistry()})
	s.SetReady(true)
	return testServer{URL: serveOn(t, s, tr)}, pub
}

func TestCheckAnswersWithContractAndPublishesDecision(t *testing.T) {
	forTransports(t, func(t *testing.T, tr string) {
		srv, pub := newTestServer(t, tr, 2)
		id := redistest.Unique(t, "bot")
		body := `{"principal":{"kind":"bot","id":"` + id + `"},"ip":"2001:db8::7","method":"POST","route":"/channels/{channel_id}/messages","resource":"channel:123"}`

		var last checkapi.CheckResponse
		for i := 0; i < 3; i++ {
			resp, b := limitertest.Post(t, srv.URL, body, map[string]string{"X-Request-Id": "req-" + string(rune('a'+i))})
			require.Equal(t, http.StatusOK, resp.StatusCode)
			require.NoError(t, json.Unmarshal(b, &last))
		}
		require.False(t, last.Allowed)
		require.NotEqual(t, "req-c", last.ID, "the decision id is the server's, never the caller's")
		h := last.Headers
		require.Equal(t, "req-c", h["X-Request-Id"], "a valid caller correlation id is kept, for correlation")
		require.Equal(t, "2", h["X-RateLimit-Limit"])
		require.Equal(t, "0", h["X-RateLimit-Remaining"])
		require.Equal(t, "principal", h["X-RateLimit-Scope"])
		require.Equal(t, `"principal";q=2;w=60`, h["RateLimit-Policy"])
		require.Equal(t, `"principal";r=0;t=30`, h["RateLimit"], "on a denial t is when a request fits again, as Retry-After")
		require.Equal(t, "30", h["Retry-After"], "one token refills every 30s")
		require.Equal(t, "req-c", h["X-Request-Id"])
		require.NotNil(t, last.Problem)
		require.Equal(t, httpapi.ProblemRateLimited, last.Problem.Type)
		require.Equal(t, "https://iana.org/assignments/http-problem-types#quota-exceeded", last.Problem.Type, "the draft's registered type")
		require.Equal(t, []string{"principal"}, last.Problem.ViolatedPolicies)
		require.Equal(t, 429, last.Problem.Status)

		require.Len(t, pub.Messages(), 3, "every decision is published")
		m := pub.Messages()[2]
		require.Equal(t, "decisions", m.Topic)
		require.Equal(t, "bot:"+id, string(m.Key))
		d, err := events.DecodeDecision(m.Value)
		require.NoError(t, err, "published events pass the codec's validation")
		require.False(t, d.Allowed)
		require.Equal(t, "2001:db8::7", d.IP.String())
		require.Equal(t, "test", d.Gateway)
		require.Equal(t, "channel:123", d.Resource)
		ce := map[string]string{}
		for _, hd := range m.Headers {
			ce[hd.Key] = string(hd.Value)
		}
		require.Equal(t, events.CETypeDecision, ce["ce_type"])
		require.Equal(t, last.ID, ce["ce_id"], "the CloudEvents id is the decision id the answer carries")
		require.Equal(t, last.ID, d.ID)
	})
}

func TestCheckRejectsBadInputWithProblem(t *testing.T) {
	forTransports(t, func(t *testing.T, tr string) {
		srv, pub := newTestServer(t, tr, 10)
		cases := []struct{ name, body, field string }{
			{"not json", `{"principal":`, "body"},
			{"bad kind", `{"principal":{"kind":"robot","id":"x"},"ip":"1.2.3.4","method":"GET","route":"/a"}`, "kind"},
			{"bad ip", `{"principal":{"kind":"bot","id":"x"},"ip":"1.2.3","method":"GET","route":"/a"}`, "ip"},
			{"bad method", `{"principal":{"kind":"bot","id":"x"},"ip":"1.2.3.4","method":"FETCH","route":"/a"}`, "method"},
			{"raw path instead of template", `{"principal":{"kind":"bot","id":"x"},"ip":"1.2.3.4","method":"GET","route":"/a?b=1"}`, "route"},
			{"cost out of range", `{"principal":{"kind":"bot","id":"x"},"ip":"1.2.3.4","method":"GET","route":"/a","cost":-3}`, "cost"},
		}
		for _, tc := range cases {
			t.Run(tc.name, func(t *testing.T) {
				resp, b := limitertest.Post(t, srv.URL, tc.body, nil)
				require.Equal(t, http.StatusBadRequest, resp.StatusCode)
				require.Equal(t, "application/problem+json", resp.Header.Get("Content-Type"))
				var p httpapi.Problem
				require.NoError(t, json.Unmarshal(b, &p))
				require.Equal(t, httpapi.ProblemInvalidRequest, p.Type)
				require.Contains(t, p.Detail, tc.field)
				require.NotEmpty(t, p.CorrelationID)
				require.Equal(t, p.CorrelationID, resp.Header.Get("X-Request-Id"))
			})
		}
		require.Empty(t, pub.Messages(), "rejected requests publish nothing")
	})
}

func TestDenialProblemTypes(t *testing.T) {
	cases := []struct {
		name  string
		tier  events.Tier
		scale float64
		want  string
	}{
		{"rate limited", events.TierPrincipal, 1, httpapi.ProblemRateLimited},
		{"penalty", events.TierPenalty, 1, httpapi.ProblemPenalized},
		{"penalty beats a reduced scale", events.TierPenalty, 0.5, httpapi.ProblemPenalized},
		{"quota", events.TierQuota, 1, httpapi.ProblemQuota},
		{"adjuster reduced capacity", events.TierEndpoint, 0.5, httpapi.ProblemReducedCapacity},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := DenialProblem(limiter.Result{Tier: tc.tier, Scale: tc.scale, RetryAfter: 1500 * time.Millisecond}, "cid")
			require.Equal(t, tc.want, p.Type)
			require.Equal(t, "cid", p.CorrelationID)
			require.Equal(t, "urn:floodgate:decision:cid", p.Instance)
		})
	}
	require.Nil(t, DenialProblem(limiter.Result{Allowed: true}, "cid"))
}

func TestHeadersRoundRetryUp(t *testing.T) {
	h := Headers(limiter.Result{Tier: events.TierEndpoint, Limit: 5, Remaining: 0, ResetAfter: 1100 * time.Millisecond, RetryAfter: 100 * time.Millisecond, Period: 5 * time.Second}, "cid")
	require.Equal(t, "1", h["Retry-After"], "never 0: a client must wait")
	require.Equal(t, "2", h["X-RateLimit-Reset"])
	require.Equal(t, `"endpoint";q=5;w=5`, h["RateLimit-Policy"])
	require.NotContains(t, h, "X-RateLimit-Error")
	allowed := Headers(limiter.Result{Allowed: true, Tier: events.TierEndpoint, Limit: 5, Remaining: 4}, "cid")
	require.NotContains(t, allowed, "Retry-After")
	// The quota's Retry-After is never earlier than its reset at 00:00 UTC.
	q := Headers(limiter.Result{Tier: events.TierQuota, Limit: 10, RetryAfter: time.Second, ResetAfter: 3*time.Hour + 1}, "cid")
	require.Equal(t, "10801", q["Retry-After"])
	d := Headers(limiter.Result{Allowed: true, Tier: events.TierPrincipal, Degraded: true, Error: "redis circuit open"}, "cid")
	require.Equal(t, "redis circuit open; answered by fail policy", d["X-RateLimit-Error"])
}

func TestBatchAnswersEachCheckIndependently(t *testing.T) {
	forTransports(t, func(t *testing.T, tr string) {
		srv, pub := newTestServer(t, tr, 1)
		a, b := redistest.Unique(t, "a"), redistest.Unique(t, "b")
		item := func(id string) string {
			return `{"principal":{"kind":"bot","id":"` + id + `"},"ip":"192.0.2.1","method":"GET","route":"/x"}`
		}
		body := `{"checks":[` + item(a) + `,` + item(b) + `,{"principal":{"kind":"robot","id":"x"}},` + item(a) + `]}`
		req, err := http.NewRequest(http.MethodPost, srv.URL+"/v1/check/batch", strings.NewReader(body))
		require.NoError(t, err)
		req.Header.Set("X-Request-Id", "batch1")
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		require.Equal(t, http.StatusOK, resp.StatusCode)
		var out checkapi.BatchResponse
		require.NoError(t, json.NewDecoder(resp.Body).Decode(&out))
		require.Len(t, out.Results, 4)
		require.Equal(t, http.StatusOK, out.Results[1].Status)
		require.True(t, out.Results[1].Allowed, "b has its own bucket")
		require.Equal(t, http.StatusBadRequest, out.Results[2].Status)
		require.Equal(t, httpapi.ProblemInvalidRequest, out.Results[2].Error.Type)
		require.Contains(t, out.Results[2].Error.Detail, "kind")
		// a's two checks run concurrently: exactly one gets the single token.
		require.NotEqual(t, out.Results[0].Allowed, out.Results[3].Allowed)
		denied := out.Results[0]
		if denied.Allowed {
			denied = out.Results[3]
		}
		require.Equal(t, httpapi.ProblemRateLimited, denied.Problem.Type)
		require.Regexp(t, `^batch1-[03]$`, denied.Headers["X-Request-Id"], "each check gets its own correlation id")
		require.NotRegexp(t, `^batch1`, denied.ID, "and a decision id of the server's")
		require.Len(t, pub.Messages(), 3, "one event per decided check")

		for _, bad := range []string{`{"checks":[]}`, `{"checks":` + strings.Repeat("[", 1) + strings.TrimSuffix(strings.Repeat(item(a)+",", checkapi.MaxBatch+1), ",") + `]}`, `nope`} {
			resp, b := postPath(t, srv.URL+"/v1/check/batch", bad)
			require.Equal(t, http.StatusBadRequest, resp.StatusCode, string(b))
		}
	})
}

func postPath(t *testing.T, url, body string) (*http.Response, []byte) {
	resp, err := http.Post(url, "application/json", strings.NewReader(body))
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp, b
}

type observed struct {
	mu   sync.Mutex
	seen []string
}

func (o *observed) Observe(scope string, tier events.Tier, allowed, shadow bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.seen = append(o.seen, fmt.Sprintf("%s/%s/%v/%v", scope, tier, allowed, shadow))
}

func TestEventsCarryShadowNearLimitAndRule(t *testing.T) {
	forTransports(t, func(t *testing.T, tr string) {
		obs := &observed{}
		srv, pub := newTestServerRules(t, tr, "version: 1\nrules:\n  - {id: real, tier: principal, limit: 5, period: 1h}\n  - {id: trial, tier: principal, limit: 1, period: 1h, shadow: true}\n", obs)
		id := redistest.Unique(t, "bot")
		body := `{"principal":{"kind":"bot","id":"` + id + `"},"ip":"192.0.2.1","method":"GET","route":"/x"}`
		var last checkapi.CheckResponse
		for range 4 {
			_, b := limitertest.Post(t, srv.URL, body, nil)
			require.NoError(t, json.Unmarshal(b, &last))
		}
		require.True(t, last.Allowed)
		require.True(t, last.Shadow)
		require.True(t, last.NearLimit, "4 of 5 used")
		require.Equal(t, "real", last.Rule)
		d, err := events.DecodeDecision(pub.Messages()[3].Value)
		require.NoError(t, err)
		require.True(t, d.Shadow)
		require.True(t, d.NearLimit)
		require.Equal(t, "real", d.Rule)
		require.False(t, d.Degraded)
		first, err := events.DecodeDecision(pub.Messages()[0].Value)
		require.NoError(t, err)
		require.False(t, first.Shadow)
		require.False(t, first.NearLimit)
		require.Contains(t, obs.seen, "trial/principal/true/true", "shadow counts per scope")
		require.Contains(t, obs.seen, "real/principal/true/false")
	})
}

// TestSecurityCallerChosenIDsS7 replays finding S7 of issue 22: twenty checks
// sent with one X-Request-Id became twenty decision events with the same id,
// which the quota ledger (deduplicating by id) counted once. Decision ids are
// now minted by the limiter; the caller's id is echoed for correlation only.
func TestSecurityCallerChosenIDsS7(t *testing.T) {
	forTransports(t, func(t *testing.T, tr string) {
		srv, pub := newTestServer(t, tr, 100)
		body := `{"principal":{"kind":"user","id":"` + redistest.Unique(t, "s7") + `"},"ip":"203.0.113.7","method":"GET","route":"/users/@me"}`
		for range 20 {
			resp, _ := limitertest.Post(t, srv.URL, body, map[string]string{"X-Request-Id": "same-id"})
			require.Equal(t, http.StatusOK, resp.StatusCode)
			require.Equal(t, "same-id", resp.Header.Get("X-Request-Id"))
		}
		ids := map[string]bool{}
		for _, m := range pub.Messages() {
			ev, err := events.DecodeDecision(m.Value)
			require.NoError(t, err)
			ids[ev.ID] = true
		}
		require.Len(t, ids, 20, "twenty decisions, twenty ids")
		require.False(t, ids["same-id"])
	})
}

// TestRateLimitPolicyIsTheConfiguredOne: RateLimit-Policy names the rule with
// its configured quota, so it does not change between responses as the
// adjuster's scales move (the effective limit is X-RateLimit-Limit's), and on
// a token-bucket denial the RateLimit field's t is Retry-After, never later.
func TestRateLimitPolicyIsTheConfiguredOne(t *testing.T) {
	ctx := context.Background()
	rdb := redistest.Client(t)
	e := limitertest.Engine(t, rdb, "version: 1\nrules:\n  - {id: bot-per-minute, tier: principal, limit: 100, period: 1m}\n", nil)
	p := limitertest.Principal(t)
	r := limitertest.Check(t, e, limiter.Request{Principal: p, Cost: 1})
	h := Headers(r, "cid")
	require.Equal(t, `"bot-per-minute";q=100;w=60`, h["RateLimit-Policy"])
	require.Equal(t, "100", h["X-RateLimit-Limit"])

	require.NoError(t, rdb.HSet(ctx, e.Runtime().ScalesKey, "global", "0.5").Err())
	require.NoError(t, e.Runtime().Refresh(ctx))
	r = limitertest.Check(t, e, limiter.Request{Principal: p, Cost: 1})
	h = Headers(r, "cid")
	require.Equal(t, "50", h["X-RateLimit-Limit"], "the effective limit follows the scale")
	require.Equal(t, `"bot-per-minute";q=100;w=60`, h["RateLimit-Policy"], "the policy does not")

	r = limitertest.Check(t, e, limiter.Request{Principal: p, Cost: 60}) // more than the scaled bucket holds now
	require.False(t, r.Allowed)
	h = Headers(r, "cid")
	require.Regexp(t, `^"bot-per-minute";r=\d+;t=`+h["Retry-After"]+`$`, h["RateLimit"], "t is Retry-After on a denial")
	require.Equal(t, []string{"bot-per-minute"}, DenialProblem(r, "cid").ViolatedPolicies)
}
