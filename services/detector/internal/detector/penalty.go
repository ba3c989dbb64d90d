package detector

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/floodgate-dev/floodgate/pkg/events"
	"github.com/floodgate-dev/floodgate/pkg/redisx"
)

// Penalty outcomes of one write.
const (
	PenaltyStale     = 0 // already expired by the time it was written (replay of old history)
	PenaltyApplied   = 1
	PenaltyUnchanged = 2 // an equal or stronger penalty was already in place (redelivery)
)

// applyPenalty merges a penalty into the principal's hash: the strongest multiplier,
// the highest level and the latest expiry win, so writing the same penalty twice —
// a redelivered message, a replayed partition — changes nothing. Its field
// names are redisx's PenaltyField constants.
var applyPenalty = redis.NewScript(`
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local m, level, exp = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[4])
if exp <= now then return 0 end
local cur = redis.call('HMGET', KEYS[1], 'm', 'level', 'expires_at')
local cm, cl, ce = tonumber(cur[1]), tonumber(cur[2]), tonumber(cur[3])
if cm and cl and ce then
  if cm <= m and cl >= level and ce >= exp then return 2 end
  m, level, exp = math.min(cm, m), math.max(cl, level), math.max(ce, exp)
end
redis.call('HSET', KEYS[1], 'm', tostring(m), 'level', level, 'abuse_id', ARGV[3], 'expires_at', exp)
redis.call('PEXPIREAT', KEYS[1], exp)
return 1
`)

// PenaltyStore writes penalties the limiter reads. Safe for concurrent use.
type PenaltyStore struct {
	rdb redis.Cmdable
	reassertState
}

// NewPenaltyStore returns a store on rdb.
func NewPenaltyStore(rdb redis.Cmdable) *PenaltyStore { return &PenaltyStore{rdb: rdb} }

// Apply writes p for principal and reports which of the Penalty* outcomes
// happened. The store remembers it, to write it again if Redis loses it
// (RunReassert).
func (s *PenaltyStore) Apply(ctx context.Context, principal events.Principal, abuseID string, p events.Penalty) (int, error) {
	n, err := s.write(ctx, principal, abuseID, p)
	if err == nil && n != PenaltyStale {
		s.remember(principal, abuseID, p)
	}
	return n, err
}

func (s *PenaltyStore) write(ctx context.Context, principal events.Principal, abuseID string, p events.Penalty) (int, error) {
	key := redisx.PenaltyKey(string(principal.Kind), principal.ID)
	n, err := applyPenalty.Run(ctx, s.rdb, []string{key},
		strconv.FormatFloat(p.Multiplier, 'f', -1, 64), p.Level, abuseID, p.ExpiresAt.UnixMilli()).Int()
	if err != nil {
		return 0, fmt.Errorf("apply penalty to %s: %w", principal.Key(), err)
	}
	return n, nil
}

// Get reads a principal's current multiplier and expiry; 1 and zero time mean none.
func (s *PenaltyStore) Get(ctx context.Context, principal events.Principal) (float64, time.Time, error) {
	vals, err := s.rdb.HMGet(ctx, redisx.PenaltyKey(string(principal.Kind), principal.ID), redisx.PenaltyFieldMultiplier, redisx.PenaltyFieldExpiresAt).Result()
	if err != nil {
		return 0, time.Time{}, err
	}
	if vals[0] == nil {
		return 1, time.Time{}, nil
	}
	m, _ := strconv.ParseFloat(fmt.Sprint(vals[0]), 64)
	ms, _ := strconv.ParseInt(fmt.Sprint(vals[1]), 10, 64)
	return m, time.UnixMilli(ms).UTC(), nil
}
