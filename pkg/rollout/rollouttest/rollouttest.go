// Package rollouttest gives tests a rules topic of their own on the local
// Kafka-protocol broker (FLOODGATE_KAFKA_BROKERS, default 127.0.0.1:9092):
// one compacted partition, like migration 0003's, under a unique name,
// deleted when the test ends. A broker that cannot be reached fails the test.
package rollouttest

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/floodgate-dev/floodgate/pkg/config"
	"github.com/floodgate-dev/floodgate/pkg/rollout"
)

var seq atomic.Int64

// Brokers are the local broker addresses.
func Brokers() []string {
	b := os.Getenv("FLOODGATE_KAFKA_BROKERS")
	if b == "" {
		b = config.DefaultKafkaBrokers
	}
	return strings.Split(b, ",")
}

// Topic creates a unique rules topic and returns the brokers and its name.
// Under -short (make test-unit, no stack) it skips the test.
func Topic(t testing.TB) ([]string, string) {
	t.Helper()
	if testing.Short() {
		t.Skip("needs the local stack's broker: `make test` runs it (`make test-unit` is -short, no stack)")
	}
	brokers := Brokers()
	name := fmt.Sprintf("test.rules.v1.%d.%d.%d", os.Getpid(), time.Now().UnixNano(), seq.Add(1))
	c := &kafka.Client{Addr: kafka.TCP(brokers...), Timeout: 10 * time.Second}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	res, err := c.CreateTopics(ctx, &kafka.CreateTopicsRequest{Topics: []kafka.TopicConfig{{Topic: name, NumPartitions: 1, ReplicationFactor: 1,
		ConfigEntries: []kafka.ConfigEntry{{ConfigName: "cleanup.policy", ConfigValue: "compact"}}}}})
	if err != nil {
		t.Fatalf("rollouttest: create topic %s on %v (is the local stack up? make up): %v", name, brokers, err)
	}
	if err := res.Errors[name]; err != nil {
		t.Fatalf("rollouttest: create topic %s: %v", name, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, _ = c.DeleteTopics(ctx, &kafka.DeleteTopicsRequest{Topics: []string{name}})
	})
	return brokers, name
}

// OpenTopic creates a unique rules topic (as Topic) and opens it on the local
// brokers, closed when the test ends; it returns the topic and its name.
func OpenTopic(t testing.TB) (*rollout.Topic, string) {
	t.Helper()
	brokers, name := Topic(t)
	topic := rollout.NewTopic(brokers, nil, name, nil)
	t.Cleanup(func() { _ = topic.Close() })
	return topic, name
}
