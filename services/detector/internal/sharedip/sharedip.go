// Package sharedip keeps the principals seen per client address in Redis,
// shared by every detector instance of a group, so shared-IP awareness (NAT,
// proxies) gives the same answers from one instance or many: each instance
// scores only its partitions' principals, but an address is shared when the
// principals of all partitions together make it so.
//
// Layout: one HyperLogLog per address (IPv4 address, IPv6 /64) and IP-window
// epoch, `<prefix>{<address key, hex>}:<epoch>`, holding principal hashes
// (score.StableHash), expiring after two windows. The hash tag keeps an
// address's epochs in one cluster slot so one PFCOUNT merges them.
package sharedip

import (
	"context"
	"encoding/binary"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/floodgate-dev/floodgate/pkg/config"
	"github.com/floodgate-dev/floodgate/pkg/metric"
	"github.com/floodgate-dev/floodgate/services/detector/internal/score"
)

// Config tunes the store.
type Config struct {
	Prefix        string        // key prefix, e.g. "fg:ipshare:"
	Window        time.Duration // the detector's IP window (FLOODGATE_DETECTOR_IP_WINDOW)
	FlushInterval time.Duration // how often additions are written (default 200ms)
	CacheFor      time.Duration // how long a count read from Redis is reused (default 1s)
	ReadTimeout   time.Duration // budget of one PFCOUNT on the decision path (default 50ms)
	MaxPending    int           // additions buffered between flushes; beyond, dropped and counted (default 200,000)
}

func (c Config) withDefaults() Config {
	if c.Prefix == "" {
		c.Prefix = "fg:ipshare:"
	}
	config.Default(&c.FlushInterval, 200*time.Millisecond)
	config.Default(&c.CacheFor, time.Second)
	config.Default(&c.ReadTimeout, 50*time.Millisecond)
	config.Default(&c.MaxPending, 200_000)
	return c
}

type addKey struct {
	key   uint64
	epoch uint32
}

type cached struct {
	n     int64
	epoch uint32
	at    time.Time
}

// Store implements score.RemoteIPs on Redis. Safe for concurrent use; Run
// writes the additions.
type Store struct {
	rdb redis.UniversalClient
	cfg Config
	win uint32
	log *slog.Logger

	mu      sync.Mutex
	pending map[addKey]map[uint64]struct{}
	npend   int

	cmu   sync.Mutex
	cache map[uint64]cached

	dropped, flushErrs, readErrs prometheus.Counter
	written                      prometheus.Counter
}

var _ score.RemoteIPs = (*Store)(nil)

// New returns a store; reg receives its metrics.
func New(rdb redis.UniversalClient, cfg Config, reg prometheus.Registerer, log *slog.Logger) (*Store, error) {
	cfg = cfg.withDefaults()
	if cfg.Window < time.Second {
		return nil, fmt.Errorf("sharedip: window %s: at least 1s", cfg.Window)
	}
	f := metric.With(reg)
	return &Store{
		rdb: rdb, cfg: cfg, win: uint32(cfg.Window / time.Second), log: log,
		pending: map[addKey]map[uint64]struct{}{}, cache: map[uint64]cached{},
		dropped:   f.Counter("floodgate_detector_shared_ip_dropped_total", "Address sightings not shared with other instances because the buffer was full."),
		flushErrs: f.Counter("floodgate_detector_shared_ip_flush_errors_total", "Failed writes of address sightings to Redis."),
		readErrs:  f.Counter("floodgate_detector_shared_ip_read_errors_total", "Failed reads of shared address counts (the local count was used)."),
		written:   f.Counter("floodgate_detector_shared_ip_written_total", "Address sightings written to Redis."),
	}, nil
}

// Add buffers one sighting; it never blocks on Redis.
func (s *Store) Add(key, principal uint64, sec uint32) {
	k := addKey{key, sec / s.win}
	s.mu.Lock()
	defer s.mu.Unlock()
	set := s.pending[k]
	if set == nil {
		if s.npend >= s.cfg.MaxPending {
			s.dropped.Inc()
			return
		}
		set = map[uint64]struct{}{}
		s.pending[k] = set
	}
	if _, ok := set[principal]; ok {
		return
	}
	if s.npend >= s.cfg.MaxPending {
		s.dropped.Inc()
		return
	}
	set[principal] = struct{}{}
	s.npend++
}

// Count is how many distinct principals every instance saw on key in the
// current and the previous epoch. A count is reused for CacheFor; on a Redis
// error it answers 0, so the caller falls back to its local count.
func (s *Store) Count(key uint64, sec uint32) int64 {
	epoch := sec / s.win
	now := time.Now()
	s.cmu.Lock()
	c, ok := s.cache[key]
	s.cmu.Unlock()
	if ok && c.epoch == epoch && now.Sub(c.at) < s.cfg.CacheFor {
		return c.n
	}
	ctx, cancel := context.WithTimeout(context.Background(), s.cfg.ReadTimeout)
	defer cancel()
	n, err := s.rdb.PFCount(ctx, s.redisKey(key, epoch), s.redisKey(key, epoch-1)).Result()
	if err != nil {
		s.readErrs.Inc()
		return 0
	}
	s.cmu.Lock()
	if len(s.cache) >= 100_000 {
		clear(s.cache) // a bound, not an LRU: counts are cheap to read again
	}
	s.cache[key] = cached{n: n, epoch: epoch, at: now}
	s.cmu.Unlock()
	return n
}

func (s *Store) redisKey(key uint64, epoch uint32) string {
	b := make([]byte, 0, len(s.cfg.Prefix)+32)
	b = append(b, s.cfg.Prefix...)
	b = append(b, '{')
	b = strconv.AppendUint(b, key, 16)
	b = append(b, "}:"...)
	b = strconv.AppendUint(b, uint64(epoch), 10)
	return string(b)
}

// Run writes buffered sightings every FlushInterval until ctx is done, then
// once more.
func (s *Store) Run(ctx context.Context) error {
	t := time.NewTicker(s.cfg.FlushInterval)
	defer t.Stop()
	var lastLog time.Time
	for {
		select {
		case <-ctx.Done():
			fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
			defer cancel()
			_ = s.Flush(fctx)
			return nil
		case <-t.C:
			if err := s.Flush(ctx); err != nil && time.Since(lastLog) > time.Minute {
				lastLog = time.Now()
				s.log.Warn("share address sightings with other detector instances; local counts are used meanwhile", "err", err)
			}
		}
	}
}

// Flush writes the buffered sightings now.
func (s *Store) Flush(ctx context.Context) error {
	s.mu.Lock()
	batch := s.pending
	n := s.npend
	s.pending, s.npend = map[addKey]map[uint64]struct{}{}, 0
	s.mu.Unlock()
	if len(batch) == 0 {
		return nil
	}
	ttl := 2*s.cfg.Window + time.Minute
	pipe := s.rdb.Pipeline()
	var buf [8]byte
	for k, set := range batch {
		members := make([]any, 0, len(set))
		for p := range set {
			binary.BigEndian.PutUint64(buf[:], p)
			members = append(members, string(buf[:]))
		}
		rk := s.redisKey(k.key, k.epoch)
		pipe.PFAdd(ctx, rk, members...)
		pipe.Expire(ctx, rk, ttl)
	}
	if _, err := pipe.Exec(ctx); err != nil {
		s.flushErrs.Inc()
		return fmt.Errorf("write %d address sightings: %w", n, err)
	}
	s.written.Add(float64(n))
	return nil
}
