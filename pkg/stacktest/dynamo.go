package stacktest

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
)

// DropTables deletes every DynamoDB table whose name starts with prefix —
// a test's own tables, at its end — logging what it could not delete
// rather than failing the test over its clean-up.
func DropTables(t testing.TB, ddb *dynamodb.Client, prefix string) {
	ctx := context.Background()
	out, err := ddb.ListTables(ctx, &dynamodb.ListTablesInput{})
	if err != nil {
		t.Logf("list tables: %v", err)
		return
	}
	for _, name := range out.TableNames {
		if !strings.HasPrefix(name, prefix) {
			continue
		}
		_, err := ddb.DeleteTable(ctx, &dynamodb.DeleteTableInput{TableName: aws.String(name)})
		var notFound *types.ResourceNotFoundException
		if err != nil && !errors.As(err, &notFound) {
			t.Logf("delete table %s: %v", name, err)
		}
	}
}
