package detector

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/floodgate-dev/floodgate/pkg/dynamo"
	"github.com/floodgate-dev/floodgate/pkg/events"
)

// DynamoRecords keeps the abuse history in floodgate_abuse_records and reads
// allowlists from floodgate_runtime_config. Safe for concurrent use.
//
// Abuse record: pk = principal key (kind:id), sk = detected_at#id,
// gsi1pk = day#YYYY-MM-DD, gsi1sk = detected_at, expires_at (TTL, epoch
// seconds), the pattern, severity, score, penalty, and the abuse event with
// every IP truncated to its /24 (IPv4) or /64 (IPv6). The put is conditional
// on the key not existing, so a replayed detection writes nothing.
type DynamoRecords struct {
	Client       *dynamodb.Client
	AbuseTable   string        // prefix + floodgate_abuse_records
	RuntimeTable string        // prefix + floodgate_runtime_config
	Retention    time.Duration // how long a record is kept
}

// Put stores a once; a second put of the same detection is a no-op.
func (r *DynamoRecords) Put(ctx context.Context, a *events.Abuse) error {
	stored := TruncateIPs(*a)
	body, err := events.EncodeAbuse(&stored)
	if err != nil {
		return fmt.Errorf("encode abuse record %s: %w", a.ID, err)
	}
	at := a.DetectedAt.UTC().Format("2006-01-02T15:04:05.000Z")
	item := map[string]types.AttributeValue{
		"pk":               &types.AttributeValueMemberS{Value: a.Principal.Key()},
		"sk":               &types.AttributeValueMemberS{Value: at + "#" + a.ID},
		"gsi1pk":           &types.AttributeValueMemberS{Value: "day#" + a.DetectedAt.UTC().Format("2006-01-02")},
		"gsi1sk":           &types.AttributeValueMemberS{Value: at},
		"id":               &types.AttributeValueMemberS{Value: a.ID},
		"pattern":          &types.AttributeValueMemberS{Value: string(a.Pattern)},
		"severity":         &types.AttributeValueMemberS{Value: string(a.Severity)},
		"score":            &types.AttributeValueMemberN{Value: strconv.FormatFloat(a.Score, 'f', -1, 64)},
		"mode":             &types.AttributeValueMemberS{Value: string(a.Penalty.Mode)},
		"level":            &types.AttributeValueMemberN{Value: strconv.FormatInt(a.Penalty.Level, 10)},
		"multiplier":       &types.AttributeValueMemberN{Value: strconv.FormatFloat(a.Penalty.Multiplier, 'f', -1, 64)},
		"penalty_until":    &types.AttributeValueMemberS{Value: a.Penalty.ExpiresAt.UTC().Format(time.RFC3339)},
		"detector_version": &types.AttributeValueMemberS{Value: a.DetectorVersion},
		"event":            &types.AttributeValueMemberS{Value: string(body)},
		"expires_at":       &types.AttributeValueMemberN{Value: strconv.FormatInt(a.DetectedAt.Add(r.Retention).Unix(), 10)},
	}
	_, err = r.Client.PutItem(ctx, &dynamodb.PutItemInput{
		TableName: aws.String(r.AbuseTable), Item: item,
		ConditionExpression: aws.String("attribute_not_exists(pk)"),
	})
	var cond *types.ConditionalCheckFailedException
	if errors.As(err, &cond) {
		return nil // already recorded: a redelivery or a replay
	}
	if err != nil {
		return fmt.Errorf("put abuse record %s: %w", a.ID, err)
	}
	return nil
}

// PriorIncidents counts the incidents of p that ended before at: enforced
// detections in (at-lookback, at), other than the one with id exclude, grouped
// into incidents (see endedIncidents). A detection inside an ongoing incident
// therefore gets that incident's level: re-detections of one attack extend its
// penalty but never escalate it. Event time bounds make it give the same answer
// on a replay, which keeps the escalation level (and so the penalty) idempotent.
func (r *DynamoRecords) PriorIncidents(ctx context.Context, p events.Principal, at time.Time, lookback, quiet time.Duration, exclude string) (int, error) {
	from := at.Add(-lookback).UTC().Format("2006-01-02T15:04:05.000Z")
	to := at.UTC().Format("2006-01-02T15:04:05.000Z")
	var offs []offense
	pages := dynamodb.NewQueryPaginator(r.Client, &dynamodb.QueryInput{
		TableName:              aws.String(r.AbuseTable),
		KeyConditionExpression: aws.String("pk = :pk AND sk BETWEEN :from AND :to"),
		FilterExpression:       aws.String("#m = :enforced AND id <> :id"),
		ExpressionAttributeNames: map[string]string{
			"#m": "mode",
		},
		ExpressionAttributeValues: map[string]types.AttributeValue{
			":pk": &types.AttributeValueMemberS{Value: p.Key()}, ":from": &types.AttributeValueMemberS{Value: from},
			":to": &types.AttributeValueMemberS{Value: to}, ":enforced": &types.AttributeValueMemberS{Value: string(events.PenaltyEnforced)},
			":id": &types.AttributeValueMemberS{Value: exclude},
		},
		ProjectionExpression: aws.String("sk, penalty_until"),
	})
	for pages.HasMorePages() {
		out, err := pages.NextPage(ctx)
		if err != nil {
			return 0, fmt.Errorf("query offenses of %s: %w", p.Key(), err)
		}
		for _, it := range out.Items {
			sk, _ := it["sk"].(*types.AttributeValueMemberS)
			until, _ := it["penalty_until"].(*types.AttributeValueMemberS)
			if sk == nil || until == nil {
				return 0, fmt.Errorf("offense of %s without sk or penalty_until", p.Key())
			}
			when, _, _ := strings.Cut(sk.Value, "#")
			o := offense{}
			if o.at, err = time.Parse("2006-01-02T15:04:05.000Z", when); err != nil {
				return 0, fmt.Errorf("offense of %s: sk %q: %w", p.Key(), sk.Value, err)
			}
			if o.until, err = time.Parse(time.RFC3339, until.Value); err != nil {
				return 0, fmt.Errorf("offense of %s: penalty_until %q: %w", p.Key(), until.Value, err)
			}
			offs = append(offs, o)
		}
	}
	return endedIncidents(offs, at, quiet), nil
}

// offense is one enforced detection: when, and until when its penalty ran.
type offense struct{ at, until time.Time }

// endedIncidents groups offenses (in time order) into incidents — a
// detection that comes while an earlier one's penalty runs, or within quiet
// after it ended, belongs to the same incident — and counts the incidents
// that were over (penalty ended and quiet passed) by at.
func endedIncidents(offs []offense, at time.Time, quiet time.Duration) int {
	n := 0
	var end time.Time // the current incident's penalty end; zero: none yet
	for _, o := range offs {
		if !end.IsZero() && o.at.After(end.Add(quiet)) {
			n++ // the previous incident was over before this one began
			end = time.Time{}
		}
		if o.until.After(end) {
			end = o.until
		}
	}
	if !end.IsZero() && at.After(end.Add(quiet)) {
		n++
	}
	return n
}

// Allowlist items in floodgate_runtime_config, editable by an admin tool:
//
//	pk = "detector#allow#principal#<kind:id>"   or   "detector#allow#cidr#<prefix>"
//	expires_at (N, epoch seconds; also the table's TTL), comment (S), created_by (S), created_at (S)
const (
	allowPrincipalPrefix = "detector#allow#principal#"
	allowCIDRPrefix      = "detector#allow#cidr#"
)

// AllowEntry is one allowlist entry.
type AllowEntry struct {
	Principal string       // kind:id, or empty for a CIDR entry
	CIDR      netip.Prefix // valid for a CIDR entry
	ExpiresAt time.Time
	Comment   string
	CreatedBy string
}

// PutAllow writes an allowlist entry (the admin side; tests use it too).
func (r *DynamoRecords) PutAllow(ctx context.Context, e AllowEntry) error {
	pk := allowPrincipalPrefix + e.Principal
	if e.Principal == "" {
		pk = allowCIDRPrefix + e.CIDR.Masked().String()
	}
	_, err := r.Client.PutItem(ctx, &dynamodb.PutItemInput{TableName: aws.String(r.RuntimeTable), Item: map[string]types.AttributeValue{
		"pk":         &types.AttributeValueMemberS{Value: pk},
		"expires_at": &types.AttributeValueMemberN{Value: strconv.FormatInt(e.ExpiresAt.Unix(), 10)},
		"comment":    &types.AttributeValueMemberS{Value: e.Comment},
		"created_by": &types.AttributeValueMemberS{Value: e.CreatedBy},
		"created_at": &types.AttributeValueMemberS{Value: time.Now().UTC().Format(time.RFC3339)},
	}})
	if err != nil {
		return fmt.Errorf("put allowlist entry %s: %w", pk, err)
	}
	return nil
}

// LoadAllowlist reads every unexpired entry.
func (r *DynamoRecords) LoadAllowlist(ctx context.Context, now time.Time) ([]AllowEntry, error) {
	var out []AllowEntry
	pages := dynamodb.NewScanPaginator(r.Client, &dynamodb.ScanInput{
		TableName:                 aws.String(r.RuntimeTable),
		FilterExpression:          aws.String("begins_with(pk, :p) AND expires_at > :now"),
		ExpressionAttributeValues: map[string]types.AttributeValue{":p": &types.AttributeValueMemberS{Value: "detector#allow#"}, ":now": &types.AttributeValueMemberN{Value: strconv.FormatInt(now.Unix(), 10)}},
	})
	for pages.HasMorePages() {
		page, err := pages.NextPage(ctx)
		if err != nil {
			return nil, fmt.Errorf("scan allowlist: %w", err)
		}
		for _, it := range page.Items {
			pk := dynamo.Str(it["pk"])
			exp, _ := strconv.ParseInt(dynamo.Num(it["expires_at"]), 10, 64)
			e := AllowEntry{ExpiresAt: time.Unix(exp, 0).UTC(), Comment: dynamo.Str(it["comment"]), CreatedBy: dynamo.Str(it["created_by"])}
			switch {
			case strings.HasPrefix(pk, allowPrincipalPrefix):
				e.Principal = strings.TrimPrefix(pk, allowPrincipalPrefix)
			case strings.HasPrefix(pk, allowCIDRPrefix):
				p, err := netip.ParsePrefix(strings.TrimPrefix(pk, allowCIDRPrefix))
				if err != nil {
					continue // an admin typo must not stop detection; the admin tool validates
				}
				e.CIDR = p.Masked()
			default:
				continue
			}
			out = append(out, e)
		}
	}
	return out, nil
}

// TruncateIPs returns a copy of a whose top IPs are cut to their /24 (IPv4)
// or /64 (IPv6) network address, for storage outside the short-lived topic.
func TruncateIPs(a events.Abuse) events.Abuse { return truncateTopIPs(a, 64) }

// truncateTopIPs cuts a's top IPs to their IPv4 /24 and IPv6 /v6bits.
func truncateTopIPs(a events.Abuse, v6bits int) events.Abuse {
	ips := make([]events.IPCount, len(a.Evidence.TopIPs))
	for i, ip := range a.Evidence.TopIPs {
		ips[i] = ip
		ips[i].IP = truncateIP(ip.IP, v6bits)
	}
	a.Evidence.TopIPs = ips
	return a
}

func truncateIP(ip netip.Addr, v6bits int) netip.Addr {
	bits := v6bits
	if ip.Is4() || ip.Is4In6() {
		ip, bits = ip.Unmap(), 24
	}
	p, _ := ip.Prefix(bits)
	return p.Addr()
}
