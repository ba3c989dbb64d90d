package chaos

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
)

// DynamoFaults is an HTTP proxy in front of DynamoDB that fails a share of
// the write requests (UpdateItem, PutItem, BatchWriteItem,
// TransactWriteItems) while enabled, three ways in turn:
//   - throttled: 400 ProvisionedThroughputExceededException, not forwarded;
//   - server error: 500 InternalServerError, not forwarded;
//   - lost answer: forwarded (DynamoDB applies it), then answered 500 —
//     the case that double-counts a ledger without fencing.
type DynamoFaults struct {
	URL string

	srv     *httptest.Server
	rate    atomic.Uint64 // math.Float64bits-free: share × 1e6
	n       atomic.Uint64
	mu      sync.Mutex
	rnd     *rand.Rand
	counts  map[string]int64
	writes  atomic.Int64
	proxied *httputil.ReverseProxy
}

// NewDynamoFaults starts the proxy in front of target.
func NewDynamoFaults(target string) (*DynamoFaults, error) {
	u, err := url.Parse(target)
	if err != nil {
		return nil, fmt.Errorf("parse dynamodb endpoint %q: %w", target, err)
	}
	f := &DynamoFaults{rnd: rand.New(rand.NewPCG(1, 2)), counts: map[string]int64{}, proxied: httputil.NewSingleHostReverseProxy(u)}
	f.srv = httptest.NewServer(http.HandlerFunc(f.serve))
	f.URL = f.srv.URL
	return f, nil
}

// SetRate sets the share (0..1) of write requests to fail; 0 turns faults off.
func (f *DynamoFaults) SetRate(share float64) { f.rate.Store(uint64(share * 1e6)) }

// Counts returns the faults injected by kind, and the writes seen.
func (f *DynamoFaults) Counts() (map[string]int64, int64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make(map[string]int64, len(f.counts))
	for k, v := range f.counts {
		out[k] = v
	}
	return out, f.writes.Load()
}

// Close stops the proxy.
func (f *DynamoFaults) Close() { f.srv.Close() }

func (f *DynamoFaults) serve(w http.ResponseWriter, r *http.Request) {
	op := r.Header.Get("X-Amz-Target")
	op = op[strings.LastIndexByte(op, '.')+1:]
	switch op {
	case "UpdateItem", "PutItem", "BatchWriteItem", "TransactWriteItems":
	default:
		f.proxied.ServeHTTP(w, r)
		return
	}
	f.writes.Add(1)
	rate := f.rate.Load()
	f.mu.Lock()
	hit := rate > 0 && f.rnd.Uint64N(1e6) < rate
	f.mu.Unlock()
	if !hit {
		f.proxied.ServeHTTP(w, r)
		return
	}
	kind := [...]string{"throttled", "server_error", "lost_answer"}[f.n.Add(1)%3]
	f.mu.Lock()
	f.counts[kind]++
	f.mu.Unlock()
	switch kind {
	case "throttled":
		awsError(w, http.StatusBadRequest, "ProvisionedThroughputExceededException", "injected by the chaos proxy")
	case "server_error":
		awsError(w, http.StatusInternalServerError, "InternalServerError", "injected by the chaos proxy")
	case "lost_answer":
		rec := httptest.NewRecorder()
		f.proxied.ServeHTTP(rec, r) // applied by DynamoDB; the answer is dropped
		awsError(w, http.StatusInternalServerError, "InternalServerError", "injected by the chaos proxy after the write was applied")
	}
}

func awsError(w http.ResponseWriter, status int, typ, msg string) {
	w.Header().Set("Content-Type", "application/x-amz-json-1.0")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]string{"__type": "com.amazonaws.dynamodb.v20120810#" + typ, "message": msg})
}

// LedgerTotals reads the ledger items of the principals (strongly consistent).
func LedgerTotals(ctx context.Context, db *dynamodb.Client, table string, principals []string) (map[DayKey]int64, error) {
	out := map[DayKey]int64{}
	for _, p := range principals {
		res, err := db.Query(ctx, &dynamodb.QueryInput{
			TableName:                 aws.String(table),
			KeyConditionExpression:    aws.String("pk = :pk"),
			ExpressionAttributeValues: map[string]types.AttributeValue{":pk": &types.AttributeValueMemberS{Value: p}},
			ConsistentRead:            aws.Bool(true),
		})
		if err != nil {
			return nil, fmt.Errorf("query ledger %s: %w", p, err)
		}
		for _, it := range res.Items {
			sk, _ := it["sk"].(*types.AttributeValueMemberS)
			n, _ := it["units"].(*types.AttributeValueMemberN)
			if sk == nil || n == nil {
				continue
			}
			v, err := strconv.ParseInt(n.Value, 10, 64)
			if err != nil {
				return nil, fmt.Errorf("ledger %s %s: units %q: %w", p, sk.Value, n.Value, err)
			}
			out[DayKey{p, sk.Value}] = v
		}
	}
	return out, nil
}

// CompareLedger counts the principal-days whose ledger differs from want and
// the total units on each side.
func CompareLedger(want, got map[DayKey]int64) (wrong int, wantSum, gotSum int64) {
	for k, v := range want {
		wantSum += v
		if got[k] != v {
			wrong++
		}
	}
	for k, v := range got {
		gotSum += v
		if _, ok := want[k]; !ok {
			wrong++
		}
	}
	return wrong, wantSum, gotSum
}
