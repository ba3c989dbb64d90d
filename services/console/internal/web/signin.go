package web

import (
	"context"
	"fmt"
	"math"
	"net/http"
	"net/netip"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"

	"github.com/floodgate-dev/floodgate/pkg/gateway"
	"github.com/floodgate-dev/floodgate/services/console/internal/auth"
)

// signInMetrics count authentication failures and lockouts (kind: password
// or token; scope: account or ip).
type signInMetrics struct {
	failures *prometheus.CounterVec
	lockouts *prometheus.CounterVec
}

func newSignInMetrics(f promauto.Factory) signInMetrics {
	return signInMetrics{
		failures: f.NewCounterVec(prometheus.CounterOpts{Name: "floodgate_console_auth_failures_total",
			Help: "Failed sign-ins and API-token authentications by kind (password, token)."}, []string{"kind"}),
		lockouts: f.NewCounterVec(prometheus.CounterOpts{Name: "floodgate_console_auth_lockouts_total",
			Help: "Authentication attempts refused by the failure limits, by kind and scope (account, ip)."}, []string{"kind", "scope"}),
	}
}

// clientIP is the address the failure limits count: the TCP peer, or the
// client a trusted proxy names in X-Forwarded-For.
func (s *Server) clientIP(r *http.Request) netip.Addr {
	ip, err := gateway.ClientIP(r, s.cfg.Proxies)
	if err != nil {
		return netip.Addr{}
	}
	return ip
}

// lockedOut checks the failure limits before an attempt; it reports the
// lockout (and sets Retry-After) or, when Redis cannot answer, an error.
func (s *Server) lockedOut(w http.ResponseWriter, ctx context.Context, kind, account string, ip netip.Addr) (auth.Lockout, error) {
	if s.cfg.SignIn == nil {
		return auth.Lockout{}, nil
	}
	lock, err := s.cfg.SignIn.Check(ctx, account, ip)
	if err != nil {
		return auth.Lockout{}, err
	}
	if lock.Locked {
		s.signIn.lockouts.WithLabelValues(kind, lock.Scope).Inc()
		s.cfg.Log.Warn("authentication locked out", "kind", kind, "user", account, "remote", ip.String(), "scope", lock.Scope,
			"retry_after", lock.RetryAfter.Round(time.Second).String())
		w.Header().Set("Retry-After", strconv.Itoa(retrySeconds(lock.RetryAfter)))
	}
	return lock, nil
}

// failed counts a failure against the limits and logs it.
func (s *Server) failed(ctx context.Context, kind, account string, ip netip.Addr) {
	s.signIn.failures.WithLabelValues(kind).Inc()
	if s.cfg.SignIn == nil {
		return
	}
	lock, err := s.cfg.SignIn.Fail(ctx, account, ip)
	if err != nil {
		s.cfg.Log.Error("count authentication failure", "kind", kind, "err", err)
		return
	}
	if lock.Locked {
		s.cfg.Log.Warn("authentication limit reached", "kind", kind, "user", account, "remote", ip.String(), "scope", lock.Scope,
			"retry_after", lock.RetryAfter.Round(time.Second).String())
	}
}

func retrySeconds(d time.Duration) int { return max(1, int(math.Ceil(d.Seconds()))) }

// lockoutMessage tells the person at the sign-in form what happened.
func lockoutMessage(l auth.Lockout) string {
	wait := fmt.Sprintf("%d minutes", (retrySeconds(l.RetryAfter)+59)/60)
	if l.RetryAfter <= time.Minute {
		wait = fmt.Sprintf("%d seconds", retrySeconds(l.RetryAfter))
	}
	if l.Scope == "ip" {
		return "Too many failed sign-ins from your network. Try again in " + wait + "."
	}
	return "Too many failed sign-ins for this account. Try again in " + wait + ", or ask an admin."
}
