package chaos

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"path/filepath"
	"strconv"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/floodgate-dev/floodgate/migrations"
	"github.com/floodgate-dev/floodgate/pkg/events"
	"github.com/floodgate-dev/floodgate/pkg/kafkascan"
	"github.com/floodgate-dev/floodgate/pkg/stream"
)

// Broker is a Kafka-protocol broker process this run owns (the
// deploy/local/broker program), persisting to its own data directory with
// every acknowledged produce fsynced, so a SIGKILL loses nothing it acked.
type Broker struct {
	Port    int
	Addr    string
	DataDir string
	e       *Env
	proc    *Proc
}

// StartBroker starts a broker on a free port and creates the topics of the
// migrations on it.
func (e *Env) StartBroker(ctx context.Context) (*Broker, error) {
	port, err := FreePort()
	if err != nil {
		return nil, err
	}
	b := &Broker{Port: port, Addr: "127.0.0.1:" + strconv.Itoa(port), DataDir: e.TempDir("kafka"), e: e}
	if err := b.Start(ctx); err != nil {
		return nil, err
	}
	ms, err := migrations.Load()
	if err != nil {
		return nil, fmt.Errorf("load migrations: %w", err)
	}
	k := migrations.NewKafka([]string{b.Addr}, 1, nil)
	for _, m := range ms {
		if err := k.Apply(ctx, m.Kafka.Topics, func(string) {}); err != nil {
			return nil, fmt.Errorf("create topics on %s: %w", b.Addr, err)
		}
	}
	// A writer that looks a topic up before the broker lists it caches the
	// miss; wait until every topic has its partitions.
	c := &kafka.Client{Addr: kafka.TCP(b.Addr), Timeout: 2 * time.Second}
	err = waitFor(ctx, 20*time.Second, "topics listed", func() error {
		meta, err := c.Metadata(ctx, &kafka.MetadataRequest{})
		if err != nil {
			return err
		}
		listed := map[string]bool{}
		for _, t := range meta.Topics {
			listed[t.Name] = t.Error == nil && len(t.Partitions) > 0
		}
		for _, m := range ms {
			for _, t := range m.Kafka.Topics {
				if !listed[t.Name] {
					return fmt.Errorf("topic %s not listed yet", t.Name)
				}
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return b, nil
}

// Start (re)starts the broker on its port with its data directory.
func (b *Broker) Start(ctx context.Context) error {
	p, err := b.e.Start("broker", filepath.Join(b.e.Bin, "broker"), []string{
		"-port", strconv.Itoa(b.Port), "-data-dir", b.DataDir, "-sync",
		"-group-min-session-timeout", "500ms", "-partitions", "12",
	}, nil)
	if err != nil {
		return err
	}
	b.proc = p
	return waitFor(ctx, 20*time.Second, "broker "+b.Addr, func() error {
		if p.Exited() {
			return fmt.Errorf("exited, see %s: %w", p.LogPath, errStop)
		}
		c := &kafka.Client{Addr: kafka.TCP(b.Addr), Timeout: time.Second}
		_, err := c.Metadata(ctx, &kafka.MetadataRequest{})
		return err
	})
}

// Kill9 kills the broker with SIGKILL.
func (b *Broker) Kill9() { b.proc.Kill() }

// Writer is a reliable writer (acks=all, hash on the key, the principal).
func (b *Broker) Writer() *kafka.Writer {
	return &kafka.Writer{Addr: kafka.TCP(b.Addr), Balancer: &kafka.Hash{}, RequiredAcks: kafka.RequireAll,
		BatchTimeout: 5 * time.Millisecond, BatchSize: 1000, MaxAttempts: 10,
		Transport: &kafka.Transport{MetadataTTL: time.Second}}
}

// Produce writes msgs to topic in batches, acknowledged by the broker.
func (b *Broker) Produce(ctx context.Context, w *kafka.Writer, topic string, msgs []kafka.Message) error {
	for i := 0; i < len(msgs); i += 2000 {
		batch := append([]kafka.Message(nil), msgs[i:min(i+2000, len(msgs))]...)
		for j := range batch {
			batch[j].Topic = topic
		}
		for attempt := 0; len(batch) > 0; attempt++ {
			err := w.WriteMessages(ctx, batch...)
			if err == nil {
				break
			}
			// Retry only the messages the broker did not take (a fresh
			// topic's metadata can lag its creation), never a whole batch
			// twice: a duplicate would be a new event to the ledger.
			var werrs kafka.WriteErrors
			switch {
			case attempt >= 60:
				return fmt.Errorf("produce to %s: %w", topic, err)
			case errors.As(err, &werrs):
				var failed []kafka.Message
				for i, e := range werrs {
					if e != nil {
						failed = append(failed, batch[i])
					}
				}
				batch = failed
			case errors.Is(err, kafka.UnknownTopicOrPartition):
				// Refused before anything was written: retry it all.
			default:
				return fmt.Errorf("produce to %s: %w", topic, err)
			}
			if err := sleep(ctx, 250*time.Millisecond); err != nil {
				return err
			}
		}
	}
	return nil
}

// partitions returns topic's partitions and their end offsets.
func (b *Broker) ends(ctx context.Context, topic string) (map[int]int64, error) {
	c := &kafka.Client{Addr: kafka.TCP(b.Addr), Timeout: 5 * time.Second}
	meta, err := c.Metadata(ctx, &kafka.MetadataRequest{Topics: []string{topic}})
	if err != nil {
		return nil, fmt.Errorf("metadata %s: %w", topic, err)
	}
	if len(meta.Topics) != 1 || meta.Topics[0].Error != nil {
		return nil, fmt.Errorf("topic %s: no metadata", topic)
	}
	var reqs []kafka.OffsetRequest
	for _, p := range meta.Topics[0].Partitions {
		reqs = append(reqs, kafka.LastOffsetOf(p.ID))
	}
	res, err := c.ListOffsets(ctx, &kafka.ListOffsetsRequest{Topics: map[string][]kafka.OffsetRequest{topic: reqs}})
	if err != nil {
		return nil, fmt.Errorf("list offsets %s: %w", topic, err)
	}
	out := map[int]int64{}
	for _, p := range res.Topics[topic] {
		if p.Error != nil {
			return nil, fmt.Errorf("list offsets %s/%d: %w", topic, p.Partition, p.Error)
		}
		out[p.Partition] = p.LastOffset
	}
	return out, nil
}

// Lag is how many messages of topic group has not committed yet.
func (b *Broker) Lag(ctx context.Context, group, topic string) (int64, error) {
	ends, err := b.ends(ctx, topic)
	if err != nil {
		return 0, err
	}
	ids := make([]int, 0, len(ends))
	for id := range ends {
		ids = append(ids, id)
	}
	c := &kafka.Client{Addr: kafka.TCP(b.Addr), Timeout: 5 * time.Second}
	got, err := c.OffsetFetch(ctx, &kafka.OffsetFetchRequest{GroupID: group, Topics: map[string][]int{topic: ids}})
	if err != nil {
		return 0, fmt.Errorf("offset fetch %s: %w", group, err)
	}
	committed := map[int]int64{}
	for _, p := range got.Topics[topic] {
		committed[p.Partition] = max(p.CommittedOffset, 0)
	}
	var lag int64
	for id, end := range ends {
		lag += max(end-committed[id], 0)
	}
	return lag, nil
}

// ReadAll reads every message of topic up to its current end. A read that
// fails is read again from the start, up to 5 times: a broker restarted
// moments before, on a loaded machine, once answered a ListOffsets with
// UNKNOWN_SERVER_ERROR (make test, 2026-12-03), and the count is of what
// the topic holds, not of how the first read went. f sees each message once,
// after the read that succeeded.
func (b *Broker) ReadAll(ctx context.Context, topic string, f func(kafka.Message)) (int, error) {
	c := &kafka.Client{Addr: kafka.TCP(b.Addr), Timeout: 30 * time.Second}
	var msgs []kafka.Message
	var err error
	for attempt := range 5 {
		if attempt > 0 {
			select {
			case <-ctx.Done():
				return 0, ctx.Err()
			case <-time.After(500 * time.Millisecond):
			}
		}
		msgs = msgs[:0]
		if err = kafkascan.All(ctx, c, topic, func(m kafka.Message) bool { msgs = append(msgs, m); return true }); err == nil {
			break
		}
	}
	if err != nil {
		return 0, err
	}
	for _, m := range msgs {
		f(m)
	}
	return len(msgs), nil
}

// Header returns the value of the header key, or "".
func Header(m kafka.Message, key string) string {
	for _, h := range m.Headers {
		if h.Key == key {
			return string(h.Value)
		}
	}
	return ""
}

// DayKey names one ledger item.
type DayKey struct{ Principal, Day string }

// Workload generates decision events with known ledger totals (allowed units
// per principal per UTC day).
type Workload struct {
	Principals []events.Principal
	Expected   map[DayKey]int64
	rnd        *rand.Rand
	run        string
	seq        int
}

// NewWorkload returns a workload over n principals unique to this run.
func NewWorkload(seed uint64, n int, prefix string) *Workload {
	w := &Workload{Expected: map[DayKey]int64{}, rnd: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)),
		run: fmt.Sprintf("%s%d", prefix, time.Now().UnixNano())}
	kinds := []events.PrincipalKind{events.PrincipalUser, events.PrincipalBot, events.PrincipalAPIKey}
	for i := range n {
		w.Principals = append(w.Principals, events.Principal{Kind: kinds[i%len(kinds)], ID: fmt.Sprintf("%s_%d", w.run, i)})
	}
	return w
}

// Messages returns n decisions of random principals at ts ≈ now (80 %
// allowed, cost 1..5), keyed and headed as the limiter publishes them.
func (w *Workload) Messages(n int) []kafka.Message {
	out := make([]kafka.Message, 0, n)
	for range n {
		p := w.Principals[w.rnd.IntN(len(w.Principals))]
		ts := time.Now().UTC().Truncate(time.Millisecond)
		w.seq++
		d := events.Decision{
			ID: fmt.Sprintf("%s_d%d", w.run, w.seq), TS: ts, Principal: p,
			IP: netip.MustParseAddr("198.51.100.7"), Method: "GET", Route: "/v1/things",
			Allowed: w.rnd.IntN(10) < 8, Tier: events.TierPrincipal, Cost: 1 + w.rnd.Int64N(5),
			Limit: 1000, Remaining: 500, Gateway: "chaos",
		}
		if !d.Allowed {
			d.Tier = events.TierQuota
		} else {
			w.Expected[DayKey{p.Key(), ts.Format("2006-01-02")}] += d.Cost
		}
		out = append(out, DecisionMessage(d))
	}
	return out
}

// DecisionMessage encodes d as the limiter publishes it.
func DecisionMessage(d events.Decision) kafka.Message {
	v, err := events.EncodeDecision(&d)
	if err != nil {
		panic(fmt.Sprintf("chaos: encode decision: %v", err)) // the workload built d: a bug here
	}
	return kafka.Message{Key: []byte(d.Principal.Key()), Value: v,
		Headers: stream.CloudEventHeaders(events.CETypeDecision, d.ID, "chaos", d.TS)}
}

// ScriptedDecision is the seq-th decision event of p on route as a limiter
// would have published it now: bots send 200/s against a limit of 50/s, so
// three in four are denied (what makes automation rapid fire); everyone else
// is allowed well inside a limit of 1000.
func ScriptedDecision(p events.Principal, route string, seq int) kafka.Message {
	d := events.Decision{ID: fmt.Sprintf("%s_%d", p.ID, seq), TS: time.Now().UTC().Truncate(time.Millisecond),
		Principal: p, IP: ipOf(seq), Method: "POST", Route: route, Allowed: true, Tier: events.TierPrincipal,
		Cost: 1, Limit: 1000, Remaining: 900, Gateway: "chaos"}
	if p.Kind == events.PrincipalBot {
		d.Allowed, d.Limit, d.Remaining = seq%4 == 0, 50, 0
	}
	return DecisionMessage(d)
}
