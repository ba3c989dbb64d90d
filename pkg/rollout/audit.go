// The audit log table (floodgate_audit_log) keeps two things of the rules
// rollout: its steps (DynamoAudit) and the claims that make changes to the
// rules topic compare-and-set (DynamoClaims).

package rollout

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
	// Subject is the audit partition (AuditSubject when empty; the detector
	// parameters topic's rollouts use ParamsAuditSubject).
	Subject string
}

// ParamsAuditSubject is the audit partition of detector parameters rollouts.
const ParamsAuditSubject = "detector-params#rollout"

func (d *DynamoAudit) subject() string {
	if d.Subject == "" {
		return AuditSubject
	}
	return d.Subject
}

var _ Auditor = (*DynamoAudit)(nil)

// Audit writes e as one new row; under ParamsAuditSubject its action is
// named after the parameters (ParamsAction: rules.step → params.step), so
// the two rollouts' steps never read alike.
func (d *DynamoAudit) Audit(ctx context.Context, e AuditEntry) error {
	if d.subject() == ParamsAuditSubject {
		e.Action = ParamsAction(e.Action)
	}
	sk := e.At.UTC().Format("2006-01-02T15:04:05.000000000Z") + "#" + uuid.NewString()
	before, _ := json.Marshal(e.Before)
	after, _ := json.Marshal(e.After)
	s := func(v string) types.AttributeValue { return &types.AttributeValueMemberS{Value: v} }
	item := map[string]types.AttributeValue{
		"pk": s(d.subject()), "sk": s(sk), "gsi1pk": s("actor#" + e.Actor), "gsi1sk": s(sk),
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
		ExpressionAttributeValues: map[string]types.AttributeValue{":p": &types.AttributeValueMemberS{Value: d.subject()}},
		ScanIndexForward:          aws.Bool(false), Limit: aws.Int32(int32(limit)), ConsistentRead: aws.Bool(true)})
	if err != nil {
		return nil, fmt.Errorf("query audit log of %s: %w", d.subject(), err)
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

// ErrConflict is returned when another change to the rules topic was planned
// against the same state and claimed it first: this change was not published.
var ErrConflict = errors.New("another change to the rules topic was made at the same moment; nothing was published — read the topic again and retry")

// ClaimLease bounds how long a claim holds its offset for a change that was
// never published (its writer died between the claim and the publish); a
// publish is given half of it.
const ClaimLease = time.Minute

// Claims make the changes to the rules topic compare-and-set. Every change is
// planned against the topic read up to an offset (State.Next) — the version
// number a new rollout gets comes from it — and is published only by the
// first writer to claim that offset: a second writer that read the same
// state gets ErrConflict instead of publishing the same version number with
// other rules. Must be safe for concurrent use.
type Claims interface {
	// Claim takes offset next of topic for holder until lease has passed.
	Claim(ctx context.Context, topic string, next int64, holder string, lease time.Duration) error
	// Release gives back holder's claim of a change that was not published.
	Release(ctx context.Context, topic string, next int64, holder string) error
}

// DynamoClaims keeps claims as conditional writes in the audit log's table
// (partition "rules#claim#<topic>", one row per offset, removed by the
// table's TTL after a day): every writer of the topic — the command line, the
// console, the adjuster's controller — already writes its audit rows there,
// and DynamoDB's conditional write is the atomic compare-and-set.
type DynamoClaims struct {
	Client *dynamodb.Client
	Table  string           // with the deployment's prefix
	Now    func() time.Time // nil = time.Now
}

var _ Claims = (*DynamoClaims)(nil)

func claimKey(topic string, next int64) map[string]types.AttributeValue {
	return map[string]types.AttributeValue{
		"pk": &types.AttributeValueMemberS{Value: "rules#claim#" + topic},
		"sk": &types.AttributeValueMemberS{Value: fmt.Sprintf("%020d", next)},
	}
}

func (d *DynamoClaims) now() time.Time {
	if d.Now == nil {
		return time.Now()
	}
	return d.Now()
}

// Claim writes the claim row unless one exists whose lease has not passed.
func (d *DynamoClaims) Claim(ctx context.Context, topic string, next int64, holder string, lease time.Duration) error {
	now := d.now()
	item := claimKey(topic, next)
	item["holder"] = &types.AttributeValueMemberS{Value: holder}
	item["lease_until"] = &types.AttributeValueMemberN{Value: strconv.FormatInt(now.Add(lease).UnixMilli(), 10)}
	item["expires_at"] = &types.AttributeValueMemberN{Value: strconv.FormatInt(now.Add(24*time.Hour).Unix(), 10)}
	_, err := d.Client.PutItem(ctx, &dynamodb.PutItemInput{TableName: aws.String(d.Table), Item: item,
		ConditionExpression:       aws.String("attribute_not_exists(pk) OR lease_until < :now"),
		ExpressionAttributeValues: map[string]types.AttributeValue{":now": &types.AttributeValueMemberN{Value: strconv.FormatInt(now.UnixMilli(), 10)}}})
	var failed *types.ConditionalCheckFailedException
	switch {
	case errors.As(err, &failed):
		return fmt.Errorf("offset %d of %s: %w", next, topic, ErrConflict)
	case err != nil:
		return fmt.Errorf("claim offset %d of %s: %w", next, topic, err)
	}
	return nil
}

// Release deletes the claim row if holder still has it.
func (d *DynamoClaims) Release(ctx context.Context, topic string, next int64, holder string) error {
	_, err := d.Client.DeleteItem(ctx, &dynamodb.DeleteItemInput{TableName: aws.String(d.Table), Key: claimKey(topic, next),
		ConditionExpression:       aws.String("holder = :h"),
		ExpressionAttributeValues: map[string]types.AttributeValue{":h": &types.AttributeValueMemberS{Value: holder}}})
	var failed *types.ConditionalCheckFailedException
	if err != nil && !errors.As(err, &failed) {
		return fmt.Errorf("release offset %d of %s: %w", next, topic, err)
	}
	return nil
}
