package server

import (
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
)

// Decision ids are RFC 9562 UUIDv7s in their canonical form, carry the
// time they were minted at, are unique and, minted one after another, in
// increasing order (the hex string sorts as the id), across goroutines too.
func TestNewDecisionIDIsAnIncreasingUUIDv7(t *testing.T) {
	t.Parallel()
	before := time.Now().Truncate(time.Millisecond)
	const goroutines, each = 4, 20_000
	ids := make([][]string, goroutines)
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Go(func() {
			for range each {
				ids[g] = append(ids[g], NewDecisionID())
			}
		})
	}
	wg.Wait()
	// More than 4,096 ids in one millisecond move the ids' time past the
	// clock (each id is greater than the last): a fast machine mints these
	// 80,000 in under 20 ms, so the newest may lead the clock by up to one
	// millisecond per 4,096.
	after := time.Now().Add(time.Duration(goroutines*each/4096+1) * time.Millisecond)
	seen := make(map[string]bool, goroutines*each)
	for _, own := range ids {
		for i, id := range own {
			require.Len(t, id, 36)
			u, err := uuid.Parse(id)
			require.NoError(t, err, id)
			require.Equal(t, id, u.String(), "canonical lower-case form")
			require.Equal(t, uuid.Version(7), u.Version(), id)
			require.Equal(t, uuid.RFC4122, u.Variant(), id)
			ts := time.Unix(u.Time().UnixTime())
			require.False(t, ts.Before(before) || ts.After(after), "%s minted at %v, outside %v–%v", id, ts, before, after)
			require.False(t, seen[id], "%s twice", id)
			seen[id] = true
			if i > 0 {
				require.Less(t, own[i-1], id, "ids of one goroutine increase")
			}
		}
	}
}

// The random bits differ between ids of the same instant.
func TestNewDecisionIDRandomBits(t *testing.T) {
	t.Parallel()
	a, b := uuid.MustParse(NewDecisionID()), uuid.MustParse(NewDecisionID())
	require.NotEqual(t, a[8:], b[8:])
}

// BenchmarkNewDecisionID against google/uuid's NewV7 and String, which it
// replaced.
func BenchmarkNewDecisionID(b *testing.B) {
	b.Run("floodgate", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			_ = NewDecisionID()
		}
	})
	b.Run("google_uuid", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			_ = uuid.Must(uuid.NewV7()).String()
		}
	})
}
