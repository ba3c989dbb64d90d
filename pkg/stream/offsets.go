package stream

import (
	"sort"
	"sync"
)

// offsetTrack follows one partition's messages from dispatch to commit. It
// knows the offsets handed to handlers, in fetch order, and which of them have
// finished (handled or dead-lettered); the commit point is the highest offset
// before which everything finished — the contiguous prefix — so an offset is
// never committed while an earlier message is still in flight or was
// abandoned. "Contiguous" follows the fetched sequence, not offset+1: Kafka
// offsets have gaps (transaction markers, compaction). Safe for concurrent use.
type offsetTrack struct {
	mu        sync.Mutex
	pending   []trackedOffset // began and not yet in the finished prefix, ascending
	buf       []trackedOffset // pending's backing array, reused once pending empties
	lastBegun int64           // highest offset begun, -1 if none
	finished  int64           // highest offset of the finished prefix, -1 if none
	committed int64           // highest offset committed, -1 if none
}

type trackedOffset struct {
	offset int64
	done   bool
}

func newOffsetTrack() *offsetTrack {
	return &offsetTrack{lastBegun: -1, finished: -1, committed: -1}
}

// begin records that offset is being dispatched. It returns false, recording
// nothing, when offset is not beyond the last one begun: kafka-go restarts a
// partition from the committed offset after a rebalance, so messages this
// consumer already took come again, and they are either done or in flight.
func (t *offsetTrack) begin(offset int64) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if offset <= t.lastBegun {
		return false
	}
	t.lastBegun = offset
	if len(t.pending) == 0 && cap(t.buf) > 0 {
		t.pending = t.buf[:0]
	}
	t.pending = append(t.pending, trackedOffset{offset: offset})
	if cap(t.pending) > cap(t.buf) {
		t.buf = t.pending[:0]
	}
	return true
}

// finish marks offset finished and advances the finished prefix. Offsets that
// were never begun are ignored.
func (t *offsetTrack) finish(offset int64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	i := sort.Search(len(t.pending), func(i int) bool { return t.pending[i].offset >= offset })
	if i == len(t.pending) || t.pending[i].offset != offset {
		return
	}
	t.pending[i].done = true
	n := 0
	for n < len(t.pending) && t.pending[n].done {
		n++
	}
	if n == 0 {
		return
	}
	t.finished = t.pending[n-1].offset
	t.pending = t.pending[n:]
}

// commitPoint returns the offset of the last message of the finished prefix
// if it is beyond what was committed; kafka-go commits offset+1 for it.
func (t *offsetTrack) commitPoint() (int64, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.finished, t.finished > t.committed
}

// committed records a successful commit of offset.
func (t *offsetTrack) markCommitted(offset int64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if offset > t.committed {
		t.committed = offset
	}
}

// inFlight counts messages begun and not yet in the finished prefix.
func (t *offsetTrack) inFlight() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.pending)
}

// position returns the offset the group would resume from: after the
// finished prefix, or the first offset begun when nothing finished yet; -1
// when nothing was begun.
func (t *offsetTrack) position() int64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	switch {
	case len(t.pending) > 0:
		return t.pending[0].offset
	case t.finished >= 0:
		return t.finished + 1
	}
	return -1
}
