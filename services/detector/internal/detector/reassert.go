package detector

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/floodgate-dev/floodgate/pkg/events"
	"github.com/floodgate-dev/floodgate/pkg/redisx"
)

// Penalties live in Redis, which can lose them: a FLUSHALL, a restart without
// persistence, a failover to a replica that had not received the last writes.
// On main a penalized bot then got +499 requests in 10 s until the detector
// happened to re-detect it. The store remembers what it applied and watches
// epoch markers; when one is gone or was replaced, Redis lost data since the
// last look, and every penalty this instance applied that has not expired is
// written again with its original expiry (the apply script keeps the
// strongest, so writing twice, or from several instances, changes nothing).

// markerBands is how many epoch markers there are: one per band of
// 16384/markerBands cluster slots, so every master of a Redis Cluster that
// owns a band's worth of contiguous slots holds one and a shard that loses
// its data alone is noticed too.
const markerBands = 64

// maxRemembered bounds the penalties an instance remembers; past it the
// entries that expire first are forgotten.
const maxRemembered = 1_000_000

type remembered struct {
	principal events.Principal
	abuseID   string
	p         events.Penalty
}

// markers returns the epoch marker keys: prefix plus a hash tag chosen so
// marker i's slot lies in band i.
func markers(prefix string) []string {
	out := make([]string, markerBands)
	band := 16384 / markerBands
	for i := range out {
		for n := 0; ; n++ {
			k := prefix + "{epoch-" + strconv.Itoa(i) + "-" + strconv.Itoa(n) + "}"
			if redisx.Slot(k)/band == i {
				out[i] = k
				break
			}
		}
	}
	return out
}

// remember notes a penalty this instance applied.
func (s *PenaltyStore) remember(principal events.Principal, abuseID string, p events.Penalty) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.applied == nil {
		s.applied = map[string]remembered{}
	}
	key := principal.Key()
	if cur, ok := s.applied[key]; ok && cur.p.ExpiresAt.After(p.ExpiresAt) {
		p.ExpiresAt = cur.p.ExpiresAt
	}
	s.applied[key] = remembered{principal: principal, abuseID: abuseID, p: p}
	if len(s.applied) > maxRemembered {
		s.forgetExpired(time.Now())
	}
}

// forgetExpired drops entries that expired; mu held.
func (s *PenaltyStore) forgetExpired(now time.Time) {
	for k, r := range s.applied {
		if !r.p.ExpiresAt.After(now) {
			delete(s.applied, k)
		}
	}
	for k := range s.applied { // still full: forget arbitrary ones (bounded memory)
		if len(s.applied) <= maxRemembered {
			break
		}
		delete(s.applied, k)
	}
}

// Reassert writes every remembered penalty that has not expired again and
// returns how many it wrote.
func (s *PenaltyStore) Reassert(ctx context.Context) (int, error) {
	s.mu.Lock()
	s.forgetExpired(time.Now())
	list := make([]remembered, 0, len(s.applied))
	for _, r := range s.applied {
		list = append(list, r)
	}
	s.mu.Unlock()
	n := 0
	var errs []error
	for _, r := range list {
		out, err := s.write(ctx, r.principal, r.abuseID, r.p)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if out == PenaltyApplied {
			n++
		}
	}
	return n, errors.Join(errs...)
}

// RunReassert watches the epoch markers every interval until ctx ends and
// re-asserts this instance's penalties when Redis lost data. A marker that
// cannot be read (Redis down) is checked again at the next tick.
func (s *PenaltyStore) RunReassert(ctx context.Context, every time.Duration, log *slog.Logger) error {
	keys := markers("fg:detector:")
	seen := make([]string, len(keys))
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		lost, err := s.checkMarkers(ctx, keys, seen)
		if err != nil && ctx.Err() == nil {
			log.Debug("penalty re-assert: markers unreadable", "err", err)
		}
		if lost {
			start := time.Now()
			n, err := s.Reassert(ctx)
			if s.onReassert != nil {
				s.onReassert(n)
			}
			log.Warn("redis lost data (an epoch marker was gone or replaced): penalties re-asserted",
				"written", n, "took", time.Since(start).Round(time.Millisecond), "err", err)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// checkMarkers reads the markers, creates missing ones, and reports whether
// one known before was gone or replaced by another instance's.
func (s *PenaltyStore) checkMarkers(ctx context.Context, keys, seen []string) (bool, error) {
	cmds := make([]*redis.StringCmd, len(keys))
	if _, err := s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, k := range keys {
			cmds[i] = p.Get(ctx, k)
		}
		return nil
	}); err != nil && !errors.Is(err, redis.Nil) {
		return false, err
	}
	lost := false
	for i, k := range keys {
		v, err := cmds[i].Result()
		switch {
		case errors.Is(err, redis.Nil):
			if seen[i] != "" {
				lost = true
			}
			nv := newMarker()
			ok, err := s.rdb.SetNX(ctx, k, nv, 0).Result()
			if err != nil {
				return lost, fmt.Errorf("set epoch marker: %w", err)
			}
			if !ok { // another instance set it first
				if nv, err = s.rdb.Get(ctx, k).Result(); err != nil {
					return lost, fmt.Errorf("read epoch marker: %w", err)
				}
			}
			seen[i] = nv
		case err != nil:
			return lost, fmt.Errorf("read epoch marker: %w", err)
		default:
			if seen[i] != "" && v != seen[i] {
				lost = true // another instance saw the loss first and set a new one
			}
			seen[i] = v
		}
	}
	return lost, nil
}

func newMarker() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// reassertState is the store's memory of what it applied.
type reassertState struct {
	mu         sync.Mutex
	applied    map[string]remembered
	onReassert func(n int) // tests and metrics
}
