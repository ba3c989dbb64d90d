package store

import (
	"bytes"
	"context"
	"crypto/sha1" //nolint:gosec // a change tag (Redis' sha1hex), not a security boundary
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"

	"github.com/floodgate-dev/floodgate/pkg/limiter"
)

// The limiter's runtime overrides (pkg/limiter/runtime.go) live in one Redis
// hash (limiter.OverridesKey): field principal:<kind>:<id> or plan:<name>,
// value the override's JSON. The limiter decodes the JSON strictly, so what
// only the console needs — the expiry, who set it and why — is kept beside it
// in MetaKey(key); the console's sweeper removes expired overrides.

// SubjectOverrides is the audit pk of every override change.
const SubjectOverrides = "console#overrides"

// Audit actions for overrides.
const (
	ActionOverrideSet    = "override.set"
	ActionOverrideDelete = "override.delete"
	ActionOverrideExpire = "override.expire"
)

// Errors callers branch on.
var (
	ErrStale          = errors.New("the override changed since it was read")
	ErrNoOverride     = errors.New("no such override")
	ErrAuditFailed    = errors.New("the audit row could not be written; the change was undone")
	errAuditNotUndone = errors.New("the audit row could not be written and the change could not be undone")
)

// MaxOverrideTTL bounds an override's expiry.
const MaxOverrideTTL = 90 * 24 * time.Hour

// MetaKey is the hash of the console's notes on the overrides in key: field →
// OverrideMeta JSON.
func MetaKey(key string) string { return key + ":console" }

// OverrideMeta is what the console keeps beside an override.
type OverrideMeta struct {
	Tag       string    `json:"tag"`                 // Tag of the value it was written with
	ExpiresAt time.Time `json:"expires_at,omitzero"` // zero: no expiry
	By        string    `json:"by"`
	Reason    string    `json:"reason"`
	At        time.Time `json:"at"`
}

// Override is one entry of the overrides hash.
type Override struct {
	Field   string // principal:<kind>:<id> or plan:<name>
	Value   string // the JSON the limiter reads
	Tag     string // the optimistic-concurrency tag: Tag(Value)
	Invalid string // why the limiter skips it ("" when it applies)
	Meta    *OverrideMeta
}

// Tag is the change tag of an override value: the SHA-1 hex of the value,
// "" when there is none (what Redis' redis.sha1hex computes in the scripts).
func Tag(value string, exists bool) string {
	if !exists {
		return ""
	}
	sum := sha1.Sum([]byte(value)) //nolint:gosec // see import
	return hex.EncodeToString(sum[:])
}

// ValidateOverride checks field and value with the limiter's own parser and
// returns the value compacted.
func ValidateOverride(field, value string) (string, error) {
	field = strings.TrimSpace(field)
	var buf bytes.Buffer
	if err := json.Compact(&buf, []byte(value)); err != nil {
		return "", fmt.Errorf("%w: the override is not JSON: %w", ErrInvalid, err)
	}
	if _, errs := limiter.ParseOverrides(map[string]string{field: buf.String()}); len(errs) > 0 {
		return "", fmt.Errorf("%w: %w", ErrInvalid, errors.Join(errs...))
	}
	return buf.String(), nil
}

// Overrides lists the overrides in key with the console's notes, by field.
func (s *Store) Overrides(ctx context.Context, key string) ([]Override, error) {
	h, err := s.rdb.HGetAll(ctx, key).Result()
	if err != nil {
		return nil, fmt.Errorf("read overrides %s: %w", key, err)
	}
	meta, err := s.rdb.HGetAll(ctx, MetaKey(key)).Result()
	if err != nil {
		return nil, fmt.Errorf("read override notes %s: %w", MetaKey(key), err)
	}
	out := make([]Override, 0, len(h))
	for field, v := range h {
		o := Override{Field: field, Value: v, Tag: Tag(v, true)}
		if _, errs := limiter.ParseOverrides(map[string]string{field: v}); len(errs) > 0 {
			o.Invalid = errors.Join(errs...).Error()
		}
		if m, ok := parseMeta(meta[field]); ok && m.Tag == o.Tag {
			o.Meta = &m
		}
		out = append(out, o)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Field < out[j].Field })
	return out, nil
}

// GetOverride reads one override; found is false when there is none.
func (s *Store) GetOverride(ctx context.Context, key, field string) (Override, bool, error) {
	list, err := s.Overrides(ctx, key)
	if err != nil {
		return Override{}, false, err
	}
	for _, o := range list {
		if o.Field == field {
			return o, true, nil
		}
	}
	return Override{}, false, nil
}

func parseMeta(v string) (OverrideMeta, bool) {
	var m OverrideMeta
	if v == "" || json.Unmarshal([]byte(v), &m) != nil {
		return OverrideMeta{}, false
	}
	return m, true
}

// casScript sets (ARGV[3] non-empty) or deletes field ARGV[1] when its value's
// tag is still ARGV[2] ("" = absent); it answers {1|0, the value before}.
var casScript = redis.NewScript(`
local cur = redis.call('HGET', KEYS[1], ARGV[1])
local tag = ''
if cur then tag = redis.sha1hex(cur) end
if tag ~= ARGV[2] then return {0, cur} end
if ARGV[3] == '' then redis.call('HDEL', KEYS[1], ARGV[1]) else redis.call('HSET', KEYS[1], ARGV[1], ARGV[3]) end
return {1, cur}`)

// cas runs casScript; before is the value before (exists false: none).
func (s *Store) cas(ctx context.Context, key, field, tag, value string) (ok bool, before string, existed bool, err error) {
	res, err := casScript.Run(ctx, s.rdb, []string{key}, field, tag, value).Slice()
	if err != nil {
		return false, "", false, fmt.Errorf("write override %s %s: %w", key, field, err)
	}
	if len(res) > 1 {
		before, existed = res[1].(string)
	}
	n, _ := res[0].(int64)
	return n == 1, before, existed, nil
}

type overrideState struct {
	Value     json.RawMessage `json:"value,omitempty"`
	ExpiresAt *time.Time      `json:"expires_at,omitempty"`
}

func stateOf(value string, exists bool, m *OverrideMeta) overrideState {
	var st overrideState
	if exists {
		if json.Valid([]byte(value)) {
			st.Value = json.RawMessage(value)
		} else {
			st.Value, _ = json.Marshal(value)
		}
	}
	if m != nil && !m.ExpiresAt.IsZero() {
		t := m.ExpiresAt
		st.ExpiresAt = &t
	}
	return st
}

// SetOverride creates or replaces field's override in key when the stored
// value's tag is still tag ("" = create: there must be none), with an optional
// expiry (zero: none), and audits it with before/after. A stale tag changes
// nothing (ErrStale); a failed audit undoes the change (ErrAuditFailed).
func (s *Store) SetOverride(ctx context.Context, key, field, value, tag string, expires time.Time, who Actor) error {
	if err := who.check(); err != nil {
		return err
	}
	value, err := ValidateOverride(field, value)
	if err != nil {
		return err
	}
	now := s.now().UTC()
	if !expires.IsZero() && (!expires.After(now) || expires.Sub(now) > MaxOverrideTTL) {
		return fmt.Errorf("%w: the expiry must be in the future and at most %d days away", ErrInvalid, int(MaxOverrideTTL.Hours()/24))
	}
	oldMeta, _ := s.meta(ctx, key, field)
	meta := OverrideMeta{Tag: Tag(value, true), ExpiresAt: expires.UTC(), By: who.Name, Reason: who.Reason, At: now}
	mb, _ := json.Marshal(meta)
	// The note first: the sweeper only acts on a note whose tag matches the value.
	if err := s.rdb.HSet(ctx, MetaKey(key), field, string(mb)).Err(); err != nil {
		return fmt.Errorf("write override note %s: %w", field, err)
	}
	ok, before, existed, err := s.cas(ctx, key, field, tag, value)
	if err != nil {
		return err
	}
	if !ok {
		s.restoreMeta(ctx, key, field, oldMeta)
		return ErrStale
	}
	var prev *OverrideMeta
	if m, ok := parseMeta(oldMeta); ok && m.Tag == Tag(before, existed) {
		prev = &m
	}
	e := s.overrideEntry(field, who, ActionOverrideSet, now, stateOf(before, existed, prev), stateOf(value, true, &meta))
	if err := s.write(ctx, e); err != nil {
		undo := ""
		if existed {
			undo = before
		}
		if ok, _, _, uerr := s.cas(ctx, key, field, Tag(value, true), undo); uerr != nil || !ok {
			return fmt.Errorf("%w: %w", errAuditNotUndone, err)
		}
		s.restoreMeta(ctx, key, field, oldMeta)
		return fmt.Errorf("%w: %w", ErrAuditFailed, err)
	}
	return nil
}

// DeleteOverride removes field's override when its tag is still tag, audited.
func (s *Store) DeleteOverride(ctx context.Context, key, field, tag string, who Actor) error {
	if err := who.check(); err != nil {
		return err
	}
	return s.remove(ctx, key, field, tag, who, ActionOverrideDelete)
}

func (s *Store) remove(ctx context.Context, key, field, tag string, who Actor, action string) error {
	if tag == "" {
		return ErrNoOverride
	}
	oldMeta, _ := s.meta(ctx, key, field)
	ok, before, existed, err := s.cas(ctx, key, field, tag, "")
	if err != nil {
		return err
	}
	if !ok {
		if !existed {
			return ErrNoOverride
		}
		return ErrStale
	}
	var prev *OverrideMeta
	if m, ok := parseMeta(oldMeta); ok && m.Tag == tag {
		prev = &m
	}
	e := s.overrideEntry(field, who, action, s.now().UTC(), stateOf(before, true, prev), overrideState{})
	if err := s.write(ctx, e); err != nil {
		if ok, _, _, uerr := s.cas(ctx, key, field, "", before); uerr != nil || !ok {
			return fmt.Errorf("%w: %w", errAuditNotUndone, err)
		}
		return fmt.Errorf("%w: %w", ErrAuditFailed, err)
	}
	_ = s.rdb.HDel(ctx, MetaKey(key), field).Err() // a stale note is ignored and swept anyway
	return nil
}

// ExpireOverrides removes every override in key whose note says it expired
// (and whose value is still the one the note was written for), each audited
// as done by actor; stale notes are dropped. It returns how many it removed.
// Console instances may run it concurrently: removal is conditional.
func (s *Store) ExpireOverrides(ctx context.Context, key string, actor Actor) (int, error) {
	notes, err := s.rdb.HGetAll(ctx, MetaKey(key)).Result()
	if err != nil {
		return 0, fmt.Errorf("read override notes %s: %w", MetaKey(key), err)
	}
	now := s.now()
	n := 0
	var errs []error
	for field, raw := range notes {
		m, ok := parseMeta(raw)
		cur, gerr := s.rdb.HGet(ctx, key, field).Result()
		if gerr != nil && !errors.Is(gerr, redis.Nil) {
			errs = append(errs, gerr)
			continue
		}
		if !ok || errors.Is(gerr, redis.Nil) || Tag(cur, true) != m.Tag {
			// The override is gone or was rewritten without this note.
			if now.Sub(m.At) > time.Minute {
				s.rdb.HDel(ctx, MetaKey(key), field)
			}
			continue
		}
		if m.ExpiresAt.IsZero() || m.ExpiresAt.After(now) {
			continue
		}
		who := actor
		who.Reason = fmt.Sprintf("expired at %s (set by %s: %s)", m.ExpiresAt.UTC().Format(time.RFC3339), m.By, m.Reason)
		switch err := s.remove(ctx, key, field, m.Tag, who, ActionOverrideExpire); {
		case err == nil:
			n++
		case errors.Is(err, ErrStale), errors.Is(err, ErrNoOverride):
		default:
			errs = append(errs, fmt.Errorf("expire override %s: %w", field, err))
		}
	}
	return n, errors.Join(errs...)
}

func (s *Store) meta(ctx context.Context, key, field string) (string, error) {
	v, err := s.rdb.HGet(ctx, MetaKey(key), field).Result()
	if errors.Is(err, redis.Nil) {
		return "", nil
	}
	return v, err
}

func (s *Store) restoreMeta(ctx context.Context, key, field, old string) {
	if old == "" {
		s.rdb.HDel(ctx, MetaKey(key), field)
		return
	}
	s.rdb.HSet(ctx, MetaKey(key), field, old)
}

func (s *Store) overrideEntry(field string, who Actor, action string, at time.Time, before, after overrideState) AuditEntry {
	b, _ := json.Marshal(before)
	af, _ := json.Marshal(after)
	return AuditEntry{Subject: SubjectOverrides, SK: at.Format("2006-01-02T15:04:05.000000000Z") + "#" + uuid.NewString(), At: at,
		Actor: who.Name, Role: who.Role, Action: action, Reason: who.Reason, CorrelationID: who.CorrelationID,
		AbuseID: field, Before: string(b), After: string(af)}
}
