package migrations

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/floodgate-dev/floodgate/pkg/dynamo"
)

// Dynamo reconciles DynamoDB tables and keeps the migrations ledger.
type Dynamo struct {
	Client *dynamodb.Client
	Prefix string // table name prefix of this deployment
}

func (d *Dynamo) table(name string) string { return d.Prefix + name }

// Apply creates missing tables, adds missing indexes and turns TTL on.
func (d *Dynamo) Apply(ctx context.Context, specs []TableSpec, report func(string)) error {
	for _, s := range specs {
		name := d.table(s.Name)
		desc, err := d.Client.DescribeTable(ctx, &dynamodb.DescribeTableInput{TableName: aws.String(name)})
		var notFound *types.ResourceNotFoundException
		switch {
		case errors.As(err, &notFound):
			if err := d.create(ctx, name, s); err != nil {
				return err
			}
			report(fmt.Sprintf("dynamodb table %s: created", name))
		case err != nil:
			return fmt.Errorf("describe table %s: %w", name, err)
		default:
			added, err := d.addIndexes(ctx, name, s, desc.Table)
			if err != nil {
				return err
			}
			if len(added) > 0 {
				report(fmt.Sprintf("dynamodb table %s: indexes added %v", name, added))
			} else {
				report(fmt.Sprintf("dynamodb table %s: ok", name))
			}
		}
		if s.TTLAttribute != "" {
			if err := d.ensureTTL(ctx, name, s.TTLAttribute, report); err != nil {
				return err
			}
		}
	}
	return nil
}

func (d *Dynamo) create(ctx context.Context, name string, s TableSpec) error {
	attrs := map[string]types.ScalarAttributeType{}
	addAttr := func(k *KeySpec) {
		if k != nil {
			attrs[k.Name] = types.ScalarAttributeType(k.Type)
		}
	}
	addAttr(&s.PartitionKey)
	addAttr(s.SortKey)
	in := &dynamodb.CreateTableInput{
		TableName:   aws.String(name),
		BillingMode: types.BillingModePayPerRequest,
		KeySchema:   keySchema(s.PartitionKey, s.SortKey),
	}
	for _, ix := range s.Indexes {
		addAttr(&ix.PartitionKey)
		addAttr(ix.SortKey)
		in.GlobalSecondaryIndexes = append(in.GlobalSecondaryIndexes, types.GlobalSecondaryIndex{
			IndexName:  aws.String(ix.Name),
			KeySchema:  keySchema(ix.PartitionKey, ix.SortKey),
			Projection: &types.Projection{ProjectionType: types.ProjectionTypeAll},
		})
	}
	for attr, typ := range attrs {
		in.AttributeDefinitions = append(in.AttributeDefinitions, types.AttributeDefinition{AttributeName: aws.String(attr), AttributeType: typ})
	}
	if _, err := d.Client.CreateTable(ctx, in); err != nil {
		var inUse *types.ResourceInUseException
		if !errors.As(err, &inUse) { // created concurrently by another migrate run: fine
			return fmt.Errorf("create table %s: %w", name, err)
		}
	}
	w := dynamodb.NewTableExistsWaiter(d.Client)
	if err := w.Wait(ctx, &dynamodb.DescribeTableInput{TableName: aws.String(name)}, 2*time.Minute); err != nil {
		return fmt.Errorf("wait for table %s: %w", name, err)
	}
	return nil
}

func (d *Dynamo) addIndexes(ctx context.Context, name string, s TableSpec, t *types.TableDescription) ([]string, error) {
	have := map[string]bool{}
	for _, ix := range t.GlobalSecondaryIndexes {
		have[aws.ToString(ix.IndexName)] = true
	}
	var added []string
	for _, ix := range s.Indexes {
		if have[ix.Name] {
			continue
		}
		defs := []types.AttributeDefinition{{AttributeName: aws.String(ix.PartitionKey.Name), AttributeType: types.ScalarAttributeType(ix.PartitionKey.Type)}}
		if ix.SortKey != nil {
			defs = append(defs, types.AttributeDefinition{AttributeName: aws.String(ix.SortKey.Name), AttributeType: types.ScalarAttributeType(ix.SortKey.Type)})
		}
		_, err := d.Client.UpdateTable(ctx, &dynamodb.UpdateTableInput{
			TableName:            aws.String(name),
			AttributeDefinitions: defs,
			GlobalSecondaryIndexUpdates: []types.GlobalSecondaryIndexUpdate{{Create: &types.CreateGlobalSecondaryIndexAction{
				IndexName:  aws.String(ix.Name),
				KeySchema:  keySchema(ix.PartitionKey, ix.SortKey),
				Projection: &types.Projection{ProjectionType: types.ProjectionTypeAll},
			}}},
		})
		if err != nil {
			return added, fmt.Errorf("add index %s to %s: %w", ix.Name, name, err)
		}
		added = append(added, ix.Name)
	}
	return added, nil
}

func (d *Dynamo) ensureTTL(ctx context.Context, name, attr string, report func(string)) error {
	cur, err := d.Client.DescribeTimeToLive(ctx, &dynamodb.DescribeTimeToLiveInput{TableName: aws.String(name)})
	if err != nil {
		return fmt.Errorf("describe ttl of %s: %w", name, err)
	}
	if td := cur.TimeToLiveDescription; td != nil && aws.ToString(td.AttributeName) == attr &&
		(td.TimeToLiveStatus == types.TimeToLiveStatusEnabled || td.TimeToLiveStatus == types.TimeToLiveStatusEnabling) {
		return nil
	}
	_, err = d.Client.UpdateTimeToLive(ctx, &dynamodb.UpdateTimeToLiveInput{
		TableName:               aws.String(name),
		TimeToLiveSpecification: &types.TimeToLiveSpecification{AttributeName: aws.String(attr), Enabled: aws.Bool(true)},
	})
	if err != nil {
		return fmt.Errorf("enable ttl %s on %s: %w", attr, name, err)
	}
	report(fmt.Sprintf("dynamodb table %s: ttl on %s", name, attr))
	return nil
}

func keySchema(pk KeySpec, sk *KeySpec) []types.KeySchemaElement {
	out := []types.KeySchemaElement{{AttributeName: aws.String(pk.Name), KeyType: types.KeyTypeHash}}
	if sk != nil {
		out = append(out, types.KeySchemaElement{AttributeName: aws.String(sk.Name), KeyType: types.KeyTypeRange})
	}
	return out
}

var ledgerSpec = TableSpec{Name: dynamo.TableMigrations, PartitionKey: KeySpec{Name: "version", Type: "N"}}

// ensureLedger creates the migrations ledger table.
func (d *Dynamo) ensureLedger(ctx context.Context, report func(string)) error {
	return d.Apply(ctx, []TableSpec{ledgerSpec}, report)
}

// Records reads the ledger.
func (d *Dynamo) Records(ctx context.Context) (map[int]Record, error) {
	out := map[int]Record{}
	p := dynamodb.NewScanPaginator(d.Client, &dynamodb.ScanInput{TableName: aws.String(d.table(ledgerSpec.Name)), ConsistentRead: aws.Bool(true)})
	for p.HasMorePages() {
		page, err := p.NextPage(ctx)
		if err != nil {
			return nil, fmt.Errorf("read migrations ledger: %w", err)
		}
		for _, item := range page.Items {
			var r Record
			if v, ok := item["version"].(*types.AttributeValueMemberN); ok {
				r.Version, _ = strconv.Atoi(v.Value)
			}
			if v, ok := item["name"].(*types.AttributeValueMemberS); ok {
				r.Name = v.Value
			}
			if v, ok := item["checksum"].(*types.AttributeValueMemberS); ok {
				r.Checksum = v.Value
			}
			if v, ok := item["applied_at"].(*types.AttributeValueMemberS); ok {
				r.AppliedAt, _ = time.Parse(time.RFC3339, v.Value)
			}
			out[r.Version] = r
		}
	}
	return out, nil
}

// Record writes m to the ledger unless it is already there with the same checksum.
func (d *Dynamo) Record(ctx context.Context, m Migration, now time.Time) error {
	_, err := d.Client.PutItem(ctx, &dynamodb.PutItemInput{
		TableName: aws.String(d.table(ledgerSpec.Name)),
		Item: map[string]types.AttributeValue{
			"version":    &types.AttributeValueMemberN{Value: strconv.Itoa(m.Version)},
			"name":       &types.AttributeValueMemberS{Value: m.Name},
			"checksum":   &types.AttributeValueMemberS{Value: m.Checksum},
			"applied_at": &types.AttributeValueMemberS{Value: now.UTC().Format(time.RFC3339)},
		},
		ConditionExpression: aws.String("attribute_not_exists(version)"),
	})
	var exists *types.ConditionalCheckFailedException
	if errors.As(err, &exists) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("record migration %d: %w", m.Version, err)
	}
	return nil
}
