package server

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/floodgate-dev/floodgate/pkg/events"
	"github.com/floodgate-dev/floodgate/pkg/journal"
	"github.com/floodgate-dev/floodgate/pkg/kafkatest"
	"github.com/floodgate-dev/floodgate/pkg/limiter"
	"github.com/floodgate-dev/floodgate/pkg/promtest"
	"github.com/floodgate-dev/floodgate/pkg/stream"
)

// benchBroker is the local Kafka-protocol broker every service uses (make up).
const benchBroker = "127.0.0.1:9092"

// BenchmarkDecisionEventToBroker is what a decision event costs the limiter,
// end to end: from the publisher call (a decision's event built, its id
// minted, Emit) to the events acknowledged by the local broker, through the
// production wiring (a DurableProducer with its journal, as the limiter
// binary and the embedded limiter build it) on a 12-partition topic of its
// own. The clock stops once the producer has drained, so ns/op and
// cpu-ns/event (the process's user+system CPU, every goroutine: the caller,
// the producer, kafka-go's writer) include delivery; the broker is another
// process and is not counted. Events a burst sends to the journal (the record
// batcher full) are replayed by its drainer before the clock stops
// (journaled/event: their share). It fails if an event is missing from the topic
// (events produced vs events on the topic, as peerbench counts).
// "burst" publishes as fast as it can (full batches); "30k_per_s" paces the
// events at 30,000/s, about the limiter's pinned gRPC rate, so batches hold
// what 5 ms of traffic brings a partition — the per-request cost counts.
// Pinned:
//
//	taskset -c 1 go test -run '^$' -bench DecisionEventToBroker -benchtime 200000x -benchmem ./pkg/limiter/server/
func BenchmarkDecisionEventToBroker(b *testing.B) {
	b.Run("burst", func(b *testing.B) { benchEventsToBroker(b, 0) })
	b.Run("30k_per_s", func(b *testing.B) { benchEventsToBroker(b, 30_000) })
}

// benchEventsToBroker publishes b.N events, rate a second (0: unpaced).
func benchEventsToBroker(b *testing.B, rate int) {
	const partitions = 12
	topic := fmt.Sprintf("bench.decisions.%d", time.Now().UnixNano())
	kafkatest.CreateTopic(b, benchBroker, topic, partitions)
	reg := prometheus.NewRegistry()
	log := slog.New(slog.DiscardHandler)
	p, err := journal.NewDurableProducer(journal.DurableProducerConfig{
		Async:   stream.AsyncProducerConfig{Name: "decisions", Brokers: []string{benchBroker}, Topic: topic, Logger: log, Registerer: reg},
		Journal: journal.Config{Dir: b.TempDir()},
	})
	if err != nil {
		b.Fatal(err)
	}
	s := New(Config{Publisher: p, Topic: topic, Gateway: "bench", Logger: log, Registry: reg})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()

	reqs := make([]limiter.Request, 1000)
	for i := range reqs {
		reqs[i] = limiter.Request{Principal: events.Principal{Kind: events.PrincipalBot, ID: fmt.Sprintf("bot_%06d", i)},
			IP: netip.AddrFrom4([4]byte{203, 0, 113, byte(i)}), Method: "POST", Route: "/channels/{channel_id}/messages"}
	}
	res := limiter.Result{Allowed: true, Tier: events.TierPrincipal, Rule: "p", Limit: 100, Remaining: 42, Penalty: 1, Scale: 1, Cost: 1}
	emit := func(i int) {
		r := res
		r.Now = time.Now().UTC()
		ev := DecisionEvent(NewDecisionID(), "bench", reqs[i%len(reqs)], r)
		s.Emit(ctx, &ev)
	}
	// Warm up: connections and metadata, then count from here.
	emit(0)
	kafkatest.WaitEnd(b, benchBroker, topic, partitions, 1)

	b.ReportAllocs()
	cpu0 := processCPU()
	b.ResetTimer()
	if rate == 0 {
		for i := range b.N {
			emit(i)
		}
	} else {
		// Each millisecond, the events due by then.
		start := time.Now()
		for i := 0; i < b.N; {
			due := min(int(time.Since(start).Microseconds()*int64(rate)/1e6)+1, b.N)
			for ; i < due; i++ {
				emit(i)
			}
			time.Sleep(time.Millisecond)
		}
	}
	// Events the record batcher had no room for went to the journal, whose
	// drainer replays them while Run runs (on one core a burst outruns the
	// writer): they are delivered, and their replay is part of the cost.
	for wait := time.Now().Add(2 * time.Minute); ; time.Sleep(10 * time.Millisecond) {
		st := p.Journal().Stats()
		if st.Pending == 0 && st.Queued == 0 {
			break
		}
		if time.Now().After(wait) {
			b.Fatalf("the journal still holds %d events 2 min after the last was published", st.Pending)
		}
	}
	cancel()
	if err := <-done; err != nil {
		b.Fatal(err)
	}
	b.StopTimer()
	cpu := processCPU() - cpu0
	b.ReportMetric(float64(cpu.Nanoseconds())/float64(b.N), "cpu-ns/event")
	b.ReportMetric(promtest.Value(b, reg, "floodgate_stream_journaled_total", nil)/float64(b.N), "journaled/event")
	got := kafkatest.WaitEnd(b, benchBroker, topic, partitions, int64(b.N)+1)
	if got != int64(b.N)+1 {
		b.Fatalf("events on the topic %d, produced %d: %d lost", got, b.N+1, int64(b.N)+1-got)
	}
}

// processCPU is the user+system CPU time this process has used.
func processCPU() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
