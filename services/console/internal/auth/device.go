package auth

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// DeviceCookies are OWASP's device cookies ("Slow Down Online Guessing
// Attacks with Device Cookies"): a browser that once signed in as a user
// carries a cookie saying so, signed under the console's server secret and
// bound to that user. The sign-in limits treat such a browser as a known
// device: failures from elsewhere — any number of addresses — never lock it
// out, and its own failures count against that cookie only (issue 22 S9).
//
// A cookie is "<nonce>.<issued unix seconds>.<MAC>", the MAC an HMAC-SHA256
// over the user name, the nonce and the issue time under a key derived from
// the server secret (never stored anywhere). Its name carries a MAC of the
// user name too (fgc_dev_<16 hex>), so one browser keeps one cookie per user
// and no cookie names a user in clear. Safe for concurrent use.
type DeviceCookies struct {
	key []byte
	ttl time.Duration
	now func() time.Time
}

// DefaultDeviceTTL is how long a device cookie stays valid after the
// sign-in that issued it (every sign-in issues a fresh one).
const DefaultDeviceTTL = 90 * 24 * time.Hour

// DeviceCookiePrefix begins every device cookie's name.
const DeviceCookiePrefix = "fgc_dev_"

// NewDeviceCookies returns device cookies signed under secret (at least
// MinSessionSecret bytes: the console's FLOODGATE_CONSOLE_SESSION_SECRET),
// valid for ttl.
func NewDeviceCookies(secret []byte, ttl time.Duration, now func() time.Time) (*DeviceCookies, error) {
	if len(secret) < MinSessionSecret {
		return nil, fmt.Errorf("device cookie secret: %d bytes, at least %d", len(secret), MinSessionSecret)
	}
	if ttl < time.Hour {
		return nil, fmt.Errorf("device cookie lifetime %s: at least 1h", ttl)
	}
	if now == nil {
		now = time.Now
	}
	m := hmac.New(sha256.New, secret)
	_, _ = m.Write([]byte("floodgate console device cookies v1"))
	return &DeviceCookies{key: m.Sum(nil), ttl: ttl, now: now}, nil
}

// TTL is the cookies' lifetime.
func (d *DeviceCookies) TTL() time.Duration { return d.ttl }

func (d *DeviceCookies) mac(parts ...string) []byte { return macOf(d.key, parts...) }

// Name is the cookie name of account's device cookie.
func (d *DeviceCookies) Name(account string) string {
	return DeviceCookiePrefix + hex.EncodeToString(d.mac("name", account)[:8])
}

// Issue returns a fresh device cookie value for account.
func (d *DeviceCookies) Issue(account string) (string, error) {
	var n [16]byte
	if _, err := rand.Read(n[:]); err != nil {
		return "", fmt.Errorf("device cookie: %w", err)
	}
	nonce := base64.RawURLEncoding.EncodeToString(n[:])
	issued := strconv.FormatInt(d.now().Unix(), 10)
	return nonce + "." + issued + "." + base64.RawURLEncoding.EncodeToString(d.mac("device", account, nonce, issued)), nil
}

// Verify returns the device id of a cookie value issued for account (the
// key its failures are counted under), or false when the value is not one:
// malformed, signed for another user or under another secret, or expired.
func (d *DeviceCookies) Verify(account, value string) (string, bool) {
	if account == "" || len(value) > 200 {
		return "", false
	}
	nonce, rest, ok := strings.Cut(value, ".")
	if !ok {
		return "", false
	}
	issued, sig, ok := strings.Cut(rest, ".")
	if !ok || nonce == "" {
		return "", false
	}
	got, err := base64.RawURLEncoding.DecodeString(sig)
	if err != nil || !hmac.Equal(got, d.mac("device", account, nonce, issued)) {
		return "", false
	}
	at, err := strconv.ParseInt(issued, 10, 64)
	if err != nil {
		return "", false
	}
	if age := d.now().Sub(time.Unix(at, 0)); age > d.ttl || age < -time.Hour {
		return "", false
	}
	return hex.EncodeToString(d.mac("id", account, nonce)[:16]), true
}
