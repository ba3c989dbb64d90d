package journal

import (
	"cmp"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/floodgate-dev/floodgate/pkg/config"
	"github.com/floodgate-dev/floodgate/pkg/stream"
)

// Journal defaults.
const (
	DefaultSegmentBytes  = 64 << 20
	DefaultMaxBytes      = 1 << 30
	DefaultReserveBytes  = 64 << 20
	DefaultMemoryBytes   = 32 << 20
	DefaultSyncInterval  = 100 * time.Millisecond
	DefaultQueueSize     = 65536
	DefaultReplayBatch   = 500
	DefaultReplayTimeout = 30 * time.Second

	// MinSegmentBytes is the smallest SegmentBytes Validate accepts.
	MinSegmentBytes = 4 << 10
)

// SyncPolicy says when appended records are fsynced.
type SyncPolicy int

const (
	// SyncBatch fsyncs after every appended batch: once Append
	// returns, the batch survives a machine crash. The default.
	SyncBatch SyncPolicy = iota
	// SyncInterval fsyncs the active segment every SyncInterval (and
	// on every segment roll and on Close): up to SyncInterval of appended
	// records can be lost to a machine (not process) crash.
	SyncInterval
)

// String returns "batch" or "interval".
func (s SyncPolicy) String() string {
	switch s {
	case SyncBatch:
		return "batch"
	case SyncInterval:
		return "interval"
	}
	return "SyncPolicy(" + strconv.Itoa(int(s)) + ")"
}

// ParseSyncPolicy parses "batch" or "interval".
func ParseSyncPolicy(s string) (SyncPolicy, error) {
	switch s {
	case "batch":
		return SyncBatch, nil
	case "interval":
		return SyncInterval, nil
	}
	return 0, fmt.Errorf("parse journal sync policy %q: want batch or interval", s)
}

// Config configures a Journal. Each field names the environment
// variable ConfigFromEnv reads it from.
type Config struct {
	// Dir holds the segment files (created if missing). Required. One
	// journal per directory: Open locks it.
	// FLOODGATE_JOURNAL_DIR; empty disables the journal.
	Dir string
	// Name labels the metrics (journal="..."); default "journal".
	Name string
	// SegmentBytes is the size at which the active segment is sealed and a
	// new one started; default 64 MiB. FLOODGATE_JOURNAL_SEGMENT_BYTES.
	SegmentBytes int64
	// MaxBytes caps the bytes on disk; appending past it drops the oldest
	// segments, counting their unreplayed messages in
	// floodgate_stream_journal_dropped_total{reason="cap"}. At least
	// 2×SegmentBytes; default 1 GiB. FLOODGATE_JOURNAL_MAX_BYTES.
	MaxBytes int64
	// ReserveBytes is left free on the journal's filesystem: the journal
	// holds on disk at most the smaller of MaxBytes and what it holds plus
	// the free space less this reserve, read at every append. What the disk
	// has no room for goes to the memory buffer (MemoryBytes) instead of
	// failing writes. Default 64 MiB; FLOODGATE_JOURNAL_RESERVE_BYTES.
	ReserveBytes int64
	// MemoryBytes bounds the in-memory buffer that takes the records the
	// disk refuses (no room on the filesystem under ReserveBytes, or a
	// failed write: ENOSPC, EIO, EROFS…) until the disk takes writes again
	// or the drainer publishes them; records beyond it are dropped and
	// counted in floodgate_stream_journal_dropped_total{reason="memory_full"}.
	// Default 32 MiB; FLOODGATE_JOURNAL_MEMORY_BYTES.
	MemoryBytes int64
	// Sync is the fsync policy; default SyncBatch.
	// FLOODGATE_JOURNAL_SYNC (batch | interval).
	Sync SyncPolicy
	// SyncInterval is the fsync period under SyncInterval; default
	// 100ms. FLOODGATE_JOURNAL_SYNC_INTERVAL.
	SyncInterval time.Duration
	// QueueSize bounds the in-memory hand-off from Offer (the producer's
	// overflow) to the disk writer; default 65536. FLOODGATE_JOURNAL_QUEUE.
	QueueSize int
	// ReplayBatchSize is the most messages published at once by the
	// drainer (and written, with one fsync, at once by the overflow
	// writer); default 500.
	ReplayBatchSize int
	// ReplayInitialBackoff and ReplayMaxBackoff bound the jittered backoff
	// between failed replay attempts; defaults 100ms and 5s.
	ReplayInitialBackoff time.Duration
	ReplayMaxBackoff     time.Duration
	// ReplayTimeout bounds one replay Publish; default 30s.
	ReplayTimeout time.Duration

	// Logger and Registerer: nil discards logs and leaves metrics unregistered.
	Logger     *slog.Logger
	Registerer prometheus.Registerer
}

// ConfigFromEnv reads the FLOODGATE_JOURNAL_* variables (see
// Config); the result is not validated. Dir is empty, which disables
// the journal, unless FLOODGATE_JOURNAL_DIR is set.
func ConfigFromEnv(getenv config.Getenv) (Config, error) {
	e := config.NewEnv(getenv)
	c := Config{
		Dir:          e.String("FLOODGATE_JOURNAL_DIR", ""),
		SegmentBytes: int64(e.Int("FLOODGATE_JOURNAL_SEGMENT_BYTES", DefaultSegmentBytes)),
		MaxBytes:     int64(e.Int("FLOODGATE_JOURNAL_MAX_BYTES", DefaultMaxBytes)),
		ReserveBytes: int64(e.Int("FLOODGATE_JOURNAL_RESERVE_BYTES", DefaultReserveBytes)),
		MemoryBytes:  int64(e.Int("FLOODGATE_JOURNAL_MEMORY_BYTES", DefaultMemoryBytes)),
		SyncInterval: e.Duration("FLOODGATE_JOURNAL_SYNC_INTERVAL", DefaultSyncInterval),
		QueueSize:    e.Int("FLOODGATE_JOURNAL_QUEUE", DefaultQueueSize),
	}
	sync, err := ParseSyncPolicy(e.String("FLOODGATE_JOURNAL_SYNC", "batch"))
	if err != nil {
		return c, errors.Join(e.Err(), fmt.Errorf("FLOODGATE_JOURNAL_SYNC: %w", err))
	}
	c.Sync = sync
	return c, e.Err()
}

// Validate checks the configuration; zero values that have defaults are valid.
func (c Config) Validate() error {
	var errs []error
	bad := func(field, env, format string, args ...any) {
		if env != "" {
			field += " (" + env + ")"
		}
		errs = append(errs, fmt.Errorf("%w: journal.Config.%s: %s", stream.ErrInvalidConfig, field, fmt.Sprintf(format, args...)))
	}
	if c.Dir == "" {
		bad("Dir", "FLOODGATE_JOURNAL_DIR", "required")
	}
	d := c.withDefaults()
	if c.SegmentBytes < 0 || d.SegmentBytes < MinSegmentBytes {
		bad("SegmentBytes", "FLOODGATE_JOURNAL_SEGMENT_BYTES", "must be at least %d, got %d", MinSegmentBytes, c.SegmentBytes)
	}
	if c.MaxBytes < 0 || d.MaxBytes < 2*d.SegmentBytes {
		bad("MaxBytes", "FLOODGATE_JOURNAL_MAX_BYTES", "must be at least 2×SegmentBytes (%d), got %d", 2*d.SegmentBytes, c.MaxBytes)
	}
	if c.ReserveBytes < 0 {
		bad("ReserveBytes", "FLOODGATE_JOURNAL_RESERVE_BYTES", "must not be negative, got %d", c.ReserveBytes)
	}
	if c.MemoryBytes < 0 {
		bad("MemoryBytes", "FLOODGATE_JOURNAL_MEMORY_BYTES", "must not be negative, got %d", c.MemoryBytes)
	}
	if c.Sync != SyncBatch && c.Sync != SyncInterval {
		bad("Sync", "FLOODGATE_JOURNAL_SYNC", "want batch or interval, got %v", c.Sync)
	}
	if c.SyncInterval < 0 {
		bad("SyncInterval", "FLOODGATE_JOURNAL_SYNC_INTERVAL", "must not be negative, got %v", c.SyncInterval)
	}
	if c.QueueSize < 0 {
		bad("QueueSize", "FLOODGATE_JOURNAL_QUEUE", "must not be negative, got %d", c.QueueSize)
	}
	if c.ReplayBatchSize < 0 {
		bad("ReplayBatchSize", "", "must not be negative, got %d", c.ReplayBatchSize)
	}
	for _, f := range []struct {
		name string
		v    time.Duration
	}{{"ReplayInitialBackoff", c.ReplayInitialBackoff}, {"ReplayMaxBackoff", c.ReplayMaxBackoff}, {"ReplayTimeout", c.ReplayTimeout}} {
		if f.v < 0 {
			bad(f.name, "", "must not be negative, got %v", f.v)
		}
	}
	if d.ReplayMaxBackoff < d.ReplayInitialBackoff {
		bad("ReplayMaxBackoff", "", "must be at least ReplayInitialBackoff (%v), got %v", d.ReplayInitialBackoff, d.ReplayMaxBackoff)
	}
	return errors.Join(errs...)
}

func (c Config) withDefaults() Config {
	c.Name = cmp.Or(c.Name, "journal")
	c.SegmentBytes = cmp.Or(c.SegmentBytes, DefaultSegmentBytes)
	c.MaxBytes = cmp.Or(c.MaxBytes, max(DefaultMaxBytes, 2*c.SegmentBytes))
	c.ReserveBytes = cmp.Or(c.ReserveBytes, DefaultReserveBytes)
	c.MemoryBytes = cmp.Or(c.MemoryBytes, DefaultMemoryBytes)
	c.SyncInterval = cmp.Or(c.SyncInterval, DefaultSyncInterval)
	c.QueueSize = cmp.Or(c.QueueSize, DefaultQueueSize)
	c.ReplayBatchSize = cmp.Or(c.ReplayBatchSize, DefaultReplayBatch)
	c.ReplayInitialBackoff, c.ReplayMaxBackoff = stream.BackoffDefaults(c.ReplayInitialBackoff, c.ReplayMaxBackoff)
	c.ReplayTimeout = cmp.Or(c.ReplayTimeout, DefaultReplayTimeout)
	c.Logger = stream.OrDiscard(c.Logger)
	return c
}
