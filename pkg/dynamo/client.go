// Package dynamo builds the DynamoDB client every Floodgate service uses.
package dynamo

import (
	"context"
	"fmt"

	"github.com/aws/aws-sdk-go-v2/aws"
	awsconfig "github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
)

// Options select AWS or a local endpoint.
type Options struct {
	// Endpoint, when set, points the client at DynamoDB Local (FLOODGATE_DYNAMODB_ENDPOINT);
	// static dummy credentials are used there. Empty means AWS with the default chain.
	Endpoint string
	// Region defaults to us-east-1 for a local endpoint and to the AWS chain otherwise.
	Region string
	// TablePrefix is prepended to every table name (FLOODGATE_DYNAMODB_TABLE_PREFIX), so
	// several environments or test runs share one account or one DynamoDB Local.
	TablePrefix string
}

// NewClient returns a DynamoDB client for o.
func NewClient(ctx context.Context, o Options) (*dynamodb.Client, error) {
	var opts []func(*awsconfig.LoadOptions) error
	if o.Region != "" {
		opts = append(opts, awsconfig.WithRegion(o.Region))
	}
	if o.Endpoint != "" {
		if o.Region == "" {
			opts = append(opts, awsconfig.WithRegion("us-east-1"))
		}
		opts = append(opts, awsconfig.WithCredentialsProvider(
			credentials.NewStaticCredentialsProvider("local", "local", "")))
	}
	cfg, err := awsconfig.LoadDefaultConfig(ctx, opts...)
	if err != nil {
		return nil, fmt.Errorf("load aws config: %w", err)
	}
	return dynamodb.NewFromConfig(cfg, func(do *dynamodb.Options) {
		if o.Endpoint != "" {
			do.BaseEndpoint = aws.String(o.Endpoint)
			// DynamoDB Local answers some calls with an X-Amz-Crc32 that does not match
			// the body it sends; the SDK would log a warning per response.
			do.DisableValidateResponseChecksum = true
		}
	}), nil
}

// Table names, without the deployment's prefix.
const (
	TableQuotaLedger   = "floodgate_quota_ledger"
	TableAbuseRecords  = "floodgate_abuse_records"
	TableAuditLog      = "floodgate_audit_log"
	TableRuntimeConfig = "floodgate_runtime_config"
	TableMigrations    = "floodgate_schema_migrations"
	TableDLQRecords    = "floodgate_dlq_records"
)
