package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/floodgate-dev/floodgate/pkg/events"
)

func TestClientIP(t *testing.T) {
	trusted, err := ParseTrustedProxies([]string{"10.0.0.0/8", "::1"})
	require.NoError(t, err)
	cases := []struct {
		name, remote string
		xff          []string
		want         string
	}{
		{"direct client, header ignored", "203.0.113.7:5555", []string{"1.2.3.4"}, "203.0.113.7"},
		{"through one trusted proxy", "10.0.0.2:80", []string{"198.51.100.9"}, "198.51.100.9"},
		{"spoofed entry before the real client is ignored", "10.0.0.2:80", []string{"1.2.3.4, 198.51.100.9"}, "198.51.100.9"},
		{"chain of trusted proxies", "10.0.0.2:80", []string{"198.51.100.9, 10.1.1.1", "10.2.2.2"}, "198.51.100.9"},
		{"garbage stops the walk at the last trusted hop", "10.0.0.2:80", []string{"not-an-ip"}, "10.0.0.2"},
		{"ipv6 peer trusted", "[::1]:80", []string{"2001:db8::5"}, "2001:db8::5"},
		{"ipv4-mapped peer", "[::ffff:203.0.113.7]:80", nil, "203.0.113.7"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := httptest.NewRequest(http.MethodGet, "/", nil)
			r.RemoteAddr = tc.remote
			for _, h := range tc.xff {
				r.Header.Add("X-Forwarded-For", h)
			}
			got, err := ClientIP(r, trusted)
			require.NoError(t, err)
			require.Equal(t, tc.want, got.String())
		})
	}
	_, err = ParseTrustedProxies([]string{"10.0.0.0/33"})
	require.Error(t, err)
}

func TestRouterPicksMostSpecificAndFillsResource(t *testing.T) {
	r, err := NewRouter([]Route{
		{Method: "POST", Template: "/channels/{channel_id}/messages", Resource: "channel:{channel_id}"},
		{Method: "POST", Template: "/channels/{channel_id}/{action}"},
		{Method: "POST", Template: "/channels/bulk/messages", Cost: 10},
	}, "")
	require.NoError(t, err)
	cases := []struct {
		method, path string
		want         Match
	}{
		{"POST", "/channels/123/messages", Match{Template: "/channels/{channel_id}/messages", Resource: "channel:123", Cost: 1}},
		{"POST", "/channels/bulk/messages", Match{Template: "/channels/bulk/messages", Cost: 10}},
		{"POST", "/channels/123/typing", Match{Template: "/channels/{channel_id}/{action}", Cost: 1}},
		{"GET", "/channels/123/messages", Match{Template: "/{unmatched}", Cost: 1}},
		{"POST", "/channels//messages", Match{Template: "/{unmatched}", Cost: 1}},
		{"POST", "/channels/a%20b/messages", Match{Template: "/channels/{channel_id}/messages", Resource: "channel:a%20b", Cost: 1}},
	}
	for _, tc := range cases {
		t.Run(tc.method+" "+tc.path, func(t *testing.T) {
			require.Equal(t, tc.want, r.Match(tc.method, tc.path))
		})
	}
	_, err = NewRouter([]Route{{Method: "POST", Template: "/a/{id}", Resource: "thing:{other}"}}, "")
	require.ErrorContains(t, err, "{other} is not a parameter")
	_, err = NewRouter([]Route{{Method: "FETCH", Template: "/a"}}, "")
	require.Error(t, err)
	rt, err := ParseRoute("POST /channels/{channel_id}/messages resource=channel:{channel_id} cost=2")
	require.NoError(t, err)
	require.Equal(t, Route{Method: "POST", Template: "/channels/{channel_id}/messages", Resource: "channel:{channel_id}", Cost: 2}, rt)
	_, err = ParseRoute("POST /a cost=0")
	require.Error(t, err)
}

type fakeChecker struct {
	mu    sync.Mutex
	reqs  []Request
	allow bool
	shed  bool
	err   error
}

func (f *fakeChecker) Check(_ context.Context, r Request) (Decision, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.reqs = append(f.reqs, r)
	if f.err != nil {
		return Decision{}, f.err
	}
	d := Decision{Allowed: f.allow, Shed: f.shed, Headers: map[string]string{"X-RateLimit-Limit": "5", "X-RateLimit-Remaining": "0"}}
	if !f.allow {
		d.Headers["Retry-After"] = "3"
		d.Problem = json.RawMessage(`{"type":"https://floodgate.dev/problems/rate-limited","status":429}`)
	}
	return d, nil
}

func serve(t *testing.T, o Options, remote string, hdr map[string]string) *httptest.ResponseRecorder {
	mw, err := Middleware(o)
	require.NoError(t, err)
	h := mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusNoContent) }))
	r := httptest.NewRequest(http.MethodPost, "/channels/9/messages", nil)
	r.RemoteAddr = remote
	for k, v := range hdr {
		r.Header.Set(k, v)
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

func TestMiddlewareEnforcesDecisions(t *testing.T) {
	router, err := NewRouter([]Route{{Method: "POST", Template: "/channels/{channel_id}/messages", Resource: "channel:{channel_id}"}}, "")
	require.NoError(t, err)
	trusted, _ := ParseTrustedProxies([]string{"10.0.0.0/8"})

	allow := &fakeChecker{allow: true}
	w := serve(t, Options{Checker: allow, Router: router}, "203.0.113.7:1", nil)
	require.Equal(t, http.StatusNoContent, w.Code)
	require.Equal(t, "5", w.Header().Get("X-RateLimit-Limit"))
	require.Equal(t, Request{Principal: events.Principal{Kind: events.PrincipalAnonymous, ID: "203.0.113.7"}, IP: "203.0.113.7",
		Method: "POST", Route: "/channels/{channel_id}/messages", Resource: "channel:9", Cost: 1}, allow.reqs[0])

	deny := &fakeChecker{}
	w = serve(t, Options{Checker: deny, Router: router}, "203.0.113.7:1", nil)
	require.Equal(t, http.StatusTooManyRequests, w.Code)
	require.Equal(t, "3", w.Header().Get("Retry-After"))
	require.Equal(t, "application/problem+json", w.Header().Get("Content-Type"))
	require.JSONEq(t, `{"type":"https://floodgate.dev/problems/rate-limited","status":429}`, w.Body.String())

	// A request shed by its priority is a 503: the platform is short of
	// capacity, not the client over a limit. The priority is the gateway's.
	shed := &fakeChecker{shed: true}
	w = serve(t, Options{Checker: shed, Router: router, Priority: func(*http.Request) string { return "bulk" }}, "203.0.113.7:1", nil)
	require.Equal(t, http.StatusServiceUnavailable, w.Code)
	require.Equal(t, "3", w.Header().Get("Retry-After"))
	require.Equal(t, "bulk", shed.reqs[0].Priority)

	// Principal headers count only when they come through a trusted proxy.
	pf := PrincipalFromHeaders("X-Principal-Kind", "X-Principal-Id", trusted)
	hdr := map[string]string{"X-Principal-Kind": "bot", "X-Principal-Id": "bot_1", "X-Forwarded-For": "198.51.100.4"}
	c := &fakeChecker{allow: true}
	serve(t, Options{Checker: c, Principal: pf, TrustedProxies: trusted}, "10.0.0.9:1", hdr)
	serve(t, Options{Checker: c, Principal: pf, TrustedProxies: trusted}, "203.0.113.50:1", hdr)
	require.Equal(t, "bot:bot_1", c.reqs[0].Principal.Key())
	require.Equal(t, "198.51.100.4", c.reqs[0].IP)
	require.Equal(t, "anonymous:203.0.113.50", c.reqs[1].Principal.Key(), "a client cannot claim a principal")
}

func TestMiddlewareFailPolicy(t *testing.T) {
	down := &fakeChecker{err: errors.New("connection refused")}
	w := serve(t, Options{Checker: down}, "203.0.113.7:1", nil)
	require.Equal(t, http.StatusNoContent, w.Code, "fails open by default")
	require.Contains(t, w.Header().Get("X-RateLimit-Error"), "failing open")
	w = serve(t, Options{Checker: down, FailClosed: true}, "203.0.113.7:1", nil)
	require.Equal(t, http.StatusServiceUnavailable, w.Code)
	require.Contains(t, w.Header().Get("X-RateLimit-Error"), "failing closed")
	_, err := Middleware(Options{})
	require.Error(t, err)
}

func TestReverseProxyForwardsAllowedOnly(t *testing.T) {
	var got *http.Request
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got = r
		w.WriteHeader(http.StatusOK)
	}))
	defer upstream.Close()
	u, _ := url.Parse(upstream.URL)
	c := &fakeChecker{allow: true}
	h, err := NewReverseProxy(u, Options{Checker: c})
	require.NoError(t, err)
	r := httptest.NewRequest(http.MethodPost, "/channels/9/messages", nil)
	r.RemoteAddr = "203.0.113.7:1"
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	require.Equal(t, http.StatusOK, w.Code)
	require.NotNil(t, got)
	require.Equal(t, "203.0.113.7", got.Header.Get("X-Forwarded-For"))

	got = nil
	c.allow = false
	w = httptest.NewRecorder()
	h.ServeHTTP(w, r)
	require.Equal(t, http.StatusTooManyRequests, w.Code)
	require.Nil(t, got, "a denied request never reaches the upstream")
}

// TestSecurityAnonymousIPv6IsKeyedByPrefixS14: a client rotating through the
// addresses of its /64 stays one anonymous principal.
func TestSecurityAnonymousIPv6IsKeyedByPrefixS14(t *testing.T) {
	for _, tc := range []struct {
		bits     int
		distinct int
	}{{0, 1}, {48, 1}, {128, 40}} {
		c := &fakeChecker{allow: true}
		for i := range 40 {
			serve(t, Options{Checker: c, AnonymousIPv6Prefix: tc.bits}, fmt.Sprintf("[2001:db8:7:9::%x]:1", i+1), nil)
		}
		ids := map[string]bool{}
		for _, r := range c.reqs {
			ids[r.Principal.Key()] = true
		}
		require.Len(t, ids, tc.distinct, "prefix %d: %v", tc.bits, ids)
		if tc.bits == 0 {
			require.True(t, ids["anonymous:2001:db8:7:9::/64"], "default /64: %v", ids)
			require.Equal(t, "2001:db8:7:9::28", c.reqs[39].IP, "the IP tier still counts the address")
		}
	}
	c := &fakeChecker{allow: true}
	serve(t, Options{Checker: c}, "203.0.113.7:1", nil)
	require.Equal(t, "anonymous:203.0.113.7", c.reqs[0].Principal.Key(), "IPv4 is keyed whole")
	_, err := Middleware(Options{Checker: c, AnonymousIPv6Prefix: 129})
	require.ErrorContains(t, err, "AnonymousIPv6Prefix")
	_, err = Middleware(Options{Checker: c, PrincipalHeaders: &PrincipalHeaders{Kind: "X-P", ID: "x-p"}})
	require.ErrorContains(t, err, "PrincipalHeaders")
}

// TestSecurityIdentityHeadersS14: trusting a load balancer's X-Forwarded-For
// does not let clients behind it name a principal, and what a client sent in
// the identity headers never reaches the upstream.
func TestSecurityIdentityHeadersS14(t *testing.T) {
	var got http.Header
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got = r.Header.Clone()
		w.WriteHeader(http.StatusOK)
	}))
	defer upstream.Close()
	u, _ := url.Parse(upstream.URL)
	lb, _ := ParseTrustedProxies([]string{"10.0.0.0/8"})         // forwards addresses only
	authn, _ := ParseTrustedProxies([]string{"192.168.50.0/24"}) // authenticates, sets the headers
	c := &fakeChecker{allow: true}
	h, err := NewReverseProxy(u, Options{Checker: c, TrustedProxies: append(lb, authn...),
		Principal:        PrincipalFromHeaders("X-Principal-Kind", "X-Principal-Id", authn),
		PrincipalHeaders: &PrincipalHeaders{Kind: "X-Principal-Kind", ID: "X-Principal-Id"}})
	require.NoError(t, err)
	send := func(peer string) {
		r := httptest.NewRequest(http.MethodGet, "/users/@me", nil)
		r.RemoteAddr = peer
		r.Header.Set("X-Forwarded-For", "198.51.100.4")
		r.Header.Set("X-Principal-Kind", "bot")
		r.Header.Set("X-Principal-Id", "victim")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		require.Equal(t, http.StatusOK, w.Code)
	}

	send("10.1.2.3:1") // through the load balancer: the address is believed, the claim is not
	require.Equal(t, "anonymous:198.51.100.4", c.reqs[0].Principal.Key())
	require.Equal(t, "anonymous", got.Get("X-Principal-Kind"), "the client's claim is replaced")
	require.Equal(t, "198.51.100.4", got.Get("X-Principal-Id"))

	send("192.168.50.7:1") // through the authenticating layer: its headers are believed
	require.Equal(t, "bot:victim", c.reqs[1].Principal.Key())
	require.Equal(t, "bot", got.Get("X-Principal-Kind"))
	require.Equal(t, "victim", got.Get("X-Principal-Id"))
}
