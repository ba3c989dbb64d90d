package web

import (
	"context"
	"strconv"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/stretchr/testify/require"

	"github.com/floodgate-dev/floodgate/pkg/dynamo"
	"github.com/floodgate-dev/floodgate/pkg/events"
	"github.com/floodgate-dev/floodgate/services/console/internal/store"
)

// The DynamoDB items the web tests write as other services do, or read back
// as those services would (the detector's allowlist, the quota ledger).

// item is one DynamoDB item as stored.
type item map[string]types.AttributeValue

// str is a string attribute's value ("" when it is missing or not a string).
func (it item) str(name string) string {
	v, _ := it[name].(*types.AttributeValueMemberS)
	if v == nil {
		return ""
	}
	return v.Value
}

// num is a whole-number attribute's value; it fails the test when there is none.
func (it item) num(t *testing.T, name string) int64 {
	t.Helper()
	v, ok := it[name].(*types.AttributeValueMemberN)
	require.True(t, ok, "%s is a number attribute", name)
	n, err := strconv.ParseInt(v.Value, 10, 64)
	require.NoError(t, err)
	return n
}

func (it item) keys() []string {
	out := make([]string, 0, len(it))
	for k := range it {
		out = append(out, k)
	}
	return out
}

// runtimeItem reads one floodgate_runtime_config item as stored (empty when none).
func (e *testEnv) runtimeItem(t *testing.T, pk string) item {
	t.Helper()
	out, err := e.ddb.GetItem(context.Background(), &dynamodb.GetItemInput{TableName: aws.String(e.prefix + dynamo.TableRuntimeConfig),
		Key: map[string]types.AttributeValue{"pk": s(pk)}, ConsistentRead: aws.Bool(true)})
	require.NoError(t, err)
	return out.Item
}

// putUsage writes a principal's units of one day (YYYY-MM-DD) to the quota
// ledger as the quota service does: pk principal, sk day, units.
func (e *testEnv) putUsage(t *testing.T, principal, day string, units int64) {
	t.Helper()
	_, err := e.ddb.PutItem(context.Background(), &dynamodb.PutItemInput{TableName: aws.String(e.prefix + dynamo.TableQuotaLedger),
		Item: map[string]types.AttributeValue{"pk": s(principal), "sk": s(day), "units": &types.AttributeValueMemberN{Value: strconv.FormatInt(units, 10)}}})
	require.NoError(t, err)
}

// setCrossing records ref in the stored alert's event, as the detector does.
func (e *testEnv) setCrossing(t *testing.T, a store.Alert, ref *events.EventRef) store.Alert {
	t.Helper()
	ev := *a.Event
	ev.Evidence.CrossingEvent = ref
	body, err := events.EncodeAbuse(&ev)
	require.NoError(t, err)
	_, err = e.ddb.UpdateItem(context.Background(), &dynamodb.UpdateItemInput{TableName: aws.String(e.prefix + dynamo.TableAbuseRecords),
		Key: map[string]types.AttributeValue{"pk": s(a.Principal), "sk": s(a.SK)}, UpdateExpression: aws.String("SET #e = :e"),
		ExpressionAttributeNames: map[string]string{"#e": "event"}, ExpressionAttributeValues: map[string]types.AttributeValue{":e": s(string(body))}})
	require.NoError(t, err)
	got, err := e.st.Get(context.Background(), a.Principal, a.SK)
	require.NoError(t, err)
	return got
}
