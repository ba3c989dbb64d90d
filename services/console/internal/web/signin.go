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
// or token; scope: account, ip, device or throttle).
type signInMetrics struct {
	failures *prometheus.CounterVec
	lockouts *prometheus.CounterVec
}

func newSignInMetrics(f promauto.Factory) signInMetrics {
	return signInMetrics{
		failures: f.NewCounterVec(prometheus.CounterOpts{Name: "floodgate_console_auth_failures_total",
			Help: "Failed sign-ins and API-token authentications by kind (password, token)."}, []string{"kind"}),
		lockouts: f.NewCounterVec(prometheus.CounterOpts{Name: "floodgate_console_auth_lockouts_total",
			Help: "Authentication attempts refused by the failure limits, by kind and scope (account: the account from this address; ip; device: a known device; throttle: an account's unknown devices slowed)."}, []string{"kind", "scope"}),
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

// attempt is a sign-in attempt for account: the client address and, when
// the browser carries a valid device cookie for the account, the device.
func (s *Server) attempt(r *http.Request, account string) auth.Attempt {
	a := auth.Attempt{Account: account, IP: s.clientIP(r)}
	if s.cfg.Devices == nil || account == "" {
		return a
	}
	if c, err := r.Cookie(s.cfg.Devices.Name(account)); err == nil {
		if id, ok := s.cfg.Devices.Verify(account, c.Value); ok {
			a.Device = id
		}
	}
	return a
}

// setDeviceCookie gives the browser that just signed in as account a fresh
// device cookie, sent back only to the sign-in form.
func (s *Server) setDeviceCookie(w http.ResponseWriter, r *http.Request, account string) {
	if s.cfg.Devices == nil {
		return
	}
	v, err := s.cfg.Devices.Issue(account)
	if err != nil {
		s.cfg.Log.Error("issue device cookie", "user", account, "err", err)
		return
	}
	http.SetCookie(w, &http.Cookie{Name: s.cfg.Devices.Name(account), Value: v, Path: "/login",
		MaxAge: int(s.cfg.Devices.TTL().Seconds()), HttpOnly: true, Secure: s.cfg.SecureCookies || r.TLS != nil,
		SameSite: http.SameSiteStrictMode})
}

// lockedOut checks the failure limits before an attempt; it reports the
// lockout (and sets Retry-After) or, when Redis cannot answer, an error.
func (s *Server) lockedOut(w http.ResponseWriter, ctx context.Context, kind string, a auth.Attempt) (auth.Lockout, error) {
	if s.cfg.SignIn == nil {
		return auth.Lockout{}, nil
	}
	lock, err := s.cfg.SignIn.Check(ctx, a)
	if err != nil {
		return auth.Lockout{}, err
	}
	if lock.Locked {
		s.signIn.lockouts.WithLabelValues(kind, lock.Scope).Inc()
		s.cfg.Log.Warn("authentication locked out", "kind", kind, "user", a.Account, "remote", a.IP.String(), "scope", lock.Scope,
			"known_device", a.Device != "", "retry_after", lock.RetryAfter.Round(time.Second).String())
		w.Header().Set("Retry-After", strconv.Itoa(retrySeconds(lock.RetryAfter)))
	}
	return lock, nil
}

// failed counts a failure against the limits, logs it, and audits every
// limit it reached on an account of the users file (lockouts of invented
// names and of addresses are logged and counted only: anyone can cause
// those in bulk).
func (s *Server) failed(ctx context.Context, kind string, a auth.Attempt, corr string) {
	s.signIn.failures.WithLabelValues(kind).Inc()
	if s.cfg.SignIn == nil {
		return
	}
	lock, began, err := s.cfg.SignIn.Fail(ctx, a)
	if err != nil {
		s.cfg.Log.Error("count authentication failure", "kind", kind, "err", err)
	}
	if lock.Locked {
		s.cfg.Log.Warn("authentication limit reached", "kind", kind, "user", a.Account, "remote", a.IP.String(), "scope", lock.Scope,
			"known_device", a.Device != "", "retry_after", lock.RetryAfter.Round(time.Second).String())
	}
	if a.Account == "" || s.cfg.Store == nil {
		return
	}
	if _, known := s.cfg.Directory.User(a.Account); !known {
		return
	}
	for _, b := range began {
		if b.Scope == auth.ScopeIP {
			continue
		}
		reason := s.lockoutReason(a, b)
		s.cfg.Log.Warn("sign-in lockout", "user", a.Account, "remote", a.IP.String(), "scope", b.Scope, "reason", reason)
		actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
		err := s.cfg.Store.RecordSignInLockout(actx, a.Account, b.Scope, a.IP.String(), s.cfg.Now().Add(b.For), reason, corr)
		cancel()
		if err != nil {
			s.cfg.Log.Error("audit sign-in lockout", "user", a.Account, "scope", b.Scope, "err", err)
		}
	}
}

// lockoutReason is the audit row's reason for a limit a reached.
func (s *Server) lockoutReason(a auth.Attempt, b auth.Began) string {
	l := s.cfg.SignIn
	until := s.cfg.Now().Add(b.For).UTC().Format(time.RFC3339)
	switch b.Scope {
	case auth.ScopeAccount:
		return fmt.Sprintf("%d failed sign-ins for %s from %s within %s: browsers there without a device cookie for it are locked out of it until %s; other addresses and known devices are not",
			l.PerAccountClient, a.Account, a.IP, l.Window, until)
	case auth.ScopeDevice:
		return fmt.Sprintf("%d failed sign-ins for %s from one known device (at %s) within %s: that device cookie is locked out until %s",
			l.PerDevice, a.Account, a.IP, l.Window, until)
	case auth.ScopeThrottle:
		return fmt.Sprintf("%d failed sign-ins for %s from unknown devices within %s (the last from %s): unknown devices get one attempt per %s for it while they go on; known devices are not slowed",
			l.AccountThrottle, a.Account, l.Window, a.IP, l.ThrottleInterval)
	}
	return fmt.Sprintf("%s limit reached for %s from %s", b.Scope, a.Account, a.IP)
}

func retrySeconds(d time.Duration) int { return max(1, int(math.Ceil(d.Seconds()))) }

// lockoutMessage tells the person at the sign-in form what happened.
func lockoutMessage(l auth.Lockout) string {
	wait := fmt.Sprintf("%d minutes", (retrySeconds(l.RetryAfter)+59)/60)
	if l.RetryAfter <= time.Minute {
		wait = fmt.Sprintf("%d seconds", retrySeconds(l.RetryAfter))
	}
	switch l.Scope {
	case auth.ScopeIP:
		return "Too many failed sign-ins from your network. Try again in " + wait + "."
	case auth.ScopeDevice:
		return "Too many failed sign-ins for this account from this browser. Try again in " + wait + ", or ask an admin."
	case auth.ScopeThrottle:
		return "Too many failed sign-ins for this account from new browsers: they may try once in a while. Try again in " + wait +
			", or sign in from a browser you have used before."
	}
	return "Too many failed sign-ins for this account from your network. Try again in " + wait +
		", sign in from a browser you have used before, or ask an admin."
}
