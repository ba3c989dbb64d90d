package server

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/floodgate-dev/floodgate/pkg/httpapi"
	"github.com/floodgate-dev/floodgate/pkg/httpapi/httpapitest"
	"github.com/floodgate-dev/floodgate/pkg/kafkatest"
	"github.com/floodgate-dev/floodgate/pkg/limiter/checkapi"
	"github.com/floodgate-dev/floodgate/pkg/limiter/limitertest"
	"github.com/floodgate-dev/floodgate/pkg/promtest"
	"github.com/floodgate-dev/floodgate/pkg/redisx/redistest"
)

func newDeadlineServer(t *testing.T) (*Server, *httptest.Server, *kafkatest.Capture, *prometheus.Registry) {
	rdb := redistest.Client(t)
	e := limitertest.Engine(t, rdb, "version: 1\nrules:\n  - {id: principal, tier: principal, limit: 5, period: 1m}\n", nil)
	pub, reg := &kafkatest.Capture{}, prometheus.NewRegistry()
	s := New(Config{Engine: e, Publisher: pub, Topic: "decisions", Gateway: "test", Logger: slog.New(slog.DiscardHandler), Registry: reg})
	s.SetReady(true)
	srv := httptest.NewServer(s.Handler())
	t.Cleanup(srv.Close)
	return s, srv, pub, reg
}

func checkBody(t *testing.T) string {
	return `{"principal":{"kind":"user","id":"` + redistest.Unique(t, "u") + `"},"ip":"192.0.2.1","method":"GET","route":"/v1/x"}`
}

// TestTimeoutHeadersAreValidated: the caller's timeout (Floodgate's header,
// else Envoy's) must be whole milliseconds in 1..60000; anything else is a
// 400 problem naming the header. A good one is decided as any check.
func TestTimeoutHeadersAreValidated(t *testing.T) {
	_, srv, pub, _ := newDeadlineServer(t)
	for _, h := range []string{HeaderTimeout, HeaderEnvoyTimeout} {
		for _, v := range []string{"0", "-5", "1.5", "ten", "60001"} {
			resp, b := limitertest.Post(t, srv.URL, checkBody(t), map[string]string{h: v})
			require.Equal(t, http.StatusBadRequest, resp.StatusCode, "%s: %s", h, v)
			require.Contains(t, string(b), h)
			require.Contains(t, resp.Header.Get("Content-Type"), "application/problem+json")
		}
	}
	require.Empty(t, pub.Messages(), "nothing decided")
	resp, b := limitertest.Post(t, srv.URL, checkBody(t), map[string]string{HeaderTimeout: "5000", HeaderEnvoyTimeout: "junk"})
	require.Equal(t, http.StatusOK, resp.StatusCode, "Floodgate's header is read first: %s", b)
	var got checkapi.CheckResponse
	require.NoError(t, json.Unmarshal(b, &got))
	require.True(t, got.Allowed)
	require.False(t, got.Degraded)
	require.Len(t, pub.Messages(), 1)
}

// TestHTTPDeadlineDefaults: with no header the configured default applies
// from when the request is read; with neither, there is no deadline.
func TestHTTPDeadlineDefaults(t *testing.T) {
	s, _, _, _ := newDeadlineServer(t)
	r := httptest.NewRequest(http.MethodPost, "/v1/check", strings.NewReader("{}"))
	d, err := s.httpDeadline(r)
	require.NoError(t, err)
	require.True(t, d.IsZero(), "no header, no default: none")

	s.SetCheckTimeout(time.Hour)
	before := time.Now()
	d, err = s.httpDeadline(r)
	require.NoError(t, err)
	require.False(t, d.Before(before.Add(time.Hour)))
	require.False(t, s.DeadlineOf(context.Background()).Before(before.Add(time.Hour)), "the same default for in-process callers")
	ctx, cancel := context.WithDeadline(context.Background(), before)
	defer cancel()
	require.Equal(t, before, s.DeadlineOf(ctx), "a context's deadline is the caller's")

	r.Header.Set(HeaderEnvoyTimeout, "20")
	d, err = s.httpDeadline(r)
	require.NoError(t, err)
	require.Less(t, time.Until(d), time.Hour, "Envoy's timeout replaces the default")
}

// TestLateCallsFailOpenUncounted: a check whose caller's deadline has
// passed on arrival at the engine, or whose caller left (its context
// cancelled, as net/http does when the client closes the connection), is
// answered as the caller fails open (allowed, degraded, X-RateLimit-Error),
// counted as dropped past its deadline by protocol and priority — not as a
// failed check (a warning each) — never published, and Redis counts nothing
// of it.
func TestLateCallsFailOpenUncounted(t *testing.T) {
	for _, tc := range []struct {
		name string
		late func() (context.Context, Call)
	}{
		{"deadline passed", func() (context.Context, Call) {
			return context.Background(), Call{Protocol: ProtocolHTTP, Deadline: time.Now().Add(-time.Millisecond)}
		}},
		{"caller left", func() (context.Context, Call) {
			ctx, cancel := context.WithCancel(context.Background())
			cancel()
			return ctx, Call{Protocol: ProtocolHTTP}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, srv, pub, reg := newDeadlineServer(t)
			var req checkapi.CheckRequest
			body := checkBody(t)
			require.NoError(t, json.Unmarshal([]byte(body), &req))
			require.NoError(t, req.Validate())
			ctx, call := tc.late()
			res := s.DecideCall(ctx, NewDecisionID(), &req, call)
			require.True(t, res.Allowed)
			require.True(t, res.Degraded)
			require.Equal(t, DeadlineReason, res.Error)
			require.Contains(t, Headers(res, "x")["X-RateLimit-Error"], DeadlineReason)
			require.Empty(t, pub.Messages(), "no decision was made: no event")
			require.Equal(t, 1.0, promtest.Value(t, reg, "floodgate_limiter_calls_dropped_past_deadline_total", map[string]string{"protocol": "http", "priority": "degraded"}))
			require.Equal(t, 0.0, promtest.Value(t, reg, "floodgate_limiter_errors_total", map[string]string{"kind": "check"}), "not a failed check")

			_, b := limitertest.Post(t, srv.URL, body, nil)
			var got checkapi.CheckResponse
			require.NoError(t, json.Unmarshal(b, &got))
			require.Equal(t, 4, got.Remaining, "the late check took nothing from Redis")
		})
	}
}

// TestCallerGoneIsNotDecided: a check whose caller closed its connection
// before the limiter read it (it gave up on its deadline while the request
// waited in the kernel's queue) is not decided — no event, nothing taken
// from Redis, nothing written — and counted as dropped past its deadline;
// a caller still waiting gets its answer.
func TestCallerGoneIsNotDecided(t *testing.T) {
	s, _, pub, reg := newDeadlineServer(t)
	gl := httpapitest.NewGatedListener(t)
	srv := httpapi.DefaultServerConfig().NewServer(s.Handler(), nil)
	go func() { _ = srv.Serve(gl) }()
	t.Cleanup(func() { _ = srv.Close() })

	body := checkBody(t)
	req := fmt.Sprintf("POST /v1/check HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n%s: 50\r\nContent-Length: %d\r\n\r\n%s", HeaderTimeout, len(body), body)
	c := gl.Send(t, req, true)
	n, err := c.Read(make([]byte, 1))
	require.Zero(t, n, "nothing written to a caller that left")
	require.Error(t, err)
	require.Empty(t, pub.Messages(), "not decided: no event")
	require.Equal(t, 1.0, promtest.Value(t, reg, "floodgate_limiter_calls_dropped_past_deadline_total", map[string]string{"protocol": "http", "priority": "none"}))

	c2 := gl.Send(t, req, false)
	resp, err := http.ReadResponse(bufio.NewReader(c2), nil)
	require.NoError(t, err)
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode, "%s", b)
	var got checkapi.CheckResponse
	require.NoError(t, json.Unmarshal(b, &got))
	require.Equal(t, 4, got.Remaining, "the abandoned check took nothing from Redis")
	require.Len(t, pub.Messages(), 1)
}

// TestGoneGateSamplesUntilCallersLeave: callerGone peeks at the first check
// of every goneSample while no caller has been found gone, and at every
// check for goneWatch after one was.
func TestGoneGateSamplesUntilCallersLeave(t *testing.T) {
	var g goneGate
	t0 := time.Unix(1_000_000, 0)
	peeked := 0
	for i := range 3 * goneSample {
		if g.peek(t0) {
			peeked++
			require.Zero(t, i%goneSample, "check %d", i)
		}
	}
	require.Equal(t, 3, peeked, "one in goneSample while callers wait")
	g.found(t0)
	for i := range goneSample {
		require.True(t, g.peek(t0.Add(time.Duration(i)*goneWatch/goneSample)), "check %d within the watch", i)
	}
	peeked = 0
	for range goneSample {
		if g.peek(t0.Add(goneWatch)) {
			peeked++
		}
	}
	require.Equal(t, 1, peeked, "sampled again once the watch is over")
}
