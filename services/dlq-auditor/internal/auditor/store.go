package auditor

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

	"github.com/floodgate-dev/floodgate/pkg/dlqapi"
	"github.com/floodgate-dev/floodgate/pkg/dynamo"
)

// AuditTTL is how long audit records are kept (the audit log's 400 days).
const AuditTTL = 400 * 24 * time.Hour

// MaxListRange is the longest time range one list request may cover.
const MaxListRange = 31 * 24 * time.Hour

// ErrBadFilter is wrapped by List's errors about its filter or cursor.
var ErrBadFilter = errors.New("bad filter")

// tsLayout is the fixed-width, sortable time format of index sort keys.
const tsLayout = "2006-01-02T15:04:05.000Z"

// Store keeps dead-letter records and audit entries in DynamoDB. Safe for
// concurrent use.
type Store struct {
	ddb     *dynamodb.Client
	records string // table names with the deployment's prefix
	audit   string
}

// NewStore returns a store on the tables named with prefix.
func NewStore(ddb *dynamodb.Client, prefix string) *Store {
	return &Store{ddb: ddb, records: prefix + dynamo.TableDLQRecords, audit: prefix + dynamo.TableAuditLog}
}

func recordPK(dlqTopic string, partition int) string {
	return "rec#" + dlqTopic + "#" + strconv.Itoa(partition)
}

func pad(n int64) string { return fmt.Sprintf("%020d", n) }

func dayOf(t time.Time) string { return t.UTC().Format(time.DateOnly) }

func timeKey(r *Record) string {
	return r.DeadLetteredAt.UTC().Format(tsLayout) + "#" + strconv.Itoa(r.DLQPartition) + "#" + pad(r.DLQOffset)
}

func groupKey(group, topic string, partition int) string {
	return "grp#" + group + "#" + topic + "#" + strconv.Itoa(partition)
}

// Put stores r unless a record with its id exists; created says which. A
// redelivered dead letter therefore changes nothing.
func (s *Store) Put(ctx context.Context, r *Record) (created bool, err error) {
	_, err = s.ddb.PutItem(ctx, &dynamodb.PutItemInput{
		TableName:           aws.String(s.records),
		Item:                recordItem(r),
		ConditionExpression: aws.String("attribute_not_exists(pk)"),
	})
	var exists *types.ConditionalCheckFailedException
	if errors.As(err, &exists) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("put dlq record %s: %w", r.ID, err)
	}
	return true, nil
}

// Get reads one record by id; ErrNotFound when it is not stored.
func (s *Store) Get(ctx context.Context, id string) (Record, error) {
	topic, p, o, err := ParseID(id)
	if err != nil {
		return Record{}, err
	}
	out, err := s.ddb.GetItem(ctx, &dynamodb.GetItemInput{
		TableName:      aws.String(s.records),
		Key:            map[string]types.AttributeValue{"pk": str(recordPK(topic, p)), "sk": str(pad(o))},
		ConsistentRead: aws.Bool(true),
	})
	if err != nil {
		return Record{}, fmt.Errorf("get dlq record %s: %w", id, err)
	}
	if out.Item == nil {
		return Record{}, fmt.Errorf("%w: %s", ErrNotFound, id)
	}
	return recordFromItem(out.Item)
}

// Filter selects records for List. Topic (a source topic or its DLQ topic) or
// Service is required; Class narrows either. From and To bound the
// dead-lettering time, inclusive.
type Filter struct {
	Topic   string
	Service string
	Class   string
	From    time.Time
	To      time.Time
	Limit   int    // 1..1000
	Cursor  string // from the previous Page; empty for the first
}

// Page is one page of List (pkg/dlqapi).
type Page = dlqapi.Page

type listCursor struct {
	Day int               `json:"d"`
	Key map[string]string `json:"k,omitempty"`
}

// List returns records matching f, oldest first, one page at a time; a page
// of none has empty Records, not nil (the API answers [], not null).
func (s *Store) List(ctx context.Context, f Filter) (Page, error) {
	if f.Topic == "" && f.Service == "" {
		return Page{}, fmt.Errorf("%w: topic or service is required", ErrBadFilter)
	}
	if f.Limit < 1 || f.Limit > 1000 {
		return Page{}, fmt.Errorf("%w: limit %d not in 1..1000", ErrBadFilter, f.Limit)
	}
	if f.To.Before(f.From) || f.To.Sub(f.From) > MaxListRange {
		return Page{}, fmt.Errorf("%w: time range %s..%s must be ordered and at most %s", ErrBadFilter,
			f.From.Format(time.RFC3339), f.To.Format(time.RFC3339), MaxListRange)
	}
	var cur listCursor
	if f.Cursor != "" {
		raw, err := base64.RawURLEncoding.DecodeString(f.Cursor)
		if err != nil || json.Unmarshal(raw, &cur) != nil || cur.Day < 0 {
			return Page{}, fmt.Errorf("%w: cursor is not one this server returned", ErrBadFilter)
		}
	}
	index, pkAttr, skAttr, pkPrefix := "gsi2", "gsi2pk", "gsi2sk", "svc#"+f.Service+"#"
	var filters []string
	values := map[string]types.AttributeValue{}
	if f.Topic != "" {
		index, pkAttr, skAttr, pkPrefix = "gsi1", "gsi1pk", "gsi1sk", "topic#"+strings.TrimSuffix(f.Topic, DLQSuffix)+"#"
		if f.Service != "" {
			filters = append(filters, "#svc = :svc")
			values[":svc"] = str(f.Service)
		}
	}
	if f.Class != "" {
		filters = append(filters, "#class = :class")
		values[":class"] = str(f.Class)
	}
	values[":lo"] = str(f.From.UTC().Format(tsLayout))
	values[":hi"] = str(f.To.UTC().Format(tsLayout) + "~")
	var days []string
	for d := f.From.UTC().Truncate(24 * time.Hour); !d.After(f.To.UTC()); d = d.Add(24 * time.Hour) {
		days = append(days, dayOf(d))
	}
	page := Page{Records: []Record{}}
	for day := cur.Day; day < len(days); day++ {
		var start map[string]types.AttributeValue
		if day == cur.Day && cur.Key != nil {
			start = map[string]types.AttributeValue{}
			for k, v := range cur.Key {
				start[k] = str(v)
			}
		}
		values[":pk"] = str(pkPrefix + days[day])
		for {
			in := &dynamodb.QueryInput{
				TableName:                 aws.String(s.records),
				IndexName:                 aws.String(index),
				KeyConditionExpression:    aws.String(pkAttr + " = :pk AND " + skAttr + " BETWEEN :lo AND :hi"),
				ExpressionAttributeValues: values,
				ExclusiveStartKey:         start,
				Limit:                     aws.Int32(int32(f.Limit - len(page.Records))),
			}
			if len(filters) > 0 {
				in.FilterExpression = aws.String(strings.Join(filters, " AND "))
			}
			if len(filters) > 0 {
				in.ExpressionAttributeNames = map[string]string{}
				if f.Class != "" {
					in.ExpressionAttributeNames["#class"] = "class"
				}
				if f.Topic != "" && f.Service != "" {
					in.ExpressionAttributeNames["#svc"] = "service"
				}
			}
			out, err := s.ddb.Query(ctx, in)
			if err != nil {
				return Page{}, fmt.Errorf("list dlq records on %s: %w", index, err)
			}
			for _, item := range out.Items {
				r, err := recordFromItem(item)
				if err != nil {
					return Page{}, err
				}
				page.Records = append(page.Records, r)
			}
			start = out.LastEvaluatedKey
			if len(page.Records) >= f.Limit {
				if start == nil {
					if day+1 < len(days) {
						page.Cursor = encodeCursor(listCursor{Day: day + 1})
					}
				} else {
					page.Cursor = encodeCursor(listCursor{Day: day, Key: stringKey(start)})
				}
				return page, nil
			}
			if start == nil {
				break
			}
		}
	}
	return page, nil
}

func encodeCursor(c listCursor) string {
	raw, _ := json.Marshal(c)
	return base64.RawURLEncoding.EncodeToString(raw)
}

func stringKey(k map[string]types.AttributeValue) map[string]string {
	out := make(map[string]string, len(k))
	for name, v := range k {
		if s, ok := v.(*types.AttributeValueMemberS); ok {
			out[name] = s.Value
		}
	}
	return out
}

// BySource returns the records that consumer group dead-lettered from
// topic/partition with a source offset in [from, to).
func (s *Store) BySource(ctx context.Context, group, topic string, partition int, from, to int64) ([]Record, error) {
	if to <= from {
		return nil, nil
	}
	p := dynamodb.NewQueryPaginator(s.ddb, &dynamodb.QueryInput{
		TableName:              aws.String(s.records),
		IndexName:              aws.String("gsi3"),
		KeyConditionExpression: aws.String("gsi3pk = :pk AND gsi3sk BETWEEN :lo AND :hi"),
		ExpressionAttributeValues: map[string]types.AttributeValue{
			":pk": str(groupKey(group, topic, partition)), ":lo": str(pad(from)), ":hi": str(pad(to - 1)),
		},
	})
	var out []Record
	for p.HasMorePages() {
		page, err := p.NextPage(ctx)
		if err != nil {
			return nil, fmt.Errorf("query dlq records of %s on %s/%d: %w", group, topic, partition, err)
		}
		for _, item := range page.Items {
			r, err := recordFromItem(item)
			if err != nil {
				return nil, err
			}
			out = append(out, r)
		}
	}
	return out, nil
}

// MarkReplayed counts a replay on the stored record.
func (s *Store) MarkReplayed(ctx context.Context, id, replayID string, at time.Time) error {
	topic, p, o, err := ParseID(id)
	if err != nil {
		return err
	}
	_, err = s.ddb.UpdateItem(ctx, &dynamodb.UpdateItemInput{
		TableName:           aws.String(s.records),
		Key:                 map[string]types.AttributeValue{"pk": str(recordPK(topic, p)), "sk": str(pad(o))},
		UpdateExpression:    aws.String("SET replays = if_not_exists(replays, :zero) + :one, last_replay_id = :rid, last_replayed_at = :at"),
		ConditionExpression: aws.String("attribute_exists(pk)"),
		ExpressionAttributeValues: map[string]types.AttributeValue{
			":zero": num(0), ":one": num(1), ":rid": str(replayID), ":at": str(at.UTC().Format(tsLayout)),
		},
	})
	var gone *types.ConditionalCheckFailedException
	if errors.As(err, &gone) {
		return fmt.Errorf("%w: %s", ErrNotFound, id)
	}
	if err != nil {
		return fmt.Errorf("mark dlq record %s replayed: %w", id, err)
	}
	return nil
}

// AuditEntry is one audited change (pkg/dlqapi), stored in the shared audit
// log: pk is the subject ("dlq_record#<id>"), sk "<at>#<id>", gsi1 lists by actor.
type AuditEntry = dlqapi.AuditEntry

// Audit actions.
const (
	ActionReplay = "dlq.replay"
	ActionPurge  = "dlq.purge"
)

// SubjectOf is the audit-log subject of a record.
func SubjectOf(id string) string { return "dlq_record#" + id }

func auditItem(e AuditEntry) map[string]types.AttributeValue {
	sk := e.At.UTC().Format(tsLayout) + "#" + e.ID
	item := map[string]types.AttributeValue{
		"pk": str(e.Subject), "sk": str(sk),
		"gsi1pk": str("actor#" + e.Actor), "gsi1sk": str(sk),
		"id": str(e.ID), "at": str(e.At.UTC().Format(tsLayout)), "actor": str(e.Actor), "role": str(e.Role),
		"action": str(e.Action), "reason": str(e.Reason), "correlation_id": str(e.CorrelationID),
		"expires_at": num(e.At.Add(AuditTTL).Unix()),
	}
	if len(e.Details) > 0 {
		m := make(map[string]types.AttributeValue, len(e.Details))
		for k, v := range e.Details {
			m[k] = str(v)
		}
		item["details"] = &types.AttributeValueMemberM{Value: m}
	}
	return item
}

// Audit writes one audit entry.
func (s *Store) Audit(ctx context.Context, e AuditEntry) error {
	if _, err := s.ddb.PutItem(ctx, &dynamodb.PutItemInput{TableName: aws.String(s.audit), Item: auditItem(e)}); err != nil {
		return fmt.Errorf("write audit %s %s: %w", e.Action, e.Subject, err)
	}
	return nil
}

// Purge deletes the record with id and writes its audit entry in one
// transaction: a record is never gone without its audit entry.
func (s *Store) Purge(ctx context.Context, id string, e AuditEntry) error {
	topic, p, o, err := ParseID(id)
	if err != nil {
		return err
	}
	_, err = s.ddb.TransactWriteItems(ctx, &dynamodb.TransactWriteItemsInput{TransactItems: []types.TransactWriteItem{
		{Delete: &types.Delete{
			TableName:           aws.String(s.records),
			Key:                 map[string]types.AttributeValue{"pk": str(recordPK(topic, p)), "sk": str(pad(o))},
			ConditionExpression: aws.String("attribute_exists(pk)"),
		}},
		{Put: &types.Put{TableName: aws.String(s.audit), Item: auditItem(e)}},
	}})
	var canceled *types.TransactionCanceledException
	if errors.As(err, &canceled) && len(canceled.CancellationReasons) > 0 &&
		aws.ToString(canceled.CancellationReasons[0].Code) == "ConditionalCheckFailed" {
		return fmt.Errorf("%w: %s", ErrNotFound, id)
	}
	if err != nil {
		return fmt.Errorf("purge dlq record %s: %w", id, err)
	}
	return nil
}

// AuditOf returns the audit entries of one subject, oldest first; empty, not
// nil, when there are none.
func (s *Store) AuditOf(ctx context.Context, subject string) ([]AuditEntry, error) {
	out, err := s.ddb.Query(ctx, &dynamodb.QueryInput{
		TableName:                 aws.String(s.audit),
		KeyConditionExpression:    aws.String("pk = :pk"),
		ExpressionAttributeValues: map[string]types.AttributeValue{":pk": str(subject)},
		ConsistentRead:            aws.Bool(true),
	})
	if err != nil {
		return nil, fmt.Errorf("read audit of %s: %w", subject, err)
	}
	entries := make([]AuditEntry, 0, len(out.Items))
	for _, item := range out.Items {
		e := AuditEntry{
			ID: getS(item, "id"), Actor: getS(item, "actor"), Role: getS(item, "role"), Action: getS(item, "action"),
			Subject: getS(item, "pk"), Reason: getS(item, "reason"), CorrelationID: getS(item, "correlation_id"),
		}
		e.At, _ = time.Parse(tsLayout, getS(item, "at"))
		if m, ok := item["details"].(*types.AttributeValueMemberM); ok {
			e.Details = map[string]string{}
			for k, v := range m.Value {
				if s, ok := v.(*types.AttributeValueMemberS); ok {
					e.Details[k] = s.Value
				}
			}
		}
		entries = append(entries, e)
	}
	return entries, nil
}

// Item encoding. Empty strings and zero times are left out.

func str(s string) types.AttributeValue { return &types.AttributeValueMemberS{Value: s} }

func num[N int | int64](n N) types.AttributeValue {
	return &types.AttributeValueMemberN{Value: strconv.FormatInt(int64(n), 10)}
}

func recordItem(r *Record) map[string]types.AttributeValue {
	tk := timeKey(r)
	item := map[string]types.AttributeValue{
		"pk": str(recordPK(r.DLQTopic, r.DLQPartition)), "sk": str(pad(r.DLQOffset)),
		"gsi1pk": str("topic#" + r.SourceTopic + "#" + dayOf(r.DeadLetteredAt)), "gsi1sk": str(tk),
		"gsi2pk": str("svc#" + r.Service + "#" + dayOf(r.DeadLetteredAt)), "gsi2sk": str(tk),
		"id": str(r.ID), "dlq_topic": str(r.DLQTopic), "dlq_partition": num(r.DLQPartition), "dlq_offset": num(r.DLQOffset),
		"dead_lettered_at": str(r.DeadLetteredAt.UTC().Format(tsLayout)),
		"source_partition": num(r.SourcePartition), "source_offset": num(r.SourceOffset),
		"attempts": num(r.Attempts), "stored_at": str(r.StoredAt.UTC().Format(tsLayout)),
		"expires_at": num(r.ExpiresAt.Unix()), "replays": num(r.Replays),
	}
	if r.ConsumerGroup != "" && r.Class != ClassInvalidRecord {
		item["gsi3pk"] = str(groupKey(r.ConsumerGroup, r.SourceTopic, r.SourcePartition))
		item["gsi3sk"] = str(pad(r.SourceOffset))
	}
	for name, v := range map[string]string{
		"source_topic": r.SourceTopic, "consumer_group": r.ConsumerGroup, "service": r.Service, "class": r.Class,
		"error_message": r.ErrorMessage, "redaction": r.Redaction, "event_type": r.EventType, "event_id": r.EventID,
		"last_replay_id": r.LastReplayID,
	} {
		if v != "" {
			item[name] = str(v)
		}
	}
	for name, t := range map[string]time.Time{"source_time": r.SourceTime, "first_failure": r.FirstFailure, "last_replayed_at": r.LastReplayedAt} {
		if !t.IsZero() {
			item[name] = str(t.UTC().Format(tsLayout))
		}
	}
	if len(r.Key) > 0 {
		item["key"] = &types.AttributeValueMemberB{Value: r.Key}
	}
	if len(r.Value) > 0 {
		item["value"] = &types.AttributeValueMemberB{Value: r.Value}
	}
	if len(r.Headers) > 0 {
		hs := make([]types.AttributeValue, len(r.Headers))
		for i, h := range r.Headers {
			hs[i] = &types.AttributeValueMemberM{Value: map[string]types.AttributeValue{"k": str(h.Key), "v": str(h.Value)}}
		}
		item["headers"] = &types.AttributeValueMemberL{Value: hs}
	}
	return item
}

func getS(item map[string]types.AttributeValue, name string) string {
	if v, ok := item[name].(*types.AttributeValueMemberS); ok {
		return v.Value
	}
	return ""
}

func recordFromItem(item map[string]types.AttributeValue) (Record, error) {
	var errs []error
	getN := func(name string) int64 {
		v, ok := item[name].(*types.AttributeValueMemberN)
		if !ok {
			return 0
		}
		n, err := strconv.ParseInt(v.Value, 10, 64)
		if err != nil {
			errs = append(errs, fmt.Errorf("attribute %s: %w", name, err))
		}
		return n
	}
	getT := func(name string) time.Time {
		s := getS(item, name)
		if s == "" {
			return time.Time{}
		}
		t, err := time.Parse(tsLayout, s)
		if err != nil {
			errs = append(errs, fmt.Errorf("attribute %s: %w", name, err))
		}
		return t
	}
	getB := func(name string) []byte {
		if v, ok := item[name].(*types.AttributeValueMemberB); ok {
			return v.Value
		}
		return nil
	}
	r := Record{
		ID: getS(item, "id"), DLQTopic: getS(item, "dlq_topic"), DLQPartition: int(getN("dlq_partition")), DLQOffset: getN("dlq_offset"),
		DeadLetteredAt: getT("dead_lettered_at"), SourceTopic: getS(item, "source_topic"),
		SourcePartition: int(getN("source_partition")), SourceOffset: getN("source_offset"), SourceTime: getT("source_time"),
		ConsumerGroup: getS(item, "consumer_group"), Service: getS(item, "service"), Class: getS(item, "class"),
		ErrorMessage: getS(item, "error_message"), Attempts: int(getN("attempts")), FirstFailure: getT("first_failure"),
		Key: getB("key"), Value: getB("value"), Redaction: getS(item, "redaction"),
		EventType: getS(item, "event_type"), EventID: getS(item, "event_id"), StoredAt: getT("stored_at"),
		ExpiresAt: time.Unix(getN("expires_at"), 0).UTC(), Replays: int(getN("replays")),
		LastReplayID: getS(item, "last_replay_id"), LastReplayedAt: getT("last_replayed_at"),
	}
	if l, ok := item["headers"].(*types.AttributeValueMemberL); ok {
		for _, v := range l.Value {
			if m, ok := v.(*types.AttributeValueMemberM); ok {
				r.Headers = append(r.Headers, Header{Key: getS(m.Value, "k"), Value: getS(m.Value, "v")})
			}
		}
	}
	if r.ID == "" {
		errs = append(errs, errors.New("attribute id missing"))
	}
	if len(errs) > 0 {
		return Record{}, fmt.Errorf("decode dlq record item: %w", errors.Join(errs...))
	}
	return r, nil
}
