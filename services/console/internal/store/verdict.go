package store

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"

	"github.com/floodgate-dev/floodgate/pkg/dynamo"
	"github.com/floodgate-dev/floodgate/pkg/events"
	"github.com/floodgate-dev/floodgate/pkg/precision"
)

// ActionVerdict is the audit action of a reviewer's verdict on a detection.
const ActionVerdict = "abuse.verdict"

// Verdict is a reviewer's latest verdict on a detection, as stored on its
// abuse record (pkg/dynamo's AttrVerdict*).
type Verdict struct {
	ID            string
	Value         events.VerdictValue
	Reason        string
	Reviewer      string
	At            time.Time
	Route         string    // the detection's top route template
	Network       string    // its network class (pkg/precision)
	AllowUntil    time.Time // false positive: the principal is allowlisted until then
	PenaltyLifted bool      // false positive: a live penalty was lifted
}

// Judgement is what a reviewer decides on one alert.
type Judgement struct {
	Value events.VerdictValue
	// AllowUntil is how long a false positive's principal is allowlisted;
	// required for a false positive, ignored otherwise.
	AllowUntil time.Time
	// Route and Network are the detection's precision dimensions
	// (precision.Route, Classifier.Network), stored with the verdict.
	Route, Network string
}

// Judge stores a verdict on the alert with its audit row, in one
// transaction. A false positive first lifts the principal's live penalty
// (the limiter stops applying it at its next check) and allowlists the
// principal until j.AllowUntil with the reason as the entry's comment; when
// the transaction fails the penalty is put back. A later verdict replaces
// an earlier one.
func (s *Store) Judge(ctx context.Context, a Alert, j Judgement, who Actor) (Verdict, error) {
	if err := who.check(); err != nil {
		return Verdict{}, err
	}
	if !j.Value.Valid() {
		return Verdict{}, fmt.Errorf("%w: verdict %q is not one of confirmed|false_positive|unsure", ErrInvalid, j.Value)
	}
	key, err := penaltyKey(a.Principal)
	if err != nil {
		return Verdict{}, err
	}
	now := s.now().UTC()
	v := Verdict{ID: uuid.NewString(), Value: j.Value, Reason: who.Reason, Reviewer: who.Name, At: now, Route: j.Route, Network: j.Network}
	fp := j.Value == events.VerdictFalsePositive
	if fp {
		if err := checkAllow(now, j.AllowUntil, who.Reason); err != nil {
			return Verdict{}, err
		}
		v.AllowUntil = j.AllowUntil.UTC()
	}
	sets := "SET #v = :v, #vid = :vid, #vat = :vat, #vby = :vby, #vr = :vr, #vroute = :vroute, #vnet = :vnet"
	names := map[string]string{"#v": dynamo.AttrVerdict, "#vid": dynamo.AttrVerdictID, "#vat": dynamo.AttrVerdictAt, "#vby": dynamo.AttrVerdictBy,
		"#vr": dynamo.AttrVerdictReason, "#vroute": dynamo.AttrVerdictRoute, "#vnet": dynamo.AttrVerdictNetwork}
	vals := map[string]types.AttributeValue{":v": sv(string(v.Value)), ":vid": sv(v.ID), ":vat": sv(now.Format(time.RFC3339Nano)),
		":vby": sv(v.Reviewer), ":vr": sv(v.Reason), ":vroute": sv(v.Route), ":vnet": sv(v.Network)}
	var items []types.TransactWriteItem
	var before Penalty
	if fp {
		sets += ", #vallow = :vallow, false_positive_at = if_not_exists(false_positive_at, :at), false_positive_by = if_not_exists(false_positive_by, :vby)"
		names["#vallow"] = dynamo.AttrVerdictAllowUntil
		vals[":vallow"], vals[":at"] = sv(v.AllowUntil.Format(time.RFC3339)), sv(now.Format(time.RFC3339))
		e := AllowEntry{PK: AllowlistPK(a.Principal), ExpiresAt: v.AllowUntil.Unix(), Comment: who.Reason, CreatedBy: who.Name, CreatedAt: now.Format(time.RFC3339)}
		items = append(items, types.TransactWriteItem{Put: s.allowPut(e)})
		if a.FalsePositive == "" { // counted once per detection
			items = append(items, types.TransactWriteItem{Update: s.fpCount(a, now)})
		}
		res, err := liftScript.Run(ctx, s.rdb, []string{key}).Result()
		switch {
		case errors.Is(err, redis.Nil): // no live penalty
		case err != nil:
			return Verdict{}, fmt.Errorf("lift penalty of %s: %w", a.Principal, err)
		default:
			before, _ = penaltyFrom(pairs(res))
			v.PenaltyLifted = true
		}
	}
	// What an earlier verdict set and this one does not is removed.
	names["#vlift"] = dynamo.AttrVerdictLifted
	var removes []string
	if v.PenaltyLifted {
		sets += ", #vlift = :vlift"
		vals[":vlift"] = &types.AttributeValueMemberBOOL{Value: true}
	} else {
		removes = append(removes, "#vlift")
	}
	if !fp {
		names["#vallow"] = dynamo.AttrVerdictAllowUntil
		removes = append(removes, "#vallow")
	}
	if len(removes) > 0 {
		sets += " REMOVE " + strings.Join(removes, ", ")
	}
	mark := &types.Update{TableName: aws.String(s.abuse), Key: recordKey(a), UpdateExpression: aws.String(sets),
		ConditionExpression: aws.String("attribute_exists(pk)"), ExpressionAttributeNames: names, ExpressionAttributeValues: vals}
	after := map[string]any{"verdict": v.Value, "verdict_id": v.ID, "pattern": a.Pattern, "route": v.Route, "network": v.Network}
	if fp {
		after["allowlisted_until"] = v.AllowUntil.Format(time.RFC3339)
		after["penalty_lifted"] = v.PenaltyLifted
	}
	prev := map[string]any{"status": a.Status, "verdict": a.Verdict.Value}
	if v.PenaltyLifted {
		prev["penalty"] = before
	}
	err = s.write(ctx, s.entry(a, who, ActionVerdict, now, prev, after), append([]types.TransactWriteItem{{Update: mark}}, items...)...)
	if err != nil {
		if v.PenaltyLifted {
			if rerr := restoreScript.Run(ctx, s.rdb, []string{key}, before.Multiplier, before.Level, before.AbuseID, before.ExpiresAt).Err(); rerr != nil {
				return Verdict{}, fmt.Errorf("store verdict on %s: %w (and restoring the penalty failed: %w)", a.ID, err, rerr)
			}
			return Verdict{}, fmt.Errorf("store verdict on %s (penalty restored): %w", a.ID, err)
		}
		return Verdict{}, fmt.Errorf("store verdict on %s: %w", a.ID, err)
	}
	return v, nil
}

// fpCount counts a false positive of the alert's pattern and detector version.
func (s *Store) fpCount(a Alert, now time.Time) *types.Update {
	version := a.DetectorVersion
	if version == "" {
		version = "unknown"
	}
	return &types.Update{TableName: aws.String(s.runtime),
		Key:                       map[string]types.AttributeValue{"pk": sv(FalsePositivePK(a.Pattern, version))},
		UpdateExpression:          aws.String("ADD #c :one SET pattern = :p, detector_version = :v, updated_at = :at"),
		ExpressionAttributeNames:  map[string]string{"#c": "count"},
		ExpressionAttributeValues: map[string]types.AttributeValue{":one": nv(1), ":p": sv(a.Pattern), ":v": sv(version), ":at": sv(now.Format(time.RFC3339))}}
}

// parseVerdict reads the verdict attributes of an abuse record.
func parseVerdict(it map[string]types.AttributeValue) Verdict {
	v := Verdict{ID: dynamo.Str(it[dynamo.AttrVerdictID]), Value: events.VerdictValue(dynamo.Str(it[dynamo.AttrVerdict])),
		Reason: dynamo.Str(it[dynamo.AttrVerdictReason]), Reviewer: dynamo.Str(it[dynamo.AttrVerdictBy]),
		Route: dynamo.Str(it[dynamo.AttrVerdictRoute]), Network: dynamo.Str(it[dynamo.AttrVerdictNetwork])}
	v.At, _ = time.Parse(time.RFC3339Nano, dynamo.Str(it[dynamo.AttrVerdictAt]))
	v.AllowUntil, _ = time.Parse(time.RFC3339, dynamo.Str(it[dynamo.AttrVerdictAllowUntil]))
	if b, ok := it[dynamo.AttrVerdictLifted].(*types.AttributeValueMemberBOOL); ok {
		v.PenaltyLifted = b.Value
	}
	return v
}

// Judged lists the judged detections made from since to until (at most
// MaxDays), for precision, reading the detections of each day.
func (s *Store) Judged(ctx context.Context, since, until time.Time) ([]precision.Judged, error) {
	if until.Sub(since) > MaxDays*24*time.Hour {
		since = until.Add(-MaxDays * 24 * time.Hour)
	}
	var out []precision.Judged
	for day := truncDay(since); !day.After(until); day = day.AddDate(0, 0, 1) {
		in := &dynamodb.QueryInput{TableName: aws.String(s.abuse), IndexName: aws.String("gsi1"),
			KeyConditionExpression:    aws.String("gsi1pk = :d AND gsi1sk BETWEEN :from AND :to"),
			FilterExpression:          aws.String("attribute_exists(#v)"),
			ExpressionAttributeNames:  map[string]string{"#v": dynamo.AttrVerdict, "#p": "pattern"},
			ProjectionExpression:      aws.String("pk, gsi1sk, id, #p, " + dynamo.AttrVerdict + ", " + dynamo.AttrVerdictRoute + ", " + dynamo.AttrVerdictNetwork),
			ExpressionAttributeValues: map[string]types.AttributeValue{":d": sv("day#" + day.Format("2006-01-02")), ":from": sv(since.UTC().Format(tsLayout)), ":to": sv(until.UTC().Format(tsLayout))}}
		for {
			res, err := s.ddb.Query(ctx, in)
			if err != nil {
				return nil, fmt.Errorf("query verdicts of %s: %w", day.Format("2006-01-02"), err)
			}
			for _, it := range res.Items {
				kind, _, _ := strings.Cut(dynamo.Str(it["pk"]), ":")
				j := precision.Judged{AbuseID: dynamo.Str(it["id"]), Pattern: dynamo.Str(it["pattern"]), Kind: kind,
					Route: dynamo.Str(it[dynamo.AttrVerdictRoute]), Network: dynamo.Str(it[dynamo.AttrVerdictNetwork]),
					Verdict: events.VerdictValue(dynamo.Str(it[dynamo.AttrVerdict]))}
				j.DetectedAt, _ = time.Parse(tsLayout, dynamo.Str(it["gsi1sk"]))
				out = append(out, j)
			}
			if len(res.LastEvaluatedKey) == 0 {
				break
			}
			in.ExclusiveStartKey = res.LastEvaluatedKey
		}
	}
	return out, nil
}
