package ledger_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/stretchr/testify/require"

	"github.com/floodgate-dev/floodgate/pkg/dynamo"
	"github.com/floodgate-dev/floodgate/services/quota/internal/ledger"
	"github.com/floodgate-dev/floodgate/services/quota/internal/quotatest"
)

// faultyDB wraps the real client: a share of UpdateItem calls fail as
// throttled before reaching DynamoDB, and a share succeed in DynamoDB but
// lose their answer (the caller sees an error and retries a write that was
// applied) — the case only the fence makes exact.
type faultyDB struct {
	ledger.DynamoAPI
	throttle, lose float64

	mu        sync.Mutex
	rnd       *rand.Rand
	throttled atomic.Int64
	lost      atomic.Int64
}

func newFaultyDB(db ledger.DynamoAPI, throttle, lose float64) *faultyDB {
	return &faultyDB{DynamoAPI: db, throttle: throttle, lose: lose, rnd: rand.New(rand.NewPCG(1, 2))}
}

func (f *faultyDB) roll() float64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.rnd.Float64()
}

func (f *faultyDB) UpdateItem(ctx context.Context, in *dynamodb.UpdateItemInput, opts ...func(*dynamodb.Options)) (*dynamodb.UpdateItemOutput, error) {
	if f.roll() < f.throttle {
		f.throttled.Add(1)
		return nil, &types.ProvisionedThroughputExceededException{Message: aws.String("injected throttle")}
	}
	out, err := f.DynamoAPI.UpdateItem(ctx, in, opts...)
	if err == nil && f.roll() < f.lose {
		f.lost.Add(1)
		return nil, errors.New("injected: response lost after the write was applied")
	}
	return out, err
}

func entries(offsets ...int64) []ledger.Entry {
	out := make([]ledger.Entry, len(offsets))
	for i, o := range offsets {
		out[i] = ledger.Entry{Offset: o, Cost: o + 1} // cost distinguishes offsets
	}
	return out
}

// ledgerStore is the ledger as the consumer writes it and the usage API reads it.
type ledgerStore interface {
	ledger.Writer
	ledger.UsageReader
}

// TestLedgerContract runs the contract of the ledger against the DynamoDB
// store and the in-memory double (quotatest.MemLedger).
func TestLedgerContract(t *testing.T) {
	t.Run("dynamodb", func(t *testing.T) {
		db, prefix := quotatest.LedgerTable(t)
		store := ledger.NewStore(db, prefix+dynamo.TableQuotaLedger, 400, time.Now)
		ledgerContract(t, func() ledgerStore { return store })
	})
	t.Run("memory", func(t *testing.T) {
		ledgerContract(t, func() ledgerStore { return quotatest.NewMemLedger() })
	})
}

// ledgerContract is what every ledger does: each decision's units count once
// however often its partition's batch or its replay is written. The
// principals of each case are unique, so open may return one shared store.
func ledgerContract(t *testing.T, open func() ledgerStore) {
	ctx := context.Background()
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
		{"first write applies", []write{{0, entries(0, 1, 2), nil}}, 1 + 2 + 3},
		{"same batch again is fenced", []write{{0, entries(0, 1, 2), nil}, {0, entries(0, 1, 2), nil}}, 6},
		{"next batch applies", []write{{0, entries(0, 1), nil}, {0, entries(5, 7), nil}}, 1 + 2 + 6 + 8},
		{"overlapping batch applies only the new offsets", []write{{3, entries(1, 2), nil}, {3, entries(1, 2, 3, 4), nil}}, 2 + 3 + 4 + 5},
		{"a shorter redelivery after a longer write is fenced", []write{{3, entries(1, 2, 3), nil}, {3, entries(1, 2), nil}, {3, entries(3, 4), nil}}, 2 + 3 + 4 + 5},
		{"partitions are fenced separately", []write{{1, entries(10), nil}, {2, entries(10), nil}, {1, entries(10), nil}}, 22},
		{"a replay counts once", []write{{0, entries(4), nil}, {replay: &[2]int64{0, 4}}, {replay: &[2]int64{0, 4}}, {replay: &[2]int64{1, 4}}}, 5 + 100 + 100},
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
					res, err = store.ApplyReplay(ctx, principal, "2026-01-02", int(w.replay[0]), w.replay[1], 100)
				} else {
					res, err = store.ApplyPartition(ctx, principal, "2026-01-02", w.partition, w.entries)
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
			got, err := store.Usage(ctx, principal, time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC), time.Date(2026, 1, 2, 12, 0, 0, 0, time.UTC))
			require.NoError(t, err)
			require.Equal(t, []ledger.DayUsage{{Day: "2026-01-01", Units: 0}, {Day: "2026-01-02", Units: tc.want}}, got)
		})
	}
	t.Run("days are kept apart", func(t *testing.T) {
		store := open()
		principal := "user:days" + time.Now().Format("150405.000000")
		_, err := store.ApplyPartition(ctx, principal, "2026-01-02", 0, entries(0))
		require.NoError(t, err)
		_, err = store.ApplyPartition(ctx, principal, "2026-01-04", 0, entries(0, 1))
		require.NoError(t, err)
		got, err := store.Usage(ctx, principal, time.Date(2026, 1, 2, 23, 0, 0, 0, time.UTC), time.Date(2026, 1, 4, 1, 0, 0, 0, time.UTC))
		require.NoError(t, err)
		require.Equal(t, []ledger.DayUsage{{Day: "2026-01-02", Units: 1}, {Day: "2026-01-03", Units: 0}, {Day: "2026-01-04", Units: 3}}, got)
	})
}

// TestStoreFencing covers what only DynamoDB can do to the store: lost
// answers and throttling, and the items' time to live.
func TestStoreFencing(t *testing.T) {
	db, prefix := quotatest.LedgerTable(t)
	store := ledger.NewStore(db, prefix+dynamo.TableQuotaLedger, 400, time.Now)
	ctx := context.Background()

	t.Run("retries after lost answers count once", func(t *testing.T) {
		faulty := newFaultyDB(db, 0.3, 0.3)
		fstore := ledger.NewStore(faulty, prefix+dynamo.TableQuotaLedger, 400, time.Now)
		principal := "user:lost" + time.Now().Format("150405.000000")
		var want int64
		for batch := range 50 {
			es := entries(int64(batch*3), int64(batch*3+1), int64(batch*3+2))
			for _, e := range es {
				want += e.Cost
			}
			for {
				if _, err := fstore.ApplyPartition(ctx, principal, "2026-01-02", 0, es); err == nil {
					break
				}
			}
		}
		require.Positive(t, faulty.lost.Load(), "the test injected lost answers")
		require.Positive(t, faulty.throttled.Load(), "the test injected throttling")
		got, err := store.Usage(ctx, principal, time.Date(2026, 1, 2, 0, 0, 0, 0, time.UTC), time.Date(2026, 1, 2, 0, 0, 0, 0, time.UTC))
		require.NoError(t, err)
		require.Equal(t, want, got[0].Units)
	})

	t.Run("items expire retention days after their day", func(t *testing.T) {
		principal := "user:ttl" + time.Now().Format("150405.000000")
		_, err := store.ApplyPartition(ctx, principal, "2026-01-02", 0, entries(0))
		require.NoError(t, err)
		out, err := db.GetItem(ctx, &dynamodb.GetItemInput{
			TableName: aws.String(prefix + dynamo.TableQuotaLedger),
			Key: map[string]types.AttributeValue{
				"pk": &types.AttributeValueMemberS{Value: principal}, "sk": &types.AttributeValueMemberS{Value: "2026-01-02"},
			},
		})
		require.NoError(t, err)
		want := time.Date(2026, 1, 3, 0, 0, 0, 0, time.UTC).Add(400 * 24 * time.Hour).Unix()
		require.Equal(t, &types.AttributeValueMemberN{Value: itoa(want)}, out.Item["expires_at"])
	})
}

func itoa(n int64) string { return fmtInt(n) }
