// Package quotatest builds the quota service's integration tests: a ledger
// table on DynamoDB Local under a per-test prefix, an in-process broker with
// the topics from migrations, decision workloads with known totals, and
// readers for the ledger and the group's committed offsets.
package quotatest

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/require"

	"github.com/floodgate-dev/floodgate/migrations"
	"github.com/floodgate-dev/floodgate/migrations/migrationstest"
	"github.com/floodgate-dev/floodgate/pkg/dynamo"
	"github.com/floodgate-dev/floodgate/pkg/events"
	"github.com/floodgate-dev/floodgate/pkg/kafkatest"
	"github.com/floodgate-dev/floodgate/pkg/stream"
)

// DynamoEndpoint is FLOODGATE_DYNAMODB_ENDPOINT or the local stack's.
func DynamoEndpoint() string { return migrationstest.DynamoEndpoint() }

// LedgerTable creates the ledger table from the migrations under a fresh
// prefix on DynamoDB Local and deletes it on cleanup. It returns the client
// and the prefix (the table is prefix + dynamo.TableQuotaLedger).
func LedgerTable(t testing.TB) (*dynamodb.Client, string) {
	t.Helper()
	return migrationstest.DynamoTables(t, "tq", dynamo.TableQuotaLedger)
}

// Broker starts an in-process broker with the topics of the migrations.
func Broker(t testing.TB) string {
	t.Helper()
	addr := kafkatest.Start(t, nil)
	ms, err := migrations.Load()
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	k := migrations.NewKafka([]string{addr}, 1, nil)
	for _, m := range ms {
		require.NoError(t, k.Apply(ctx, m.Kafka.Topics, func(string) {}))
	}
	return addr
}

// DayKey identifies one ledger item.
type DayKey struct{ Principal, Day string }

// Workload generates decision messages with known ledger totals.
type Workload struct {
	Principals []events.Principal
	Days       []time.Time // UTC midnights the events fall on
	Expected   map[DayKey]int64
	rnd        *rand.Rand
	seq        int
	run        string
}

// NewWorkload returns a workload over n principals (ids unique to this run)
// spread over today and yesterday.
func NewWorkload(seed uint64, n int) *Workload {
	run := fmt.Sprintf("%d", time.Now().UnixNano())
	w := &Workload{Expected: map[DayKey]int64{}, rnd: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)), run: run}
	kinds := []events.PrincipalKind{"user", "bot", "api_key"}
	for i := range n {
		w.Principals = append(w.Principals, events.Principal{Kind: kinds[i%len(kinds)], ID: fmt.Sprintf("q%s_%d", run, i)})
	}
	today := time.Now().UTC().Truncate(24 * time.Hour)
	w.Days = []time.Time{today.Add(-24 * time.Hour), today}
	return w
}

// Decision returns one random decision and records its units if allowed.
func (w *Workload) Decision() events.Decision {
	p := w.Principals[w.rnd.IntN(len(w.Principals))]
	day := w.Days[w.rnd.IntN(len(w.Days))]
	ts := day.Add(time.Duration(w.rnd.Int64N(int64(24*time.Hour - time.Millisecond)))).Truncate(time.Millisecond)
	if ts.After(time.Now()) {
		ts = time.Now().UTC().Truncate(time.Millisecond)
		day = ts.Truncate(24 * time.Hour)
	}
	w.seq++
	d := events.Decision{
		ID: fmt.Sprintf("d%s_%d", w.run, w.seq), TS: ts, Principal: p,
		IP: netip.MustParseAddr("203.0.113.7"), Method: "POST", Route: "/v1/things",
		Allowed: w.rnd.IntN(10) < 8, Tier: "principal", Shadow: w.rnd.IntN(10) == 0,
		Cost: 1 + w.rnd.Int64N(5), Limit: 100, Remaining: 50, Gateway: "test",
	}
	if !d.Allowed {
		d.Tier = "quota"
	}
	if d.Allowed {
		w.Expected[DayKey{p.Key(), day.Format("2006-01-02")}] += d.Cost
	}
	return d
}

// Messages returns n decision messages (keyed by principal, with CloudEvents
// headers), and poison messages interleaved every poisonEvery (0: none).
func (w *Workload) Messages(n, poisonEvery int) []kafka.Message {
	out := make([]kafka.Message, 0, n+1)
	for i := range n {
		if poisonEvery > 0 && i%poisonEvery == poisonEvery-1 {
			p := w.Principals[w.rnd.IntN(len(w.Principals))]
			out = append(out, kafka.Message{Key: []byte(p.Key()), Value: []byte(`{"type":"decision.v1","broken":`)})
			continue
		}
		d := w.Decision()
		out = append(out, Message(d))
	}
	return out
}

// Message encodes d as the limiter publishes it.
func Message(d events.Decision) kafka.Message {
	v, err := events.EncodeDecision(&d)
	if err != nil {
		panic(fmt.Sprintf("quotatest: encode decision: %v", err))
	}
	return kafka.Message{Key: []byte(d.Principal.Key()), Value: v,
		Headers: stream.CloudEventHeaders(events.CETypeDecision, d.ID, "quotatest", d.TS)}
}

// Writer returns a reliable writer to broker (acks=all, hash on key).
func Writer(broker string) *kafka.Writer {
	return &kafka.Writer{
		Addr: kafka.TCP(broker), Balancer: &kafka.Hash{}, RequiredAcks: kafka.RequireAll,
		BatchTimeout: 5 * time.Millisecond, BatchSize: 1000, AllowAutoTopicCreation: false,
	}
}

// Produce writes msgs to topic in batches.
func Produce(ctx context.Context, t testing.TB, w *kafka.Writer, topic string, msgs []kafka.Message) {
	t.Helper()
	for i := 0; i < len(msgs); i += 5000 {
		batch := append([]kafka.Message(nil), msgs[i:min(i+5000, len(msgs))]...)
		for j := range batch {
			batch[j].Topic = topic
		}
		require.NoError(t, w.WriteMessages(ctx, batch...))
	}
}

// LedgerTotals reads every item of the given principals.
func LedgerTotals(ctx context.Context, t testing.TB, db *dynamodb.Client, table string, principals []events.Principal) map[DayKey]int64 {
	t.Helper()
	out := map[DayKey]int64{}
	for _, p := range principals {
		res, err := db.Query(ctx, &dynamodb.QueryInput{
			TableName:                 aws.String(table),
			KeyConditionExpression:    aws.String("pk = :pk"),
			ExpressionAttributeValues: map[string]typesAV{":pk": strAV(p.Key())},
			ConsistentRead:            aws.Bool(true),
		})
		require.NoError(t, err)
		for _, it := range res.Items {
			out[DayKey{p.Key(), dynamo.Str(it["sk"])}] = avN(it["units"])
		}
	}
	return out
}

// Committed reports whether group's committed offsets reached the end of
// every partition of topic.
func Committed(ctx context.Context, broker, group, topic string) (bool, error) {
	client := &kafka.Client{Addr: kafka.TCP(broker), Timeout: 5 * time.Second}
	meta, err := client.Metadata(ctx, &kafka.MetadataRequest{Topics: []string{topic}})
	if err != nil {
		return false, err
	}
	if len(meta.Topics) != 1 {
		return false, fmt.Errorf("topic %s: no metadata", topic)
	}
	var reqs []kafka.OffsetRequest
	var ids []int
	for _, p := range meta.Topics[0].Partitions {
		reqs = append(reqs, kafka.LastOffsetOf(p.ID))
		ids = append(ids, p.ID)
	}
	ends, err := client.ListOffsets(ctx, &kafka.ListOffsetsRequest{Topics: map[string][]kafka.OffsetRequest{topic: reqs}})
	if err != nil {
		return false, err
	}
	got, err := client.OffsetFetch(ctx, &kafka.OffsetFetchRequest{GroupID: group, Topics: map[string][]int{topic: ids}})
	if err != nil {
		return false, err
	}
	committed := map[int]int64{}
	for _, p := range got.Topics[topic] {
		committed[p.Partition] = p.CommittedOffset
	}
	for _, p := range ends.Topics[topic] {
		if p.LastOffset > 0 && committed[p.Partition] < p.LastOffset {
			return false, nil
		}
	}
	return true, nil
}
