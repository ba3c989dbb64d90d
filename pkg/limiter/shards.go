package limiter

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/sony/gobreaker/v2"

	"github.com/floodgate-dev/floodgate/pkg/limiter/admission"
	"github.com/floodgate-dev/floodgate/pkg/redisx"
	"github.com/floodgate-dev/floodgate/pkg/tick"
)

// A shard is one Redis node the engine writes to — the standalone server, the
// master Sentinel names, or one Redis Cluster master — with what keeps its
// faults its own: a circuit breaker, a pipeline batcher and an adaptive
// concurrency limit. A stall or a failover of one cluster master opens that
// master's breaker only; checks whose keys live elsewhere never notice.
type shard struct {
	name    string
	breaker *gobreaker.TwoStepCircuitBreaker[struct{}]
	batch   *scriptBatcher // nil: one Redis call per check
	adm     *admission.ConcurrencyLimit
	set     *shardSet

	lastErr atomic.Pointer[string] // the latest Redis error, named when the breaker opens
	errLog  rateLog                // "redis call failed" lines
	tripLog rateLog                // "redis circuit breaker opened" lines
}

// rateLog lets one line through per interval and counts the rest; safe for
// concurrent use.
type rateLog struct {
	mu sync.Mutex
	t  tick.Throttle
}

// allow reports whether to log now, and how many lines were held back since.
func (r *rateLog) allow(now time.Time, every time.Duration) (bool, int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	ok, n := r.t.Pass(now, every)
	return ok, int(n)
}

// shardConfig is what every shard is built from.
type shardConfig struct {
	rdb             redis.UniversalClient
	script          *redis.Script
	budget          time.Duration
	batch           int           // checks per pipeline; ≤ 1 = no batcher
	breakerFailures uint32        // failures within the window, at least…
	breakerRatio    float64       // …and at least this share of the window's calls
	breakerWindow   time.Duration // sliding window of the counts
	breakerOpen     time.Duration // open for 0.5–1.25 × this, jittered per breaker
	logEvery        time.Duration
	admission       admission.Config
	log             *slog.Logger
	m               *engineMetrics
}

// shardSet maps keys to shards. Without a cluster there is one shard. With
// one, Run keeps a slot table from CLUSTER SLOTS — reloaded every second and
// at once after an error on any shard, together with go-redis's own routing
// (ReloadState) — so a promoted replica takes its slots over within a reload.
// Slots not (yet) in the table share the "cluster" shard, on which go-redis
// routes by itself: that is the case while the cluster is unreachable at start.
type shardSet struct {
	cfg     shardConfig
	cluster *redis.ClusterClient
	single  *shard // no cluster: the one node; cluster: slots not in the table

	mu     sync.Mutex
	byAddr map[string]*shard
	table  atomic.Pointer[[redisx.Slots]*shard]
	reload chan struct{}

	reconnectAt atomic.Int64 // last Reconnect, unix ns (at most one per 100 ms)
	roLog       rateLog      // "redis node is read-only" lines
}

func newShardSet(cfg shardConfig) *shardSet {
	s := &shardSet{cfg: cfg, byAddr: map[string]*shard{}, reload: make(chan struct{}, 1)}
	name := "redis"
	if cc, ok := cfg.rdb.(*redis.ClusterClient); ok {
		s.cluster, name = cc, "cluster"
	}
	s.single = s.newShard(name)
	return s
}

func (s *shardSet) newShard(name string) *shard {
	c := s.cfg
	sh := &shard{name: name, set: s}
	if c.batch > 1 {
		sh.batch = newScriptBatcher(c.rdb, c.script, c.batch, 16*c.batch, c.budget, c.m)
	}
	inflight := c.m.admissionLimit.WithLabelValues(name)
	sh.adm = admission.NewConcurrencyLimit(c.admission, func(v int64) { inflight.Set(float64(v)) })
	open := c.m.breakerOpen.WithLabelValues(name)
	open.Set(0)
	timeout := time.Duration(float64(c.breakerOpen) * (0.5 + 0.75*rand.Float64()))
	sh.breaker = gobreaker.NewTwoStepCircuitBreaker[struct{}](gobreaker.Settings{
		Name:         name,
		MaxRequests:  5,
		Interval:     c.breakerWindow,
		BucketPeriod: c.breakerWindow / 10,
		Timeout:      timeout,
		ReadyToTrip: func(cnt gobreaker.Counts) bool {
			return tripRatio(cnt, c.breakerFailures, c.breakerRatio)
		},
		// A caller that went away, or a check shed before it reached Redis,
		// says nothing about Redis.
		IsExcluded: func(err error) bool {
			return errors.Is(err, context.Canceled) || errors.Is(err, errOverloaded) || errors.Is(err, ErrPastDeadline)
		},
		OnStateChange: func(_ string, from, to gobreaker.State) {
			if to == gobreaker.StateOpen {
				open.Set(1)
				c.m.breakerTrips.WithLabelValues(name).Inc()
				if ok, held := sh.tripLog.allow(time.Now(), c.logEvery); ok {
					cause := ""
					if p := sh.lastErr.Load(); p != nil {
						cause = *p
					}
					c.log.Warn("redis circuit breaker opened", "shard", name, "from", from.String(), "open_for", timeout,
						"cause", cause, "trips_not_logged", held)
				}
				return
			}
			if to == gobreaker.StateClosed {
				open.Set(0)
			}
		},
	})
	return sh
}

// tripRatio opens a breaker when, within its sliding window, at least
// minFailures calls failed and they were at least ratio of the calls — so a
// short stall under load (a few percent of a second's calls) leaves it closed,
// and a dead node at low traffic still opens it.
func tripRatio(cnt gobreaker.Counts, minFailures uint32, ratio float64) bool {
	return cnt.TotalFailures >= minFailures && float64(cnt.TotalFailures) >= ratio*float64(cnt.Requests)
}

// of returns the shard that holds key.
func (s *shardSet) of(key string) *shard {
	if s.cluster == nil {
		return s.single
	}
	t := s.table.Load()
	if t == nil {
		return s.single
	}
	if sh := t[redisx.Slot(key)]; sh != nil {
		return sh
	}
	return s.single
}

// failed records a Redis error of sh: logged (at most one line per shard per
// logEvery, with the count held back), remembered as the cause of a trip, and
// acted on — READONLY means the node was demoted, so a cluster's slots are
// reloaded and a single node's connections retired (the next dial asks
// Sentinel for the master); any error on a cluster shard reloads the slots.
func (s *shardSet) failed(sh *shard, err error) {
	if rc, ok := s.cfg.rdb.(interface{ RootCause(error) error }); ok {
		err = rc.RootCause(err) // "connection refused", not only the deadline it caused
	}
	msg := err.Error()
	sh.lastErr.Store(&msg)
	readOnly := redisx.IsReadOnly(err)
	if readOnly {
		s.cfg.m.readOnly.Inc()
	}
	if ok, held := sh.errLog.allow(time.Now(), s.cfg.logEvery); ok {
		s.cfg.log.Warn("redis call failed", "shard", sh.name, "err", msg, "errors_not_logged", held)
	}
	if s.cluster != nil {
		s.requestReload()
		return
	}
	if readOnly {
		if n, ok := s.cfg.rdb.(interface{ Reconnect() }); ok {
			now := time.Now().UnixNano()
			if last := s.reconnectAt.Load(); now-last >= int64(100*time.Millisecond) && s.reconnectAt.CompareAndSwap(last, now) {
				n.Reconnect()
				if ok, held := s.roLog.allow(time.Now(), s.cfg.logEvery); ok {
					s.cfg.log.Warn("redis node is read-only (demoted); reconnecting to the current master", "shard", sh.name, "lines_not_logged", held)
				}
			}
		}
	}
}

func (s *shardSet) requestReload() {
	select {
	case s.reload <- struct{}{}:
	default:
	}
}

// all returns every shard.
func (s *shardSet) all() []*shard {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := []*shard{s.single}
	for _, sh := range s.byAddr {
		out = append(out, sh)
	}
	return out
}

// refresh reads the cluster's slot table and points go-redis at it too.
func (s *shardSet) refresh(ctx context.Context) error {
	if s.cluster == nil {
		return nil
	}
	s.cluster.ReloadState(ctx)
	slots, err := s.cluster.ClusterSlots(ctx).Result()
	if err != nil {
		s.cfg.m.slotReloads.WithLabelValues("error").Inc()
		return fmt.Errorf("cluster slots: %w", err)
	}
	var t [redisx.Slots]*shard
	s.mu.Lock()
	for _, r := range slots {
		if len(r.Nodes) == 0 || r.Start < 0 || r.End >= redisx.Slots {
			continue
		}
		addr := r.Nodes[0].Addr
		sh := s.byAddr[addr]
		if sh == nil {
			sh = s.newShard(addr)
			s.byAddr[addr] = sh
		}
		for i := r.Start; i <= r.End; i++ {
			t[i] = sh
		}
	}
	s.mu.Unlock()
	if old := s.table.Load(); old == nil || *old != t {
		s.table.Store(&t)
		s.cfg.m.slotReloads.WithLabelValues("changed").Inc()
	} else {
		s.cfg.m.slotReloads.WithLabelValues("same").Inc()
	}
	return nil
}

// run keeps the slot table fresh until ctx is done: every interval, and at
// most every 100 ms while errors ask for it.
func (s *shardSet) run(ctx context.Context, every time.Duration) {
	if s.cluster == nil {
		return
	}
	t := time.NewTicker(every)
	defer t.Stop()
	var last time.Time
	for {
		rctx, cancel := context.WithTimeout(ctx, max(every, time.Second))
		if err := s.refresh(rctx); err != nil && ctx.Err() == nil {
			if ok, _ := s.single.errLog.allow(time.Now(), s.cfg.logEvery); ok {
				s.cfg.log.Warn("redis cluster slot reload", "err", err)
			}
		}
		cancel()
		last = time.Now()
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-s.reload:
			if d := 100*time.Millisecond - time.Since(last); d > 0 {
				select {
				case <-ctx.Done():
					return
				case <-time.After(d):
				}
			}
		}
	}
}

// healthy reports whether no shard's breaker is open.
func (s *shardSet) healthy() (bool, map[string]string) {
	ok, states := true, map[string]string{}
	for _, sh := range s.all() {
		st := sh.breaker.State()
		states[sh.name] = st.String()
		if st != gobreaker.StateClosed {
			ok = false
		}
	}
	return ok, states
}
