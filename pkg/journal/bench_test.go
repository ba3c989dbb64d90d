package journal

import (
	"context"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/segmentio/kafka-go"

	"github.com/floodgate-dev/floodgate/pkg/kafkatest"
	"github.com/floodgate-dev/floodgate/pkg/stream"
	"github.com/floodgate-dev/floodgate/pkg/stream/streamtest"
)

// benchDecisions is n decision.v1-sized messages (~330 bytes of value plus
// CloudEvents headers).
func benchDecisions(n int) []kafka.Message {
	msgs := make([]kafka.Message, n)
	for i := range msgs {
		id := fmt.Sprintf("0192f3a4-7b1c-7d2e-9f00-%012d", i)
		msgs[i] = kafka.Message{
			Topic: "floodgate.decisions.v1",
			Key:   fmt.Appendf(nil, "bot:bot_%06d", i%10000),
			Value: fmt.Appendf(nil, `{"id":%q,"ts":"2026-01-01T00:00:00.000Z","principal":{"kind":"bot","id":"bot_%06d"},"ip":"203.0.113.7","method":"POST","route":"/channels/{channel_id}/messages","resource":"channel:123","allowed":true,"tier":"principal","shadow":false,"cost":1,"limit":50,"remaining":49,"gateway":"bench"}`,
				id, i%10000),
			Headers: stream.CloudEventHeaders("decision.v1", id, "floodgate/limiter/bench", time.Unix(1767225600, 0)),
		}
	}
	return msgs
}

// openBench opens a journal for a benchmark; cfg.Dir and cfg.Logger are
// filled in.
func openBench(b *testing.B, cfg Config) *Journal {
	cfg.Dir, cfg.Logger = b.TempDir(), slog.New(slog.DiscardHandler)
	j, err := Open(cfg)
	if err != nil {
		b.Fatal(err)
	}
	return j
}

// appendN appends n messages to j, batch at a time.
func appendN(b *testing.B, j *Journal, batch []kafka.Message, n int) {
	for left := n; left > 0; left -= len(batch) {
		if err := j.Append(batch[:min(len(batch), left)]); err != nil {
			b.Fatal(err)
		}
	}
}

// runBench runs j through pub (nil: store only) in the background; stop ends
// it and fails the benchmark if Run failed.
func runBench(b *testing.B, j *Journal, pub ReplayPublisher) (stop func()) {
	done := streamtest.Start(b, time.Minute, func(ctx context.Context) error { return j.Run(ctx, pub) })
	return func() {
		if err := done(); err != nil {
			b.Fatal(err)
		}
	}
}

// reportRate stops the timer and reports b.N messages over the time since
// start, in msgs/s.
func reportRate(b *testing.B, start time.Time) {
	elapsed := time.Since(start)
	b.StopTimer()
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "msgs/s")
}

// BenchmarkJournalAppend appends b.N decision events in batches, under each
// fsync policy; MB/s counts framed record bytes.
//
//	go test -run '^$' -bench BenchmarkJournalAppend -benchtime 200000x ./pkg/journal/
func BenchmarkJournalAppend(b *testing.B) {
	msgs := benchDecisions(1000)
	recordBytes := len(appendRecord(nil, &msgs[0]))
	for _, sync := range []SyncPolicy{SyncBatch, SyncInterval} {
		for _, batch := range []int{1, 100, 1000} {
			b.Run(fmt.Sprintf("sync=%s/batch=%d", sync, batch), func(b *testing.B) {
				j := openBench(b, Config{Sync: sync, SyncInterval: 100 * time.Millisecond, Registerer: prometheus.NewRegistry()})
				stop := runBench(b, j, nil) // the interval syncer
				b.SetBytes(int64(recordBytes))
				b.ResetTimer()
				start := time.Now()
				appendN(b, j, msgs[:batch], b.N)
				reportRate(b, start)
				stop()
			})
		}
	}
}

// BenchmarkDurableProducerOverflow exercises the outage path: the in-memory
// buffer is full, so every event spills to the journal's hand-off queue and
// the journal writer (batch fsync) puts it on disk.
//
//   - call: the cost of one TryPublish; "refused" counts events refused
//     because the writer fell behind a tight loop.
//
//   - sustained: events offered as fast as the writer takes them (a refused
//     one is retried after 50µs); msgs/s is what reaches the disk.
//
//     go test -run '^$' -bench BenchmarkDurableProducerOverflow -benchtime 200000x ./pkg/journal/
func BenchmarkDurableProducerOverflow(b *testing.B) {
	msgs := benchDecisions(1000)
	for _, mode := range []string{"call", "sustained"} {
		b.Run(mode, func(b *testing.B) {
			d, err := NewDurableProducer(DurableProducerConfig{
				Async:   stream.AsyncProducerConfig{Brokers: []string{kafkatest.DeadAddr(b)}, Topic: "floodgate.decisions.v1", BufferSize: 1},
				Journal: Config{Dir: b.TempDir(), Logger: slog.New(slog.DiscardHandler)},
			})
			if err != nil {
				b.Fatal(err)
			}
			j := d.Journal()
			stop := runBench(b, j, nil) // the writer only: Kafka is "down"
			refused := 0
			b.ResetTimer()
			start := time.Now()
			for i := range b.N {
				for !d.TryPublish(msgs[i%len(msgs)]) {
					refused++
					if mode == "call" {
						break
					}
					time.Sleep(50 * time.Microsecond)
				}
			}
			if mode == "sustained" {
				// The first event took the async buffer's one slot.
				for j.Stats().Pending < int64(b.N)-1 {
					time.Sleep(100 * time.Microsecond)
				}
				b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "msgs/s")
			}
			b.StopTimer()
			b.ReportMetric(float64(refused), "refused")
			stop()
		})
	}
}

// BenchmarkJournalReplay replays b.N journaled decision events into the
// in-process broker (acks=all): how fast a backlog drains once Kafka is back.
//
//	go test -run '^$' -bench BenchmarkJournalReplay -benchtime 200000x ./pkg/journal/
func BenchmarkJournalReplay(b *testing.B) {
	const topic = "floodgate.decisions.v1"
	addr := kafkatest.Start(b, map[string]int32{topic: 6})
	j := openBench(b, Config{MaxBytes: 4 << 30})
	appendN(b, j, benchDecisions(1000), b.N)
	p := stream.NewProducer(stream.ProducerConfig{Brokers: []string{addr}, Topic: topic, BatchSize: DefaultReplayBatch, BatchTimeout: time.Millisecond, MaxAttempts: 3})
	defer p.Close()
	b.ResetTimer()
	start := time.Now()
	stop := runBench(b, j, p)
	for j.Stats().Pending > 0 {
		time.Sleep(time.Millisecond)
	}
	reportRate(b, start)
	stop()
}
