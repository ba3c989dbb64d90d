package envoyrls

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/floodgate-dev/floodgate/pkg/journal"
	"github.com/floodgate-dev/floodgate/pkg/kafkatest"
	"github.com/floodgate-dev/floodgate/pkg/limiter/limitertest"
	"github.com/floodgate-dev/floodgate/pkg/redisx/redistest"
	"github.com/floodgate-dev/floodgate/pkg/stream"
)

// BenchmarkEnvoyDecisionEvents is what a decision event adds to an Envoy
// ShouldRateLimit call in process (gRPC on loopback, the engine, real
// Redis): "off" names no principal, so no event, as
// FLOODGATE_LIMITER_ENVOY_PRINCIPAL_KEYS=none; "to_broker" publishes every
// call's event through the limiter's DurableProducer (journal on) to a
// 12-partition topic of its own on the local broker, drained before the
// clock stops and counted on the topic. cpu-ns/call is this process's CPU
// (caller, gRPC, engine, producer; Redis and the broker are other
// processes); the difference between the two is the event's cost. Pinned:
//
//	taskset -c 1 go test -run '^$' -bench EnvoyDecisionEvents -benchtime 100000x ./pkg/limiter/envoyrls/
func BenchmarkEnvoyDecisionEvents(b *testing.B) {
	const conf = `domain: DOMAIN
descriptors:
  - key: user
    rate_limit: {unit: second, requests_per_unit: 1000000000}
`
	const broker = "127.0.0.1:9092"
	for _, events := range []bool{false, true} {
		name := "off"
		if events {
			name = "to_broker"
		}
		b.Run(name, func(b *testing.B) {
			o := envoyExtOpts{anonymous: !events}
			var p *journal.DurableProducer
			var done chan error
			var topic string
			cancel := func() {}
			if events {
				topic = fmt.Sprintf("bench.envoy.%d", time.Now().UnixNano())
				kafkatest.CreateTopic(b, broker, topic, 12)
				var err error
				p, err = journal.NewDurableProducer(journal.DurableProducerConfig{
					Async: stream.AsyncProducerConfig{Name: "decisions", Brokers: []string{broker}, Topic: topic,
						Logger: slog.New(slog.DiscardHandler), Registerer: prometheus.NewRegistry()},
					Journal: journal.Config{Dir: b.TempDir()},
				})
				if err != nil {
					b.Fatal(err)
				}
				var ctx context.Context
				ctx, cancel = context.WithCancel(context.Background())
				done = make(chan error, 1)
				go func() { done <- p.Run(ctx) }()
				o.publisher, o.topic = p, topic
			}
			defer cancel()
			f := newEnvoyExt(b, conf, o)
			base := redistest.Unique(b, "envoy_events")
			call := func(w string, i int) {
				r, err := f.rls.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: f.domain,
					Descriptors: []*rlcommon.RateLimitDescriptor{limitertest.Descriptor("user", base+"_"+w+"_"+strconv.Itoa(i%1000))}})
				if err != nil || r.GetOverallCode() != rlsv3.RateLimitResponse_OK {
					b.Errorf("should rate limit: %v %v", err, r.GetOverallCode())
				}
			}
			call("warm", 0) // connections, scripts, the producer's metadata
			if events {
				kafkatest.WaitEnd(b, broker, topic, 12, 1)
			}
			var worker atomic.Int64
			b.SetParallelism(16)
			cpu0 := processCPU()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				w := strconv.FormatInt(worker.Add(1), 10)
				for i := 0; pb.Next(); i++ {
					call(w, i)
				}
			})
			if events {
				cancel()
				if err := <-done; err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			b.ReportMetric(float64((processCPU()-cpu0).Nanoseconds())/float64(b.N), "cpu-ns/call")
			if events {
				if got := kafkatest.WaitEnd(b, broker, topic, 12, int64(b.N)+1); got != int64(b.N)+1 {
					b.Fatalf("events on the topic %d, calls %d: %d lost", got, b.N+1, int64(b.N)+1-got)
				}
			}
		})
	}
}

// processCPU is the user+system CPU time this process has used.
func processCPU() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
