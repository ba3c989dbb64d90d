package auth

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

// Session is a signed-in browser: who, their CSRF token and when it ends.
type Session struct {
	ID        string // the cookie value; never stored (Redis holds an HMAC of it)
	Identity  Identity
	CSRF      string
	ExpiresAt time.Time
}

// Sessions keeps sessions server-side in Redis, so every console instance sees
// them and a restart signs nobody out. A session is valid because the server
// secret says so, not because a key exists in Redis: its key is
// fg:console:session:<HMAC-SHA256(secret, cookie)>, so nobody without the
// secret can name the key a cookie would read, and its fields carry an
// HMAC under the same secret, so nobody can rename a session's user, change
// the credential generation it was granted under or move its expiry. The
// user's role is not stored at all: the caller re-reads it from the users
// directory on every request, and ends the session when the user's
// generation moved (a new password, another role, the user removed).
//
// Both ends of a session are checked against signed times, never against a
// key's TTL: the absolute expiry is in the MACed fields, and the last use is
// a field with its own MAC, rewritten on every use — so PERSIST or a
// rewritten field neither revives nor extends a session (an old last-use
// value written back only brings the idle end nearer). The TTL only tidies
// up. Sign-out leaves a revocation under a key of its own
// (<prefix>revoked:<HMAC-SHA256(secret, cookie)>) for as long as any session
// can live, so writing the session's hash back after sign-out revives
// nothing. Safe for concurrent use.
type Sessions struct {
	rdb      redis.UniversalClient
	secret   []byte
	prefix   string
	idle     time.Duration
	absolute time.Duration
	now      func() time.Time
}

// MinSessionSecret is the shortest session secret accepted, in bytes.
const MinSessionSecret = 32

// NewSessions returns a store; prefix lets tests use their own keys. secret
// (at least MinSessionSecret bytes) must be the same on every console replica
// and is never stored in Redis.
func NewSessions(rdb redis.UniversalClient, prefix string, secret []byte, idle, absolute time.Duration, now func() time.Time) (*Sessions, error) {
	if len(secret) < MinSessionSecret {
		return nil, fmt.Errorf("session secret: %d bytes, at least %d", len(secret), MinSessionSecret)
	}
	return &Sessions{rdb: rdb, secret: secret, prefix: prefix, idle: idle, absolute: absolute, now: now}, nil
}

// ErrNoSession is returned for a missing, expired or revoked session.
var ErrNoSession = errors.New("no session")

func (s *Sessions) mac(parts ...string) []byte { return macOf(s.secret, parts...) }

// macOf is the HMAC-SHA256 under key of parts, each written as its length,
// ':' and itself (so no two lists of parts read the same).
func macOf(key []byte, parts ...string) []byte {
	m := hmac.New(sha256.New, key)
	for _, p := range parts {
		_, _ = m.Write([]byte(strconv.Itoa(len(p))))
		_, _ = m.Write([]byte{':'})
		_, _ = m.Write([]byte(p))
	}
	return m.Sum(nil)
}

func (s *Sessions) key(id string) string {
	return s.prefix + hex.EncodeToString(s.mac("session-key", id))
}

func (s *Sessions) revokedKey(id string) string {
	return s.prefix + "revoked:" + hex.EncodeToString(s.mac("session-revoked", id))
}

func (s *Sessions) fieldsMAC(key, name, gen, csrf, expires string) string {
	return hex.EncodeToString(s.mac("session-fields", key, name, gen, csrf, expires))
}

func (s *Sessions) seenMAC(key, seen string) string {
	return hex.EncodeToString(s.mac("session-seen", key, seen))
}

// touch records now as the session's last use, signed, and sets the key's
// TTL (tidying only) to what is left of its life.
func (s *Sessions) touch(ctx context.Context, p redis.Pipeliner, key string, now, exp time.Time) {
	seen := strconv.FormatInt(now.UnixMilli(), 10)
	p.HSet(ctx, key, "seen_at", seen, "seen_mac", s.seenMAC(key, seen))
	p.PExpire(ctx, key, min(s.idle, exp.Sub(now)))
}

// Create starts a session for who, bound to who.Generation.
func (s *Sessions) Create(ctx context.Context, who Identity) (Session, error) {
	id, err := RandomString(32)
	if err != nil {
		return Session{}, err
	}
	csrf, err := RandomString(32)
	if err != nil {
		return Session{}, err
	}
	now := s.now()
	sess := Session{ID: id, Identity: who, CSRF: csrf, ExpiresAt: now.Add(s.absolute)}
	key := s.key(id)
	expires := strconv.FormatInt(sess.ExpiresAt.UnixMilli(), 10)
	_, err = s.rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
		p.HSet(ctx, key, "name", who.Name, "gen", who.Generation, "csrf", csrf, "expires_at", expires,
			"mac", s.fieldsMAC(key, who.Name, who.Generation, csrf, expires))
		s.touch(ctx, p, key, now, sess.ExpiresAt)
		return nil
	})
	if err != nil {
		return Session{}, fmt.Errorf("create session: %w", err)
	}
	return sess, nil
}

// Get returns the live session with id and records its use. The session's
// Identity holds the user's name and the generation it was granted under
// only: the caller reads the role from the users directory (a removed user
// has none) and ends the session when the generation differs.
func (s *Sessions) Get(ctx context.Context, id string) (Session, error) {
	if id == "" {
		return Session{}, ErrNoSession
	}
	key := s.key(id)
	var fields *redis.MapStringStringCmd
	var revoked *redis.IntCmd
	if _, err := s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		fields = p.HGetAll(ctx, key)
		revoked = p.Exists(ctx, s.revokedKey(id))
		return nil
	}); err != nil {
		return Session{}, fmt.Errorf("read session: %w", err)
	}
	vals := fields.Val()
	if len(vals) == 0 {
		return Session{}, ErrNoSession
	}
	if revoked.Val() != 0 {
		_ = s.rdb.Del(ctx, key).Err() // written back after sign-out
		return Session{}, ErrNoSession
	}
	want := s.fieldsMAC(key, vals["name"], vals["gen"], vals["csrf"], vals["expires_at"])
	if !hmac.Equal([]byte(want), []byte(vals["mac"])) {
		return Session{}, ErrNoSession // written by someone without the secret
	}
	if !hmac.Equal([]byte(s.seenMAC(key, vals["seen_at"])), []byte(vals["seen_mac"])) {
		return Session{}, ErrNoSession
	}
	ms, err1 := strconv.ParseInt(vals["expires_at"], 10, 64)
	seenMS, err2 := strconv.ParseInt(vals["seen_at"], 10, 64)
	if err1 != nil || err2 != nil {
		return Session{}, ErrNoSession
	}
	exp, seen := time.UnixMilli(ms), time.UnixMilli(seenMS)
	now := s.now()
	if !now.Before(exp) || !now.Before(seen.Add(s.idle)) {
		_ = s.rdb.Del(ctx, key).Err()
		return Session{}, ErrNoSession
	}
	if _, err := s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		s.touch(ctx, p, key, now, exp)
		return nil
	}); err != nil {
		return Session{}, fmt.Errorf("touch session: %w", err)
	}
	return Session{ID: id, Identity: Identity{Name: vals["name"], Via: "session", Generation: vals["gen"]},
		CSRF: vals["csrf"], ExpiresAt: exp}, nil
}

// Delete ends a session: it records the revocation first, for as long as
// any session can live, then removes the session's key.
func (s *Sessions) Delete(ctx context.Context, id string) error {
	if id == "" {
		return nil
	}
	if _, err := s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		p.Set(ctx, s.revokedKey(id), "1", s.absolute)
		p.Del(ctx, s.key(id))
		return nil
	}); err != nil {
		return fmt.Errorf("delete session: %w", err)
	}
	return nil
}
