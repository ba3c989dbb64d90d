package stream

import (
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"
)

// TestHandoff: offers are refused at once when the queue is full and after
// Close; once Close returns, the reader takes every value that was queued,
// however many senders raced it.
func TestHandoff(t *testing.T) {
	t.Run("full and closed", func(t *testing.T) {
		full, closed := prometheus.NewCounter(prometheus.CounterOpts{Name: "full"}), prometheus.NewCounter(prometheus.CounterOpts{Name: "closed"})
		h := NewHandoff[int](2, full, closed)
		for i := range 2 {
			require.True(t, h.Offer(i))
		}
		require.False(t, h.Offer(2), "full")
		require.Equal(t, 2, h.Len())
		require.False(t, h.Close())
		require.True(t, h.Close(), "closed already")
		require.False(t, h.Offer(3), "closed")
		require.InDelta(t, 1, testutil.ToFloat64(full), 0)
		require.InDelta(t, 1, testutil.ToFloat64(closed), 0)
		require.Equal(t, []int{0, 1}, TakeBuffered(h.C(), nil, 10), "what was queued stays to be taken")
	})
	t.Run("senders racing Close", func(t *testing.T) {
		h := NewHandoff[int](1<<16, prometheus.NewCounter(prometheus.CounterOpts{Name: "full"}), prometheus.NewCounter(prometheus.CounterOpts{Name: "closed"}))
		var wg sync.WaitGroup
		var mu sync.Mutex
		accepted := 0
		for range 8 {
			wg.Go(func() {
				n := 0
				for i := range 2000 {
					if h.Offer(i) {
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
