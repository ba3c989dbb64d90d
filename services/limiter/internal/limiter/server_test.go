package limiter

import (
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/require"

	"github.com/floodgate-dev/floodgate/pkg/events"
	"github.com/floodgate-dev/floodgate/pkg/redisx/redistest"
)

type capture struct {
	mu   sync.Mutex
	msgs []kafka.Message
}

func (c *capture) TryPublish(m kafka.Message) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.msgs = append(c.msgs, m)
	return true
}

func newTestServer(t *testing.T, limit int) (*httptest.Server, *capture) {
	rdb := redistest.Client(t)
	rules := []Rule{{Tier: events.TierPrincipal, Limit: limit, Period: time.Minute}}
	e, err := NewEngine(rdb, rules)
	require.NoError(t, err)
	pub := &capture{}
	s := NewServer(ServerConfig{Engine: e, Rules: rules, Publisher: pub, Topic: "decisions", Gateway: "test",
		RedisTimeout: time.Second, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Registry: prometheus.NewRegistry()})
	s.SetReady(true)
	srv := httptest.NewServer(s.Handler())
	t.Cleanup(srv.Close)
	return srv, pub
}

func post(t *testing.T, url, body string, hdr map[string]string) (*http.Response, []byte) {
	req, err := http.NewRequest(http.MethodPost, url+"/v1/check", strings.NewReader(body))
	require.NoError(t, err)
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp, b
}

func TestCheckAnswersWithContractAndPublishesDecision(t *testing.T) {
	srv, pub := newTestServer(t, 2)
	id := redistest.Unique(t, "bot")
	body := `{"principal":{"kind":"bot","id":"` + id + `"},"ip":"2001:db8::7","method":"POST","route":"/channels/{channel_id}/messages","resource":"channel:123"}`

	var last CheckResponse
	for i := 0; i < 3; i++ {
		resp, b := post(t, srv.URL, body, map[string]string{"X-Request-Id": "req-" + string(rune('a'+i))})
		require.Equal(t, http.StatusOK, resp.StatusCode)
		require.NoError(t, json.Unmarshal(b, &last))
	}
	require.False(t, last.Allowed)
	require.Equal(t, "req-c", last.ID, "a valid caller correlation id is kept")
	h := last.Headers
	require.Equal(t, "2", h["X-RateLimit-Limit"])
	require.Equal(t, "0", h["X-RateLimit-Remaining"])
	require.Equal(t, "principal", h["X-RateLimit-Scope"])
	require.Equal(t, `"principal";q=2;w=60`, h["RateLimit-Policy"])
	require.Regexp(t, `^"principal";r=0;t=\d+$`, h["RateLimit"])
	require.Equal(t, "30", h["Retry-After"], "one token refills every 30s")
	require.Equal(t, "req-c", h["X-Request-Id"])
	require.NotNil(t, last.Problem)
	require.Equal(t, ProblemRateLimited, last.Problem.Type)
	require.Equal(t, 429, last.Problem.Status)

	require.Len(t, pub.msgs, 3, "every decision is published")
	m := pub.msgs[2]
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
	require.Equal(t, "req-c", ce["ce_id"])
}

func TestCheckRejectsBadInputWithProblem(t *testing.T) {
	srv, pub := newTestServer(t, 10)
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
			resp, b := post(t, srv.URL, tc.body, nil)
			require.Equal(t, http.StatusBadRequest, resp.StatusCode)
			require.Equal(t, "application/problem+json", resp.Header.Get("Content-Type"))
			var p Problem
			require.NoError(t, json.Unmarshal(b, &p))
			require.Equal(t, ProblemBadRequest, p.Type)
			require.Contains(t, p.Detail, tc.field)
			require.NotEmpty(t, p.CorrelationID)
			require.Equal(t, p.CorrelationID, resp.Header.Get("X-Request-Id"))
		})
	}
	require.Empty(t, pub.msgs, "rejected requests publish nothing")
}

func TestDenialProblemTypes(t *testing.T) {
	cases := []struct {
		tier events.Tier
		want string
	}{
		{events.TierPrincipal, ProblemRateLimited},
		{events.TierPenalty, ProblemPenalized},
		{events.TierQuota, ProblemQuota},
	}
	for _, tc := range cases {
		t.Run(string(tc.tier), func(t *testing.T) {
			p := DenialProblem(Result{Tier: tc.tier, RetryAfter: 1500 * time.Millisecond}, "cid")
			require.Equal(t, tc.want, p.Type)
			require.Equal(t, "cid", p.CorrelationID)
		})
	}
	require.Nil(t, DenialProblem(Result{Allowed: true}, "cid"))
}

func TestHeadersRoundRetryUp(t *testing.T) {
	h := Headers(Result{Tier: events.TierEndpoint, Limit: 5, Remaining: 0, ResetAfter: 1100 * time.Millisecond, RetryAfter: 100 * time.Millisecond}, 5*time.Second, "cid")
	require.Equal(t, "1", h["Retry-After"], "never 0: a client must wait")
	require.Equal(t, "2", h["X-RateLimit-Reset"])
	allowed := Headers(Result{Allowed: true, Tier: events.TierEndpoint, Limit: 5, Remaining: 4}, 5*time.Second, "cid")
	require.NotContains(t, allowed, "Retry-After")
}
