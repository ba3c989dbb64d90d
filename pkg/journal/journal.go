package journal

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/segmentio/kafka-go"

	"github.com/floodgate-dev/floodgate/pkg/stream"
	"github.com/floodgate-dev/floodgate/pkg/tick"
)

// Journal errors callers can branch on.
var (
	// ErrClosed: the journal was closed (Run returned, or Close).
	ErrClosed = errors.New("journal closed")
	// ErrFull: the batch did not fit under MaxBytes even after the
	// oldest segments were dropped, or the disk refused it and it did not
	// fit in the memory buffer (what did not fit was dropped and counted).
	ErrFull = errors.New("journal full")
	// ErrLocked: another Journal (in this or another process) has
	// the directory open.
	ErrLocked = errors.New("journal directory in use")
)

// Journal sources (label source of floodgate_stream_journaled_total).
const (
	journalSourceFailed   = "failed"   // the async producer gave up on them
	journalSourceOverflow = "overflow" // the async producer's buffer was full
)

// Journal drop reasons (label reason of floodgate_stream_journal_dropped_total).
const (
	journalDropCap        = "cap"         // oldest segment dropped, or batch refused, at MaxBytes
	journalDropQueueFull  = "queue_full"  // Offer refused: the hand-off queue was full
	journalDropClosed     = "closed"      // offered or appended after the journal closed
	journalDropWriteError = "write_error" // the disk write failed
	journalDropNoTopic    = "no_topic"    // a message without a topic cannot be replayed
	journalDropCorrupt    = "corrupt"     // a stored record could not be read back
	journalDropMemoryFull = "memory_full" // the disk refused them and the memory buffer was full
)

// Journal is an append-only, segmented, checksummed on-disk log of Kafka
// messages that could not be delivered, with a drainer (Run) that
// re-publishes them, oldest first, once Kafka takes them again.
//
// Append and Offer are safe for concurrent use. Offer never blocks. Append
// writes (and, under SyncBatch, fsyncs) before it returns.
type Journal struct {
	cfg      Config
	log      *slog.Logger
	lockFile *os.File

	journaledFailed, journaledOverflow, replayed prometheus.Counter
	dropped                                      map[string]prometheus.Counter
	bytesGauge, segmentsGauge, pendingGauge      prometheus.Gauge
	memoryGauge                                  prometheus.Gauge
	truncatedBytes, replayErrors, fsyncErrors    prometheus.Counter
	fsyncSeconds                                 prometheus.Observer

	mu      sync.Mutex
	segs    []*journalSegment // oldest first; the active one, if any, is last
	active  *os.File          // open for append; nil until the next append
	dirty   bool              // active has unsynced writes
	bytes   int64             // on disk, all segments
	pending int64             // records not yet acknowledged by Kafka, in memory too
	nextID  uint64
	closed  bool
	buf     []byte

	// The memory buffer (memory.go): records the disk refused, oldest
	// first, all newer than every record on disk.
	mem        [][]byte  // framed records
	memBytes   int64     // sum of their lengths, at most MemoryBytes
	memBusy    int       // records at mem's head the drainer is publishing
	memRetryAt time.Time // no disk write of mem before this

	free func(dir string) (int64, error) // freeBytes; tests replace it

	wake chan struct{} // an append happened: the drainer may have work

	queue *stream.Handoff[kafka.Message] // Offer's hand-off to Run's disk writer

	lost atomic.Int64 // messages Append or Offer could not keep, cap drops excluded

	errLogAt  time.Time // last error line (logError); j.mu held
	errHeld   int       // error lines held back since
	warnLogAt time.Time // last warning line (logWarn); j.mu held
	warnHeld  int       // warning lines held back since
	ran       atomic.Bool
}

// Open opens (or creates) the journal in cfg.Dir and recovers it:
// a torn or corrupt tail of any segment is truncated (the bytes cut are
// counted in floodgate_stream_journal_truncated_bytes_total), and each
// segment's replay checkpoint is restored. Run replays what it finds.
func Open(cfg Config) (*Journal, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	m, err := newMetrics(cfg.Registerer)
	if err != nil {
		cfg.Logger.Error("journal metrics left unregistered", "err", err)
		m, _ = newMetrics(nil)
	}
	j := &Journal{
		cfg:               cfg,
		log:               cfg.Logger.With("journal", cfg.Name),
		journaledFailed:   m.journaled.WithLabelValues(cfg.Name, journalSourceFailed),
		journaledOverflow: m.journaled.WithLabelValues(cfg.Name, journalSourceOverflow),
		replayed:          m.replayed.WithLabelValues(cfg.Name),
		dropped:           map[string]prometheus.Counter{},
		bytesGauge:        m.bytes.WithLabelValues(cfg.Name),
		memoryGauge:       m.memoryBytes.WithLabelValues(cfg.Name),
		segmentsGauge:     m.segments.WithLabelValues(cfg.Name),
		pendingGauge:      m.pending.WithLabelValues(cfg.Name),
		truncatedBytes:    m.truncated.WithLabelValues(cfg.Name),
		replayErrors:      m.replayErrors.WithLabelValues(cfg.Name),
		fsyncErrors:       m.fsyncErrors.WithLabelValues(cfg.Name),
		fsyncSeconds:      m.fsyncSeconds.WithLabelValues(cfg.Name),
		wake:              make(chan struct{}, 1),
		free:              freeBytes,
	}
	for _, r := range []string{journalDropCap, journalDropQueueFull, journalDropClosed, journalDropWriteError, journalDropNoTopic, journalDropCorrupt, journalDropMemoryFull} {
		j.dropped[r] = m.dropped.WithLabelValues(cfg.Name, r)
	}
	j.queue = stream.NewHandoff[kafka.Message](cfg.QueueSize, j.dropped[journalDropQueueFull], j.dropped[journalDropClosed])
	if err := os.MkdirAll(cfg.Dir, 0o750); err != nil {
		return nil, fmt.Errorf("create journal dir: %w", err)
	}
	if j.lockFile, err = lockDir(cfg.Dir); err != nil {
		return nil, err
	}
	if err := j.recover(); err != nil {
		_ = j.lockFile.Close()
		return nil, fmt.Errorf("recover journal %s: %w", cfg.Dir, err)
	}
	j.updateGauges()
	if j.pending > 0 {
		j.log.Info("journal has messages to replay", "pending", j.pending, "segments", len(j.segs), "bytes", j.bytes)
	}
	return j, nil
}

// Append writes msgs to the journal (fsynced before it returns under
// SyncBatch) and counts them as source "failed". It is the hook for
// stream.AsyncProducerConfig.OnFailed (see OnFailed). Messages without a topic are
// dropped and counted (they could never be replayed). When the batch does
// not fit under MaxBytes the oldest segments are dropped and counted; if it
// still does not fit it is dropped, counted, and ErrFull returned.
func (j *Journal) Append(msgs []kafka.Message) error {
	return j.append(msgs, j.journaledFailed)
}

// OnFailed is Append for stream.AsyncProducerConfig.OnFailed; errors are counted and
// logged.
func (j *Journal) OnFailed(msgs []kafka.Message) { _ = j.Append(msgs) }

// Offer hands msg to Run's disk writer without blocking and reports whether
// it was taken; a full hand-off queue, or a stopped journal, refuses it and
// counts it in floodgate_stream_journal_dropped_total. Messages offered are
// counted as source "overflow".
func (j *Journal) Offer(msg kafka.Message) bool {
	return j.queue.Offer(msg)
}

func (j *Journal) append(msgs []kafka.Message, counter prometheus.Counter) error {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.closed {
		j.drop(journalDropClosed, int64(len(msgs)), true)
		return ErrClosed
	}
	buf := j.buf[:0]
	var n int64
	for i := range msgs {
		if msgs[i].Topic == "" {
			j.drop(journalDropNoTopic, 1, true)
			continue
		}
		buf = appendRecord(buf, &msgs[i])
		n++
	}
	if cap(buf) <= 4<<20 {
		j.buf = buf
	} else {
		j.buf = nil // do not pin a huge buffer after one huge batch
	}
	if n == 0 {
		return nil
	}
	if err := j.flushMemory(); err != nil {
		// Older records wait in memory: these go behind them, in order.
		return j.keep(buf, n, counter, err)
	}
	err := j.writeRecords(buf, n)
	switch {
	case err == nil:
		j.pending += n
		counter.Add(float64(n))
		j.updateGauges()
		return nil
	case errors.Is(err, ErrFull):
		j.drop(journalDropCap, n, false)
		j.logError("journal full: batch dropped", "messages", n, "bytes", len(buf), "max_bytes", j.cfg.MaxBytes)
		return fmt.Errorf("append %d messages: %w", n, err)
	default: // the disk refused them: keep them in memory
		return j.keep(buf, n, counter, err)
	}
}

// errNoRoom: the journal's filesystem has no room for a batch under
// ReserveBytes; the batch goes to the memory buffer.
var errNoRoom = errors.New("no room on the journal's filesystem")

// writeRecords writes buf, n framed records, to the active segment (rolling
// it at SegmentBytes, dropping the oldest segments to stay under
// MaxBytes), and fsyncs under SyncBatch. On error nothing was stored:
// ErrFull when the batch does not fit under MaxBytes, errNoRoom when the
// filesystem has no room for it under ReserveBytes, or the failed create or
// write (ENOSPC, EIO, EROFS…). The caller
// counts the records (pending, journaled). j.mu held.
func (j *Journal) writeRecords(buf []byte, n int64) error {
	need := int64(len(buf))
	if err := j.makeRoom(need + int64(len(segmentMagic))); err != nil {
		return err
	}
	seg := j.activeSegment()
	if seg != nil && seg.records > 0 && seg.size+need > j.cfg.SegmentBytes {
		j.sealActive()
		seg = nil
	}
	if seg == nil {
		var err error
		if seg, err = j.startSegment(); err != nil {
			return err
		}
	}
	if _, err := j.active.Write(buf); err != nil {
		// Cut the partial record so later appends stay readable; if that
		// fails too, seal the segment: the drainer reads only up to
		// seg.size and the next Open truncates the torn tail.
		if terr := j.active.Truncate(seg.size); terr != nil {
			j.sealActive()
		}
		return fmt.Errorf("write segment: %w", err)
	}
	seg.size += need
	seg.records += n
	j.bytes += need
	j.dirty = true
	if j.cfg.Sync == SyncBatch {
		j.syncActive()
	}
	j.signal()
	return nil
}

// signal wakes the drainer: there may be work.
func (j *Journal) signal() {
	select {
	case j.wake <- struct{}{}:
	default:
	}
}

// journalLogEvery bounds the journal's error lines: on a full disk every
// batch fails the same way (15,373 ERROR lines in a 25 s outage on main).
const journalLogEvery = 10 * time.Second

// logError logs an error line — messages lost — at most once per
// journalLogEvery, counting the lines it held back meanwhile. j.mu held.
func (j *Journal) logError(msg string, args ...any) {
	j.logLimited(slog.LevelError, &j.errLogAt, &j.errHeld, msg, args...)
}

// logWarn is logError for trouble that loses nothing (a full disk whose
// batches the memory buffer keeps), on its own budget so that it never
// holds back a loss's ERROR line. j.mu held.
func (j *Journal) logWarn(msg string, args ...any) {
	j.logLimited(slog.LevelWarn, &j.warnLogAt, &j.warnHeld, msg, args...)
}

func (j *Journal) logLimited(level slog.Level, at *time.Time, held *int, msg string, args ...any) {
	now := time.Now()
	if !at.IsZero() && now.Sub(*at) < journalLogEvery {
		*held++
		return
	}
	j.log.Log(context.Background(), level, msg, append(args, "errors_not_logged", *held)...)
	*at, *held = now, 0
}

// drop counts n messages dropped for reason; lost marks messages that were
// never stored (cap drops of stored segments are accounted separately).
func (j *Journal) drop(reason string, n int64, lost bool) {
	if n <= 0 {
		return
	}
	j.dropped[reason].Add(float64(n))
	if lost {
		j.lost.Add(n)
	}
}

func (j *Journal) updateGauges() {
	j.bytesGauge.Set(float64(j.bytes))
	j.memoryGauge.Set(float64(j.memBytes))
	j.segmentsGauge.Set(float64(len(j.segs)))
	j.pendingGauge.Set(float64(j.pending))
}

// Stats is a snapshot of a journal's state.
type Stats struct {
	Pending        int64 // messages stored (on disk or in memory) and not yet acknowledged by Kafka
	Bytes          int64 // bytes on disk
	Segments       int
	Queued         int   // messages offered and not yet written
	MemoryBytes    int64 // bytes held in memory because the disk refused them
	MemoryMessages int   // messages held in memory
}

// Stats returns a snapshot of the journal's state.
func (j *Journal) Stats() Stats {
	j.mu.Lock()
	defer j.mu.Unlock()
	return Stats{Pending: j.pending, Bytes: j.bytes, Segments: len(j.segs), Queued: j.queue.Len(), MemoryBytes: j.memBytes, MemoryMessages: len(j.mem)}
}

// ReplayPublisher publishes messages and returns once all of them are
// acknowledged by all in-sync replicas; on error some may have been written
// (a kafka.WriteErrors in the chain gives each message's outcome). *stream.Producer
// is one. It must be safe for use from one goroutine at a time.
type ReplayPublisher interface {
	Publish(ctx context.Context, msgs ...kafka.Message) error
}

var _ ReplayPublisher = (*stream.Producer)(nil)

// Run writes offered messages to disk, fsyncs on the interval policy, and
// replays the journal through pub (nil: store only) until ctx is done. Then
// it refuses new offers, writes what was offered, fsyncs and closes the
// journal; an in-flight replay is cancelled (its messages stay journaled and
// are replayed, perhaps again, after the next Open). Run may be called
// once; Append still works while it runs and until it returns.
func (j *Journal) Run(ctx context.Context, pub ReplayPublisher) error {
	if !j.ran.CompareAndSwap(false, true) {
		return errors.New("journal: Run called twice")
	}
	bg, stopBG := context.WithCancel(ctx)
	var wg sync.WaitGroup
	if pub != nil {
		wg.Go(func() { j.replayLoop(bg, pub) })
	}
	if j.cfg.Sync == SyncInterval {
		wg.Go(func() { _ = tick.Every(bg, j.cfg.SyncInterval, func(context.Context) { j.Sync() }) })
	}
	j.writeLoop(ctx)
	stopBG()
	wg.Wait()
	return j.Close()
}

// writeLoop moves offered messages to disk in batches until ctx is done, then
// closes the queue and writes what is left.
func (j *Journal) writeLoop(ctx context.Context) {
	batch := make([]kafka.Message, 0, j.cfg.ReplayBatchSize)
	for {
		select {
		case <-ctx.Done():
			j.closeQueue()
			return
		case m := <-j.queue.C():
			batch = j.fillFromQueue(append(batch[:0], m))
			_ = j.append(batch, j.journaledOverflow)
			clear(batch)
		}
	}
}

// fillFromQueue appends to batch what the queue holds, up to cap(batch).
func (j *Journal) fillFromQueue(batch []kafka.Message) []kafka.Message {
	return stream.TakeBuffered(j.queue.C(), batch, cap(batch))
}

// closeQueue refuses further offers and writes what is queued.
func (j *Journal) closeQueue() {
	if j.queue.Close() {
		return
	}
	batch := make([]kafka.Message, 0, max(j.cfg.ReplayBatchSize, 1))
	for {
		batch = j.fillFromQueue(batch[:0])
		if len(batch) == 0 {
			return
		}
		_ = j.append(batch, j.journaledOverflow)
	}
}

// Close writes what was offered, fsyncs and closes the active segment, and
// releases the directory. Later Appends and Offers are refused and counted.
// Close is idempotent; Run calls it.
func (j *Journal) Close() error {
	j.closeQueue()
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.closed {
		return nil
	}
	j.closeMemory()
	j.closed = true
	var errs []error
	if j.active != nil {
		j.syncActive()
		if err := j.active.Close(); err != nil {
			errs = append(errs, fmt.Errorf("close journal segment: %w", err))
		}
		j.active = nil
	}
	if err := j.lockFile.Close(); err != nil {
		errs = append(errs, fmt.Errorf("unlock journal dir: %w", err))
	}
	return errors.Join(errs...)
}
