package app

// Benchmarks of the whole detector through a Kafka-protocol broker: the app
// (app.Run, exactly what the binary runs) consumes floodgate.decisions.v1 from
// an in-process kfake broker with the topics from migrations/, applies
// penalties in the real Redis, writes abuse records to DynamoDB Local and
// points to InfluxDB. Run them one at a time (each owns the machine):
//
//	go test -run xxx -bench BrokerThroughput -benchtime 1x ./services/detector/internal/app/
//	go test -run xxx -bench BrokerLatency -benchtime 1x ./services/detector/internal/app/

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/require"

	"github.com/floodgate-dev/floodgate/loadtest/labeled"
	"github.com/floodgate-dev/floodgate/migrations"
	"github.com/floodgate-dev/floodgate/pkg/config"
	"github.com/floodgate-dev/floodgate/pkg/dynamo"
	"github.com/floodgate-dev/floodgate/pkg/events"
	"github.com/floodgate-dev/floodgate/pkg/kafkatest"
	"github.com/floodgate-dev/floodgate/pkg/redisx"
	"github.com/floodgate-dev/floodgate/pkg/redisx/redistest"
	"github.com/floodgate-dev/floodgate/pkg/service"
	"github.com/floodgate-dev/floodgate/pkg/stream"
)

// rig is one detector app running against an in-process broker.
type rig struct {
	broker, group, prefix, run string
	dynamoEndpoint             string
	producer                   *stream.Producer
	admin                      *kafka.Client
	partitions                 []int
	stop                       func() error
}

// newRig starts a broker with the migrations' topics and creates the
// detector's DynamoDB tables under a unique prefix.
func newRig(b *testing.B) *rig {
	b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	broker := kafkatest.Start(b, nil)
	ms, err := migrations.Load()
	require.NoError(b, err)
	endpoint := config.NewEnv(os.Getenv).String("FLOODGATE_DYNAMODB_ENDPOINT", "http://127.0.0.1:8000")
	ddb, err := dynamo.NewClient(ctx, dynamo.Options{Endpoint: endpoint})
	require.NoError(b, err)
	run := fmt.Sprintf("bb%d", time.Now().UnixNano())
	prefix := run + "_"
	var tables []migrations.TableSpec
	for _, m := range ms {
		require.NoError(b, migrations.NewKafka([]string{broker}, 1, nil).Apply(ctx, m.Kafka.Topics, func(string) {}))
		for _, tb := range m.DynamoDB.Tables {
			if tb.Name == dynamo.TableAbuseRecords || tb.Name == dynamo.TableRuntimeConfig {
				tables = append(tables, tb)
			}
		}
	}
	require.NoError(b, (&migrations.Dynamo{Client: ddb, Prefix: prefix}).Apply(ctx, tables, func(string) {}), "DynamoDB Local at %s (make up)", endpoint)
	b.Cleanup(func() {
		for _, tb := range tables {
			_, _ = ddb.DeleteTable(context.Background(), &dynamodb.DeleteTableInput{TableName: aws.String(prefix + tb.Name)})
		}
	})
	r := &rig{broker: broker, group: run + "-detector", prefix: prefix, run: run, dynamoEndpoint: endpoint,
		admin: &kafka.Client{Addr: kafka.TCP(broker), Timeout: 10 * time.Second}}
	r.producer = stream.NewProducer(stream.ProducerConfig{Brokers: []string{broker}, Topic: config.DefaultDecisionsTopic, BatchSize: 2000})
	b.Cleanup(func() { _ = r.producer.Close() })
	conn, err := kafka.Dial("tcp", broker)
	require.NoError(b, err)
	parts, err := conn.ReadPartitions(config.DefaultDecisionsTopic)
	_ = conn.Close()
	require.NoError(b, err)
	for _, p := range parts {
		r.partitions = append(r.partitions, p.ID)
	}
	return r
}

// start runs the detector app; stop cancels it and waits for its drain.
func (r *rig) start(b *testing.B) {
	b.Helper()
	env := map[string]string{
		"FLOODGATE_KAFKA_BROKERS":         r.broker,
		"FLOODGATE_DETECTOR_GROUP":        r.group,
		"FLOODGATE_PAGER_GROUP":           r.run + "-pager",
		"FLOODGATE_DETECTOR_ADDR":         "127.0.0.1:0",
		"FLOODGATE_DYNAMODB_TABLE_PREFIX": r.prefix,
		"FLOODGATE_DYNAMODB_ENDPOINT":     r.dynamoEndpoint,
		"FLOODGATE_PAGERDUTY_ROUTING_KEY": "",
		// Every labeled abuser is penalized: the blast-radius guard (100 a
		// minute by default) would hold most of them in simulation.
		"FLOODGATE_DETECTOR_BLAST_LIMIT": "1000000",
	}
	getenv := func(k string) string {
		if v, ok := env[k]; ok {
			return v
		}
		return os.Getenv(k)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	level := slog.LevelWarn
	if os.Getenv("FLOODGATE_BENCH_LOG") == "info" {
		level = slog.LevelInfo
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	go func() { done <- Run(ctx, service.NewEnv("detector", service.Stdio{Getenv: getenv}, log)) }()
	var once sync.Once
	var err error
	select {
	case err = <-done:
		cancel()
		b.Fatalf("detector app stopped at start: %v", err)
	case <-time.After(time.Second):
	}
	r.stop = func() error {
		once.Do(func() { cancel(); err = <-done })
		return err
	}
	b.Cleanup(func() { _ = r.stop() })
}

// lag is the decisions not yet committed by the detector's group, summed over
// partitions (a partition the group never committed counts from offset 0).
func (r *rig) lag(ctx context.Context) (lag, committed int64, err error) {
	req := &kafka.ListOffsetsRequest{Topics: map[string][]kafka.OffsetRequest{}}
	for _, p := range r.partitions {
		req.Topics[config.DefaultDecisionsTopic] = append(req.Topics[config.DefaultDecisionsTopic], kafka.LastOffsetOf(p))
	}
	ends, err := r.admin.ListOffsets(ctx, req)
	if err != nil {
		return 0, 0, fmt.Errorf("list offsets: %w", err)
	}
	got, err := r.admin.OffsetFetch(ctx, &kafka.OffsetFetchRequest{GroupID: r.group, Topics: map[string][]int{config.DefaultDecisionsTopic: r.partitions}})
	if err != nil {
		return 0, 0, fmt.Errorf("fetch offsets: %w", err)
	}
	commit := map[int]int64{}
	for _, po := range got.Topics[config.DefaultDecisionsTopic] {
		if po.CommittedOffset > 0 {
			commit[po.Partition] = po.CommittedOffset
		}
	}
	for _, po := range ends.Topics[config.DefaultDecisionsTopic] {
		lag += po.LastOffset - commit[po.Partition]
		committed += commit[po.Partition]
	}
	return lag, committed, nil
}

// messages turns the next n events of s into decision messages, principal ids
// prefixed with run so penalty keys never collide with another run's.
func messages(b *testing.B, s *labeled.Stream, run string, n int) []kafka.Message {
	out := make([]kafka.Message, 0, n)
	var d events.Decision
	for len(out) < n && s.Next(&d) {
		d.Principal.ID = run + "_" + d.Principal.ID
		v, err := events.EncodeDecision(&d)
		require.NoError(b, err)
		out = append(out, kafka.Message{Key: []byte(d.Principal.Key()), Value: v})
	}
	return out
}

// BenchmarkBrokerThroughput measures the detector consuming and scoring
// decisions through the broker: first draining a backlog (the most it can
// do), then keeping up with a producer writing as fast as it can on the same
// two cores, sampling the group's lag every 100 ms.
func BenchmarkBrokerThroughput(b *testing.B) {
	const backlog, live = 1_000_000, 2_000_000
	ctx := context.Background()
	r := newRig(b)
	// Events dated an hour ago: inside the detector's event-age window
	// (FLOODGATE_DETECTOR_MAX_EVENT_AGE) whatever the day; the scenario's fixed
	// start went out of it a week after it was written, and every event
	// was dead-lettered as too old.
	sc := labeled.Default(1)
	sc.Start = time.Now().Add(-time.Hour).UTC().Truncate(time.Second)
	src := labeled.New(sc)
	b.ResetTimer()
	for range b.N {
		// Phase 1: a backlog produced while the detector is down.
		t0 := time.Now()
		for sent := 0; sent < backlog; {
			msgs := messages(b, src, r.run, 20_000)
			require.NoError(b, r.producer.Publish(ctx, msgs...))
			sent += len(msgs)
		}
		b.Logf("backlog: produced %d events in %s (%.0f/s, one producer incl. generating and encoding)", backlog, time.Since(t0).Round(time.Millisecond), backlog/time.Since(t0).Seconds())
		r.start(b)
		var first time.Time
		var firstCommitted int64
		for {
			time.Sleep(100 * time.Millisecond)
			lag, committed, err := r.lag(ctx)
			require.NoError(b, err)
			if committed > 0 && first.IsZero() {
				first, firstCommitted = time.Now(), committed
			}
			if lag == 0 {
				rate := float64(committed-firstCommitted) / time.Since(first).Seconds()
				b.Logf("backlog drained: %d events, %.0f events/s between the first and the last commit", committed, rate)
				b.ReportMetric(rate, "drain_events/s")
				break
			}
		}

		// Phase 2: live traffic, producer and detector sharing the machine. The
		// events are generated and encoded beforehand so the producer's CPU goes
		// to producing.
		var pending [][]kafka.Message
		for n := 0; n < live; {
			msgs := messages(b, src, r.run, 10_000)
			require.NotEmpty(b, msgs, "labeled stream ended after %d live events", n)
			pending = append(pending, msgs)
			n += len(msgs)
		}
		var produced atomic.Int64
		var prodDone atomic.Bool
		var wg sync.WaitGroup
		var perr error
		wg.Add(1)
		p0 := time.Now()
		go func() {
			defer wg.Done()
			defer prodDone.Store(true)
			for _, msgs := range pending {
				if err := r.producer.Publish(ctx, msgs...); err != nil {
					perr = err
					return
				}
				produced.Add(int64(len(msgs)))
			}
		}()
		var maxLag int64
		var prodTime time.Duration
		_, base, err := r.lag(ctx)
		require.NoError(b, err)
		for {
			time.Sleep(100 * time.Millisecond)
			lag, committed, err := r.lag(ctx)
			require.NoError(b, err)
			maxLag = max(maxLag, lag)
			if prodDone.Load() && prodTime == 0 {
				prodTime = time.Since(p0)
			}
			if prodDone.Load() && lag == 0 {
				total := time.Since(p0)
				n := committed - base
				b.Logf("live: produced %d events in %s (%.0f/s); detector committed them all %s after the first was produced (%.0f events/s end to end); max lag %d events (%.2f s of production)",
					n, prodTime.Round(time.Millisecond), float64(n)/prodTime.Seconds(), total.Round(time.Millisecond), float64(n)/total.Seconds(),
					maxLag, float64(maxLag)/(float64(n)/prodTime.Seconds()))
				b.ReportMetric(float64(n)/total.Seconds(), "e2e_events/s")
				b.ReportMetric(float64(maxLag), "max_lag_events")
				break
			}
		}
		wg.Wait()
		require.NoError(b, perr)
		require.NoError(b, r.stop())
	}
}

// BenchmarkBrokerLatency produces labeled traffic (loadtest/labeled: normal
// users, carrier NAT, roaming phones, pollers, integrations, rapid-fire bots
// and users, botnets) in real time (event time = wall clock) for a minute,
// reports recall and false positives from what the detector enforced, and
// measures, for every abusive principal detected, the time
// from its crossing event (abuse.v1 detected_at: the event that took it over
// the threshold) to the moment its penalty key is visible in Redis, polled
// every 2 ms. The path measured: produce (acks=all) → broker → consumer group
// fetch → decode and score → escalation lookup in DynamoDB → Redis penalty.
func BenchmarkBrokerLatency(b *testing.B) {
	ctx := context.Background()
	rdb := redistest.Client(b)
	r := newRig(b)
	r.start(b)
	// Wait for the group to own the partitions before traffic starts.
	time.Sleep(4 * time.Second)
	b.ResetTimer()
	for range b.N {
		start := time.Now().Add(time.Second).UTC()
		sc := labeled.Scenario{Seed: uint64(start.UnixNano()), Start: start, Duration: time.Minute,
			Normal: 20_000, NAT: 200, NATAddresses: 8, Roaming: 400, Pollers: 400, Integrations: 50,
			RapidFire: 200, Botnets: 50}
		src := labeled.New(sc)
		var abusive []events.Principal
		legit := map[string]string{} // principal key → population
		for _, l := range src.Labels() {
			p := l.Principal
			p.ID = r.run + "_" + p.ID
			if l.Abusive {
				abusive = append(abusive, p)
			} else {
				legit[p.Key()] = l.Population
			}
		}
		keys := make([]string, len(abusive))
		for i, p := range abusive {
			keys[i] = redisx.PenaltyKey(string(p.Kind), p.ID)
		}
		b.Cleanup(func() { rdb.Del(context.Background(), keys...) })

		// Poll the penalty keys.
		seen := make([]time.Time, len(keys))
		pollCtx, stopPoll := context.WithCancel(ctx)
		var pollWG sync.WaitGroup
		pollWG.Add(1)
		go func() {
			defer pollWG.Done()
			for pollCtx.Err() == nil {
				pipe := rdb.Pipeline()
				cmds := make([]interface{ Val() int64 }, len(keys))
				for i, k := range keys {
					if seen[i].IsZero() {
						cmds[i] = pipe.Exists(pollCtx, k)
					}
				}
				_, _ = pipe.Exec(pollCtx)
				now := time.Now()
				for i, c := range cmds {
					if c != nil && c.Val() == 1 {
						seen[i] = now
					}
				}
				time.Sleep(2 * time.Millisecond)
			}
		}()

		// Produce in real time: each event is sent once the wall clock reaches its ts.
		var d events.Decision
		var batch []kafka.Message
		n := 0
		for src.Next(&d) {
			if wait := time.Until(d.TS); wait > time.Millisecond {
				if len(batch) > 0 {
					require.NoError(b, r.producer.Publish(ctx, batch...))
					n += len(batch)
					batch = batch[:0]
				}
				if wait = time.Until(d.TS); wait > 0 {
					time.Sleep(wait)
				}
			}
			d.Principal.ID = r.run + "_" + d.Principal.ID
			v, err := events.EncodeDecision(&d)
			require.NoError(b, err)
			batch = append(batch, kafka.Message{Key: []byte(d.Principal.Key()), Value: v})
			if len(batch) >= 2000 {
				require.NoError(b, r.producer.Publish(ctx, batch...))
				n += len(batch)
				batch = batch[:0]
			}
		}
		require.NoError(b, r.producer.Publish(ctx, batch...))
		n += len(batch)
		time.Sleep(3 * time.Second)
		stopPoll()
		pollWG.Wait()

		// detected_at of each principal's first enforced detection, from abuse.v1.
		detected := firstDetections(b, r)
		var lat []time.Duration
		missed := 0
		for i, p := range abusive {
			at, ok := detected[p.Key()]
			if !ok {
				missed++
				continue
			}
			require.False(b, seen[i].IsZero(), "%s detected at %s but no penalty in Redis", p.Key(), at)
			lat = append(lat, seen[i].Sub(at))
		}
		nseen := 0
		for _, t := range seen {
			if !t.IsZero() {
				nseen++
			}
		}
		require.NotEmpty(b, lat, "%d events produced, %d penalties seen in Redis, %d principals on the abuse topic", n, nseen, len(detected))
		falsePos := map[string]int{}
		for k := range detected {
			if pop, ok := legit[k]; ok {
				falsePos[pop]++
			}
		}
		fp := 0
		for _, c := range falsePos {
			fp += c
		}
		b.Logf("quality: recall %d/%d abusive principals penalized within the run; %d of %d legitimate principals penalized %v",
			len(lat), len(abusive), fp, len(legit), falsePos)
		b.ReportMetric(float64(len(lat))/float64(len(abusive)), "recall")
		b.ReportMetric(float64(fp), "false_positives")
		slices.Sort(lat)
		q := func(f float64) time.Duration { return lat[min(len(lat)-1, int(f*float64(len(lat))))] }
		b.Logf("latency: %d events in %s real time, %d abusive principals, %d detected (%d not within the run); crossing event → penalty in Redis: p50 %s p90 %s p99 %s max %s",
			n, sc.Duration, len(abusive), len(lat), missed, q(0.5), q(0.9), q(0.99), lat[len(lat)-1])
		b.ReportMetric(float64(q(0.5).Microseconds())/1000, "p50_ms")
		b.ReportMetric(float64(q(0.99).Microseconds())/1000, "p99_ms")
	}
}

// firstDetections reads the abuse topic and returns, per principal, the
// detected_at of its first enforced detection.
func firstDetections(b *testing.B, r *rig) map[string]time.Time {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	out := map[string]time.Time{}
	conn, err := kafka.Dial("tcp", r.broker)
	require.NoError(b, err)
	parts, err := conn.ReadPartitions(config.DefaultAbuseTopic)
	_ = conn.Close()
	require.NoError(b, err)
	for _, p := range parts {
		rd := kafka.NewReader(kafka.ReaderConfig{Brokers: []string{r.broker}, Topic: config.DefaultAbuseTopic, Partition: p.ID, MaxWait: 100 * time.Millisecond})
		end, err := kafka.DialLeader(ctx, "tcp", r.broker, config.DefaultAbuseTopic, p.ID)
		require.NoError(b, err)
		last, err := end.ReadLastOffset()
		_ = end.Close()
		require.NoError(b, err)
		for off := int64(0); off < last; off++ {
			m, err := rd.ReadMessage(ctx)
			require.NoError(b, err)
			a, err := events.DecodeAbuse(m.Value)
			require.NoError(b, err)
			if a.Penalty.Mode != events.PenaltyEnforced {
				continue
			}
			if cur, ok := out[a.Principal.Key()]; !ok || a.DetectedAt.Before(cur) {
				out[a.Principal.Key()] = a.DetectedAt
			}
		}
		_ = rd.Close()
	}
	return out
}
