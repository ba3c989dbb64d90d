package auth

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/netip"
	"time"

	"github.com/redis/go-redis/v9"
)

// Limiter counts failed sign-ins and API-token failures in Redis, per account
// and per client address, so a password cannot be guessed faster than the
// limits allow on any number of console replicas. Each counter is a fixed
// window that starts at its first failure: after PerAccount failures for one
// user name, or PerIP failures from one client (an IPv4 address or an IPv6
// /64), further attempts are refused until the window ends — without looking
// at the password. A successful sign-in clears its account's counter. Safe
// for concurrent use.
type Limiter struct {
	rdb        redis.UniversalClient
	prefix     string
	Window     time.Duration
	PerAccount int64
	PerIP      int64
}

// NewLimiter returns a limiter with keys under prefix
// (fg:console:authfail: in production): 5 failures per account and 20 per
// client address per 15 minutes.
func NewLimiter(rdb redis.UniversalClient, prefix string) *Limiter {
	return &Limiter{rdb: rdb, prefix: prefix, Window: 15 * time.Minute, PerAccount: 5, PerIP: 20}
}

// Lockout says whether an attempt may go ahead.
type Lockout struct {
	Locked     bool
	Scope      string        // "account" or "ip" when locked
	RetryAfter time.Duration // until the locking window ends
}

// accountKey hashes the name: user input never shapes a key.
func (l *Limiter) accountKey(name string) string {
	sum := sha256.Sum256([]byte(name))
	return l.prefix + "acct:" + hex.EncodeToString(sum[:16])
}

// ipKey counts an IPv4 address, or an IPv6 address by its /64 (one host
// holds a whole /64).
func (l *Limiter) ipKey(ip netip.Addr) string {
	ip = ip.Unmap()
	if ip.Is6() {
		p, _ := ip.Prefix(64)
		ip = p.Addr()
	}
	return l.prefix + "ip:" + hex.EncodeToString(ip.AsSlice())
}

// checkScript returns, for each key, its count and its remaining TTL (ms).
var checkScript = redis.NewScript(`
local out = {}
for i, k in ipairs(KEYS) do
  out[#out+1] = tonumber(redis.call('GET', k) or '0')
  out[#out+1] = redis.call('PTTL', k)
end
return out`)

// failScript counts one failure on each key; a key's window starts with its
// first failure. Returns the counts and TTLs like checkScript.
var failScript = redis.NewScript(`
local out = {}
for i, k in ipairs(KEYS) do
  local n = redis.call('INCR', k)
  if n == 1 or redis.call('PTTL', k) < 0 then redis.call('PEXPIRE', k, ARGV[1]) end
  out[#out+1] = n
  out[#out+1] = redis.call('PTTL', k)
end
return out`)

func (l *Limiter) keys(account string, ip netip.Addr) ([]string, []int64, []string) {
	var keys []string
	var limits []int64
	var scopes []string
	if account != "" {
		keys, limits, scopes = append(keys, l.accountKey(account)), append(limits, l.PerAccount), append(scopes, "account")
	}
	if ip.IsValid() {
		keys, limits, scopes = append(keys, l.ipKey(ip)), append(limits, l.PerIP), append(scopes, "ip")
	}
	return keys, limits, scopes
}

// Check reports whether account (empty for an API token) from ip is locked
// out. Counters live in separate keys (they may sit on different cluster
// slots), so each is read by its own call.
func (l *Limiter) Check(ctx context.Context, account string, ip netip.Addr) (Lockout, error) {
	return l.run(ctx, checkScript, account, ip)
}

// Fail counts a failure of account (empty for an API token) from ip and
// reports whether this or a later attempt is locked out.
func (l *Limiter) Fail(ctx context.Context, account string, ip netip.Addr) (Lockout, error) {
	return l.run(ctx, failScript, account, ip)
}

func (l *Limiter) run(ctx context.Context, script *redis.Script, account string, ip netip.Addr) (Lockout, error) {
	keys, limits, scopes := l.keys(account, ip)
	var out Lockout
	for i, k := range keys {
		res, err := script.Run(ctx, l.rdb, []string{k}, l.Window.Milliseconds()).Int64Slice()
		if err != nil {
			return Lockout{}, fmt.Errorf("sign-in failures of %s: %w", scopes[i], err)
		}
		n, ttl := res[0], time.Duration(res[1])*time.Millisecond
		// Check: locked once the limit is reached. Fail: this failure is
		// counted; the next attempt is locked once the limit is reached.
		if n >= limits[i] {
			if ttl < 0 {
				ttl = l.Window
			}
			if !out.Locked || ttl > out.RetryAfter {
				out = Lockout{Locked: true, Scope: scopes[i], RetryAfter: ttl}
			}
		}
	}
	return out, nil
}

// Succeed clears the account's failures after a successful sign-in; the
// client address's counter stays (one right password must not reset a
// spray across accounts).
func (l *Limiter) Succeed(ctx context.Context, account string) error {
	if err := l.rdb.Del(ctx, l.accountKey(account)).Err(); err != nil {
		return fmt.Errorf("clear sign-in failures: %w", err)
	}
	return nil
}
