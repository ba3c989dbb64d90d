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
	"github.com/floodgate-dev/floodgate/services/quota/internal/ledger/ledgertest"
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

// TestLedgerContract runs the contract of the ledger against the DynamoDB
// store and the in-memory double (quotatest.MemLedger).
func TestLedgerContract(t *testing.T) {
	t.Run("dynamodb", func(t *testing.T) {
		db, prefix := quotatest.LedgerTable(t)
		store := ledger.NewStore(db, prefix+dynamo.TableQuotaLedger, 400, time.Now)
		ledgertest.Run(t, func() ledgertest.Store { return store })
	})
	t.Run("memory", func(t *testing.T) {
		ledgertest.Run(t, func() ledgertest.Store { return quotatest.NewMemLedger() })
	})
}

// TestStoreFencing covers what only DynamoDB can do to the store: lost
// answers and throttling, and the items' time to live.
func TestStoreFencing(t *testing.T) {
	db, prefix := quotatest.LedgerTable(t)
	store := ledger.NewStore(db, prefix+dynamo.TableQuotaLedger, 400, time.Now)
	ctx := context.Background()
	// Yesterday: a fixed day's item would be written already expired once
	// its retention is over, and DynamoDB Local deletes it within seconds.
	day := time.Now().UTC().Truncate(24*time.Hour).AddDate(0, 0, -1)
	dayKey := day.Format(ledger.DayLayout)

	t.Run("retries after lost answers count once", func(t *testing.T) {
		faulty := newFaultyDB(db, 0.3, 0.3)
		fstore := ledger.NewStore(faulty, prefix+dynamo.TableQuotaLedger, 400, time.Now)
		principal := "user:lost" + time.Now().Format("150405.000000")
		var want int64
		for batch := range 50 {
			es := ledgertest.Entries(int64(batch*3), int64(batch*3+1), int64(batch*3+2))
			for _, e := range es {
				want += e.Cost
			}
			for {
				if _, err := fstore.ApplyPartition(ctx, principal, dayKey, 0, es); err == nil {
					break
				}
			}
		}
		require.Positive(t, faulty.lost.Load(), "the test injected lost answers")
		require.Positive(t, faulty.throttled.Load(), "the test injected throttling")
		got, err := store.Usage(ctx, principal, day, day)
		require.NoError(t, err)
		require.Equal(t, want, got[0].Units)
	})

	t.Run("items expire retention days after their day", func(t *testing.T) {
		principal := "user:ttl" + time.Now().Format("150405.000000")
		_, err := store.ApplyPartition(ctx, principal, dayKey, 0, ledgertest.Entries(0))
		require.NoError(t, err)
		out, err := db.GetItem(ctx, &dynamodb.GetItemInput{
			TableName: aws.String(prefix + dynamo.TableQuotaLedger),
			Key: map[string]types.AttributeValue{
				"pk": &types.AttributeValueMemberS{Value: principal}, "sk": &types.AttributeValueMemberS{Value: dayKey},
			},
		})
		require.NoError(t, err)
		want := day.Add(24 * time.Hour).Add(400 * 24 * time.Hour).Unix()
		require.Equal(t, &types.AttributeValueMemberN{Value: itoa(want)}, out.Item["expires_at"])
	})
}

func itoa(n int64) string { return fmtInt(n) }
