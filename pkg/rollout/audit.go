package rollout

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/google/uuid"
)

// AuditSubject is the audit log partition (pk) of every rollout step.
const AuditSubject = "rules#rollout"

// auditRetention matches the console's audit rows (400 days).
const auditRetention = 400 * 24 * time.Hour

// AuditEntry is one rollout step in the audit log.
type AuditEntry struct {
	At            time.Time
	Actor         string
	Role          string
	Via           string // cli, console, controller
	Action        string
	Version       int64
	Reason        string
	Before, After map[string]any
}

// Auditor records rollout steps. Must be safe for concurrent use.
type Auditor interface {
	Audit(ctx context.Context, e AuditEntry) error
}

// DynamoAudit writes rollout steps to floodgate_audit_log in the console's
// row format (pk AuditSubject, sk time#id, gsi1 by actor), so the console's
// audit views read them like its own.
type DynamoAudit struct {
	Client *dynamodb.Client
	Table  string // with the deployment's prefix
}

var _ Auditor = (*DynamoAudit)(nil)

// Audit writes e as one new row.
func (d *DynamoAudit) Audit(ctx context.Context, e AuditEntry) error {
	sk := e.At.UTC().Format("2006-01-02T15:04:05.000000000Z") + "#" + uuid.NewString()
	before, _ := json.Marshal(e.Before)
	after, _ := json.Marshal(e.After)
	s := func(v string) types.AttributeValue { return &types.AttributeValueMemberS{Value: v} }
	item := map[string]types.AttributeValue{
		"pk": s(AuditSubject), "sk": s(sk), "gsi1pk": s("actor#" + e.Actor), "gsi1sk": s(sk),
		"at": s(e.At.UTC().Format(time.RFC3339Nano)), "actor": s(e.Actor), "action": s(e.Action),
		"reason": s(e.Reason), "abuse_id": s("rules-v" + strconv.FormatInt(e.Version, 10)),
		"before": s(string(before)), "after": s(string(after)), "service": s(e.Via),
		"expires_at": &types.AttributeValueMemberN{Value: strconv.FormatInt(e.At.Add(auditRetention).Unix(), 10)},
	}
	if e.Role != "" {
		item["role"] = s(e.Role)
	}
	if e.Via == "" {
		item["service"] = s("rollout")
	}
	_, err := d.Client.PutItem(ctx, &dynamodb.PutItemInput{TableName: aws.String(d.Table), Item: item,
		ConditionExpression: aws.String("attribute_not_exists(pk)")})
	if err != nil {
		return fmt.Errorf("write audit row %s: %w", sk, err)
	}
	return nil
}

// History reads the newest rollout steps, newest first.
func (d *DynamoAudit) History(ctx context.Context, limit int) ([]AuditEntry, error) {
	out, err := d.Client.Query(ctx, &dynamodb.QueryInput{TableName: aws.String(d.Table),
		KeyConditionExpression:    aws.String("pk = :p"),
		ExpressionAttributeValues: map[string]types.AttributeValue{":p": &types.AttributeValueMemberS{Value: AuditSubject}},
		ScanIndexForward:          aws.Bool(false), Limit: aws.Int32(int32(limit)), ConsistentRead: aws.Bool(true)})
	if err != nil {
		return nil, fmt.Errorf("query audit log of %s: %w", AuditSubject, err)
	}
	str := func(v types.AttributeValue) string {
		if s, ok := v.(*types.AttributeValueMemberS); ok {
			return s.Value
		}
		return ""
	}
	res := make([]AuditEntry, 0, len(out.Items))
	for _, it := range out.Items {
		e := AuditEntry{Actor: str(it["actor"]), Role: str(it["role"]), Via: str(it["service"]), Action: str(it["action"]), Reason: str(it["reason"])}
		e.At, _ = time.Parse(time.RFC3339Nano, str(it["at"]))
		if ref := str(it["abuse_id"]); len(ref) > len("rules-v") {
			e.Version, _ = strconv.ParseInt(ref[len("rules-v"):], 10, 64)
		}
		_ = json.Unmarshal([]byte(str(it["before"])), &e.Before)
		_ = json.Unmarshal([]byte(str(it["after"])), &e.After)
		res = append(res, e)
	}
	return res, nil
}
