// Package redisx holds what every Floodgate service shares about Redis: how a
// client is built from the configured addresses and how keys are spelled.
//
// Key layout. Everything about one principal lives under one hash tag, so the
// limiter's multi-tier Lua script never crosses a Redis Cluster slot:
//
//	fg:{<kind>:<id>}:tb:<tier>   token-bucket state of one tier
//	fg:{<kind>:<id>}:pen         the principal's penalty (hash: m, level, abuse_id, expires_at)
//	fg:{<kind>:<id>}:day:<date>  units the principal was allowed on that UTC day (YYYY-MM-DD);
//	                             the limiter increments it, the quota service re-seeds it
//
// The limiter's IP tier counts an address (IPv4) or a /64 (IPv6) as a principal of
// kind "ip" — fg:{ip:<addr>}:tb:<rule> — which no principal kind can collide with.
//
// Global keys, not under any principal's tag:
//
//	fg:scales                    hash scope → scale in (0,10]; written by the adjuster,
//	                             polled by every limiter (about once a second) and passed
//	                             into the check script as arguments
//	fg:limiters                  sorted set of live limiter instances (heartbeats)
//	fg:overrides                 hash of per-principal and per-plan rule overrides, polled
//	                             by the limiter (services/limiter runtime.go)
//	fg:detector:pager:open       hash of open PagerDuty incidents the detector resolves
//	                             when their penalty expires or is lifted
//	fg:console:session:<hmac>    a console session (server-side, expiring); the cookie
//	                             holds the id, Redis only its HMAC under the session secret
//	fg:console:session:revoked:<hmac>
//	                             a signed-out session, kept as long as a session can live
//
// Principal ids and IP literals come from the outside world. Escape encodes the
// bytes that could change a key's meaning (':' separates parts, '{' and '}'
// delimit the cluster hash tag, '%' is the escape itself, and control bytes) so
// "a}b" or "2001:db8::1" cannot move a key to another slot or collide with another key.
package redisx

import (
	"strings"
)

const hexDigits = "0123456789ABCDEF"

// Escape percent-encodes the bytes of s that are structural in a Floodgate key.
// It is injective: distinct inputs give distinct outputs.
func Escape(s string) string {
	n := 0
	for i := 0; i < len(s); i++ {
		if needsEscape(s[i]) {
			n++
		}
	}
	if n == 0 {
		return s
	}
	var b strings.Builder
	b.Grow(len(s) + 2*n)
	for i := 0; i < len(s); i++ {
		c := s[i]
		if needsEscape(c) {
			b.WriteByte('%')
			b.WriteByte(hexDigits[c>>4])
			b.WriteByte(hexDigits[c&0x0f])
			continue
		}
		b.WriteByte(c)
	}
	return b.String()
}

// Unescape reverses Escape. It reports false for malformed input.
func Unescape(s string) (string, bool) {
	if strings.IndexByte(s, '%') < 0 {
		return s, true
	}
	var b strings.Builder
	b.Grow(len(s))
	for i := 0; i < len(s); i++ {
		if s[i] != '%' {
			b.WriteByte(s[i])
			continue
		}
		if i+2 >= len(s) {
			return "", false
		}
		hi, ok1 := unhex(s[i+1])
		lo, ok2 := unhex(s[i+2])
		if !ok1 || !ok2 {
			return "", false
		}
		b.WriteByte(hi<<4 | lo)
		i += 2
	}
	return b.String(), true
}

func needsEscape(c byte) bool {
	return c == ':' || c == '{' || c == '}' || c == '%' || c < 0x20 || c == 0x7f || c == ' '
}

func unhex(c byte) (byte, bool) {
	switch {
	case c >= '0' && c <= '9':
		return c - '0', true
	case c >= 'A' && c <= 'F':
		return c - 'A' + 10, true
	}
	return 0, false
}

// PrincipalTag is the cluster hash tag, braces included, of one principal.
func PrincipalTag(kind, id string) string {
	return "{" + Escape(kind) + ":" + Escape(id) + "}"
}

// BucketKey is the key of one tier's bucket state for a principal.
func BucketKey(kind, id, tier string) string {
	return "fg:{" + Escape(kind) + ":" + Escape(id) + "}:tb:" + Escape(tier) // PrincipalTag's, in one allocation
}

// PenaltyKey is the key of a principal's penalty hash.
func PenaltyKey(kind, id string) string {
	return "fg:{" + Escape(kind) + ":" + Escape(id) + "}:pen" // PrincipalTag's, in one allocation
}

// Fields of a penalty hash (PenaltyKey): the detector writes them (its
// apply script), the limiter's check script reads the multiplier (check.lua),
// the console and the detector's pager read the rest.
const (
	PenaltyFieldMultiplier = "m"          // the limits' multiplier, in (0, 1]
	PenaltyFieldLevel      = "level"      // the escalation level
	PenaltyFieldExpiresAt  = "expires_at" // when it ends, Unix ms
	PenaltyFieldAbuseID    = "abuse_id"   // the abuse.v1 event that set it
)

// DayUsageKey is the key of a principal's allowed units on one UTC day (YYYY-MM-DD).
func DayUsageKey(kind, id, day string) string {
	return "fg:{" + Escape(kind) + ":" + Escape(id) + "}:day:" + Escape(day) // PrincipalTag's, in one allocation
}

// LimitersKey is the sorted set of live limiter instances (member: instance
// id, score: its last heartbeat in Unix ms). Each limiter counts the members
// seen within the last few heartbeats; answers it gives from local state
// enforce limit ÷ that count.
const LimitersKey = "fg:limiters"

// ScalesKey is the hash of limit scales by scope (global, tier:<tier>, route:<class>).
const ScalesKey = "fg:scales"

// ShedKey is the hash of the adjuster's shed state (level, retry_after_ms,
// reason; see limiter.ParseShedding), with a time to live of a few adjuster
// ticks: a missing hash means nothing is shed.
const ShedKey = "fg:shed"
