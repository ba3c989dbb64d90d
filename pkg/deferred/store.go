// Package deferred is Floodgate's deferred work: requests on a route whose rule
// says on_limit: defer are, when denied or shed, written durably to
// floodgate.deferred.v1 and answered 202 Accepted (Edge, shared by pkg/gateway's
// middleware and the limiter's reverse proxy); services/deferred replays them to
// the upstream at the rule's pace, exactly once, and keeps each result in Redis
// for the client at /v1/deferred/{id} (Store). See docs/deferred.md.
package deferred

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"

	"github.com/floodgate-dev/floodgate/pkg/redisx"
)

// State is where a deferred request is in its life.
type State string

// States. queued → sending → done | dead | expired; queued → cancelled when
// the edge could not get the request onto Kafka (the client got a 429).
const (
	StateQueued    State = "queued"
	StateSending   State = "sending"
	StateDone      State = "done"      // the upstream answered 1xx-3xx
	StateDead      State = "dead"      // the upstream refused it (4xx); dead-lettered
	StateExpired   State = "expired"   // its max_age passed before it could be sent; dead-lettered
	StateCancelled State = "cancelled" // never accepted: the client got the plain 429
	// StateUnknown is never stored: a 202 says it when the edge could not
	// learn whether Kafka took the request (nor record that it gave up);
	// the client's poll then shows queued, sending, done — or expired.
	StateUnknown State = "unknown"
)

// Final reports whether s is an end state.
func (s State) Final() bool {
	return s == StateDone || s == StateDead || s == StateExpired || s == StateCancelled
}

// Record is what Redis keeps about one deferred request: who may read it, and
// its result once there is one.
type Record struct {
	State     State     `json:"state"`
	Principal string    `json:"principal"` // kind:id; only this principal may read it
	Method    string    `json:"method"`
	Route     string    `json:"route"`
	Deadline  time.Time `json:"deadline"`
	Attempts  int       `json:"attempts,omitempty"`
	// The upstream's answer (done, dead): status, kept headers, body up to the cap.
	Status    int         `json:"status,omitempty"`
	Header    http.Header `json:"header,omitempty"`
	Body      []byte      `json:"body,omitempty"`
	Truncated bool        `json:"truncated,omitempty"`
	Reason    string      `json:"reason,omitempty"` // why it is dead, expired or cancelled
	Finished  time.Time   `json:"finished,omitzero"`
}

// Store keeps deferred requests' records and the queue bounds in Redis. Keys:
//
//	fg:dfr:r:{<id>}                        hash: state, data (Record JSON)
//	fg:dfr:qr:<method route>               sorted set: id → deadline (ms), the route's queue
//	fg:dfr:qp:{<principal>}:<method route> sorted set: id → deadline (ms), the principal's
//	fg:dfr:paused                          hash: "<method route>" → who paused it
//
// Entries past their deadline do not count towards a queue bound, so a queue
// heals by itself if a release is lost. Safe for concurrent use.
type Store struct {
	rdb redis.UniversalClient
}

// NewStore returns a Store on rdb (a cluster client works: each script
// touches one key).
func NewStore(rdb redis.UniversalClient) *Store { return &Store{rdb: rdb} }

// ErrQueueFull is returned by Reserve when a queue bound is reached.
var ErrQueueFull = errors.New("deferred queue full")

func recordKey(id string) string { return "fg:dfr:r:{" + redisx.Escape(id) + "}" }

// RouteKey names a route in the queue keys and metrics: "POST /orders".
func RouteKey(method, route string) string { return method + " " + route }

func routeQueueKey(route string) string { return "fg:dfr:qr:" + redisx.Escape(route) }

func principalQueueKey(principal, route string) string {
	return "fg:dfr:qp:{" + redisx.Escape(principal) + "}:" + redisx.Escape(route)
}

const pausedKey = "fg:dfr:paused"

// reserveScript adds ARGV[2] to queue KEYS[1] unless it holds ARGV[3]
// unexpired entries. ARGV[1] is the entry's deadline (ms since the epoch);
// time is Redis's. Returns 1 when added (or already there), 0 when full.
var reserveScript = redis.NewScript(`
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if redis.call('ZSCORE', KEYS[1], ARGV[2]) then return 1 end
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[3]) then return 0 end
redis.call('ZADD', KEYS[1], ARGV[1], ARGV[2])
local ttl = tonumber(ARGV[1]) - now + 60000
if ttl > redis.call('PTTL', KEYS[1]) then redis.call('PEXPIRE', KEYS[1], ttl) end
return 1
`)

// Reserve counts id against the route's and the principal's queue bounds; on
// ErrQueueFull nothing is held.
func (s *Store) Reserve(ctx context.Context, id, principal, route string, deadline time.Time, maxRoute, maxPrincipal int) error {
	dl := strconv.FormatInt(deadline.UnixMilli(), 10)
	ok, err := reserveScript.Run(ctx, s.rdb, []string{routeQueueKey(route)}, dl, id, maxRoute).Int()
	if err != nil {
		return fmt.Errorf("reserve %s: %w", route, err)
	}
	if ok == 0 {
		return fmt.Errorf("%w: route %s holds %d", ErrQueueFull, route, maxRoute)
	}
	ok, err = reserveScript.Run(ctx, s.rdb, []string{principalQueueKey(principal, route)}, dl, id, maxPrincipal).Int()
	if err == nil && ok == 0 {
		err = fmt.Errorf("%w: principal %s holds %d on %s", ErrQueueFull, principal, maxPrincipal, route)
	}
	if err != nil {
		_ = s.rdb.ZRem(ctx, routeQueueKey(route), id).Err()
		return err
	}
	return nil
}

// Release takes id off both queues (idempotent).
func (s *Store) Release(ctx context.Context, id, principal, route string) error {
	_, err := s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		p.ZRem(ctx, routeQueueKey(route), id)
		p.ZRem(ctx, principalQueueKey(principal, route), id)
		return nil
	})
	if err != nil {
		return fmt.Errorf("release %s: %w", id, err)
	}
	return nil
}

// Depth is a route's queue: how many wait, and the oldest deadline.
type Depth struct {
	Route          string    `json:"route"`
	Queued         int64     `json:"queued"`
	OldestDeadline time.Time `json:"oldest_deadline,omitzero"`
	Paused         bool      `json:"paused"`
	Draining       bool      `json:"draining"`
	// OldestQueued is when the oldest waiting request was deferred (its
	// id is a UUIDv7, which carries it); zero when none waits.
	OldestQueued time.Time `json:"oldest_queued,omitzero"`
}

// Depth counts a route's unexpired queue.
func (s *Store) Depth(ctx context.Context, route string) (Depth, error) {
	key := routeQueueKey(route)
	now := strconv.FormatInt(time.Now().UnixMilli(), 10)
	n, err := s.rdb.ZCount(ctx, key, "("+now, "+inf").Result()
	if err != nil {
		return Depth{}, fmt.Errorf("depth %s: %w", route, err)
	}
	d := Depth{Route: route, Queued: n}
	if n > 0 {
		zs, err := s.rdb.ZRangeByScoreWithScores(ctx, key, &redis.ZRangeBy{Min: "(" + now, Max: "+inf", Count: 1}).Result()
		if err == nil && len(zs) == 1 {
			d.OldestDeadline = time.UnixMilli(int64(zs[0].Score)).UTC()
			if id, err := uuid.Parse(fmt.Sprint(zs[0].Member)); err == nil && id.Version() == 7 {
				sec, nsec := id.Time().UnixTime()
				d.OldestQueued = time.Unix(sec, nsec).UTC()
			}
		}
	}
	paused, err := s.Paused(ctx, route)
	if err != nil {
		return Depth{}, err
	}
	d.Paused = paused
	if d.Draining, err = s.Draining(ctx, route); err != nil {
		return Depth{}, err
	}
	return d, nil
}

// transitionScript moves record KEYS[1] to state ARGV[2] (data ARGV[3], TTL
// ARGV[4] ms) when its state is one of ARGV[1] (",a,b," — ",," matches a
// missing record). Returns the state it found ("" for none).
var transitionScript = redis.NewScript(`
local s = redis.call('HGET', KEYS[1], 'state')
if not s then s = '' end
if string.find(ARGV[1], ',' .. s .. ',', 1, true) then
  redis.call('HSET', KEYS[1], 'state', ARGV[2], 'data', ARGV[3])
  redis.call('PEXPIRE', KEYS[1], ARGV[4])
end
return s
`)

// Transition sets id's record to rec when its current state is one of from
// (StateNone for a missing record), keeping it for ttl. It returns the state
// it found; the record changed only if that is one of from.
func (s *Store) Transition(ctx context.Context, id string, from []State, rec Record, ttl time.Duration) (State, error) {
	data, err := json.Marshal(rec)
	if err != nil {
		return "", err
	}
	var b strings.Builder
	b.WriteByte(',')
	for _, f := range from {
		b.WriteString(string(f))
		b.WriteByte(',')
	}
	prev, err := transitionScript.Run(ctx, s.rdb, []string{recordKey(id)}, b.String(), string(rec.State), data, ttl.Milliseconds()).Text()
	if err != nil {
		return "", fmt.Errorf("deferred %s to %s: %w", id, rec.State, err)
	}
	return State(prev), nil
}

// StateNone is a missing record, for Transition's from.
const StateNone State = ""

// Get returns id's record; ok=false when there is none.
func (s *Store) Get(ctx context.Context, id string) (rec Record, ok bool, err error) {
	data, err := s.rdb.HGet(ctx, recordKey(id), "data").Bytes()
	if errors.Is(err, redis.Nil) {
		return Record{}, false, nil
	}
	if err != nil {
		return Record{}, false, fmt.Errorf("get deferred %s: %w", id, err)
	}
	if err := json.Unmarshal(data, &rec); err != nil {
		return Record{}, false, fmt.Errorf("get deferred %s: %w", id, err)
	}
	return rec, true, nil
}

// SetPaused pauses (by whom) or resumes (by == "") a route's replay.
func (s *Store) SetPaused(ctx context.Context, route, by string) error {
	return s.setFlag(ctx, pausedKey, "pause", route, by)
}

// Paused reports whether a route's replay is paused.
func (s *Store) Paused(ctx context.Context, route string) (bool, error) {
	return s.flag(ctx, pausedKey, "paused", route)
}

const drainingKey = "fg:dfr:draining"

// SetDraining makes the edges stop deferring a route (by whom; the queued
// requests are still replayed) or, with by == "", defer again.
func (s *Store) SetDraining(ctx context.Context, route, by string) error {
	return s.setFlag(ctx, drainingKey, "drain", route, by)
}

// Draining reports whether the edges stopped deferring a route.
func (s *Store) Draining(ctx context.Context, route string) (bool, error) {
	return s.flag(ctx, drainingKey, "draining", route)
}

// setFlag sets a route's field of the hash key to by, or deletes it when by
// is "" (what names the change in errors).
func (s *Store) setFlag(ctx context.Context, key, what, route, by string) error {
	var err error
	if by == "" {
		err = s.rdb.HDel(ctx, key, route).Err()
	} else {
		err = s.rdb.HSet(ctx, key, route, by).Err()
	}
	if err != nil {
		return fmt.Errorf("%s %s: %w", what, route, err)
	}
	return nil
}

// flag reports whether the hash key has a field for route.
func (s *Store) flag(ctx context.Context, key, what, route string) (bool, error) {
	n, err := s.rdb.HExists(ctx, key, route).Result()
	if err != nil {
		return false, fmt.Errorf("%s %s: %w", what, route, err)
	}
	return n, nil
}

// Routes lists the routes with a queue (requests deferred within their
// max_age), paused or draining, sorted.
func (s *Store) Routes(ctx context.Context) ([]string, error) {
	seen := map[string]bool{}
	scan := func(ctx context.Context, c redis.UniversalClient) error {
		it := c.Scan(ctx, 0, "fg:dfr:qr:*", 1000).Iterator()
		for it.Next(ctx) {
			if r, ok := redisx.Unescape(strings.TrimPrefix(it.Val(), "fg:dfr:qr:")); ok {
				seen[r] = true
			}
		}
		return it.Err()
	}
	var err error
	if cc, ok := s.rdb.(*redis.ClusterClient); ok {
		var mu sync.Mutex
		err = cc.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
			local := map[string]bool{}
			it := m.Scan(ctx, 0, "fg:dfr:qr:*", 1000).Iterator()
			for it.Next(ctx) {
				if r, ok := redisx.Unescape(strings.TrimPrefix(it.Val(), "fg:dfr:qr:")); ok {
					local[r] = true
				}
			}
			mu.Lock()
			maps.Copy(seen, local)
			mu.Unlock()
			return it.Err()
		})
	} else {
		err = scan(ctx, s.rdb)
	}
	if err != nil {
		return nil, fmt.Errorf("list deferred routes: %w", err)
	}
	for _, key := range []string{pausedKey, drainingKey} {
		names, err := s.rdb.HKeys(ctx, key).Result()
		if err != nil {
			return nil, fmt.Errorf("list deferred routes: %w", err)
		}
		for _, n := range names {
			seen[n] = true
		}
	}
	out := slices.Sorted(maps.Keys(seen))
	return out, nil
}
