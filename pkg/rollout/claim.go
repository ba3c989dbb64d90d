package rollout

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
)

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
