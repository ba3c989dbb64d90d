package stream

import (
	"context"
	"errors"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/floodgate-dev/floodgate/pkg/tick"
)

// One partition's fetch loop within a generation: fetch, the door, then the
// handler (one message at a time here; batches in batch.go).

// partitionRun is one partition's fetch loop within a generation.
type partitionRun struct {
	g    *generationRun
	ps   *partitionState
	r    partitionReader
	stop context.Context // fetching ends
	hctx context.Context // handlers end (drain or rebalance deadline)
}

// fetch returns the next message that must be handled or dead-lettered.
// ok is false when fetching ended (stop is done, or a dead letter could not
// be written before the deadline). Messages that the door settles (a replay
// for another group, an oversize message, an event outside the window, a
// batch over the decompression bound) are settled here and never returned.
// deadline, when not zero, bounds the wait: expired is true when it passed
// with nothing fetched.
func (p *partitionRun) fetch(deadline time.Time) (msg kafka.Message, expired, ok bool) {
	c := p.g.c
	for {
		fctx, cancel := p.stop, context.CancelFunc(func() {})
		if !deadline.IsZero() {
			fctx, cancel = context.WithDeadline(p.stop, deadline)
		}
		m, err := p.r.FetchMessage(fctx)
		cancel()
		if err != nil {
			if p.stop.Err() != nil {
				return kafka.Message{}, false, false
			}
			if !deadline.IsZero() && errors.Is(err, context.DeadlineExceeded) {
				return kafka.Message{}, true, true
			}
			var tooLarge *errBatchTooLarge
			if errors.As(err, &tooLarge) {
				if !p.skipBatch(tooLarge) {
					return kafka.Message{}, false, false
				}
				continue
			}
			c.fetchErrCount.Inc()
			c.log.Warn("fetch message", "partition", p.ps.id, "err", err)
			if !tick.Sleep(p.stop, fetchBackoff) {
				return kafka.Message{}, false, false
			}
			continue
		}
		if !p.ps.track.begin(m.Offset) {
			c.redeliveredCount.Inc()
			continue
		}
		p.ps.start.CompareAndSwap(-1, m.Offset)
		verdict, class, derr := c.door(m)
		switch verdict {
		case doorSkipReplay:
			c.replaySkipped.Inc()
			p.ps.track.finish(m.Offset)
			continue
		case doorReject:
			rec := newDLQRecord(c, m, class, derr, 1, c.cfg.Now())
			if class == ClassOversize {
				rec = rec.asReference()
			}
			if !c.deadLetter(p.hctx, m, rec) {
				c.abandonCount.Inc()
				return kafka.Message{}, false, false
			}
			p.ps.track.finish(m.Offset)
			continue
		}
		return m, false, true
	}
}

// skipBatch dead-letters a record batch refused for its decompressed size as
// one reference and moves the reader past it.
func (p *partitionRun) skipBatch(e *errBatchTooLarge) bool {
	c := p.g.c
	last := e.next - 1
	if !p.ps.track.begin(last) {
		// Already settled in this generation; just move on.
		return p.r.SetOffset(e.next) == nil
	}
	p.ps.start.CompareAndSwap(-1, e.first)
	now := c.cfg.Now()
	rec := DLQRecord{
		SourceTopic: c.cfg.Topic, Partition: p.ps.id, Offset: e.first, Timestamp: now,
		ConsumerGroup: c.cfg.GroupID, Service: c.cfg.Service, ErrorClass: ClassOversize,
		ErrorMessage: e.Error(), Attempts: 1, FirstFailure: now,
		Reference: true, OriginalSize: int64(e.limit),
	}
	if !c.deadLetter(p.hctx, kafka.Message{Partition: p.ps.id, Offset: e.first}, rec) {
		c.abandonCount.Inc()
		return false
	}
	p.ps.track.finish(last)
	if err := p.r.SetOffset(e.next); err != nil {
		c.log.Error("move past a refused batch", "partition", p.ps.id, "offset", e.next, "err", err)
		return false
	}
	return true
}

// consumeMessages is per-message mode: each message is handled on its own.
func (p *partitionRun) consumeMessages() {
	c := p.g.c
	for {
		msg, _, ok := p.fetch(time.Time{})
		if !ok {
			return
		}
		if p.stop.Err() != nil {
			// Fetched, never started: it stays pending, so nothing at or
			// after it is committed.
			return
		}
		msgs := []kafka.Message{msg}
		if !c.handleUnit(p.hctx, msgs) {
			c.abandonCount.Inc()
			return
		}
		p.ps.track.finish(msg.Offset)
	}
}

// messageCall adapts a Handler to the shared middleware.
func (c *Consumer) messageCall(ctx context.Context, inv *Invocation) error {
	return c.handler(ctx, inv.Messages[0])
}
