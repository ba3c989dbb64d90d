package stream

import (
	"context"
	"fmt"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/segmentio/kafka-go"

	"github.com/floodgate-dev/floodgate/pkg/kafkatest"
)

// benchValue is a decision-event-sized payload.
var benchValue = []byte(`{"id":"01J2Z3Y4X5W6V7U8T9S0R1Q2P3","ts":"2026-01-02T03:04:05.678Z","principal":{"kind":"bot","id":"bot_abc123"},"ip":"203.0.113.7","method":"POST","route":"/channels/{channel_id}/messages","allowed":true,"tier":"principal","shadow":false,"cost":1,"limit":50,"remaining":42,"gateway":"gw-1"}`)

func benchMessages(n int) []kafka.Message {
	msgs := make([]kafka.Message, n)
	for i := range msgs {
		msgs[i] = kafka.Message{Key: fmt.Appendf(nil, "principal-%d", i%1000), Value: benchValue}
	}
	return msgs
}

// BenchmarkProducerThroughput publishes b.N messages with the reliable
// Producer (acks=all) in calls of 1000, from 4 goroutines.
func BenchmarkProducerThroughput(b *testing.B) {
	const topic, batch = "bench.produce", 1000
	addr := kafkatest.Start(b, map[string]int32{topic: 6})
	p := NewProducer(ProducerConfig{Brokers: []string{addr}, Topic: topic, BatchSize: batch})
	defer p.Close()
	msgs := benchMessages(batch)
	ctx := context.Background()
	if err := p.Publish(ctx, msgs[:1]...); err != nil { // connect and load metadata
		b.Fatal(err)
	}
	var left atomic.Int64
	left.Store(int64(b.N))
	b.SetBytes(int64(len(benchValue)))
	b.ResetTimer()
	start := time.Now()
	errs := make(chan error, 4)
	for range 4 {
		go func() {
			for {
				n := min(left.Add(-batch)+batch, batch)
				if n <= 0 {
					errs <- nil
					return
				}
				if err := p.Publish(ctx, msgs[:n]...); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	for range 4 {
		if err := <-errs; err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "msgs/s")
}

// BenchmarkAsyncProducerThroughput offers b.N messages to TryPublish and
// waits until Run has written them all.
func BenchmarkAsyncProducerThroughput(b *testing.B) {
	const topic = "bench.async"
	addr := kafkatest.Start(b, map[string]int32{topic: 6})
	reg := prometheus.NewRegistry()
	a := NewAsyncProducer(AsyncProducerConfig{Brokers: []string{addr}, Topic: topic, Registerer: reg})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	msgs := benchMessages(1000)
	b.SetBytes(int64(len(benchValue)))
	b.ResetTimer()
	start := time.Now()
	dropped := 0
	for i := range b.N {
		for !a.TryPublish(msgs[i%len(msgs)]) { // the benchmark offers as fast as the producer takes
			dropped++
			time.Sleep(50 * time.Microsecond)
		}
	}
	cancel()
	if err := <-done; err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "msgs/s")
	b.ReportMetric(float64(dropped), "full-retries")
}

// BenchmarkConsumerThroughput consumes b.N messages from 6 partitions with a
// no-op handler, group join included.
func BenchmarkConsumerThroughput(b *testing.B) {
	const topic = "bench.consume"
	addr := kafkatest.Start(b, map[string]int32{topic: 6, topic + ".dlq": 1})
	p := NewProducer(ProducerConfig{Brokers: []string{addr}, Topic: topic, BatchSize: 1000})
	msgs := benchMessages(1000)
	for left := b.N; left > 0; left -= len(msgs) {
		if err := p.Publish(context.Background(), msgs[:min(left, len(msgs))]...); err != nil {
			b.Fatal(err)
		}
	}
	p.Close()

	var handled atomic.Int64
	all := make(chan struct{})
	cfg := fastConsumerConfig(b, addr, topic, "bench", prometheus.NewRegistry())
	cfg.Logger = slog.New(slog.DiscardHandler)
	cfg.CommitInterval = time.Second
	c, err := NewConsumer(cfg, func(context.Context, kafka.Message) error {
		if handled.Add(1) == int64(b.N) {
			close(all)
		}
		return nil
	})
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(benchValue)))
	b.ResetTimer()
	start := time.Now()
	stop := runConsumer(b, c)
	select {
	case <-all:
	case <-time.After(5 * time.Minute):
		b.Fatalf("consumed %d of %d", handled.Load(), b.N)
	}
	elapsed := time.Since(start)
	b.StopTimer()
	if err := stop(); err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "msgs/s")
}

// BenchmarkAsyncProducerTrickle offers messages a few at a time, as a limiter
// does below saturation: Run writes many small batches spread over 12
// partitions. B/op is the garbage per message (kafka-go sizes every partition
// batch at the writer's BatchSize, see NewAsyncProducer); ns/op is the pacing.
func BenchmarkAsyncProducerTrickle(b *testing.B) {
	const topic = "bench.async.trickle"
	addr := kafkatest.Start(b, map[string]int32{topic: 12})
	a := NewAsyncProducer(AsyncProducerConfig{Brokers: []string{addr}, Topic: topic, Registerer: prometheus.NewRegistry()})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	msgs := benchMessages(1000)
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		if !a.TryPublish(msgs[i%len(msgs)]) {
			b.Fatal("buffer full at a trickle")
		}
		if i%8 == 7 {
			time.Sleep(time.Millisecond) // ~8 messages per 1 ms: batches of a few messages
		}
	}
	cancel()
	if err := <-done; err != nil {
		b.Fatal(err)
	}
}
