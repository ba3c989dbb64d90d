package stream

import (
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestHandoff: offers are refused at once when the queue is full and after
// Close; once Close returns, the reader takes every value that was queued,
// however many senders raced it.
func TestHandoff(t *testing.T) {
	t.Run("full and closed", func(t *testing.T) {
		h := NewHandoff[int](2)
		for i := range 2 {
			queued, closed := h.Offer(i)
			require.True(t, queued)
			require.False(t, closed)
		}
		queued, closed := h.Offer(2)
		require.False(t, queued, "full")
		require.False(t, closed)
		require.Equal(t, 2, h.Len())
		require.False(t, h.Close())
		require.True(t, h.Close(), "closed already")
		queued, closed = h.Offer(3)
		require.False(t, queued)
		require.True(t, closed)
		require.Equal(t, []int{0, 1}, TakeBuffered(h.C(), nil, 10), "what was queued stays to be taken")
	})
	t.Run("senders racing Close", func(t *testing.T) {
		h := NewHandoff[int](1 << 16)
		var wg sync.WaitGroup
		var mu sync.Mutex
		accepted := 0
		for range 8 {
			wg.Go(func() {
				n := 0
				for i := range 2000 {
					if queued, _ := h.Offer(i); queued {
						n++
					}
				}
				mu.Lock()
				accepted += n
				mu.Unlock()
			})
		}
		h.Close()
		taken := len(TakeBuffered(h.C(), nil, 1<<16))
		wg.Wait()
		require.Equal(t, accepted, taken, "every accepted value was there to take when Close returned")
		require.Zero(t, h.Len())
	})
}
