package stream

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cenkalti/backoff/v5"
	"github.com/segmentio/kafka-go"

	"github.com/floodgate-dev/floodgate/pkg/tick"
)

// One group generation: a goroutine per assigned partition and a commit
// loop; at its end (rebalance or shutdown) the partitions drain and the
// finished offsets are committed before the consumer rejoins.

// groupSession is what the consumer needs of a kafka-go ConsumerGroup.
type groupSession interface {
	Next(ctx context.Context) (*kafka.Generation, error)
	Close() error
}

// generationRun consumes the partitions assigned in one group generation.
type generationRun struct {
	c            *Consumer
	gen          *kafka.Generation
	drainStarted chan time.Time
	parts        map[int]*partitionState // fixed before any goroutine starts
	commitMu     sync.Mutex              // one commit at a time: the loop's and batch flushes'
}

type partitionState struct {
	id    int
	track *offsetTrack
	start atomic.Int64 // where fetching started, -1 while unknown
	lag   atomic.Int64
}

// run starts a goroutine per assigned partition plus a commit loop, all
// inside the generation, and returns when the generation ended (after its
// final commit) or, once ctx is done, after the drain and final commit; the
// generation's goroutines then wait for the group to close it.
func (g *generationRun) run(ctx, hctx context.Context) error {
	c := g.c
	assigned := g.gen.Assignments[c.cfg.Topic]
	g.parts = make(map[int]*partitionState, len(assigned))
	ids := make([]int, 0, len(assigned))
	for _, a := range assigned {
		ps := &partitionState{id: a.ID, track: newOffsetTrack()}
		ps.start.Store(-1)
		g.parts[a.ID] = ps
		ids = append(ids, a.ID)
	}
	c.rebalanceCount.Inc()
	c.log.Info("joined consumer group generation", "generation", g.gen.ID, "partitions", ids)

	// Handlers of this generation are cancelled at the rebalance deadline.
	genHctx, cancelGen := context.WithCancel(hctx)
	defer cancelGen()

	var drained sync.WaitGroup
	for _, a := range assigned {
		drained.Add(1)
		ps := g.parts[a.ID]
		g.gen.Start(func(gctx context.Context) {
			g.consume(ctx, gctx, genHctx, a, ps, &drained)
		})
	}
	result := make(chan error, 1)
	g.gen.Start(func(gctx context.Context) {
		result <- g.commitLoop(ctx, gctx, &drained, cancelGen)
		// Keep the generation open until the group ends it: on shutdown
		// that is Close, after which the group is left, not rejoined.
		<-gctx.Done()
	})
	err := <-result
	for _, ps := range g.parts {
		c.metrics.partitionLag.DeleteLabelValues(c.cfg.Topic, c.cfg.GroupID, strconv.Itoa(ps.id))
	}
	return err
}

// consume fetches one partition from its committed offset and runs its
// messages through the door and the handler, in order, until ctx or gctx is
// done.
func (g *generationRun) consume(ctx, gctx, hctx context.Context, a kafka.PartitionAssignment, ps *partitionState, drained *sync.WaitGroup) {
	defer func() {
		drained.Done()
		<-gctx.Done()
	}()
	c := g.c
	stop, cancelStop := context.WithCancel(gctx)
	defer cancelStop()
	defer context.AfterFunc(ctx, cancelStop)()

	r := c.newPartitionReader(a.ID)
	defer func() {
		if err := r.Close(); err != nil {
			c.log.Warn("close partition reader", "partition", a.ID, "err", err)
		}
	}()
	start := a.Offset
	if c.cfg.StartFrom != nil && a.Offset >= 0 {
		// A rewind rebuilds state from before the committed offset; it is
		// worth a few tries (a broker just back may not answer offset lookups
		// yet), never a partition left unread: after them the partition
		// starts at its committed offset. (On main a failed lookup parked the
		// partition until the next rebalance, which a single instance never
		// has: a bot whose events landed there was never detected.)
		var s int64
		var err error
		for try := 0; try < 3 && stop.Err() == nil; try++ {
			if s, err = c.cfg.StartFrom(stop, a.ID, a.Offset); err == nil {
				break
			}
			tick.Sleep(stop, time.Duration(try+1)*200*time.Millisecond)
		}
		if err != nil {
			c.log.Warn("choose start offset: starting at the committed offset", "partition", a.ID, "committed", a.Offset, "err", err)
			s = a.Offset
		}
		if s >= 0 && s < a.Offset {
			start = s
			ps.track.markCommitted(a.Offset - 1) // re-read history never moves the group back
			c.log.Info("rewound partition", "partition", a.ID, "committed", a.Offset, "from", s)
		}
	}
	if !g.setOffset(stop, r, a.ID, start) {
		return // the generation ended or the consumer stops
	}
	if a.Offset >= 0 {
		ps.start.Store(a.Offset)
	}
	p := &partitionRun{g: g, ps: ps, r: r, stop: stop, hctx: hctx}
	if c.batch != nil {
		p.consumeBatches()
	} else {
		p.consumeMessages()
	}
}

// setOffset positions r at offset, retrying with the consumer's backoff
// until it succeeds or stop is done, and reports whether it succeeded. A
// failed SetOffset does not end the generation (the partition goroutine
// stays in it until the group ends it), so giving up would leave the
// partition unread until the next rebalance, which a single instance never
// has.
func (g *generationRun) setOffset(stop context.Context, r partitionReader, partition int, offset int64) bool {
	c := g.c
	var bo *backoff.ExponentialBackOff
	for {
		err := r.SetOffset(offset)
		if err == nil {
			return true
		}
		if bo == nil {
			bo = c.newBackoff()
		}
		wait := min(bo.NextBackOff(), c.cfg.MaxBackoff)
		c.log.Error("set partition offset; retrying", "partition", partition, "offset", offset, "retry_in", wait, "err", err)
		if !tick.Sleep(stop, wait) {
			return false
		}
	}
}

// commitLoop commits finished offsets every CommitInterval and refreshes the
// lag gauges. When ctx is done (shutdown) or gctx is done (rebalance) it
// waits for the partitions to drain, commits a last time, and returns.
func (g *generationRun) commitLoop(ctx, gctx context.Context, drained *sync.WaitGroup, cancelHandlers context.CancelFunc) error {
	c := g.c
	t := time.NewTicker(c.cfg.CommitInterval)
	defer t.Stop()
	var deadline time.Time
	var why string
loop:
	for {
		select {
		case <-t.C:
			if err := g.commit(); err != nil {
				c.log.Warn("commit offsets; retrying next interval", "err", err)
			}
			g.refreshLag(gctx)
		case <-ctx.Done():
			why = "shutdown"
			started := time.Now()
			select {
			case started = <-g.drainStarted:
				g.drainStarted <- started // for the next reader, if any
			default:
			}
			deadline = started.Add(c.cfg.DrainTimeout + drainGrace)
			break loop
		case <-gctx.Done():
			why = "rebalance"
			budget := c.revokeTimeout()
			time.AfterFunc(budget, cancelHandlers)
			deadline = time.Now().Add(budget + drainGrace)
			break loop
		}
	}
	var errs []error
	if !waitTimeout(drained, deadline) {
		errs = append(errs, fmt.Errorf("%s: handlers still running at the deadline; their messages stay uncommitted", why))
	}
	if err := g.commit(); err != nil {
		errs = append(errs, err)
	}
	inFlight := 0
	for _, ps := range g.parts {
		inFlight += ps.track.inFlight()
	}
	c.log.Info("generation drained", "generation", g.gen.ID, "reason", why, "uncommitted_fetched", inFlight)
	if c.cfg.OnRevoke != nil {
		for id := range g.parts {
			c.cfg.OnRevoke(id)
		}
	}
	return errors.Join(errs...)
}

// refreshLag sets each owned partition's lag to its high watermark minus the
// position the group would resume from (the end of the finished prefix). A
// partition whose handler is stuck keeps its position while the watermark
// moves on, so it shows lag — unlike a lag taken from the last message
// handled, which stays at what it was when that message finished.
func (g *generationRun) refreshLag(ctx context.Context) {
	c := g.c
	if len(g.parts) == 0 {
		return
	}
	reqs := make([]kafka.OffsetRequest, 0, len(g.parts))
	for id := range g.parts {
		reqs = append(reqs, kafka.LastOffsetOf(id))
	}
	lctx, cancel := context.WithTimeout(ctx, max(c.cfg.CommitInterval, time.Second))
	defer cancel()
	resp, err := c.offsets.ListOffsets(lctx, &kafka.ListOffsetsRequest{Topics: map[string][]kafka.OffsetRequest{c.cfg.Topic: reqs}})
	if err != nil {
		if ctx.Err() == nil {
			c.log.Debug("list end offsets for lag", "err", err)
		}
		return
	}
	var total int64
	for _, po := range resp.Topics[c.cfg.Topic] {
		ps := g.parts[po.Partition]
		if ps == nil || po.Error != nil {
			continue
		}
		pos := ps.track.position()
		if pos < 0 {
			pos = ps.start.Load()
		}
		if pos < 0 {
			continue
		}
		l := max(0, po.LastOffset-pos)
		ps.lag.Store(l)
		c.metrics.partitionLag.WithLabelValues(c.cfg.Topic, c.cfg.GroupID, strconv.Itoa(ps.id)).Set(float64(l))
	}
	for _, ps := range g.parts {
		total += ps.lag.Load()
	}
	c.lag.Set(float64(total))
}

// commit commits, for every partition of the generation, the end of its
// finished prefix if it moved since the last commit.
func (g *generationRun) commit() error {
	c := g.c
	g.commitMu.Lock()
	defer g.commitMu.Unlock()
	offsets := make(map[int]int64)
	for id, ps := range g.parts {
		if off, ok := ps.track.commitPoint(); ok {
			offsets[id] = off + 1 // the committed offset is the next one to read
		}
	}
	if len(offsets) == 0 {
		return nil
	}
	if err := g.gen.CommitOffsets(map[string]map[int]int64{c.cfg.Topic: offsets}); err != nil {
		c.commitErrCount.Inc()
		return fmt.Errorf("commit offsets of %d partitions: %w", len(offsets), err)
	}
	c.commitCount.Inc()
	for id, off := range offsets {
		g.parts[id].track.markCommitted(off - 1)
	}
	return nil
}

// revokeTimeout is how long a running handler may take when the group
// rebalances: the broker waits RebalanceTimeout for members to rejoin.
func (c *Consumer) revokeTimeout() time.Duration {
	return min(c.cfg.DrainTimeout, c.cfg.RebalanceTimeout/2)
}

// waitTimeout waits for wg until deadline and reports whether it finished.
func waitTimeout(wg *sync.WaitGroup, deadline time.Time) bool {
	done := make(chan struct{})
	go func() {
		wg.Wait()
		close(done)
	}()
	t := time.NewTimer(time.Until(deadline))
	defer t.Stop()
	select {
	case <-done:
		return true
	case <-t.C:
		return false
	}
}
