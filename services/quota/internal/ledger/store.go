package ledger

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/floodgate-dev/floodgate/pkg/events"
)

// DynamoAPI is what the ledger needs of a DynamoDB client. *dynamodb.Client
// satisfies it; tests wrap it to inject throttling and lost responses. It must
// be safe for concurrent use.
type DynamoAPI interface {
	UpdateItem(ctx context.Context, in *dynamodb.UpdateItemInput, opts ...func(*dynamodb.Options)) (*dynamodb.UpdateItemOutput, error)
	Query(ctx context.Context, in *dynamodb.QueryInput, opts ...func(*dynamodb.Options)) (*dynamodb.QueryOutput, error)
}

var _ DynamoAPI = (*dynamodb.Client)(nil)

// Item attributes of the ledger table (migrations/0001_initial.yaml).
const (
	attrPK      = "pk"         // principal key "kind:id"
	attrSK      = "sk"         // UTC day "YYYY-MM-DD"
	attrUnits   = "units"      // allowed units of the day (N)
	attrExpires = "expires_at" // TTL, epoch seconds
	attrUpdated = "updated_at" // epoch milliseconds of the last write
	attrReplays = "r"          // string set of "<partition>/<offset>" replays applied
	// attrOffsetPrefix + partition: the highest offset of that partition of
	// the decisions topic whose units are in the item (N).
	attrOffsetPrefix = "o_"
)

// DayLayout formats a UTC day as the sort key.
const DayLayout = "2006-01-02"

// Entry is one allowed decision's units at its offset.
type Entry struct {
	Offset int64
	Cost   int64
}

// Store reads and writes the ledger table. It is safe for concurrent use.
type Store struct {
	db        DynamoAPI
	table     string
	retention time.Duration
	now       func() time.Time

	// Bounds, when set, is what ApplyPartition lets one principal be charged
	// in a day (issue 37); set it before the first write.
	Bounds events.DayBounds
}

// NewStore returns a Store on table (prefix included). Items expire
// retentionDays after the end of their day.
func NewStore(db DynamoAPI, table string, retentionDays int, now func() time.Time) *Store {
	return &Store{db: db, table: table, retention: time.Duration(retentionDays) * 24 * time.Hour, now: now}
}

// WriteResult says what one conditional write did.
type WriteResult struct {
	Total   int64 // the item's units after the write (or as found, when fenced)
	Applied int64 // units added by this call
	Fenced  int64 // units skipped because the item already held their offsets
	Writes  int   // UpdateItem calls that reached DynamoDB and answered
	// Over are the entries refused because they would take the
	// principal-day past Bound: the first entry that does not fit and every
	// one after it. They are not counted and not fenced, so a redelivery
	// refuses them again (units only grow).
	Over  []Entry
	Bound int64
}

// dayBound is the bound of principal ("kind:id").
func (s *Store) dayBound(principal string) (int64, bool) {
	kind, _, _ := strings.Cut(principal, ":")
	return s.Bounds.Bound(events.PrincipalKind(kind))
}

// ApplyPartition adds entries (ascending offsets, all of partition, all of
// principal's day) to the item exactly once. The item keeps o_<partition>, the
// highest offset of partition whose units it holds; the write is conditional
// on o_<partition> being below the first entry's offset, and sets it to the
// last entry's. When the condition fails (a redelivery after a crash, or a
// former owner of the partition that flushed a different slice of the same
// messages) the item's o_<partition> comes back with the failure and only the
// entries above it are written, again conditionally. Invariant: every entry of
// the principal-day on partition at or below o_<partition> is counted, and
// none twice. A write that errors is not retried here (see Flusher).
//
// With a day bound for the principal's kind (Bounds), the write is also
// conditional on the item's units leaving room for the entries; when they do
// not, the item's units come back with the failure, the entries that fit are
// written conditionally on exactly those units, and the rest are refused
// (WriteResult.Over).
func (s *Store) ApplyPartition(ctx context.Context, principal, day string, partition int, entries []Entry) (WriteResult, error) {
	var res WriteResult
	fence := attrOffsetPrefix + strconv.Itoa(partition)
	bound, bounded := s.dayBound(principal)
	res.Bound = bound
	known := int64(-1) // the item's units, once a failed condition told them
	for len(entries) > 0 {
		var n int64
		fit := len(entries)
		for i, e := range entries {
			if bounded && known >= 0 && known+n+e.Cost > bound {
				fit = i
				break
			}
			n += e.Cost
		}
		if fit < len(entries) {
			res.Over = append(res.Over, entries[fit:]...)
			if entries = entries[:fit]; fit == 0 {
				res.Total = known
				return res, nil
			}
		}
		lo, hi := entries[0].Offset, entries[len(entries)-1].Offset
		cond := "(attribute_not_exists(#o) OR #o < :lo)"
		values := map[string]types.AttributeValue{":n": num(n), ":hi": num(hi), ":lo": num(lo)}
		switch {
		case !bounded:
		case known == 0:
			cond += " AND (attribute_not_exists(#units) OR #units = :known)"
			values[":known"] = num(known)
		case known > 0:
			cond += " AND #units = :known"
			values[":known"] = num(known)
		case n <= bound:
			cond += " AND (attribute_not_exists(#units) OR #units <= :room)"
			values[":room"] = num(bound - n)
		default: // more than the bound in one batch: learn the units first
			cond += " AND #units <= :room"
			values[":room"] = num(bound - n)
		}
		out, err := s.update(ctx, principal, day, "ADD #units :n SET #o = :hi, #exp = :exp, #upd = :upd",
			cond, map[string]string{"#o": fence}, values)
		var ccf *types.ConditionalCheckFailedException
		switch {
		case err == nil:
			res.Writes++
			res.Applied += n
			res.Total = numAttr(out.Attributes[attrUnits])
			return res, nil
		case errors.As(err, &ccf):
			res.Writes++
			if bounded && len(ccf.Item) == 0 {
				known = 0 // no item yet: only the bound's condition failed
				continue
			}
			done, ok := numAttrOK(ccf.Item[fence])
			if !ok && !bounded {
				// Without the item as it was, the fence is unknown; guessing
				// could skip or double units. The caller retries.
				return res, fmt.Errorf("update ledger %s %s partition %d: condition failed without the item's %s", principal, day, partition, fence)
			}
			if !ok {
				done = -1 // the item holds no offset of this partition yet
			}
			res.Total = numAttr(ccf.Item[attrUnits])
			if bounded {
				known = res.Total
			}
			i := 0
			for i < len(entries) && entries[i].Offset <= done {
				res.Fenced += entries[i].Cost
				i++
			}
			if i == 0 {
				// The condition failed although o_<partition> is below lo: the
				// item changed between the two reads, or (bounded) it had no
				// room. Try again as is, with the units now known.
				continue
			}
			entries = entries[i:]
		default:
			return res, fmt.Errorf("update ledger %s %s partition %d offsets %d..%d: %w", principal, day, partition, lo, hi, err)
		}
	}
	return res, nil
}

// ApplyReplay adds the units of one dead-lettered decision replayed onto the
// topic, exactly once per original position: the item's string set r holds
// "<partition>/<offset>" of every replay applied, and the write is
// conditional on the position not being in it.
func (s *Store) ApplyReplay(ctx context.Context, principal, day string, partition int, offset, cost int64) (WriteResult, error) {
	id := strconv.Itoa(partition) + "/" + strconv.FormatInt(offset, 10)
	out, err := s.update(ctx, principal, day, "ADD #units :n, #r :id SET #exp = :exp, #upd = :upd",
		"attribute_not_exists(#r) OR NOT contains(#r, :idv)", map[string]string{"#r": attrReplays},
		map[string]types.AttributeValue{
			":n":   num(cost),
			":id":  &types.AttributeValueMemberSS{Value: []string{id}},
			":idv": &types.AttributeValueMemberS{Value: id},
		})
	var ccf *types.ConditionalCheckFailedException
	switch {
	case err == nil:
		return WriteResult{Total: numAttr(out.Attributes[attrUnits]), Applied: cost, Writes: 1}, nil
	case errors.As(err, &ccf):
		return WriteResult{Total: numAttr(ccf.Item[attrUnits]), Fenced: cost, Writes: 1}, nil
	default:
		return WriteResult{}, fmt.Errorf("update ledger %s %s replay %s: %w", principal, day, id, err)
	}
}

// update is the conditional UpdateItem both writes make on the principal's
// day item: expr and cond may use #units, #exp and #upd and the values :exp
// (the item's expiry) and :upd (now), besides the names and values given.
// It answers the updated units, or on a failed condition the item as it was.
func (s *Store) update(ctx context.Context, principal, day, expr, cond string, names map[string]string, values map[string]types.AttributeValue) (*dynamodb.UpdateItemOutput, error) {
	names["#units"], names["#exp"], names["#upd"] = attrUnits, attrExpires, attrUpdated
	values[":exp"], values[":upd"] = num(s.expiresAt(day)), num(s.now().UnixMilli())
	return s.db.UpdateItem(ctx, &dynamodb.UpdateItemInput{
		TableName:                           aws.String(s.table),
		Key:                                 s.key(principal, day),
		UpdateExpression:                    aws.String(expr),
		ConditionExpression:                 aws.String(cond),
		ExpressionAttributeNames:            names,
		ExpressionAttributeValues:           values,
		ReturnValues:                        types.ReturnValueUpdatedNew,
		ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld,
	})
}

// DayUsage is one day of a principal's ledger.
type DayUsage struct {
	Day   string `json:"day"`
	Units int64  `json:"units"`
}

// Usage returns the principal's units for the days from..to (inclusive,
// YYYY-MM-DD), oldest first, with zero for days without an item.
func (s *Store) Usage(ctx context.Context, principal string, from, to time.Time) ([]DayUsage, error) {
	from, to = from.UTC().Truncate(24*time.Hour), to.UTC().Truncate(24*time.Hour)
	found := map[string]int64{}
	pages := dynamodb.NewQueryPaginator(s.db, &dynamodb.QueryInput{
		TableName:              aws.String(s.table),
		KeyConditionExpression: aws.String("#pk = :pk AND #sk BETWEEN :from AND :to"),
		ExpressionAttributeNames: map[string]string{
			"#pk": attrPK, "#sk": attrSK, "#units": attrUnits,
		},
		ExpressionAttributeValues: map[string]types.AttributeValue{
			":pk":   &types.AttributeValueMemberS{Value: principal},
			":from": &types.AttributeValueMemberS{Value: from.Format(DayLayout)},
			":to":   &types.AttributeValueMemberS{Value: to.Format(DayLayout)},
		},
		ProjectionExpression: aws.String("#sk, #units"),
		ConsistentRead:       aws.Bool(true),
	})
	for pages.HasMorePages() {
		out, err := pages.NextPage(ctx)
		if err != nil {
			return nil, fmt.Errorf("query ledger %s: %w", principal, err)
		}
		for _, it := range out.Items {
			if sk, ok := it[attrSK].(*types.AttributeValueMemberS); ok {
				found[sk.Value] = numAttr(it[attrUnits])
			}
		}
	}
	var days []DayUsage
	for d := from; !d.After(to); d = d.Add(24 * time.Hour) {
		k := d.Format(DayLayout)
		days = append(days, DayUsage{Day: k, Units: found[k]})
	}
	return days, nil
}

func (s *Store) key(principal, day string) map[string]types.AttributeValue {
	return map[string]types.AttributeValue{
		attrPK: &types.AttributeValueMemberS{Value: principal},
		attrSK: &types.AttributeValueMemberS{Value: day},
	}
}

// expiresAt is the item's TTL: the end of its day plus the retention.
func (s *Store) expiresAt(day string) int64 {
	t, err := time.Parse(DayLayout, day)
	if err != nil {
		t = s.now().UTC().Truncate(24 * time.Hour)
	}
	return t.Add(24*time.Hour + s.retention).Unix()
}

func num(n int64) *types.AttributeValueMemberN {
	return &types.AttributeValueMemberN{Value: strconv.FormatInt(n, 10)}
}

// numAttr reads an N attribute; absent or malformed reads as 0.
func numAttr(v types.AttributeValue) int64 {
	i, _ := numAttrOK(v)
	return i
}

// numAttrOK reads an N attribute and reports whether it was there and well formed.
func numAttrOK(v types.AttributeValue) (int64, bool) {
	n, ok := v.(*types.AttributeValueMemberN)
	if !ok {
		return 0, false
	}
	i, err := strconv.ParseInt(n.Value, 10, 64)
	if err != nil {
		return 0, false
	}
	return i, true
}
