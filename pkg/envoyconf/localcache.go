package envoyconf

import (
	"sync"
	"time"
)

// LocalCache is envoy ratelimit's local cache (LOCAL_CACHE_SIZE_IN_BYTES):
// the fixed-window counters Redis said were over their limit, until their
// window ends. A descriptor whose counter is in it is answered OVER_LIMIT,
// nothing remaining, without asking Redis and without counting the hit, as
// envoy ratelimit answers it; shadow and quota mode then apply as to any
// over-limit answer. An attack on one counter is so answered in-process.
//
// An entry stands only while the limit it was over is the same — the
// configured requests per unit (or the descriptor's override) times the
// adjuster's scale — so a reloaded configuration or a new scale takes
// effect at once. A principal's penalty lives in Redis: one lifted while
// its counter is cached takes effect when the window ends.
//
// Bounded by Max entries: when it is full of live entries a counter is not
// cached and Redis keeps answering for it; ended entries are swept out at
// most once a second. Safe for concurrent use.
type LocalCache struct {
	Max int

	mu      sync.Mutex
	entries map[string]localEntry
	swept   time.Time // when put last swept the ended entries out
}

type localEntry struct {
	until time.Time // the counter's window's end
	limit uint32    // the limit it was over: Effective(configured, scale)
}

// NewLocalCache returns a cache of at most max counters.
func NewLocalCache(max int) *LocalCache {
	return &LocalCache{Max: max, entries: map[string]localEntry{}}
}

// over reports whether key is cached as over limit at now.
func (c *LocalCache) over(key string, limit uint32, now time.Time) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.entries[key]
	if ok && (!now.Before(e.until) || e.limit != limit) {
		delete(c.entries, key)
		return false
	}
	return ok
}

// put caches key as over limit until its window ends.
func (c *LocalCache) put(key string, limit uint32, until, now time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.entries) >= c.Max {
		if now.Sub(c.swept) < time.Second { // at most one sweep a second: an attack on many counters does not scan the map per call
			return
		}
		c.swept = now
		for k, e := range c.entries {
			if !now.Before(e.until) {
				delete(c.entries, k)
			}
		}
		if len(c.entries) >= c.Max {
			return
		}
	}
	c.entries[key] = localEntry{until: until, limit: limit}
}

// Len is the number of counters cached, live or not yet swept.
func (c *LocalCache) Len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.entries)
}
