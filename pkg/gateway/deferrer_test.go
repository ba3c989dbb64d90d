package gateway

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/floodgate-dev/floodgate/pkg/events"
)

// statusDeferrer answers every status poll 200 and counts what it was asked.
type statusDeferrer struct{ polls, defers int }

func (d *statusDeferrer) Defer(http.ResponseWriter, *http.Request, Request, Decision) bool {
	d.defers++
	return true
}

func (d *statusDeferrer) ServeStatus(w http.ResponseWriter, r *http.Request, _ events.Principal) bool {
	if !IsDeferredStatus(r) {
		return false
	}
	d.polls++
	w.WriteHeader(http.StatusOK)
	return true
}

// TestMiddlewareLimitsStatusPolls: a poll of /v1/deferred/{id} is checked as
// that route before it is answered; a denied poll gets the standard 429
// contract and is never deferred; a limiter outage follows the fail policy.
func TestMiddlewareLimitsStatusPolls(t *testing.T) {
	poll := func(o Options, method string) *httptest.ResponseRecorder {
		mw, err := Middleware(o)
		require.NoError(t, err)
		h := mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusTeapot) }))
		r := httptest.NewRequest(method, "/v1/deferred/0193a5f0-7d4e-7c1a-9b2e-3f4a5b6c7d8e", nil)
		r.RemoteAddr = "203.0.113.7:1"
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w
	}
	t.Run("allowed: checked as the status route, then answered", func(t *testing.T) {
		c, d := &fakeChecker{allow: true}, &statusDeferrer{}
		w := poll(Options{Checker: c, Deferrer: d}, http.MethodGet)
		require.Equal(t, http.StatusOK, w.Code)
		require.Equal(t, 1, d.polls)
		require.Len(t, c.reqs, 1)
		require.Equal(t, Request{Principal: events.Principal{Kind: events.PrincipalAnonymous, ID: "203.0.113.7"}, IP: "203.0.113.7",
			Method: http.MethodGet, Route: DeferredStatusRoute, Cost: 1}, c.reqs[0])
		require.Equal(t, "5", w.Header().Get("X-RateLimit-Limit"), "the rate-limit headers as on any request")
	})
	t.Run("denied: the standard 429, not answered, not deferred", func(t *testing.T) {
		c, d := &fakeChecker{}, &statusDeferrer{}
		w := poll(Options{Checker: c, Deferrer: d}, http.MethodHead)
		require.Equal(t, http.StatusTooManyRequests, w.Code)
		require.Equal(t, "3", w.Header().Get("Retry-After"))
		require.Equal(t, "application/problem+json", w.Header().Get("Content-Type"))
		require.JSONEq(t, `{"type":"https://floodgate.dev/problems/rate-limited","status":429}`, w.Body.String())
		require.Zero(t, d.polls)
		require.Zero(t, d.defers)
	})
	t.Run("limiter down: answered when failing open, 503 when failing closed", func(t *testing.T) {
		c, d := &fakeChecker{err: errors.New("connection refused")}, &statusDeferrer{}
		w := poll(Options{Checker: c, Deferrer: d}, http.MethodGet)
		require.Equal(t, http.StatusOK, w.Code)
		require.Contains(t, w.Header().Get("X-RateLimit-Error"), "failing open")
		w = poll(Options{Checker: c, Deferrer: d, FailClosed: true}, http.MethodGet)
		require.Equal(t, http.StatusServiceUnavailable, w.Code)
		require.Equal(t, 1, d.polls)
	})
	t.Run("without a Deferrer the path is an ordinary request", func(t *testing.T) {
		c := &fakeChecker{allow: true}
		w := poll(Options{Checker: c}, http.MethodGet)
		require.Equal(t, http.StatusTeapot, w.Code)
		require.Equal(t, "/{unmatched}", c.reqs[0].Route)
	})
	t.Run("a POST to the prefix is not a poll", func(t *testing.T) {
		c, d := &fakeChecker{allow: true}, &statusDeferrer{}
		w := poll(Options{Checker: c, Deferrer: d}, http.MethodPost)
		require.Equal(t, http.StatusTeapot, w.Code)
		require.Zero(t, d.polls)
		require.NotEqual(t, DeferredStatusRoute, c.reqs[0].Route)
	})
}
