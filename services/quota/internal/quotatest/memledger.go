package quotatest

import (
	"context"
	"strconv"
	"sync"
	"time"

	"github.com/floodgate-dev/floodgate/services/quota/internal/ledger"
)

// MemLedger is the in-memory double of the ledger (ledger.Writer and
// ledger.UsageReader), for tests whose subject is not DynamoDB. It fences
// partitions and replays as ledger.Store does; the ledger package's contract
// test holds both to the same behaviour. Safe for concurrent use.
type MemLedger struct {
	mu    sync.Mutex
	items map[DayKey]*memItem
}

type memItem struct {
	units   int64
	fences  map[int]int64 // partition → highest offset counted
	replays map[string]bool
}

var (
	_ ledger.Writer      = (*MemLedger)(nil)
	_ ledger.UsageReader = (*MemLedger)(nil)
)

// NewMemLedger returns an empty ledger.
func NewMemLedger() *MemLedger { return &MemLedger{items: map[DayKey]*memItem{}} }

func (l *MemLedger) item(principal, day string) *memItem {
	k := DayKey{Principal: principal, Day: day}
	it, ok := l.items[k]
	if !ok {
		it = &memItem{fences: map[int]int64{}, replays: map[string]bool{}}
		l.items[k] = it
	}
	return it
}

// ApplyPartition adds the entries above the partition's fence and moves the
// fence to the last entry's offset.
func (l *MemLedger) ApplyPartition(_ context.Context, principal, day string, partition int, entries []ledger.Entry) (ledger.WriteResult, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	it := l.item(principal, day)
	res := ledger.WriteResult{Writes: 1}
	done, fenced := it.fences[partition]
	for _, e := range entries {
		if fenced && e.Offset <= done {
			res.Fenced += e.Cost
			continue
		}
		res.Applied += e.Cost
	}
	if res.Applied > 0 {
		it.units += res.Applied
		it.fences[partition] = entries[len(entries)-1].Offset
	}
	res.Total = it.units
	return res, nil
}

// ApplyReplay adds cost once per partition and offset.
func (l *MemLedger) ApplyReplay(_ context.Context, principal, day string, partition int, offset, cost int64) (ledger.WriteResult, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	it := l.item(principal, day)
	id := strconv.Itoa(partition) + "/" + strconv.FormatInt(offset, 10)
	if it.replays[id] {
		return ledger.WriteResult{Total: it.units, Fenced: cost, Writes: 1}, nil
	}
	it.replays[id] = true
	it.units += cost
	return ledger.WriteResult{Total: it.units, Applied: cost, Writes: 1}, nil
}

// Usage returns the units of the days from..to (UTC), zero for days without writes.
func (l *MemLedger) Usage(_ context.Context, principal string, from, to time.Time) ([]ledger.DayUsage, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	var days []ledger.DayUsage
	to = to.UTC().Truncate(24 * time.Hour)
	for d := from.UTC().Truncate(24 * time.Hour); !d.After(to); d = d.Add(24 * time.Hour) {
		day := d.Format(ledger.DayLayout)
		var units int64
		if it, ok := l.items[DayKey{Principal: principal, Day: day}]; ok {
			units = it.units
		}
		days = append(days, ledger.DayUsage{Day: day, Units: units})
	}
	return days, nil
}
