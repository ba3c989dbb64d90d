package score

import (
	"testing"

	"github.com/axiomhq/hyperloglog"
	"github.com/stretchr/testify/require"
)

// TestRotateEpoch: the two-epoch sketches of a big IP set and of an address
// shared by many principals move on together, by one epoch or by several.
func TestRotateEpoch(t *testing.T) {
	fill := func(s *hyperloglog.Sketch, from, n uint64) {
		for k := from; k < from+n; k++ {
			s.InsertHash(k * 0x9E3779B97F4A7C15)
		}
	}
	type window = [2]*hyperloglog.Sketch
	estimates := func(w *window) [2]uint64 { return [2]uint64{w[0].Estimate(), w[1].Estimate()} }
	a, b := &window{hyperloglog.New14(), hyperloglog.New14()}, &window{hyperloglog.New14(), hyperloglog.New14()}
	fill(a[0], 0, 100)
	fill(a[1], 1000, 50)
	fill(b[0], 0, 10)
	epoch := uint32(7)

	rotateEpoch(&epoch, 7, a, b)
	require.Equal(t, uint32(7), epoch, "the same epoch")
	require.Equal(t, [2]uint64{100, 50}, estimates(a))
	rotateEpoch(&epoch, 6, a, b)
	require.Equal(t, uint32(7), epoch, "an older epoch changes nothing")
	require.Equal(t, [2]uint64{100, 50}, estimates(a))

	rotateEpoch(&epoch, 8, a, b)
	require.Equal(t, uint32(8), epoch)
	require.Equal(t, [2]uint64{0, 100}, estimates(a), "the current epoch's keys are now the previous one's")
	require.Equal(t, [2]uint64{0, 10}, estimates(b))

	fill(a[0], 5000, 20)
	rotateEpoch(&epoch, 10, a, b)
	require.Equal(t, uint32(10), epoch)
	require.Equal(t, [2]uint64{0, 0}, estimates(a), "two epochs on, nothing is inside the window")
	require.Equal(t, [2]uint64{0, 0}, estimates(b))
}
