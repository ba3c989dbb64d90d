package store

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/floodgate-dev/floodgate/migrations/migrationstest"
	"github.com/floodgate-dev/floodgate/pkg/dynamo"
	"github.com/stretchr/testify/require"
)

// TestListPagesThroughTies: detections of one millisecond share their index
// sort key; paging through more of them than a page holds returns each once.
func TestListPagesThroughTies(t *testing.T) {
	ctx := context.Background()
	ddb, prefix := migrationstest.DynamoTables(t, "store", dynamo.TableAbuseRecords)
	at := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	ts := at.Format(tsLayout)
	const n = 250
	for i := 0; i < n; i++ {
		_, err := ddb.PutItem(ctx, &dynamodb.PutItemInput{TableName: aws.String(prefix + dynamo.TableAbuseRecords), Item: map[string]types.AttributeValue{
			"pk": sv(fmt.Sprintf("user:u%03d", i)), "sk": sv(ts + "#a" + fmt.Sprint(i)),
			"gsi1pk": sv("day#2026-11-30"), "gsi1sk": sv(ts), "id": sv(fmt.Sprint(i)),
		}})
		require.NoError(t, err)
	}
	st := New(ddb, nil, prefix, func() time.Time { return at.Add(time.Hour) })
	seen := map[string]int{}
	cur := ""
	for pages := 0; ; pages++ {
		require.Less(t, pages, 10, "paging ends")
		page, next, err := st.List(ctx, Filter{Since: at.Add(-time.Hour), Until: at.Add(time.Minute), PageSize: 100, Cursor: cur})
		require.NoError(t, err)
		for _, a := range page {
			seen[a.Principal]++
		}
		if next == "" {
			break
		}
		cur = next
	}
	require.Len(t, seen, n)
	for p, c := range seen {
		require.Equal(t, 1, c, p)
	}
}
