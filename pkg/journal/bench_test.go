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
)

// benchDecision is a decision.v1-sized message (~330 bytes of value plus
// CloudEvents headers).
func benchDecision(i int) kafka.Message {
	id := fmt.Sprintf("0192f3a4-7b1c-7d2e-9f00-%012d", i)
	return kafka.Message{
		Topic: "floodgate.decisions.v1",
		Key:   fmt.Appendf(nil, "bot:bot_%06d", i%10000),
		Value: fmt.Appendf(nil, `{"id":%q,"ts":"2026-01-01T00:00:00.000Z","principal":{"kind":"bot","id":"bot_%06d"},"ip":"203.0.113.7","method":"POST","route":"/channels/{channel_id}/messages","resource":"channel:123","allowed":true,"tier":"principal","shadow":false,"cost":1,"limit":50,"remaining":49,"gateway":"bench"}`,
			id, i%10000),
		Headers: stream.CloudEventHeaders("decision.v1", id, "floodgate/limiter/bench", time.Unix(1767225600, 0)),
	}
}

// BenchmarkJournalAppend appends b.N decision events in batches, under each
// fsync policy; MB/s counts framed record bytes.
//
//	go test -run '^$' -bench BenchmarkJournalAppend -benchtime 200000x ./pkg/journal/
func BenchmarkJournalAppend(b *testing.B) {
	msgs := make([]kafka.Message, 1000)
	for i := range msgs {
		msgs[i] = benchDecision(i)
	}
	recordBytes := len(appendRecord(nil, &msgs[0]))
	for _, sync := range []SyncPolicy{SyncBatch, SyncInterval} {
		for _, batch := range []int{1, 100, 1000} {
			b.Run(fmt.Sprintf("sync=%s/batch=%d", sync, batch), func(b *testing.B) {
				j, err := Open(Config{
					Dir: b.TempDir(), Sync: sync, SyncInterval: 100 * time.Millisecond,
					Logger: slog.New(slog.DiscardHandler), Registerer: prometheus.NewRegistry(),
				})
				if err != nil {
					b.Fatal(err)
				}
				ctx, cancel := context.WithCancel(context.Background())
				done := make(chan error, 1)
				go func() { done <- j.Run(ctx, nil) }() // the interval syncer
				b.SetBytes(int64(recordBytes))
				b.ResetTimer()
				start := time.Now()
				for left := b.N; left > 0; left -= batch {
					if err := j.Append(msgs[:min(batch, left)]); err != nil {
						b.Fatal(err)
					}
				}
				elapsed := time.Since(start)
				b.StopTimer()
				b.ReportMetric(float64(b.N)/elapsed.Seconds(), "msgs/s")
				cancel()
				if err := <-done; err != nil {
					b.Fatal(err)
				}
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
	msgs := make([]kafka.Message, 1000)
	for i := range msgs {
		msgs[i] = benchDecision(i)
	}
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
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- j.Run(ctx, nil) }() // the writer only: Kafka is "down"
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
			cancel()
			if err := <-done; err != nil {
				b.Fatal(err)
			}
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
	j, err := Open(Config{Dir: b.TempDir(), MaxBytes: 4 << 30, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		b.Fatal(err)
	}
	msgs := make([]kafka.Message, 1000)
	for i := range msgs {
		msgs[i] = benchDecision(i)
	}
	for left := b.N; left > 0; left -= len(msgs) {
		if err := j.Append(msgs[:min(len(msgs), left)]); err != nil {
			b.Fatal(err)
		}
	}
	p := stream.NewProducer(stream.ProducerConfig{Brokers: []string{addr}, Topic: topic, BatchSize: DefaultReplayBatch, BatchTimeout: time.Millisecond, MaxAttempts: 3})
	defer p.Close()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	b.ResetTimer()
	start := time.Now()
	go func() { done <- j.Run(ctx, p) }()
	for j.Stats().Pending > 0 {
		time.Sleep(time.Millisecond)
	}
	elapsed := time.Since(start)
	b.StopTimer()
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "msgs/s")
	cancel()
	if err := <-done; err != nil {
		b.Fatal(err)
	}
}
