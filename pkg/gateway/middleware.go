package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httputil"
	"net/netip"
	"net/url"
	"strings"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/floodgate-dev/floodgate/pkg/events"
	"github.com/floodgate-dev/floodgate/pkg/tracing"
)

// PrincipalFunc identifies who made a request. It runs after the gateway's own
// authentication; ok=false falls back to an anonymous principal keyed by client IP.
type PrincipalFunc func(r *http.Request) (events.Principal, bool)

// Options configure the middleware.
type Options struct {
	Checker   Checker
	Router    *Router
	Principal PrincipalFunc // nil: every request is anonymous, keyed by client IP
	// Priority names a request's priority bucket (critical, degraded,
	// best_effort, bulk); nil or "" leaves it to the limiter's rules.
	Priority func(r *http.Request) string
	// TrustedProxies are the hops whose X-Forwarded-For entries are believed
	// for the client's address. Believing a proxy's address never means
	// believing identity headers: PrincipalFromHeaders takes its own set.
	TrustedProxies TrustedProxies
	// AnonymousIPv6Prefix is how many leading bits of an IPv6 client address
	// key an anonymous principal (default 64: one subscriber's /64, whose
	// 2^64 addresses are otherwise 2^64 fresh buckets; 128 = the address).
	// IPv4 addresses are always keyed whole.
	AnonymousIPv6Prefix int
	// PrincipalHeaders, when set, are the identity headers the middleware
	// owns: whatever the client sent in them is removed before the request
	// goes on, and the principal the check was made for — verified or
	// anonymous — is written in their place, so what is behind reads only
	// what Floodgate decided on.
	PrincipalHeaders *PrincipalHeaders
	// FailClosed answers 503 when the limiter cannot be asked; the default (false)
	// lets the request through and marks the response with X-RateLimit-Error, so a
	// limiter outage never becomes an outage of the API behind it.
	FailClosed bool
	Timeout    time.Duration // per check; default 50ms
	Logger     *slog.Logger
	// Responses, when set, counts every response by the status the client
	// received (429s from the limiter included), e.g. an influxresponses.Counter that feeds
	// the adjuster's error-rate signal.
	Responses ResponseCounter
	// Tracing, when on, makes every check a "floodgate.check" span, the child
	// of the request's own span, with the principal kind, route and decision
	// as attributes (give the Client the same Tracing so the check request
	// carries its traceparent to the limiter). Off costs nothing.
	Tracing tracing.Tracing
	// Deferrer, when set, queues denied and shed requests on deferrable
	// routes instead of refusing them, and serves GET /v1/deferred/{id}
	// (pkg/deferred; docs/deferred.md). Nil refuses as always.
	Deferrer Deferrer
}

// PrincipalHeaders names the headers that carry a principal's kind and id.
type PrincipalHeaders struct{ Kind, ID string }

// AnonymousID is the id of the anonymous principal for a client address:
// an IPv4 address whole, an IPv6 address masked to its first v6Bits bits
// (the prefix in CIDR form, or the address itself at 128).
func AnonymousID(a netip.Addr, v6Bits int) string {
	a = a.Unmap().WithZone("")
	if a.Is4() || v6Bits >= 128 {
		return a.String()
	}
	return netip.PrefixFrom(a, v6Bits).Masked().String()
}

// Middleware enforces the limiter's decisions on next: allowed requests go through
// with the rate-limit headers added, denied ones get a 429 with the headers and the
// RFC 9457 problem body the limiter chose — a 503 when the limiter shed the
// request by its priority.
func Middleware(o Options) (func(http.Handler) http.Handler, error) {
	if o.Checker == nil {
		return nil, errors.New("gateway: Options.Checker is required")
	}
	if o.Router == nil {
		r, err := NewRouter(nil, "")
		if err != nil {
			return nil, err
		}
		o.Router = r
	}
	if o.Timeout <= 0 {
		o.Timeout = 50 * time.Millisecond
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.AnonymousIPv6Prefix == 0 {
		o.AnonymousIPv6Prefix = 64
	}
	if o.AnonymousIPv6Prefix < 1 || o.AnonymousIPv6Prefix > 128 {
		return nil, fmt.Errorf("gateway: Options.AnonymousIPv6Prefix %d: must be in 1..128", o.AnonymousIPv6Prefix)
	}
	if h := o.PrincipalHeaders; h != nil && (h.Kind == "" || h.ID == "" || strings.EqualFold(h.Kind, h.ID)) {
		return nil, errors.New("gateway: Options.PrincipalHeaders needs two different header names")
	}
	tracer := o.Tracing.Tracer()
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if o.Responses != nil {
				rec := &statusRecorder{ResponseWriter: w}
				defer func() {
					if rec.status == 0 {
						rec.status = http.StatusOK
					}
					o.Responses.Count(rec.status)
				}()
				w = rec
			}
			ip, err := ClientIP(r, o.TrustedProxies)
			if err != nil {
				writeProblem(w, http.StatusBadRequest, "https://floodgate.dev/problems/invalid-request", err.Error())
				return
			}
			m := o.Router.Match(r.Method, r.URL.EscapedPath())
			p, ok := events.Principal{}, false
			if o.Principal != nil {
				p, ok = o.Principal(r)
			}
			if !ok {
				p = events.Principal{Kind: events.PrincipalAnonymous, ID: AnonymousID(ip, o.AnonymousIPv6Prefix)}
			}
			if h := o.PrincipalHeaders; h != nil {
				r.Header.Set(h.Kind, string(p.Kind))
				r.Header.Set(h.ID, p.ID)
			}
			// A status poll is checked like any request, as its own route;
			// it is answered by the Deferrer, never deferred.
			poll := o.Deferrer != nil && IsDeferredStatus(r)
			serve := next
			if poll {
				m = Match{Template: DeferredStatusRoute, Cost: 1}
				serve = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					if !o.Deferrer.ServeStatus(w, r, p) {
						next.ServeHTTP(w, r)
					}
				})
			}
			var prio string
			if o.Priority != nil {
				prio = o.Priority(r)
			}
			ctx, cancel := context.WithTimeout(r.Context(), o.Timeout)
			var span trace.Span
			if o.Tracing.Enabled() {
				ctx, span = tracer.Start(ctx, "floodgate.check", trace.WithAttributes(
					attribute.String(tracing.AttrPrincipalKind, string(p.Kind)), semconv.HTTPRoute(m.Template)))
			}
			req := Request{Principal: p, IP: ip.String(), Method: r.Method, Route: m.Template, Resource: m.Resource, Cost: m.Cost, Priority: prio}
			d, err := o.Checker.Check(ctx, req)
			cancel()
			if span != nil {
				if err != nil {
					span.RecordError(err)
					span.SetStatus(codes.Error, "limiter unavailable")
				} else {
					span.SetAttributes(attribute.String(tracing.AttrDecisionID, d.ID), attribute.Bool(tracing.AttrAllowed, d.Allowed),
						attribute.String(tracing.AttrTier, d.Tier))
				}
				span.End()
			}
			if err != nil {
				o.Logger.Warn("rate-limit check failed", "principal", p.Key(), "err", err)
				if o.FailClosed {
					w.Header().Set("X-RateLimit-Error", "limiter unavailable; failing closed")
					writeProblem(w, http.StatusServiceUnavailable, "https://floodgate.dev/problems/unavailable", "rate limiter unavailable")
					return
				}
				w.Header().Set("X-RateLimit-Error", "limiter unavailable; failing open")
				serve.ServeHTTP(w, r)
				return
			}
			if !d.Allowed && !poll && o.Deferrer != nil && o.Deferrer.Defer(w, r, req, d) {
				return
			}
			for k, v := range d.Headers {
				w.Header().Set(k, v)
			}
			if !d.Allowed {
				w.Header().Set("Content-Type", "application/problem+json")
				if d.Shed {
					w.WriteHeader(http.StatusServiceUnavailable)
				} else {
					w.WriteHeader(http.StatusTooManyRequests)
				}
				_, _ = w.Write(d.Problem)
				return
			}
			serve.ServeHTTP(w, r)
		})
	}, nil
}

// PrincipalFromHeaders reads the principal from headers an authenticating layer in
// front of the proxy sets (e.g. X-Principal-Kind / X-Principal-Id). They are
// believed only when the request's TCP peer is in trusted — the layers that
// authenticate, a set apart from the proxies whose X-Forwarded-For is believed
// (a load balancer that only forwards addresses must not be able to name
// principals). Set Options.PrincipalHeaders to the same names so that what a
// client sent in them never reaches the upstream.
func PrincipalFromHeaders(kindHeader, idHeader string, trusted TrustedProxies) PrincipalFunc {
	return func(r *http.Request) (events.Principal, bool) {
		p := events.Principal{Kind: events.PrincipalKind(r.Header.Get(kindHeader)), ID: r.Header.Get(idHeader)}
		if p.Validate() != nil || !fromTrusted(r, trusted) {
			return events.Principal{}, false
		}
		return p, true
	}
}

func fromTrusted(r *http.Request, trusted TrustedProxies) bool {
	peer, err := peerAddr(r)
	return err == nil && trusted.contains(peer)
}

// NewReverseProxy puts the middleware in front of upstream: Floodgate as a
// rate-limiting reverse proxy for services that do not embed it.
func NewReverseProxy(upstream *url.URL, o Options) (http.Handler, error) {
	mw, err := Middleware(o)
	if err != nil {
		return nil, err
	}
	var transport http.RoundTripper
	if o.Tracing.Enabled() {
		transport = o.Tracing.Transport(nil) // the upstream call is a client span, its traceparent the upstream's parent
	}
	proxy := &httputil.ReverseProxy{
		Transport: transport,
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(upstream)
			pr.SetXForwarded()
		},
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			o.Logger.Warn("upstream", "err", err)
			writeProblem(w, http.StatusBadGateway, "https://floodgate.dev/problems/upstream-unavailable", "upstream unavailable")
		},
	}
	return mw(proxy), nil
}

func writeProblem(w http.ResponseWriter, status int, typ, detail string) {
	w.Header().Set("Content-Type", "application/problem+json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]any{"type": typ, "title": http.StatusText(status), "status": status, "detail": detail})
}
