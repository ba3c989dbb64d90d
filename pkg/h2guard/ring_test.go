package h2guard

import (
	"reflect"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestOpenedRingAcrossItsWrap follows a connection past openRing streams:
// a stream still in the ring has its own opening time, an older one the
// ring's oldest (the newest it may have been opened at), one never opened
// now — and the ring holds no pointer for the collector to scan.
func TestOpenedRingAcrossItsWrap(t *testing.T) {
	now := time.Date(2026, 11, 30, 0, 0, 0, 0, time.UTC)
	g := New(Config{Now: func() time.Time { return now }}, nil, "test")
	start := now
	c := g.Conn(nil).(*conn)
	const streams = openRing + 500
	for i := range streams {
		c.frame(frameHeaders, uint32(2*i+1))
		now = now.Add(time.Millisecond)
	}
	openedAt := func(i int) time.Time { return start.Add(time.Duration(i) * time.Millisecond) }

	require.Len(t, c.opened, openRing, "the ring grows to openRing and no further")
	require.Equal(t, openedAt(streams-1), c.openedAt(2*(streams-1)+1), "the newest stream")
	require.Equal(t, openedAt(1200), c.openedAt(2*1200+1), "a stream still in the ring")
	oldest := uint32(streams - openRing)
	require.Equal(t, openedAt(int(oldest)), c.openedAt(2*oldest+1), "the ring's oldest")
	require.Equal(t, openedAt(int(oldest)), c.openedAt(2*10+1), "a stream older than the ring: the ring's oldest time")
	require.Equal(t, now, c.openedAt(2*streams+1), "a stream never opened: now")

	for i := range reflect.TypeFor[opened]().NumField() {
		f := reflect.TypeFor[opened]().Field(i)
		switch f.Type.Kind() {
		case reflect.Uint32, reflect.Int64:
		default:
			t.Fatalf("opened.%s is a %s: the ring must hold no pointer", f.Name, f.Type)
		}
	}
}
