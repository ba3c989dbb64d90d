package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"

	"github.com/floodgate-dev/floodgate/pkg/dynamo"
	"github.com/floodgate-dev/floodgate/pkg/redisx"
)

// AuditRetention is how long audit rows are kept (the table's TTL).
const AuditRetention = 400 * 24 * time.Hour

// Actor is who makes a change and why.
type Actor struct {
	Name          string
	Role          string
	Reason        string
	CorrelationID string
}

// MaxReason is the longest reason or comment accepted.
const MaxReason = 1000

func (a Actor) check() error {
	switch {
	case a.Name == "":
		return fmt.Errorf("%w: no actor", ErrInvalid)
	case strings.TrimSpace(a.Reason) == "":
		return fmt.Errorf("%w: a reason is required", ErrInvalid)
	case len(a.Reason) > MaxReason:
		return fmt.Errorf("%w: the reason is longer than %d bytes", ErrInvalid, MaxReason)
	}
	return nil
}

// Audit actions written by the console.
const (
	ActionLift          = "penalty.lift"
	ActionExtend        = "penalty.extend"
	ActionAllowlist     = "allowlist.add"
	ActionFalsePositive = "abuse.false_positive"
)

// AuditEntry is one row of floodgate_audit_log.
type AuditEntry struct {
	Subject       string // pk
	SK            string
	At            time.Time
	Actor         string
	Role          string
	Action        string
	Reason        string
	CorrelationID string
	AbuseID       string
	Before        string // JSON
	After         string // JSON
}

// AuditSubject is the audit pk of everything done to one principal.
func AuditSubject(principal string) string { return "principal#" + principal }

// Errors callers branch on.
var (
	ErrNoPenalty     = errors.New("no active penalty")
	ErrAlreadyMarked = errors.New("already marked as a false positive")
	ErrInvalid       = errors.New("invalid")
)

// Penalty is a principal's live penalty hash.
type Penalty struct {
	Multiplier string `json:"m"`
	Level      string `json:"level"`
	AbuseID    string `json:"abuse_id"`
	ExpiresAt  int64  `json:"expires_at"` // epoch ms
}

// Until is the penalty's expiry.
func (p Penalty) Until() time.Time { return time.UnixMilli(p.ExpiresAt).UTC() }

func penaltyFrom(h map[string]string) (Penalty, bool) {
	if len(h) == 0 {
		return Penalty{}, false
	}
	exp, _ := strconv.ParseInt(h[redisx.PenaltyFieldExpiresAt], 10, 64)
	return Penalty{Multiplier: h[redisx.PenaltyFieldMultiplier], Level: h[redisx.PenaltyFieldLevel], AbuseID: h[redisx.PenaltyFieldAbuseID], ExpiresAt: exp}, true
}

// GetPenalty reads a principal's live penalty.
func (s *Store) GetPenalty(ctx context.Context, principal string) (Penalty, bool, error) {
	key, err := penaltyKey(principal)
	if err != nil {
		return Penalty{}, false, err
	}
	h, err := s.rdb.HGetAll(ctx, key).Result()
	if err != nil {
		return Penalty{}, false, fmt.Errorf("read penalty of %s: %w", principal, err)
	}
	p, ok := penaltyFrom(h)
	return p, ok, nil
}

func penaltyKey(principal string) (string, error) {
	kind, id, ok := strings.Cut(principal, ":")
	if !ok || kind == "" || id == "" {
		return "", fmt.Errorf("%w: principal %q is not kind:id", ErrInvalid, principal)
	}
	return redisx.PenaltyKey(kind, id), nil
}

// liftScript deletes the penalty and returns what it was, atomically.
var liftScript = redis.NewScript(`
local h = redis.call('HGETALL', KEYS[1])
if #h == 0 then return false end
redis.call('DEL', KEYS[1])
return h`)

// extendScript moves an existing penalty's expiry and returns what it was.
var extendScript = redis.NewScript(`
local h = redis.call('HGETALL', KEYS[1])
if #h == 0 then return false end
redis.call('HSET', KEYS[1], 'expires_at', ARGV[1])
redis.call('PEXPIREAT', KEYS[1], ARGV[1])
return h`)

// restoreScript puts a lifted penalty back when its audit row could not be
// written, unless the detector wrote a new one meanwhile.
var restoreScript = redis.NewScript(`
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
if tonumber(ARGV[4]) <= tonumber(redis.call('TIME')[1]) * 1000 then return 0 end
redis.call('HSET', KEYS[1], 'm', ARGV[1], 'level', ARGV[2], 'abuse_id', ARGV[3], 'expires_at', ARGV[4])
redis.call('PEXPIREAT', KEYS[1], ARGV[4])
return 1`)

// unextendScript sets an extended penalty's expiry back, when it still is the one set.
var unextendScript = redis.NewScript(`
if redis.call('HGET', KEYS[1], 'expires_at') ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[1], 'expires_at', ARGV[2])
redis.call('PEXPIREAT', KEYS[1], ARGV[2])
return 1`)

func pairs(v any) map[string]string {
	list, _ := v.([]any)
	h := make(map[string]string, len(list)/2)
	for i := 0; i+1 < len(list); i += 2 {
		h[fmt.Sprint(list[i])] = fmt.Sprint(list[i+1])
	}
	return h
}

// LiftPenalty deletes the principal's penalty (the limiter stops applying it at
// its next check) and audits it against the alert it was lifted from.
func (s *Store) LiftPenalty(ctx context.Context, a Alert, who Actor) (Penalty, error) {
	if err := who.check(); err != nil {
		return Penalty{}, err
	}
	key, err := penaltyKey(a.Principal)
	if err != nil {
		return Penalty{}, err
	}
	res, err := liftScript.Run(ctx, s.rdb, []string{key}).Result()
	if errors.Is(err, redis.Nil) {
		return Penalty{}, ErrNoPenalty
	}
	if err != nil {
		return Penalty{}, fmt.Errorf("lift penalty of %s: %w", a.Principal, err)
	}
	before, _ := penaltyFrom(pairs(res))
	now := s.now().UTC()
	entry := s.entry(a, who, ActionLift, now, before, nil)
	mark := &types.Update{TableName: aws.String(s.abuse), Key: recordKey(a),
		UpdateExpression:          aws.String("SET lifted_at = :at, lifted_by = :by"),
		ConditionExpression:       aws.String("attribute_exists(pk)"),
		ExpressionAttributeValues: map[string]types.AttributeValue{":at": sv(now.Format(time.RFC3339)), ":by": sv(who.Name)}}
	if err := s.write(ctx, entry, types.TransactWriteItem{Update: mark}); err != nil {
		if rerr := restoreScript.Run(ctx, s.rdb, []string{key}, before.Multiplier, before.Level, before.AbuseID, before.ExpiresAt).Err(); rerr != nil {
			return Penalty{}, fmt.Errorf("audit lift of %s: %w (and restoring the penalty failed: %w)", a.Principal, err, rerr)
		}
		return Penalty{}, fmt.Errorf("audit lift of %s (penalty restored): %w", a.Principal, err)
	}
	return before, nil
}

// ExtendPenalty moves the principal's live penalty's expiry to until.
func (s *Store) ExtendPenalty(ctx context.Context, a Alert, until time.Time, who Actor) (Penalty, error) {
	if err := who.check(); err != nil {
		return Penalty{}, err
	}
	key, err := penaltyKey(a.Principal)
	if err != nil {
		return Penalty{}, err
	}
	if !until.After(s.now()) {
		return Penalty{}, fmt.Errorf("%w: the new expiry must be in the future", ErrInvalid)
	}
	cur, ok, err := s.GetPenalty(ctx, a.Principal)
	if err != nil {
		return Penalty{}, err
	}
	if !ok {
		return Penalty{}, ErrNoPenalty
	}
	if until.UnixMilli() <= cur.ExpiresAt {
		return Penalty{}, fmt.Errorf("%w: the new expiry %s is not after the current one %s", ErrInvalid,
			until.UTC().Format(time.RFC3339), cur.Until().Format(time.RFC3339))
	}
	res, err := extendScript.Run(ctx, s.rdb, []string{key}, until.UnixMilli()).Result()
	if errors.Is(err, redis.Nil) {
		return Penalty{}, ErrNoPenalty
	}
	if err != nil {
		return Penalty{}, fmt.Errorf("extend penalty of %s: %w", a.Principal, err)
	}
	before, _ := penaltyFrom(pairs(res))
	after := before
	after.ExpiresAt = until.UnixMilli()
	entry := s.entry(a, who, ActionExtend, s.now().UTC(), before, after)
	if err := s.write(ctx, entry); err != nil {
		_ = unextendScript.Run(ctx, s.rdb, []string{key}, after.ExpiresAt, before.ExpiresAt).Err()
		return Penalty{}, fmt.Errorf("audit extension of %s (expiry set back): %w", a.Principal, err)
	}
	return after, nil
}

// AllowEntry is a detector allowlist entry (docs/detector.md).
type AllowEntry struct {
	PK        string `json:"pk"`
	ExpiresAt int64  `json:"expires_at"` // epoch seconds
	Comment   string `json:"comment"`
	CreatedBy string `json:"created_by"`
	CreatedAt string `json:"created_at"`
}

// AllowlistPK is the runtime-config key the detector reads for a principal.
func AllowlistPK(principal string) string { return "detector#allow#principal#" + principal }

// GetAllow reads the principal's allowlist entry; ok is false when there is
// none or it expired.
func (s *Store) GetAllow(ctx context.Context, principal string) (AllowEntry, bool, error) {
	out, err := s.ddb.GetItem(ctx, &dynamodb.GetItemInput{TableName: aws.String(s.runtime),
		Key: map[string]types.AttributeValue{"pk": sv(AllowlistPK(principal))}, ConsistentRead: aws.Bool(true)})
	if err != nil {
		return AllowEntry{}, false, fmt.Errorf("get allowlist entry of %s: %w", principal, err)
	}
	if len(out.Item) == 0 {
		return AllowEntry{}, false, nil
	}
	e := AllowEntry{PK: dynamo.Str(out.Item["pk"]), Comment: dynamo.Str(out.Item["comment"]), CreatedBy: dynamo.Str(out.Item["created_by"]), CreatedAt: dynamo.Str(out.Item["created_at"])}
	e.ExpiresAt, _ = strconv.ParseInt(dynamo.Num(out.Item["expires_at"]), 10, 64)
	return e, e.ExpiresAt > s.now().Unix(), nil
}

// MaxAllowlist is the longest an allowlist entry may last.
const MaxAllowlist = 365 * 24 * time.Hour

// Allowlist allowlists the alert's principal until expires with a comment; the
// detector drops its detections within its allowlist refresh (30 s).
func (s *Store) Allowlist(ctx context.Context, a Alert, expires time.Time, comment string, who Actor) (AllowEntry, error) {
	if err := who.check(); err != nil {
		return AllowEntry{}, err
	}
	now := s.now().UTC()
	if err := checkAllow(now, expires, comment); err != nil {
		return AllowEntry{}, err
	}
	if _, err := penaltyKey(a.Principal); err != nil {
		return AllowEntry{}, err
	}
	prev, had, err := s.GetAllow(ctx, a.Principal)
	if err != nil {
		return AllowEntry{}, err
	}
	e := AllowEntry{PK: AllowlistPK(a.Principal), ExpiresAt: expires.Unix(), Comment: comment, CreatedBy: who.Name, CreatedAt: now.Format(time.RFC3339)}
	var before any
	if had {
		before = prev
	}
	if err := s.write(ctx, s.entry(a, who, ActionAllowlist, now, before, e), types.TransactWriteItem{Put: s.allowPut(e)}); err != nil {
		return AllowEntry{}, fmt.Errorf("allowlist %s: %w", a.Principal, err)
	}
	return e, nil
}

// checkAllow checks an allowlist entry's expiry (in the future, at most
// MaxAllowlist ahead of now) and its comment (required, at most MaxReason
// bytes); the error wraps ErrInvalid.
func checkAllow(now, expires time.Time, comment string) error {
	switch {
	case !expires.After(now):
		return fmt.Errorf("%w: the expiry must be in the future", ErrInvalid)
	case expires.Sub(now) > MaxAllowlist:
		return fmt.Errorf("%w: the expiry is at most %d days ahead", ErrInvalid, int(MaxAllowlist.Hours()/24))
	case strings.TrimSpace(comment) == "":
		return fmt.Errorf("%w: a comment is required", ErrInvalid)
	case len(comment) > MaxReason:
		return fmt.Errorf("%w: the comment is longer than %d bytes", ErrInvalid, MaxReason)
	}
	return nil
}

// allowPut writes the allowlist entry e to the runtime-config table.
func (s *Store) allowPut(e AllowEntry) *types.Put {
	return &types.Put{TableName: aws.String(s.runtime), Item: map[string]types.AttributeValue{
		"pk": sv(e.PK), "expires_at": nv(e.ExpiresAt), "comment": sv(e.Comment), "created_by": sv(e.CreatedBy), "created_at": sv(e.CreatedAt),
	}}
}

// FalsePositivePK is the runtime-config key counting false positives of one
// detector version's pattern.
func FalsePositivePK(pattern, version string) string {
	return "detector#false_positives#" + pattern + "#" + version
}

// FalsePositiveCount is one pattern's count for one detector version.
type FalsePositiveCount struct {
	Pattern         string
	DetectorVersion string
	Count           int64
	UpdatedAt       string
}

// FalsePositives lists the counts.
func (s *Store) FalsePositives(ctx context.Context) ([]FalsePositiveCount, error) {
	var res []FalsePositiveCount
	var start map[string]types.AttributeValue
	for {
		out, err := s.ddb.Scan(ctx, &dynamodb.ScanInput{TableName: aws.String(s.runtime),
			FilterExpression:          aws.String("begins_with(pk, :p)"),
			ExpressionAttributeValues: map[string]types.AttributeValue{":p": sv("detector#false_positives#")},
			ExclusiveStartKey:         start})
		if err != nil {
			return nil, fmt.Errorf("scan false positives: %w", err)
		}
		for _, it := range out.Items {
			c := FalsePositiveCount{Pattern: dynamo.Str(it["pattern"]), DetectorVersion: dynamo.Str(it["detector_version"]), UpdatedAt: dynamo.Str(it["updated_at"])}
			c.Count, _ = strconv.ParseInt(dynamo.Num(it["count"]), 10, 64)
			res = append(res, c)
		}
		if len(out.LastEvaluatedKey) == 0 {
			return res, nil
		}
		start = out.LastEvaluatedKey
	}
}

// AuditLog returns the newest audit rows of a principal.
func (s *Store) AuditLog(ctx context.Context, principal string, limit int) ([]AuditEntry, error) {
	return s.auditRows(ctx, AuditSubject(principal), principal, limit)
}

func recordKey(a Alert) map[string]types.AttributeValue {
	return map[string]types.AttributeValue{"pk": sv(a.Principal), "sk": sv(a.SK)}
}

func (s *Store) entry(a Alert, who Actor, action string, at time.Time, before, after any) AuditEntry {
	id := uuid.NewString()
	b, _ := json.Marshal(before)
	af, _ := json.Marshal(after)
	return AuditEntry{Subject: AuditSubject(a.Principal), SK: at.Format("2006-01-02T15:04:05.000000000Z") + "#" + id, At: at,
		Actor: who.Name, Role: who.Role, Action: action, Reason: who.Reason, CorrelationID: who.CorrelationID,
		AbuseID: a.ID, Before: string(b), After: string(af)}
}

// write puts the audit row and the change's items in one transaction.
func (s *Store) write(ctx context.Context, e AuditEntry, items ...types.TransactWriteItem) error {
	if strings.TrimSpace(e.Reason) == "" {
		return fmt.Errorf("%w: a reason is required", ErrInvalid)
	}
	all := append([]types.TransactWriteItem{{Put: &types.Put{TableName: aws.String(s.audit), Item: auditItem(e),
		ConditionExpression: aws.String("attribute_not_exists(pk)")}}}, items...)
	if _, err := s.ddb.TransactWriteItems(ctx, &dynamodb.TransactWriteItemsInput{TransactItems: all}); err != nil {
		return fmt.Errorf("write audit row %s: %w", e.SK, err)
	}
	return nil
}

// auditItem is the floodgate_audit_log item of e.
func auditItem(e AuditEntry) map[string]types.AttributeValue {
	return map[string]types.AttributeValue{
		"pk": sv(e.Subject), "sk": sv(e.SK), "gsi1pk": sv("actor#" + e.Actor), "gsi1sk": sv(e.SK),
		"at": sv(e.At.Format(time.RFC3339Nano)), "actor": sv(e.Actor), "role": sv(e.Role), "action": sv(e.Action),
		"reason": sv(e.Reason), "correlation_id": sv(e.CorrelationID), "abuse_id": sv(e.AbuseID),
		"before": sv(e.Before), "after": sv(e.After), "service": sv("console"),
		"expires_at": nv(e.At.Add(AuditRetention).Unix()),
	}
}

// Scale is one limit scale the adjuster wrote.
type Scale struct {
	Scope string
	Value float64
}

// Scales reads the limit scales (fg:scales), sorted by scope.
func (s *Store) Scales(ctx context.Context, key string) ([]Scale, error) {
	h, err := s.rdb.HGetAll(ctx, key).Result()
	if err != nil {
		return nil, fmt.Errorf("read scales: %w", err)
	}
	res := make([]Scale, 0, len(h))
	for scope, v := range h {
		f, err := strconv.ParseFloat(v, 64)
		if err != nil {
			continue
		}
		res = append(res, Scale{Scope: scope, Value: f})
	}
	sort.Slice(res, func(i, j int) bool { return res[i].Scope < res[j].Scope })
	return res, nil
}

// Subjects of the console's own audit rows for changes it asked another
// service to make (that service audits them too).
const (
	SubjectAdjuster = "console#adjuster"
	SubjectDLQ      = "console#dlq"
)

// SubjectSignIn is the audit pk of the sign-in lockouts of the users
// file's accounts (issue 22 S9); ActionSignInLockout their action.
const (
	SubjectSignIn       = "console#signin"
	ActionSignInLockout = "signin.lockout"
)

// RecordSignInLockout audits a sign-in limit an account reached: the
// console itself is the actor; after holds the account, the scope
// (account, device or throttle), the client address and until when.
func (s *Store) RecordSignInLockout(ctx context.Context, account, scope, client string, until time.Time, reason, corr string) error {
	at := s.now().UTC()
	after, _ := json.Marshal(map[string]string{"account": account, "scope": scope, "client": client, "until": until.UTC().Format(time.RFC3339)})
	e := AuditEntry{Subject: SubjectSignIn, SK: at.Format("2006-01-02T15:04:05.000000000Z") + "#" + uuid.NewString(), At: at,
		Actor: "console", Role: "system", Action: ActionSignInLockout, Reason: reason, CorrelationID: corr,
		Before: "null", After: string(after)}
	return s.write(ctx, e)
}

// Audit actions for the SRE pages.
const (
	ActionAdjusterRules = "adjuster.rules"
	ActionAdjusterMode  = "adjuster.mode"
	ActionDLQReplay     = "dlq.replay"
)

// RecordRemote writes the console's audit row for a change made through
// another service's API: ref names that service's own record of it.
func (s *Store) RecordRemote(ctx context.Context, subject, action, ref string, who Actor, before, after any) error {
	if err := who.check(); err != nil {
		return err
	}
	at := s.now().UTC()
	b, _ := json.Marshal(before)
	af, _ := json.Marshal(after)
	e := AuditEntry{Subject: subject, SK: at.Format("2006-01-02T15:04:05.000000000Z") + "#" + uuid.NewString(), At: at,
		Actor: who.Name, Role: who.Role, Action: action, Reason: who.Reason, CorrelationID: who.CorrelationID,
		AbuseID: ref, Before: string(b), After: string(af)}
	return s.write(ctx, e)
}

// AuditOf returns the newest audit rows under one subject (pk).
func (s *Store) AuditOf(ctx context.Context, subject string, limit int) ([]AuditEntry, error) {
	return s.auditRows(ctx, subject, subject, limit)
}

// auditRows reads the newest rows of pk subject; name is what its errors call it.
func (s *Store) auditRows(ctx context.Context, subject, name string, limit int) ([]AuditEntry, error) {
	out, err := s.ddb.Query(ctx, &dynamodb.QueryInput{TableName: aws.String(s.audit),
		KeyConditionExpression:    aws.String("pk = :p"),
		ExpressionAttributeValues: map[string]types.AttributeValue{":p": sv(subject)},
		ScanIndexForward:          aws.Bool(false), Limit: aws.Int32(int32(limit)), ConsistentRead: aws.Bool(true)})
	if err != nil {
		return nil, fmt.Errorf("query audit log of %s: %w", name, err)
	}
	res := make([]AuditEntry, 0, len(out.Items))
	for _, it := range out.Items {
		e := AuditEntry{Subject: dynamo.Str(it["pk"]), SK: dynamo.Str(it["sk"]), Actor: dynamo.Str(it["actor"]), Role: dynamo.Str(it["role"]),
			Action: dynamo.Str(it["action"]), Reason: dynamo.Str(it["reason"]), CorrelationID: dynamo.Str(it["correlation_id"]),
			AbuseID: dynamo.Str(it["abuse_id"]), Before: dynamo.Str(it["before"]), After: dynamo.Str(it["after"])}
		e.At, _ = time.Parse(time.RFC3339Nano, dynamo.Str(it["at"]))
		res = append(res, e)
	}
	return res, nil
}
