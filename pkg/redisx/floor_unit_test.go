package redisx

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestRoundTripFloorBuckets: the floor is the shortest round trip of the
// current bucket and the one before it; a bucket that passes with none
// recorded forgets both; a record late across a turn does not turn back.
func TestRoundTripFloorBuckets(t *testing.T) {
	const bucket = time.Second
	f := NewRoundTripFloor(bucket)
	clock := f.start
	f.turnAt = func() time.Time { return clock }
	in := func(b int) time.Time { return f.start.Add(time.Duration(b)*bucket + bucket/2) }

	f.Record(in(0), 5*time.Millisecond)
	f.Record(in(0), 3*time.Millisecond)
	f.Record(in(0), 4*time.Millisecond)
	require.Equal(t, 3*time.Millisecond, f.Floor())

	clock = in(1)
	require.Equal(t, 3*time.Millisecond, f.Floor(), "the previous bucket's")
	f.Record(in(1), 7*time.Millisecond)
	require.Equal(t, 3*time.Millisecond, f.Floor(), "the shorter of the two")
	f.Record(in(0), 2*time.Millisecond) // ended before the turn, recorded after it
	require.Equal(t, 2*time.Millisecond, f.Floor(), "kept in the current bucket, which did not turn back")

	clock = in(2)
	require.Equal(t, 2*time.Millisecond, f.Floor(), "bucket 1's (with the late one)")
	clock = in(3)
	require.Zero(t, f.Floor(), "bucket 2 recorded nothing: bucket 1 is too old")

	f.Record(in(3), 0)
	require.Equal(t, time.Nanosecond, f.Floor(), "a round trip too short for the clock is the shortest there is")
	clock = in(5)
	f.Record(in(5), 9*time.Millisecond)
	require.Equal(t, 9*time.Millisecond, f.Floor(), "a whole bucket passed between")
}
