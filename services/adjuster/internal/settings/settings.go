// Package settings keeps the adjuster's runtime settings — rules, dry-run, the
// kill switch and manual overrides — as one versioned document in DynamoDB, and
// writes every change together with its audit record in one transaction.
package settings

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/floodgate-dev/floodgate/pkg/adjusterapi"
	"github.com/floodgate-dev/floodgate/services/adjuster/internal/control"
)

// ErrConflict means the stored version is not the one the change was based on.
var ErrConflict = errors.New("settings changed since they were read")

// Settings are the adjuster's runtime state that SREs change.
type Settings struct {
	// Version increases by one with every change; 0 means never stored.
	Version   int64               `json:"version"`
	Rules     control.Rules       `json:"rules"`
	DryRun    bool                `json:"dry_run"`
	Frozen    bool                `json:"frozen"`
	Overrides map[string]Override `json:"overrides"`
	UpdatedAt time.Time           `json:"updated_at,omitzero"`
	UpdatedBy string              `json:"updated_by,omitempty"`
}

// Override pins one scope's scale until ExpiresAt.
type Override struct {
	Scale     float64   `json:"scale"`
	ExpiresAt time.Time `json:"expires_at"`
	Actor     string    `json:"actor"`
	Reason    string    `json:"reason"`
	SetAt     time.Time `json:"set_at"`
}

// Getter returns the stored settings (found false: none stored).
type Getter interface {
	Get(ctx context.Context) (s Settings, found bool, err error)
}

// Current returns the stored settings, or, while none are stored, defaults
// at version 0; Overrides is never nil.
func Current(ctx context.Context, g Getter, defaults control.Rules) (Settings, error) {
	s, found, err := g.Get(ctx)
	if err != nil {
		return Settings{}, err
	}
	if !found {
		s = Settings{Rules: defaults.Clone()}
	}
	if s.Overrides == nil {
		s.Overrides = map[string]Override{}
	}
	return s, nil
}

// Active returns the scale of every override that has not expired at now.
func (s Settings) Active(now time.Time) map[string]float64 {
	out := map[string]float64{}
	for scope, o := range s.Overrides {
		if now.Before(o.ExpiresAt) {
			out[scope] = o.Scale
		}
	}
	return out
}

// Clone returns a deep copy.
func (s Settings) Clone() Settings {
	c := s
	c.Rules = s.Rules.Clone()
	c.Overrides = make(map[string]Override, len(s.Overrides))
	for k, v := range s.Overrides {
		c.Overrides[k] = v
	}
	return c
}

// Prune drops overrides that expired at now.
func (s *Settings) Prune(now time.Time) {
	for scope, o := range s.Overrides {
		if !now.Before(o.ExpiresAt) {
			delete(s.Overrides, scope)
		}
	}
}

// AuditRecord is who changed what, when and why.
type AuditRecord = adjusterapi.AuditRecord

// AuditSubject is the audit log partition of adjuster changes.
const AuditSubject = "adjuster#settings"

// AuditRetention is how long audit rows live (the table's TTL).
const AuditRetention = 400 * 24 * time.Hour

// settingsKey is the runtime-config row of the adjuster.
const settingsKey = "adjuster"

// Dynamo stores settings in the runtime-config table and audit records in the
// audit-log table.
type Dynamo struct {
	Client       *dynamodb.Client
	RuntimeTable string // <prefix>floodgate_runtime_config
	AuditTable   string // <prefix>floodgate_audit_log
}

// Get returns the stored settings; found is false when none were ever stored.
func (d *Dynamo) Get(ctx context.Context) (s Settings, found bool, err error) {
	out, err := d.Client.GetItem(ctx, &dynamodb.GetItemInput{
		TableName: aws.String(d.RuntimeTable), ConsistentRead: aws.Bool(true),
		Key: map[string]types.AttributeValue{"pk": &types.AttributeValueMemberS{Value: settingsKey}},
	})
	if err != nil {
		return Settings{}, false, fmt.Errorf("get settings: %w", err)
	}
	if out.Item == nil {
		return Settings{}, false, nil
	}
	doc, ok := out.Item["doc"].(*types.AttributeValueMemberS)
	if !ok {
		return Settings{}, false, fmt.Errorf("get settings: row has no doc")
	}
	if err := json.Unmarshal([]byte(doc.Value), &s); err != nil {
		return Settings{}, false, fmt.Errorf("decode settings: %w", err)
	}
	if err := s.Rules.Validate(); err != nil {
		return Settings{}, false, fmt.Errorf("stored rules: %w", err)
	}
	return s, true, nil
}

// Put stores next (whose Version must be expected+1) if the stored version is
// still expected (0: nothing stored yet), and writes rec in the same
// transaction. A lost race returns ErrConflict and writes nothing.
func (d *Dynamo) Put(ctx context.Context, expected int64, next Settings, rec AuditRecord) error {
	if next.Version != expected+1 {
		return fmt.Errorf("put settings: version %d does not follow %d", next.Version, expected)
	}
	doc, err := json.Marshal(next)
	if err != nil {
		return fmt.Errorf("encode settings: %w", err)
	}
	row := map[string]types.AttributeValue{
		"pk":         &types.AttributeValueMemberS{Value: settingsKey},
		"version":    &types.AttributeValueMemberN{Value: strconv.FormatInt(next.Version, 10)},
		"doc":        &types.AttributeValueMemberS{Value: string(doc)},
		"updated_at": &types.AttributeValueMemberS{Value: next.UpdatedAt.UTC().Format(time.RFC3339Nano)},
		"updated_by": &types.AttributeValueMemberS{Value: next.UpdatedBy},
	}
	put := &types.Put{TableName: aws.String(d.RuntimeTable), Item: row}
	if expected == 0 {
		put.ConditionExpression = aws.String("attribute_not_exists(pk)")
	} else {
		put.ConditionExpression = aws.String("version = :v")
		put.ExpressionAttributeValues = map[string]types.AttributeValue{
			":v": &types.AttributeValueMemberN{Value: strconv.FormatInt(expected, 10)},
		}
	}
	// Sorted by time, then by version (two changes can share a timestamp), then id.
	sk := fmt.Sprintf("%s#%012d#%s", rec.At.UTC().Format("2006-01-02T15:04:05.000000000Z"), rec.VersionAfter, rec.ID)
	audit := map[string]types.AttributeValue{
		"pk":             &types.AttributeValueMemberS{Value: AuditSubject},
		"sk":             &types.AttributeValueMemberS{Value: sk},
		"gsi1pk":         &types.AttributeValueMemberS{Value: "actor#" + rec.Actor},
		"gsi1sk":         &types.AttributeValueMemberS{Value: sk},
		"id":             &types.AttributeValueMemberS{Value: rec.ID},
		"at":             &types.AttributeValueMemberS{Value: rec.At.UTC().Format(time.RFC3339Nano)},
		"actor":          &types.AttributeValueMemberS{Value: rec.Actor},
		"role":           &types.AttributeValueMemberS{Value: rec.Role},
		"action":         &types.AttributeValueMemberS{Value: rec.Action},
		"reason":         &types.AttributeValueMemberS{Value: rec.Reason},
		"correlation_id": &types.AttributeValueMemberS{Value: rec.CorrelationID},
		"version_before": &types.AttributeValueMemberN{Value: strconv.FormatInt(rec.VersionBefore, 10)},
		"version_after":  &types.AttributeValueMemberN{Value: strconv.FormatInt(rec.VersionAfter, 10)},
		"before":         &types.AttributeValueMemberS{Value: string(rec.Before)},
		"after":          &types.AttributeValueMemberS{Value: string(rec.After)},
		"expires_at":     &types.AttributeValueMemberN{Value: strconv.FormatInt(rec.At.Add(AuditRetention).Unix(), 10)},
	}
	_, err = d.Client.TransactWriteItems(ctx, &dynamodb.TransactWriteItemsInput{TransactItems: []types.TransactWriteItem{
		{Put: put},
		{Put: &types.Put{TableName: aws.String(d.AuditTable), Item: audit, ConditionExpression: aws.String("attribute_not_exists(pk)")}},
	}})
	var canceled *types.TransactionCanceledException
	if errors.As(err, &canceled) && len(canceled.CancellationReasons) > 0 &&
		aws.ToString(canceled.CancellationReasons[0].Code) == "ConditionalCheckFailed" {
		return fmt.Errorf("put settings version %d: %w", next.Version, ErrConflict)
	}
	if err != nil {
		return fmt.Errorf("put settings version %d: %w", next.Version, err)
	}
	return nil
}

// Audit returns the newest limit audit records, newest first.
func (d *Dynamo) Audit(ctx context.Context, limit int32) ([]AuditRecord, error) {
	out, err := d.Client.Query(ctx, &dynamodb.QueryInput{
		TableName:              aws.String(d.AuditTable),
		KeyConditionExpression: aws.String("pk = :pk"),
		ExpressionAttributeValues: map[string]types.AttributeValue{
			":pk": &types.AttributeValueMemberS{Value: AuditSubject},
		},
		ScanIndexForward: aws.Bool(false),
		Limit:            aws.Int32(limit),
	})
	if err != nil {
		return nil, fmt.Errorf("query audit log: %w", err)
	}
	recs := make([]AuditRecord, 0, len(out.Items))
	for _, it := range out.Items {
		recs = append(recs, decodeAudit(it))
	}
	return recs, nil
}

func decodeAudit(it map[string]types.AttributeValue) AuditRecord {
	s := func(k string) string {
		if v, ok := it[k].(*types.AttributeValueMemberS); ok {
			return v.Value
		}
		return ""
	}
	n := func(k string) int64 {
		if v, ok := it[k].(*types.AttributeValueMemberN); ok {
			x, _ := strconv.ParseInt(v.Value, 10, 64)
			return x
		}
		return 0
	}
	at, _ := time.Parse(time.RFC3339Nano, s("at"))
	raw := func(k string) json.RawMessage {
		if v := s(k); v != "" {
			return json.RawMessage(v)
		}
		return json.RawMessage("null")
	}
	return AuditRecord{
		ID: s("id"), At: at, Actor: s("actor"), Role: s("role"), Action: s("action"), Reason: s("reason"),
		CorrelationID: s("correlation_id"), VersionBefore: n("version_before"), VersionAfter: n("version_after"),
		Before: raw("before"), After: raw("after"),
	}
}
