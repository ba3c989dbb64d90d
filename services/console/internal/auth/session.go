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
// HMAC under the same secret, so nobody can rename a session's user or move
// its expiry. The user's role is not stored at all: the caller re-reads it
// from the users directory on every request. The key's TTL is the idle
// timeout, slid forward on use, never past the absolute expiry. Safe for
// concurrent use.
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

func (s *Sessions) fieldsMAC(key, name, csrf, expires string) string {
	return hex.EncodeToString(s.mac("session-fields", key, name, csrf, expires))
}

// Create starts a session for who.
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
		p.HSet(ctx, key, "name", who.Name, "csrf", csrf, "expires_at", expires,
			"mac", s.fieldsMAC(key, who.Name, csrf, expires))
		p.PExpire(ctx, key, min(s.idle, s.absolute))
		return nil
	})
	if err != nil {
		return Session{}, fmt.Errorf("create session: %w", err)
	}
	return sess, nil
}

// Get returns the live session with id and slides its idle timeout. The
// session's Identity holds the user's name only: the caller reads the role
// from the users directory (a removed user has none).
func (s *Sessions) Get(ctx context.Context, id string) (Session, error) {
	if id == "" {
		return Session{}, ErrNoSession
	}
	key := s.key(id)
	vals, err := s.rdb.HGetAll(ctx, key).Result()
	if err != nil {
		return Session{}, fmt.Errorf("read session: %w", err)
	}
	if len(vals) == 0 {
		return Session{}, ErrNoSession
	}
	want := s.fieldsMAC(key, vals["name"], vals["csrf"], vals["expires_at"])
	if !hmac.Equal([]byte(want), []byte(vals["mac"])) {
		return Session{}, ErrNoSession // written by someone without the secret
	}
	ms, err := strconv.ParseInt(vals["expires_at"], 10, 64)
	if err != nil {
		return Session{}, ErrNoSession
	}
	exp := time.UnixMilli(ms)
	now := s.now()
	if !now.Before(exp) {
		_ = s.rdb.Del(ctx, key).Err()
		return Session{}, ErrNoSession
	}
	if err := s.rdb.PExpire(ctx, key, min(s.idle, exp.Sub(now))).Err(); err != nil {
		return Session{}, fmt.Errorf("touch session: %w", err)
	}
	return Session{ID: id, Identity: Identity{Name: vals["name"], Via: "session"}, CSRF: vals["csrf"], ExpiresAt: exp}, nil
}

// Delete ends a session.
func (s *Sessions) Delete(ctx context.Context, id string) error {
	if err := s.rdb.Del(ctx, s.key(id)).Err(); err != nil {
		return fmt.Errorf("delete session: %w", err)
	}
	return nil
}
