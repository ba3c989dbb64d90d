// Package kafkatest starts an in-process Kafka-protocol broker (franz-go's
// kfake) for tests. Clients talk to it over loopback TCP exactly as they talk
// to a real cluster, so tests exercise the real kafka-go code paths: metadata,
// produce with acks, fetch, consumer-group join/sync/heartbeat and offset
// commits.
package kafkatest

import (
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
)

// GroupMinSessionTimeout is the smallest consumer-group session timeout the
// test broker accepts. kfake's default (like Kafka's) is 6s, which would
// make every group test slow; tests should set the kafka-go reader's
// SessionTimeout to at least this value (see DefaultGroupTimings).
const GroupMinSessionTimeout = 100 * time.Millisecond

// Start starts a single-broker cluster on a free loopback port with the given
// topics (name → partition count) and automatic topic creation off, and
// returns its address ("127.0.0.1:port"). The cluster is closed on t.Cleanup.
// Start fails the test if the broker cannot start.
func Start(t testing.TB, topics map[string]int32) string {
	t.Helper()
	_, addr := StartCluster(t, topics)
	return addr
}

// StartCluster is Start, returning the cluster too, for tests that inject
// faults (Cluster.Control, Cluster.Close) or need more options (opts are
// applied after the defaults, so they can override them).
func StartCluster(t testing.TB, topics map[string]int32, opts ...kfake.Opt) (*kfake.Cluster, string) {
	t.Helper()
	all := []kfake.Opt{
		kfake.NumBrokers(1),
		kfake.Ports(0), // 0: the OS picks a free port on 127.0.0.1
		kfake.GroupMinSessionTimeout(GroupMinSessionTimeout),
	}
	for name, partitions := range topics {
		all = append(all, kfake.SeedTopics(partitions, name))
	}
	all = append(all, opts...)
	c, err := kfake.NewCluster(all...)
	if err != nil {
		t.Fatalf("kafkatest: start kfake cluster: %v", err)
	}
	t.Cleanup(c.Close)
	addrs := c.ListenAddrs()
	if len(addrs) == 0 {
		t.Fatalf("kafkatest: kfake cluster has no listen address")
	}
	return c, addrs[0]
}
