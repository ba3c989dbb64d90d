package journal

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"

	"github.com/cenkalti/backoff/v5"
	"github.com/segmentio/kafka-go"

	"github.com/floodgate-dev/floodgate/pkg/tick"
)

// replayItem is one record of the batch being replayed.
type replayItem struct {
	msg  kafka.Message
	end  int64 // offset just after the record in its segment
	done bool  // acknowledged by Kafka (or unreadable and counted)
}

// replayLoop re-publishes the journal, oldest segment first and in record
// order within a segment, then the memory buffer (memory.go), until ctx is
// done. A segment is deleted only once
// every record in it was acknowledged.
func (j *Journal) replayLoop(ctx context.Context, pub ReplayPublisher) {
	bo := backoff.NewExponentialBackOff()
	bo.InitialInterval = j.cfg.ReplayInitialBackoff
	bo.MaxInterval = j.cfg.ReplayMaxBackoff
	memFailures := 0
	for ctx.Err() == nil {
		seg := j.nextReplay()
		if seg == nil {
			if j.replayMemory(ctx, pub, bo, &memFailures) {
				continue
			}
			select {
			case <-ctx.Done():
				return
			case <-j.wake:
			}
			continue
		}
		if err := j.replaySegment(ctx, pub, seg, bo); err != nil && ctx.Err() == nil {
			j.replayErrors.Inc()
			j.log.Error("journal replay", "segment", seg.id, "err", err)
			tick.Sleep(ctx, min(bo.NextBackOff(), j.cfg.ReplayMaxBackoff))
		}
	}
}

// nextReplay returns the oldest segment, sealing the active one when it is
// the only one left with records; nil when there is nothing to replay.
func (j *Journal) nextReplay() *journalSegment {
	j.mu.Lock()
	defer j.mu.Unlock()
	if len(j.segs) == 0 {
		return nil
	}
	seg := j.segs[0]
	if !seg.sealed {
		if seg.records == 0 {
			return nil
		}
		j.sealActive()
	}
	return seg
}

// replaySegment publishes seg from its checkpoint to its end, then deletes
// it. It returns nil when the segment is finished or was dropped by the cap,
// ctx's error when stopped, or a read error.
func (j *Journal) replaySegment(ctx context.Context, pub ReplayPublisher, seg *journalSegment, bo *backoff.ExponentialBackOff) error {
	j.mu.Lock()
	dropped, off, size := seg.dropped, seg.ackedOff, seg.size
	j.mu.Unlock()
	if dropped {
		return nil
	}
	f, err := os.Open(seg.path())
	if err != nil {
		if j.segmentDropped(seg) {
			return nil
		}
		return fmt.Errorf("open segment: %w", err)
	}
	defer f.Close()
	ck := &checkpointWriter{path: seg.checkpointPath()}
	defer ck.close()

	rr := newRecordReader(io.NewSectionReader(f, off, size-off))
	pos := off
	items := make([]replayItem, 0, j.cfg.ReplayBatchSize)
	for {
		items = items[:0]
		eof, corruptTail := false, false
		for len(items) < j.cfg.ReplayBatchSize {
			payload, n, err := rr.next()
			if errors.Is(err, io.EOF) {
				eof = true
				break
			}
			if errors.Is(err, errTornRecord) {
				// The segment changed under us (disk corruption): what is
				// left cannot be read; count it when the segment is closed.
				j.log.Error("journal segment unreadable past this point", "segment", seg.id, "offset", pos, "err", err)
				eof, corruptTail = true, true
				break
			}
			if err != nil {
				return fmt.Errorf("read segment %d at %d: %w", seg.id, pos, err)
			}
			pos += n
			m, derr := decodeRecord(bytes.Clone(payload))
			if derr != nil {
				j.log.Error("journal record unreadable; dropped", "segment", seg.id, "offset", pos-n, "err", derr)
				j.mu.Lock()
				seg.acked++
				j.pending--
				j.drop(journalDropCorrupt, 1, false)
				j.mu.Unlock()
				items = append(items, replayItem{end: pos, done: true})
				continue
			}
			items = append(items, replayItem{msg: m, end: pos})
		}
		if len(items) > 0 && !j.publishBatch(ctx, pub, seg, items, ck, bo) {
			if err := ctx.Err(); err != nil {
				return err
			}
			return nil // dropped by the cap
		}
		if eof {
			j.finishSegment(seg, ck, corruptTail)
			return nil
		}
	}
}

// publishBatch publishes items until every one is acknowledged, retrying the
// failed ones with backoff. It returns false if ctx is done or the cap
// dropped seg first.
func (j *Journal) publishBatch(ctx context.Context, pub ReplayPublisher, seg *journalSegment, items []replayItem, ck *checkpointWriter, bo *backoff.ExponentialBackOff) bool {
	bo.Reset()
	msgs := make([]kafka.Message, 0, len(items))
	idx := make([]int, 0, len(items))
	prefix := 0 // items[:prefix] are done and behind seg.ackedOff
	for attempt := 1; ; attempt++ {
		msgs, idx = msgs[:0], idx[:0]
		for i := range items {
			if !items[i].done {
				msgs = append(msgs, items[i].msg)
				idx = append(idx, i)
			}
		}
		j.mu.Lock()
		if seg.dropped {
			j.mu.Unlock()
			return false
		}
		seg.busy = true
		j.mu.Unlock()

		var err error
		if len(msgs) > 0 {
			pctx, cancel := context.WithTimeout(ctx, j.cfg.ReplayTimeout)
			err = pub.Publish(pctx, msgs...)
			cancel()
		}
		var newly int64
		var werrs kafka.WriteErrors
		perMessage := errors.As(err, &werrs) && len(werrs) == len(msgs)
		for k, i := range idx {
			if err == nil || (perMessage && werrs[k] == nil) {
				items[i].done = true
				newly++
			}
		}

		j.mu.Lock()
		seg.busy = false
		seg.acked += newly
		j.pending -= newly
		for prefix < len(items) && items[prefix].done {
			seg.ackedOff = items[prefix].end
			seg.prefix++
			prefix++
		}
		ckOff, ckRecords := seg.ackedOff, seg.prefix
		j.updateGauges()
		j.mu.Unlock()
		j.replayed.Add(float64(newly))
		if newly > 0 {
			ck.write(ckOff, ckRecords, j)
		}
		if prefix == len(items) {
			return true
		}
		j.replayErrors.Inc()
		if attempt == 1 || attempt%10 == 0 {
			j.log.Warn("journal replay failed; retrying", "segment", seg.id, "messages", len(msgs)-int(newly), "attempt", attempt, "err", err)
		}
		if !tick.Sleep(ctx, min(bo.NextBackOff(), j.cfg.ReplayMaxBackoff)) {
			return false
		}
	}
}

// finishSegment deletes a fully replayed segment. Records past a corrupt
// point are counted as dropped.
func (j *Journal) finishSegment(seg *journalSegment, ck *checkpointWriter, corruptTail bool) {
	ck.close()
	j.mu.Lock()
	defer j.mu.Unlock()
	if seg.dropped {
		return
	}
	if rest := seg.records - seg.acked; rest > 0 {
		if !corruptTail {
			j.log.Error("journal segment ended before its record count", "segment", seg.id, "missing", rest)
		}
		j.pending -= rest
		j.drop(journalDropCorrupt, rest, false)
	}
	j.segs = slices.DeleteFunc(j.segs, func(s *journalSegment) bool { return s == seg })
	seg.dropped = true // removed: the cap must not count it again
	j.bytes -= seg.size
	j.removeSegmentFiles(seg)
	j.updateGauges()
	j.log.Debug("journal segment replayed", "segment", seg.id, "messages", seg.acked)
}

func (j *Journal) segmentDropped(seg *journalSegment) bool {
	j.mu.Lock()
	defer j.mu.Unlock()
	return seg.dropped
}

// checkpointWriter records a segment's replay position so a restart resumes
// after what was acknowledged. It is not fsynced: losing it only means
// replaying (and consumers deduplicating) a little more.
type checkpointWriter struct {
	path string
	f    *os.File
}

func (c *checkpointWriter) write(off, records int64, j *Journal) {
	if c.f == nil {
		f, err := os.OpenFile(c.path, os.O_CREATE|os.O_WRONLY, 0o640)
		if err != nil {
			j.log.Warn("open journal checkpoint", "err", err)
			return
		}
		c.f = f
	}
	if _, err := c.f.WriteAt(encodeCheckpoint(off, records), 0); err != nil {
		j.log.Warn("write journal checkpoint", "err", err)
	}
}

func (c *checkpointWriter) close() {
	if c.f != nil {
		_ = c.f.Close()
		c.f = nil
	}
}
