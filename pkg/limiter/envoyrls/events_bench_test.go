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
	"github.com/segmentio/kafka-go"

	"github.com/floodgate-dev/floodgate/pkg/journal"
	"github.com/floodgate-dev/floodgate/pkg/kafkatest"
	"github.com/floodgate-dev/floodgate/pkg/limiter/limitertest"
	"github.com/floodgate-dev/floodgate/pkg/limiter/server"
	"github.com/floodgate-dev/floodgate/pkg/redisx/redistest"
	"github.com/floodgate-dev/floodgate/pkg/stream"
)

// BenchmarkEnvoyDecisionEvents is what a decision event adds to an Envoy
// ShouldRateLimit call in process (gRPC on loopback, the engine, real
// Redis):
//
//   - "off" names no principal, so no event, as
//     FLOODGATE_LIMITER_ENVOY_PRINCIPAL_KEYS=none — and no penalty read
//     either, so off against to_broker is an upper bound on the event;
//   - "dropped" names the principal (the penalty read kept) and encodes
//     every call's event, into an Appender that keeps none: the event
//     minus its batching and delivery. Built with -tags floodgate_noevents
//     (server.Publishing false) Emit returns at once, so "dropped" is then
//     the call with its penalty read and without its event — the like for
//     like "off";
//   - "to_broker" publishes every call's event through the limiter's
//     DurableProducer (journal on) to a 12-partition topic of its own on the
//     local broker, drained before the clock stops and counted on the topic
//     (not run with floodgate_noevents: nothing would reach the broker).
//
// cpu-ns/call is this process's CPU (caller, gRPC, engine, producer; Redis
// and the broker are other processes). Pinned, alternating the two builds:
//
//	taskset -c 1 go test -run '^$' -bench EnvoyDecisionEvents -benchtime 100000x -count 10 ./pkg/limiter/envoyrls/
//	taskset -c 1 go test -tags floodgate_noevents -run '^$' -bench EnvoyDecisionEvents/dropped -benchtime 100000x -count 10 ./pkg/limiter/envoyrls/
func BenchmarkEnvoyDecisionEvents(b *testing.B) {
	const conf = `domain: DOMAIN
descriptors:
  - key: user
    rate_limit: {unit: second, requests_per_unit: 1000000000}
`
	const broker = "127.0.0.1:9092"
	for _, v := range []struct {
		name           string
		named, publish bool
	}{{"off", false, false}, {"dropped", true, false}, {"to_broker", true, true}} {
		events := v.publish
		b.Run(v.name, func(b *testing.B) {
			if events && !server.Publishing {
				b.Skip("built with floodgate_noevents: no event reaches the broker")
			}
			o := envoyExtOpts{anonymous: !v.named}
			if v.named && !events {
				o.publisher = dropAppender{}
			}
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

// dropAppender takes every decision event, encoded, and keeps none.
type dropAppender struct{}

var _ server.Appender = dropAppender{}

func (dropAppender) TryPublish(kafka.Message) bool { return true }
func (dropAppender) TryAppend(kafka.Message) bool  { return true }

// processCPU is the user+system CPU time this process has used.
func processCPU() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
