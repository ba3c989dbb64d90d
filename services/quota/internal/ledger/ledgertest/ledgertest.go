// Package ledgertest is the exported contract suite of the quota ledger
// port (ledger.Writer and ledger.UsageReader), run against the DynamoDB store
// and the in-memory double alike.
package ledgertest

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/floodgate-dev/floodgate/services/quota/internal/ledger"
)

// Store is the ledger as the consumer writes it and the usage API reads it.
type Store interface {
	ledger.Writer
	ledger.UsageReader
}

// Entries are ledger entries at offsets, each costing its offset + 1 (the
// cost tells offsets apart).
func Entries(offsets ...int64) []ledger.Entry {
	out := make([]ledger.Entry, len(offsets))
	for i, o := range offsets {
		out[i] = ledger.Entry{Offset: o, Cost: o + 1} // cost distinguishes offsets
	}
	return out
}

// Run is the contract of the ledger, what every ledger does (the DynamoDB
// store, quotatest.MemLedger): each decision's units count once
// however often its partition's batch or its replay is written. The
// principals of each case are unique, so open may return one shared store.
func Run(t *testing.T, open func() Store) {
	ctx := context.Background()
	// Recent days: an item lives the store's retention after its day (the
	// table's TTL, which DynamoDB Local applies within seconds of a write);
	// a fixed day's items are written already expired once that has passed.
	day0 := time.Now().UTC().Truncate(24*time.Hour).AddDate(0, 0, -3)
	day := func(n int) string { return day0.AddDate(0, 0, n).Format(ledger.DayLayout) }
	type write struct {
		partition int
		entries   []ledger.Entry
		replay    *[2]int64 // partition/offset of a replayed dead letter, cost 100
	}
	tests := []struct {
		name   string
		writes []write
		want   int64
	}{
		{"first write applies", []write{{0, Entries(0, 1, 2), nil}}, 1 + 2 + 3},
		{"same batch again is fenced", []write{{0, Entries(0, 1, 2), nil}, {0, Entries(0, 1, 2), nil}}, 6},
		{"next batch applies", []write{{0, Entries(0, 1), nil}, {0, Entries(5, 7), nil}}, 1 + 2 + 6 + 8},
		{"overlapping batch applies only the new offsets", []write{{3, Entries(1, 2), nil}, {3, Entries(1, 2, 3, 4), nil}}, 2 + 3 + 4 + 5},
		{"a shorter redelivery after a longer write is fenced", []write{{3, Entries(1, 2, 3), nil}, {3, Entries(1, 2), nil}, {3, Entries(3, 4), nil}}, 2 + 3 + 4 + 5},
		{"partitions are fenced separately", []write{{1, Entries(10), nil}, {2, Entries(10), nil}, {1, Entries(10), nil}}, 22},
		{"a replay counts once", []write{{0, Entries(4), nil}, {replay: &[2]int64{0, 4}}, {replay: &[2]int64{0, 4}}, {replay: &[2]int64{1, 4}}}, 5 + 100 + 100},
	}
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			store := open()
			principal := "bot:fence" + time.Now().Format("150405.000000") + string(rune('a'+i))
			var res ledger.WriteResult
			var applied, fenced int64
			var err error
			for _, w := range tc.writes {
				if w.replay != nil {
					res, err = store.ApplyReplay(ctx, principal, day(1), int(w.replay[0]), w.replay[1], 100)
				} else {
					res, err = store.ApplyPartition(ctx, principal, day(1), w.partition, w.entries)
				}
				require.NoError(t, err)
				applied, fenced = applied+res.Applied, fenced+res.Fenced
			}
			require.Equal(t, tc.want, res.Total, "total returned by the last write")
			require.Equal(t, tc.want, applied, "units applied by all writes")
			var offered int64
			for _, w := range tc.writes {
				if w.replay != nil {
					offered += 100
				}
				for _, e := range w.entries {
					offered += e.Cost
				}
			}
			require.Equal(t, offered-tc.want, fenced, "units fenced by all writes")
			got, err := store.Usage(ctx, principal, day0, day0.Add(36*time.Hour))
			require.NoError(t, err)
			require.Equal(t, []ledger.DayUsage{{Day: day(0), Units: 0}, {Day: day(1), Units: tc.want}}, got)
		})
	}
	t.Run("days are kept apart", func(t *testing.T) {
		store := open()
		principal := "user:days" + time.Now().Format("150405.000000")
		_, err := store.ApplyPartition(ctx, principal, day(1), 0, Entries(0))
		require.NoError(t, err)
		_, err = store.ApplyPartition(ctx, principal, day(3), 0, Entries(0, 1))
		require.NoError(t, err)
		got, err := store.Usage(ctx, principal, day0.Add(47*time.Hour), day0.Add(73*time.Hour))
		require.NoError(t, err)
		require.Equal(t, []ledger.DayUsage{{Day: day(1), Units: 1}, {Day: day(2), Units: 0}, {Day: day(3), Units: 3}}, got)
	})
}
