// Package migrationstest gives integration tests the DynamoDB tables of the
// migrations on DynamoDB Local, under a table prefix no other test uses, and
// a fresh broker with the migrations' topics.
package migrationstest

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/stretchr/testify/require"

	"github.com/floodgate-dev/floodgate/migrations"
	"github.com/floodgate-dev/floodgate/pkg/dynamo"
	"github.com/floodgate-dev/floodgate/pkg/kafkatest"
	"github.com/floodgate-dev/floodgate/pkg/stacktest"
)

// DynamoEndpoint is FLOODGATE_DYNAMODB_ENDPOINT or the local stack's.
func DynamoEndpoint() string { return stacktest.Local().DynamoEndpoint }

// DynamoTables creates the DynamoDB tables the migrations define — those
// named in only, or all of them — under a fresh prefix (base, a number, "_")
// on DynamoDB Local, and deletes them when the test ends. It returns the
// client and the prefix: a table's name is prefix + its name in the
// migrations (dynamo.Table…). It skips under -short (`make test-unit` runs
// without the stack) and fails, loudly, when DynamoDB Local does not answer.
func DynamoTables(t testing.TB, base string, only ...string) (*dynamodb.Client, string) {
	t.Helper()
	ctx := stacktest.Context(t, time.Minute, "needs the local stack's DynamoDB Local: `make test` runs it (`make test-unit` is -short, no stack)")
	ddb, err := dynamo.NewClient(ctx, dynamo.Options{Endpoint: DynamoEndpoint()})
	require.NoError(t, err)
	ms, err := migrations.Load()
	require.NoError(t, err)
	var specs []migrations.TableSpec
	for _, m := range ms {
		for _, s := range m.DynamoDB.Tables {
			if len(only) == 0 || slices.Contains(only, s.Name) {
				specs = append(specs, s)
			}
		}
	}
	if len(only) > 0 {
		require.Len(t, specs, len(only), "the migrations define every table of %v", only)
	}
	prefix := fmt.Sprintf("%s%d_", base, time.Now().UnixNano())
	t.Cleanup(func() {
		for _, s := range specs {
			_, _ = ddb.DeleteTable(context.Background(), &dynamodb.DeleteTableInput{TableName: aws.String(prefix + s.Name)})
		}
	})
	d := &migrations.Dynamo{Client: ddb, Prefix: prefix}
	require.NoError(t, d.Apply(ctx, specs, func(string) {}), "create the migrations' tables on DynamoDB Local at %s (is the local stack up? `make up`)", DynamoEndpoint())
	return ddb, prefix
}

// Broker starts a fresh in-process broker and applies the migrations to it
// as production does — and to the DynamoDB and InfluxDB that r names —
// logging each step to the test; it returns the broker's address.
func Broker(t testing.TB, ctx context.Context, r migrations.Runner) string {
	t.Helper()
	broker := kafkatest.Start(t, nil)
	ms, err := migrations.Load()
	require.NoError(t, err)
	r.Kafka, r.Now, r.Report = migrations.NewKafka([]string{broker}, 1, nil), time.Now, func(line string) { t.Log(line) }
	require.NoError(t, r.Apply(ctx, ms), "migrations against the broker, InfluxDB and DynamoDB Local (is the local stack up? `make up`)")
	return broker
}
