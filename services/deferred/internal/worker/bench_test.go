package worker_test

import (
	"fmt"
	"math/rand/v2"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/floodgate-dev/floodgate/pkg/deferred"
	"github.com/floodgate-dev/floodgate/pkg/kafkatest"
	"github.com/floodgate-dev/floodgate/pkg/limiter"
	"github.com/floodgate-dev/floodgate/pkg/stream"
)

// BenchmarkEdgeDefer measures deferrals per second at one edge: a denied
// request on a deferring route made durable (two Redis queue reservations,
// the record, an acks=all write to a Kafka-protocol broker) and answered 202,
// from many concurrent clients, as the middleware calls it.
//
//	go test -run '^$' -bench EdgeDefer -benchtime 2s ./services/deferred/internal/worker/
func BenchmarkEdgeDefer(b *testing.B) {
	rdb := redisClient(b)
	run := fmt.Sprintf("b%d", rand.Uint32())
	topic := "floodgate.deferred.v1." + run
	brokers := kafkatest.Start(b, map[string]int32{topic: 12})
	rs, err := limiter.ParseRules("bench.yaml", []byte(strings.Replace(edgeRules,
		"max_queued: {principal: 2, route: 100}", "max_queued: {principal: 1000000, route: 10000000}", 1)))
	if err != nil {
		b.Fatal(err)
	}
	prod := stream.NewProducer(stream.ProducerConfig{Brokers: []string{brokers}, Topic: topic, BatchSize: 1000, MaxAttempts: 1}) // as the limiter wires it
	defer prod.Close()
	edge, err := deferred.NewEdge(deferred.EdgeConfig{Policy: rs.Deferral, Redis: rdb, Producer: prod, Topic: topic,
		Gateway: "bench", ResultTTL: time.Minute, Registerer: prometheus.NewRegistry()})
	if err != nil {
		b.Fatal(err)
	}
	srv := edgeServer(b, edge)
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 256}}
	b.SetParallelism(16)
	b.ResetTimer()
	start := time.Now()
	b.RunParallel(func(pb *testing.PB) {
		i := 0
		user := fmt.Sprintf("%s-%d", run, rand.Uint32())
		for pb.Next() {
			i++
			req, _ := http.NewRequest("POST", srv.URL+"/orders", strings.NewReader(`{"qty":1}`))
			req.Header.Set("X-Kind", "user")
			req.Header.Set("X-User", fmt.Sprintf("%s-%d", user, i%64))
			resp, err := client.Do(req)
			if err != nil {
				b.Error(err)
				return
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusAccepted {
				b.Errorf("status %d", resp.StatusCode)
				return
			}
		}
	})
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "deferrals/s")
}
