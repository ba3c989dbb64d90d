package journal

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/cenkalti/backoff/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/segmentio/kafka-go"

	"github.com/floodgate-dev/floodgate/pkg/tick"
)

// The memory buffer holds, in the journal's record format, what the disk
// refused (no room on the filesystem under ReserveBytes, or a failed create
// or write: ENOSPC, EIO, EROFS…), up to MemoryBytes; what does not fit is
// dropped and counted as reason="memory_full".
//
// Order: every record in memory is newer than every record on disk. While
// memory holds records, each append first tries to write them to disk (at
// most once per memoryRetry while the disk keeps refusing), oldest first;
// until that succeeds the new batch goes behind them in memory. The drainer
// publishes from memory only when the disk holds nothing left to replay,
// oldest first, and meanwhile appends do not move memory to disk. So the
// journal re-publishes in the order it took the records, whichever of disk
// or memory held them (failed publishes retried aside). Close writes memory
// to disk; what the disk still refuses is dropped and counted as
// reason="write_error".

// memoryRetry is how often, at most, a disk that refused writes is tried
// again while records wait in memory.
const memoryRetry = 250 * time.Millisecond

// errBehindMemory: older records wait in memory and could not be written
// to disk now (the drainer is publishing them, or the disk refused them
// less than memoryRetry ago).
var errBehindMemory = errors.New("older records wait in memory")

// frameSize is the length of the framed record at the start of b.
func frameSize(b []byte) int { return recordHeaderSize + int(binary.BigEndian.Uint32(b)) }

// keep holds buf's n framed records in memory, as many as fit under
// MemoryBytes, oldest first; the rest are dropped and counted as
// memory_full. cause is why the disk did not take them. j.mu held.
func (j *Journal) keep(buf []byte, n int64, counter prometheus.Counter, cause error) error {
	var kept int64
	size := 0
	for size < len(buf) {
		next := frameSize(buf[size:])
		if j.memBytes+int64(size+next) > j.cfg.MemoryBytes {
			break
		}
		size += next
		kept++
	}
	if kept > 0 {
		held := bytes.Clone(buf[:size])
		for off := 0; off < len(held); {
			next := frameSize(held[off:])
			j.mem = append(j.mem, held[off:off+next:off+next])
			off += next
		}
		j.memBytes += int64(size)
		j.pending += kept
		counter.Add(float64(kept))
		j.updateGauges()
		j.signal()
	}
	if lost := n - kept; lost > 0 {
		j.drop(journalDropMemoryFull, lost, true)
		j.logError("journal disk refuses writes and its memory buffer is full: messages dropped",
			"messages_dropped", lost, "messages_kept", kept, "memory_bytes", j.memBytes, "memory_max_bytes", j.cfg.MemoryBytes, "err", cause)
		return fmt.Errorf("append %d messages: memory buffer full, %d dropped: %w", n, lost, ErrFull)
	}
	if !errors.Is(cause, errBehindMemory) {
		j.logWarn("journal disk refuses writes: messages kept in memory",
			"messages", kept, "memory_bytes", j.memBytes, "memory_max_bytes", j.cfg.MemoryBytes, "err", cause)
	}
	return nil
}

// flushMemory writes the memory buffer to disk, oldest first, a segment's
// worth at a time after a first small chunk. It returns nil once memory is empty, errBehindMemory
// when it did not try, or the disk's error. j.mu held.
func (j *Journal) flushMemory() error {
	if len(j.mem) == 0 {
		return nil
	}
	if j.memBusy > 0 || time.Now().Before(j.memRetryAt) {
		return errBehindMemory
	}
	moved := 0
	// A small first chunk probes the disk: a disk that still refuses costs
	// a 64 KiB copy per retry, not a segment's worth.
	chunk := min(j.cfg.SegmentBytes, 64<<10) - int64(len(segmentMagic))
	for len(j.mem) > 0 {
		k, size := 0, 0
		for k < len(j.mem) && (k == 0 || int64(size+len(j.mem[k])) <= chunk) {
			size += len(j.mem[k])
			k++
		}
		buf := make([]byte, 0, size)
		for _, r := range j.mem[:k] {
			buf = append(buf, r...)
		}
		if err := j.writeRecords(buf, int64(k)); err != nil {
			j.memRetryAt = time.Now().Add(memoryRetry)
			j.updateGauges()
			return err
		}
		j.dropMemoryHead(k, int64(size))
		moved += k
		chunk = j.cfg.SegmentBytes - int64(len(segmentMagic))
	}
	j.updateGauges()
	j.log.Warn("journal disk accepts writes again: memory buffer written to disk", "messages", moved)
	return nil
}

// dropMemoryHead removes the k oldest records (size bytes) from memory.
// j.mu held.
func (j *Journal) dropMemoryHead(k int, size int64) {
	clear(j.mem[:k])
	j.mem = j.mem[k:]
	if len(j.mem) == 0 {
		j.mem = nil
	}
	j.memBytes -= size
}

// closeMemory writes what memory holds to disk before the journal closes;
// what the disk still refuses is lost and counted as write_error. j.mu
// held.
func (j *Journal) closeMemory() {
	if len(j.mem) == 0 {
		return
	}
	j.memBusy, j.memRetryAt = 0, time.Time{}
	err := j.flushMemory()
	if err == nil {
		return
	}
	lost := int64(len(j.mem))
	j.pending -= lost
	j.drop(journalDropWriteError, lost, true)
	j.log.Error("journal closing: the disk refused the records held in memory; dropped", "messages", lost, "bytes", j.memBytes, "err", err)
	j.dropMemoryHead(len(j.mem), j.memBytes)
	j.updateGauges()
}

// replayMemory publishes the oldest records held in memory (the disk has
// nothing older) and removes those Kafka acknowledged; it retries after a
// backoff when some failed. It reports whether memory held any.
func (j *Journal) replayMemory(ctx context.Context, pub ReplayPublisher, bo *backoff.ExponentialBackOff, failures *int) bool {
	j.mu.Lock()
	if j.closed || len(j.mem) == 0 {
		j.mu.Unlock()
		return false
	}
	k := min(len(j.mem), j.cfg.ReplayBatchSize)
	recs := make([][]byte, k)
	copy(recs, j.mem[:k])
	j.memBusy = k
	j.mu.Unlock()

	msgs := make([]kafka.Message, 0, k)
	idx := make([]int, 0, k) // msgs[i] is recs[idx[i]]
	var corrupt int64
	for i, r := range recs {
		m, derr := decodeRecord(r[recordHeaderSize:])
		if derr != nil { // encoded by append in this process: cannot happen
			j.log.Error("journal memory record unreadable; dropped", "err", derr)
			corrupt++
			continue
		}
		msgs = append(msgs, m)
		idx = append(idx, i)
	}
	var err error
	if len(msgs) > 0 {
		pctx, cancel := context.WithTimeout(ctx, j.cfg.ReplayTimeout)
		err = pub.Publish(pctx, msgs...)
		cancel()
	}
	done := make([]bool, k)
	var werrs kafka.WriteErrors
	perMessage := errors.As(err, &werrs) && len(werrs) == len(msgs)
	var newly int64
	for i, r := range idx {
		if err == nil || (perMessage && werrs[i] == nil) {
			done[r] = true
			newly++
		}
	}
	for i := range recs {
		if !done[i] && !slices.Contains(idx, i) {
			done[i] = true // unreadable: counted as corrupt
		}
	}

	j.mu.Lock()
	j.memBusy = 0
	if j.closed {
		j.mu.Unlock()
		return true
	}
	rest := make([][]byte, 0, len(j.mem))
	var gone, goneBytes int64
	for i, r := range recs {
		if done[i] {
			gone++
			goneBytes += int64(len(r))
			continue
		}
		rest = append(rest, r)
	}
	if gone > 0 {
		rest = append(rest, j.mem[k:]...)
		clear(j.mem)
		j.mem = rest
		if len(j.mem) == 0 {
			j.mem = nil
		}
		j.memBytes -= goneBytes
		j.pending -= gone
		j.drop(journalDropCorrupt, corrupt, false)
		j.updateGauges()
	}
	j.mu.Unlock()
	j.replayed.Add(float64(newly))
	if err == nil {
		*failures = 0
		bo.Reset()
		return true
	}
	j.replayErrors.Inc()
	*failures++
	if *failures == 1 || *failures%10 == 0 {
		j.log.Warn("journal replay from memory failed; retrying", "messages", len(msgs)-int(newly), "attempt", *failures, "err", err)
	}
	tick.Sleep(ctx, min(bo.NextBackOff(), j.cfg.ReplayMaxBackoff))
	return true
}
