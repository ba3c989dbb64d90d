package stream

import (
	"sync"

	"github.com/prometheus/client_golang/prometheus"
)

// Handoff is a bounded queue its senders never wait on, and that its reader
// closes to refuse further offers: once Close returns no Offer is still
// putting a value in, so what the reader takes afterwards (TakeBuffered on
// C) is everything that will ever be queued. The AsyncProducer's buffer and
// the journal's hand-off queue (pkg/journal). Offer, Close and Len are safe
// for concurrent use.
type Handoff[T any] struct {
	// mu orders Offer against Close: once closed is set under the write
	// lock, no send into ch can still be in progress.
	mu     sync.RWMutex
	closed bool
	ch     chan T

	droppedFull, droppedClosed prometheus.Counter // offers refused: the queue full, or closed
}

// NewHandoff returns a queue of up to size values whose refused offers are
// counted in full (the queue was full) and closed (it was closed).
func NewHandoff[T any](size int, full, closed prometheus.Counter) *Handoff[T] {
	return &Handoff[T]{ch: make(chan T, size), droppedFull: full, droppedClosed: closed}
}

// Offer queues v and reports true, or counts v refused and reports false at
// once: the queue is full, or closed. It never blocks.
func (h *Handoff[T]) Offer(v T) bool {
	h.mu.RLock()
	if h.closed {
		h.mu.RUnlock()
		h.droppedClosed.Inc()
		return false
	}
	select {
	case h.ch <- v:
		h.mu.RUnlock()
		return true
	default:
		h.mu.RUnlock()
		h.droppedFull.Inc()
		return false
	}
}

// C is the queue, for its reader.
func (h *Handoff[T]) C() <-chan T { return h.ch }

// Len is how many values are queued.
func (h *Handoff[T]) Len() int { return len(h.ch) }

// Close refuses further offers (what is queued stays to be taken) and
// reports whether the queue was closed already.
func (h *Handoff[T]) Close() (already bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	already, h.closed = h.closed, true
	return already
}
