// Package store reads and changes what the console shows: abuse records the
// detector wrote to DynamoDB, penalties in Redis, allowlist entries and
// false-positive counts in floodgate_runtime_config, and the audit log. Every
// change is written together with its audit row; a change whose audit row
// cannot be written is undone.
package store

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/redis/go-redis/v9"

	"github.com/floodgate-dev/floodgate/pkg/dynamo"
	"github.com/floodgate-dev/floodgate/pkg/events"
)

// DynamoDB is the part of the DynamoDB client the store uses.
type DynamoDB interface {
	Query(ctx context.Context, in *dynamodb.QueryInput, opts ...func(*dynamodb.Options)) (*dynamodb.QueryOutput, error)
	GetItem(ctx context.Context, in *dynamodb.GetItemInput, opts ...func(*dynamodb.Options)) (*dynamodb.GetItemOutput, error)
	Scan(ctx context.Context, in *dynamodb.ScanInput, opts ...func(*dynamodb.Options)) (*dynamodb.ScanOutput, error)
	TransactWriteItems(ctx context.Context, in *dynamodb.TransactWriteItemsInput, opts ...func(*dynamodb.Options)) (*dynamodb.TransactWriteItemsOutput, error)
}

// Store is safe for concurrent use.
type Store struct {
	ddb     DynamoDB
	rdb     redis.UniversalClient
	abuse   string
	audit   string
	runtime string
	now     func() time.Time
}

// New returns a store on the tables named with prefix.
func New(ddb DynamoDB, rdb redis.UniversalClient, prefix string, now func() time.Time) *Store {
	return &Store{ddb: ddb, rdb: rdb, now: now,
		abuse: prefix + dynamo.TableAbuseRecords, audit: prefix + dynamo.TableAuditLog, runtime: prefix + dynamo.TableRuntimeConfig}
}

// Alert statuses, derived from the record and the clock.
const (
	StatusActive        = "active"         // enforced, penalty not yet expired, not lifted
	StatusExpired       = "expired"        // enforced, penalty over
	StatusLifted        = "lifted"         // penalty lifted in the console
	StatusSimulated     = "simulated"      // shadow mode: no penalty was written
	StatusFalsePositive = "false_positive" // marked in the console
)

// Statuses lists the statuses in display order.
var Statuses = []string{StatusActive, StatusExpired, StatusLifted, StatusSimulated, StatusFalsePositive}

// Alert is one abuse record.
type Alert struct {
	Principal    string // kind:id (the record's pk)
	SK           string // detected_at#id
	GSI1PK       string
	GSI1SK       string
	ID           string
	Pattern      string
	Severity     string
	Mode         string
	Score        float64
	Level        int64
	Multiplier   float64
	DetectedAt   time.Time
	PenaltyUntil time.Time
	Status       string

	LiftedBy      string
	LiftedAt      string
	FalsePositive string // who marked it
	FPAt          string

	// DetectorVersion is the detector version that made the detection.
	DetectorVersion string
	// Verdict is the latest reviewer verdict (Value "" when not judged).
	Verdict Verdict

	// Event is the stored abuse.v1 (IPs truncated); set by Get.
	Event *events.Abuse
}

// PrincipalParts splits the principal key.
func (a Alert) PrincipalParts() (kind, id string) {
	kind, id, _ = strings.Cut(a.Principal, ":")
	return kind, id
}

// Filter narrows the alerts list.
type Filter struct {
	Pattern  string
	Severity string
	Status   string
	Since    time.Time // inclusive
	Until    time.Time // inclusive
	After    string    // only records with gsi1sk > After (new-alert polling)
	PageSize int
	Cursor   string
}

// MaxDays is the longest time range one list may cover.
const MaxDays = 31

type cursor struct {
	Day  string `json:"d"`
	PK   string `json:"p"`
	SK   string `json:"s"`
	G1SK string `json:"g"`
}

const tsLayout = "2006-01-02T15:04:05.000Z"

// ErrBadCursor is returned for a cursor this store did not make.
var ErrBadCursor = errors.New("bad cursor")

// List returns a page of alerts, newest first, and the cursor of the next page
// ("" when there is none).
func (s *Store) List(ctx context.Context, f Filter) ([]Alert, string, error) {
	if f.PageSize <= 0 {
		f.PageSize = 25
	}
	now := s.now()
	if f.Until.IsZero() {
		f.Until = now
	}
	if f.Since.IsZero() {
		f.Since = f.Until.Add(-7 * 24 * time.Hour)
	}
	if f.Until.Sub(f.Since) > MaxDays*24*time.Hour {
		f.Since = f.Until.Add(-MaxDays * 24 * time.Hour)
	}
	var cur *cursor
	if f.Cursor != "" {
		raw, err := base64.RawURLEncoding.DecodeString(f.Cursor)
		if err != nil {
			return nil, "", ErrBadCursor
		}
		cur = &cursor{}
		if err := json.Unmarshal(raw, cur); err != nil || cur.Day == "" {
			return nil, "", ErrBadCursor
		}
	}
	var page []Alert
	lastDay := truncDay(f.Since)
	for day := truncDay(f.Until); !day.Before(lastDay); day = day.AddDate(0, 0, -1) {
		dayKey := "day#" + day.Format("2006-01-02")
		var start map[string]types.AttributeValue
		if cur != nil {
			if dayKey > cur.Day {
				continue // pages before the cursor
			}
			if dayKey == cur.Day {
				start = map[string]types.AttributeValue{"pk": sv(cur.PK), "sk": sv(cur.SK), "gsi1pk": sv(cur.Day), "gsi1sk": sv(cur.G1SK)}
			}
		}
		for {
			in := s.listQuery(f, dayKey, start)
			out, err := s.ddb.Query(ctx, in)
			if err != nil {
				return nil, "", fmt.Errorf("query alerts of %s: %w", dayKey, err)
			}
			for _, it := range out.Items {
				a := parseAlert(it, now)
				if f.Status != "" && a.Status != f.Status {
					continue
				}
				page = append(page, a)
				if len(page) > f.PageSize {
					last := page[f.PageSize-1]
					raw, _ := json.Marshal(cursor{Day: last.GSI1PK, PK: last.Principal, SK: last.SK, G1SK: last.GSI1SK})
					return page[:f.PageSize], base64.RawURLEncoding.EncodeToString(raw), nil
				}
			}
			if len(out.LastEvaluatedKey) == 0 {
				break
			}
			start = out.LastEvaluatedKey
		}
	}
	return page, "", nil
}

func (s *Store) listQuery(f Filter, dayKey string, start map[string]types.AttributeValue) *dynamodb.QueryInput {
	vals := map[string]types.AttributeValue{":d": sv(dayKey)}
	cond := "gsi1pk = :d AND gsi1sk BETWEEN :from AND :to"
	vals[":from"] = sv(f.Since.UTC().Format(tsLayout))
	vals[":to"] = sv(f.Until.UTC().Format(tsLayout))
	if f.After != "" {
		cond = "gsi1pk = :d AND gsi1sk > :after"
		vals = map[string]types.AttributeValue{":d": sv(dayKey), ":after": sv(f.After)}
	}
	var filters []string
	names := map[string]string{}
	if f.Pattern != "" {
		filters = append(filters, "#pat = :pat")
		names["#pat"] = "pattern"
		vals[":pat"] = sv(f.Pattern)
	}
	if f.Severity != "" {
		filters = append(filters, "#sev = :sev")
		names["#sev"] = "severity"
		vals[":sev"] = sv(f.Severity)
	}
	in := &dynamodb.QueryInput{
		TableName: aws.String(s.abuse), IndexName: aws.String("gsi1"),
		KeyConditionExpression: aws.String(cond), ExpressionAttributeValues: vals,
		ScanIndexForward: aws.Bool(false), Limit: aws.Int32(100), ExclusiveStartKey: start,
	}
	if len(filters) > 0 {
		in.FilterExpression = aws.String(strings.Join(filters, " AND "))
		in.ExpressionAttributeNames = names
	}
	return in
}

func truncDay(t time.Time) time.Time {
	y, m, d := t.UTC().Date()
	return time.Date(y, m, d, 0, 0, 0, 0, time.UTC)
}

// ErrNotFound is returned for a record that does not exist.
var ErrNotFound = errors.New("not found")

// Get returns one alert with its stored event.
func (s *Store) Get(ctx context.Context, principal, sk string) (Alert, error) {
	out, err := s.ddb.GetItem(ctx, &dynamodb.GetItemInput{TableName: aws.String(s.abuse),
		Key: map[string]types.AttributeValue{"pk": sv(principal), "sk": sv(sk)}, ConsistentRead: aws.Bool(true)})
	if err != nil {
		return Alert{}, fmt.Errorf("get alert %s %s: %w", principal, sk, err)
	}
	if len(out.Item) == 0 {
		return Alert{}, ErrNotFound
	}
	a := parseAlert(out.Item, s.now())
	if body := dynamo.Str(out.Item["event"]); body != "" {
		ev, err := events.DecodeAbuse([]byte(body))
		if err != nil {
			return Alert{}, fmt.Errorf("decode alert %s: %w", a.ID, err)
		}
		a.Event = &ev
	}
	return a, nil
}

// History returns the principal's newest detections.
func (s *Store) History(ctx context.Context, principal string, limit int) ([]Alert, error) {
	out, err := s.ddb.Query(ctx, &dynamodb.QueryInput{TableName: aws.String(s.abuse),
		KeyConditionExpression:    aws.String("pk = :p"),
		ExpressionAttributeValues: map[string]types.AttributeValue{":p": sv(principal)},
		ScanIndexForward:          aws.Bool(false), Limit: aws.Int32(int32(limit)),
	})
	if err != nil {
		return nil, fmt.Errorf("query history of %s: %w", principal, err)
	}
	now := s.now()
	as := make([]Alert, 0, len(out.Items))
	for _, it := range out.Items {
		as = append(as, parseAlert(it, now))
	}
	return as, nil
}

func parseAlert(it map[string]types.AttributeValue, now time.Time) Alert {
	a := Alert{
		Principal: dynamo.Str(it["pk"]), SK: dynamo.Str(it["sk"]), GSI1PK: dynamo.Str(it["gsi1pk"]), GSI1SK: dynamo.Str(it["gsi1sk"]),
		ID: dynamo.Str(it["id"]), Pattern: dynamo.Str(it["pattern"]), Severity: dynamo.Str(it["severity"]), Mode: dynamo.Str(it["mode"]),
		LiftedBy: dynamo.Str(it["lifted_by"]), LiftedAt: dynamo.Str(it["lifted_at"]),
		FalsePositive: dynamo.Str(it["false_positive_by"]), FPAt: dynamo.Str(it["false_positive_at"]),
		DetectorVersion: dynamo.Str(it["detector_version"]), Verdict: parseVerdict(it),
	}
	a.Score, _ = strconv.ParseFloat(dynamo.Num(it["score"]), 64)
	a.Multiplier, _ = strconv.ParseFloat(dynamo.Num(it["multiplier"]), 64)
	a.Level, _ = strconv.ParseInt(dynamo.Num(it["level"]), 10, 64)
	a.DetectedAt, _ = time.Parse(tsLayout, a.GSI1SK)
	a.PenaltyUntil, _ = time.Parse(time.RFC3339, dynamo.Str(it["penalty_until"]))
	switch {
	case a.Verdict.Value == events.VerdictFalsePositive, a.Verdict.Value == "" && a.FPAt != "":
		a.Status = StatusFalsePositive
	case a.LiftedAt != "":
		a.Status = StatusLifted
	case a.Mode == string(events.PenaltySimulated):
		a.Status = StatusSimulated
	case now.Before(a.PenaltyUntil):
		a.Status = StatusActive
	default:
		a.Status = StatusExpired
	}
	return a
}

func sv(s string) types.AttributeValue { return &types.AttributeValueMemberS{Value: s} }

func nv(n int64) types.AttributeValue {
	return &types.AttributeValueMemberN{Value: strconv.FormatInt(n, 10)}
}
