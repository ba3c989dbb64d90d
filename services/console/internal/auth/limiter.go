package auth

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/netip"
	"time"

	"github.com/redis/go-redis/v9"
)

// Limiter counts failed sign-ins and API-token failures in Redis, so a
// password cannot be guessed faster than the limits allow on any number of
// console replicas — and so that nobody can lock a named account out by
// failing to sign in as it (issue 22 S9; OWASP's authentication and device
// cookie guidance). Every counter is a fixed window that starts at its first
// failure. An attempt comes either from a known device (a browser carrying a
// valid device cookie for the account, DeviceCookies) or from an unknown one:
//
//   - known device: its own failures count against that cookie only
//     (PerDevice); failures anywhere else never lock it out, so the owner
//     signs in from a browser they used before whatever an attacker does.
//   - unknown device: PerAccountClient failures of one account from one
//     client address lock that account from that address (not from others);
//     PerIP failures of any accounts (and unknown API tokens) from one
//     address lock that address; and once the account has AccountThrottle
//     failures from unknown devices anywhere (a distributed guess), unknown
//     devices get one attempt per ThrottleInterval for it — slowed, never
//     locked.
//
// Attempts refused by a limit are not checked and not counted. A successful
// sign-in clears the count it was held to (its device's, or the account's
// from that address), never the address's or the account-wide throttle.
// Safe for concurrent use.
type Limiter struct {
	rdb              redis.UniversalClient
	prefix           string
	Window           time.Duration
	PerAccountClient int64
	PerIP            int64
	AccountThrottle  int64
	ThrottleInterval time.Duration
	PerDevice        int64
}

// NewLimiter returns a limiter with keys under prefix
// (fg:console:authfail: in production): per 15 minutes, 5 failures per
// account and client address, 20 per client address, 5 per known device,
// and from 10 unknown-device failures of an account one attempt per 30 s.
func NewLimiter(rdb redis.UniversalClient, prefix string) *Limiter {
	return &Limiter{rdb: rdb, prefix: prefix, Window: 15 * time.Minute, PerAccountClient: 5, PerIP: 20,
		AccountThrottle: 10, ThrottleInterval: 30 * time.Second, PerDevice: 5}
}

// Attempt is one authentication attempt.
type Attempt struct {
	Account string     // the user name typed; "" for an API token
	IP      netip.Addr // the client address (IPv6 counted by its /64)
	// Device is the id of a valid device cookie for Account
	// (DeviceCookies.Verify); "" is an unknown device.
	Device string
}

// Scopes of a lockout (the metric label and the audit row's scope).
const (
	ScopeAccount  = "account"  // this account from this client address
	ScopeIP       = "ip"       // this client address
	ScopeDevice   = "device"   // this known device for this account
	ScopeThrottle = "throttle" // this account from unknown devices, slowed
)

// Lockout says whether an attempt may go ahead.
type Lockout struct {
	Locked     bool
	Scope      string        // a Scope* constant when locked
	RetryAfter time.Duration // until the locking window (or the throttle's interval) ends
}

// Began is a limit a failure reached: its scope and how long it holds.
type Began struct {
	Scope string
	For   time.Duration
}

// key hashes its parts: user input never shapes a key.
func (l *Limiter) key(kind string, parts ...string) string {
	h := sha256.New()
	for _, p := range parts {
		_, _ = fmt.Fprintf(h, "%d:%s", len(p), p)
	}
	return l.prefix + kind + ":" + hex.EncodeToString(h.Sum(nil)[:16])
}

// client is the counting unit of an address: IPv4, or an IPv6 /64 (one
// host holds a whole /64); "" for none.
func client(ip netip.Addr) string {
	if !ip.IsValid() {
		return ""
	}
	ip = ip.Unmap()
	if ip.Is6() {
		p, _ := ip.Prefix(64)
		ip = p.Addr()
	}
	return ip.String()
}

// ipKey keeps the layout of the keys it always had (the address in hex).
func (l *Limiter) ipKey(ip netip.Addr) string {
	ip = ip.Unmap()
	if ip.Is6() {
		p, _ := ip.Prefix(64)
		ip = p.Addr()
	}
	return l.prefix + "ip:" + hex.EncodeToString(ip.AsSlice())
}

type counter struct {
	key   string
	limit int64
	scope string
}

// counters are the limits an attempt is held to, except the throttle.
func (l *Limiter) counters(a Attempt) []counter {
	if a.Account != "" && a.Device != "" {
		return []counter{{l.key("dev", a.Account, a.Device), l.PerDevice, ScopeDevice}}
	}
	var out []counter
	if a.IP.IsValid() {
		out = append(out, counter{l.ipKey(a.IP), l.PerIP, ScopeIP})
	}
	if a.Account != "" {
		out = append(out, counter{l.key("acctip", a.Account, client(a.IP)), l.PerAccountClient, ScopeAccount})
	}
	return out
}

func (l *Limiter) throttleKey(account string) string { return l.key("acct", account) }
func (l *Limiter) gateKey(account string) string     { return l.key("gate", account) }

// checkScript returns a key's count and its remaining TTL (ms).
var checkScript = redis.NewScript(`
return {tonumber(redis.call('GET', KEYS[1]) or '0'), redis.call('PTTL', KEYS[1])}`)

// failScript counts one failure; the window starts with the first.
var failScript = redis.NewScript(`
local n = redis.call('INCR', KEYS[1])
if n == 1 or redis.call('PTTL', KEYS[1]) < 0 then redis.call('PEXPIRE', KEYS[1], ARGV[1]) end
return {n, redis.call('PTTL', KEYS[1])}`)

// count runs script on one key (each key may sit on its own cluster slot).
func (l *Limiter) count(ctx context.Context, script *redis.Script, key, scope string) (int64, time.Duration, error) {
	res, err := script.Run(ctx, l.rdb, []string{key}, l.Window.Milliseconds()).Int64Slice()
	if err != nil {
		return 0, 0, fmt.Errorf("sign-in failures of %s: %w", scope, err)
	}
	ttl := time.Duration(res[1]) * time.Millisecond
	if ttl < 0 {
		ttl = l.Window
	}
	return res[0], ttl, nil
}

func (out *Lockout) lock(scope string, ttl time.Duration) {
	if !out.Locked || ttl > out.RetryAfter {
		*out = Lockout{Locked: true, Scope: scope, RetryAfter: ttl}
	}
}

// Check reports whether attempt a may go ahead. For an unknown device on a
// throttled account it takes the account's one attempt of the interval, or
// reports the throttle with the time until the next one.
func (l *Limiter) Check(ctx context.Context, a Attempt) (Lockout, error) {
	var out Lockout
	for _, c := range l.counters(a) {
		n, ttl, err := l.count(ctx, checkScript, c.key, c.scope)
		if err != nil {
			return Lockout{}, err
		}
		if n >= c.limit {
			out.lock(c.scope, ttl)
		}
	}
	if out.Locked || a.Account == "" || a.Device != "" {
		return out, nil
	}
	n, _, err := l.count(ctx, checkScript, l.throttleKey(a.Account), ScopeThrottle)
	if err != nil {
		return Lockout{}, err
	}
	if n < l.AccountThrottle {
		return out, nil
	}
	gate := l.gateKey(a.Account)
	took, err := l.rdb.SetNX(ctx, gate, "1", l.ThrottleInterval).Result()
	if err != nil {
		return Lockout{}, fmt.Errorf("sign-in throttle: %w", err)
	}
	if took {
		return out, nil
	}
	wait, err := l.rdb.PTTL(ctx, gate).Result()
	if err != nil {
		return Lockout{}, fmt.Errorf("sign-in throttle: %w", err)
	}
	if wait <= 0 {
		wait = l.ThrottleInterval
	}
	out.lock(ScopeThrottle, wait)
	return out, nil
}

// Fail counts a failure of a. It reports the lockout a next attempt would
// meet and the limits this failure reached (each once per window: the
// failure that reached it), which the caller audits.
func (l *Limiter) Fail(ctx context.Context, a Attempt) (Lockout, []Began, error) {
	cs := l.counters(a)
	if a.Account != "" && a.Device == "" {
		cs = append(cs, counter{l.throttleKey(a.Account), l.AccountThrottle, ScopeThrottle})
	}
	var out Lockout
	var began []Began
	var errs []error
	for _, c := range cs {
		n, ttl, err := l.count(ctx, failScript, c.key, c.scope)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if n >= c.limit {
			if c.scope == ScopeThrottle {
				ttl = l.ThrottleInterval // slowed, not locked
			}
			out.lock(c.scope, ttl)
		}
		if n == c.limit {
			began = append(began, Began{Scope: c.scope, For: ttl})
		}
	}
	return out, began, errors.Join(errs...)
}

// Succeed clears, after a successful sign-in, the count the attempt was
// held to: its known device's, or an unknown device's count of the account
// from this address. The address's counter and the account-wide throttle
// stay (one right password must not reset a spray), and so does the
// address's count when the owner signs in there from a known device (it is
// someone else's).
func (l *Limiter) Succeed(ctx context.Context, a Attempt) error {
	key := l.key("acctip", a.Account, client(a.IP))
	if a.Device != "" {
		key = l.key("dev", a.Account, a.Device)
	}
	if err := l.rdb.Del(ctx, key).Err(); err != nil {
		return fmt.Errorf("clear sign-in failures: %w", err)
	}
	return nil
}
