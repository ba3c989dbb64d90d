package detector

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/floodgate-dev/floodgate/pkg/events"
)

// The in-memory doubles of the detector's ports, for tests whose subject is
// the detector's logic; penaltytest.Run and pagertest.Run hold each to the
// behaviour of the real adapter.

// MemPenalties is the in-memory double of Penalties, for tests whose subject
// is the detector's logic rather than Redis. It merges as the Redis script
// does, and a penalty is gone at its expiry; penaltytest.Run holds both to
// the same behaviour.
type MemPenalties struct {
	mu  sync.Mutex
	now func() time.Time
	m   map[string]memPenalty
}

type memPenalty struct {
	multiplier float64
	level      int64
	until      time.Time
}

var _ Penalties = (*MemPenalties)(nil)

// NewMemPenalties returns an empty double on the clock now.
func NewMemPenalties(now func() time.Time) *MemPenalties {
	return &MemPenalties{now: now, m: map[string]memPenalty{}}
}

// Apply merges p as the Redis script does.
func (s *MemPenalties) Apply(_ context.Context, principal events.Principal, _ string, p events.Penalty) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	until := time.UnixMilli(p.ExpiresAt.UnixMilli()).UTC() // Redis keeps milliseconds
	if !until.After(now) {
		return PenaltyStale, nil
	}
	next := memPenalty{multiplier: p.Multiplier, level: p.Level, until: until}
	if cur, ok := s.m[principal.Key()]; ok && cur.until.After(now) {
		if cur.multiplier <= next.multiplier && cur.level >= next.level && !cur.until.Before(next.until) {
			return PenaltyUnchanged, nil
		}
		next.multiplier, next.level = min(cur.multiplier, next.multiplier), max(cur.level, next.level)
		if cur.until.After(next.until) {
			next.until = cur.until
		}
	}
	s.m[principal.Key()] = next
	return PenaltyApplied, nil
}

// Get returns the penalty in force (1 and no expiry when none).
func (s *MemPenalties) Get(_ context.Context, principal events.Principal) (float64, time.Time, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	cur, ok := s.m[principal.Key()]
	if !ok || !cur.until.After(s.now()) {
		return 1, time.Time{}, nil
	}
	return cur.multiplier, cur.until, nil
}

// Page is one alert as its receiver saw it.
type Page struct {
	Key, Summary string
	Details      map[string]any
}

// MemAlerter is the in-memory double of Alerter: it keeps every page, and
// fails the next down calls as an unreachable PagerDuty would.
type MemAlerter struct {
	mu    sync.Mutex
	pages []Page
	down  int
}

var _ Alerter = (*MemAlerter)(nil)

// Alert keeps the page, or fails while the double is down.
func (a *MemAlerter) Alert(_ context.Context, key, summary string, details map[string]any) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.down > 0 {
		a.down--
		return fmt.Errorf("alert %s: %w", key, errors.New("pager unavailable"))
	}
	a.pages = append(a.pages, Page{Key: key, Summary: summary, Details: details})
	return nil
}

// Pages returns the pages kept, oldest first (a copy).
func (a *MemAlerter) Pages() []Page {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]Page(nil), a.pages...)
}

// FailNext makes the next n alerts fail.
func (a *MemAlerter) FailNext(n int) {
	a.mu.Lock()
	a.down = n
	a.mu.Unlock()
}
