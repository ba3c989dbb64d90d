package auth

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

// Session is a signed-in browser: who, their CSRF token and when it ends.
type Session struct {
	ID        string // the cookie value; never stored (Redis holds its SHA-256)
	Identity  Identity
	CSRF      string
	ExpiresAt time.Time
}

// Sessions keeps sessions server-side in Redis, so every console instance sees
// them and a restart signs nobody out. Keys are fg:console:session:<sha256(id)>
// with the session's absolute expiry as the key's TTL; an idle timeout slides
// it forward on use, never past the absolute expiry. Safe for concurrent use.
type Sessions struct {
	rdb      redis.UniversalClient
	prefix   string
	idle     time.Duration
	absolute time.Duration
	now      func() time.Time
}

// NewSessions returns a store; prefix lets tests use their own keys.
func NewSessions(rdb redis.UniversalClient, prefix string, idle, absolute time.Duration, now func() time.Time) *Sessions {
	return &Sessions{rdb: rdb, prefix: prefix, idle: idle, absolute: absolute, now: now}
}

// ErrNoSession is returned for a missing, expired or revoked session.
var ErrNoSession = errors.New("no session")

func (s *Sessions) key(id string) string {
	sum := sha256.Sum256([]byte(id))
	return s.prefix + hex.EncodeToString(sum[:])
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
	_, err = s.rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
		p.HSet(ctx, key, "name", who.Name, "role", who.Role.String(), "csrf", csrf,
			"expires_at", sess.ExpiresAt.UnixMilli())
		p.PExpire(ctx, key, min(s.idle, s.absolute))
		return nil
	})
	if err != nil {
		return Session{}, fmt.Errorf("create session: %w", err)
	}
	return sess, nil
}

// Get returns the live session with id and slides its idle timeout.
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
	role, err := ParseRole(vals["role"])
	if err != nil {
		return Session{}, ErrNoSession
	}
	var ms int64
	if _, err := fmt.Sscan(vals["expires_at"], &ms); err != nil {
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
	return Session{ID: id, Identity: Identity{Name: vals["name"], Role: role, Via: "session"}, CSRF: vals["csrf"], ExpiresAt: exp}, nil
}

// Delete ends a session.
func (s *Sessions) Delete(ctx context.Context, id string) error {
	if err := s.rdb.Del(ctx, s.key(id)).Err(); err != nil {
		return fmt.Errorf("delete session: %w", err)
	}
	return nil
}
