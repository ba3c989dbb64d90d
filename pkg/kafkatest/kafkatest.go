// Package kafkatest starts an in-process Kafka-protocol broker (franz-go's
// kfake) for tests. Clients talk to it over loopback TCP exactly as they talk
// to a real cluster, so tests exercise the real kafka-go code paths: metadata,
// produce with acks, fetch, consumer-group join/sync/heartbeat and offset
// commits.
package kafkatest

import (
	"log/slog"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/floodgate-dev/floodgate/pkg/kafkatest/sessionkeeper"
)

// GroupMinSessionTimeout is the smallest consumer-group session timeout the
// test broker accepts. kfake's default (like Kafka's) is 6s, which would
// make every group test slow; tests should set the kafka-go reader's
// SessionTimeout to at least this value (see DefaultGroupTimings).
const GroupMinSessionTimeout = 100 * time.Millisecond

// keeperInterval is how often the session keeper of a test cluster looks
// for group members kfake never times out. It only delays an expiry due
// after twice the member's session timeout, so it need not be as short as
// GroupMinSessionTimeout; a sweep is a DescribeGroups request.
const keeperInterval = 250 * time.Millisecond

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
//
// The cluster runs a session keeper (package sessionkeeper), as the local
// broker program does: a consumer SIGKILLed while its JoinGroup waits in a
// rebalance is expired after twice its session timeout, which kfake alone
// never does. The keeper logs to t's output at warn level, and stops at
// cleanup, before the cluster closes. Its client is plaintext and
// anonymous: on a cluster with TLS or SASL it expires nobody. A cluster
// closed by the test keeps its keeper until cleanup; one started again on
// its port is left alone by it (see sessionkeeper.Start).
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
	log := slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn}))
	stop, err := sessionkeeper.Start(c, log, keeperInterval, kgo.ClientID("kafkatest-sessions"))
	if err != nil {
		t.Fatalf("kafkatest: %v", err)
	}
	t.Cleanup(stop) // runs before c.Close: cleanups run last added first
	return c, addrs[0]
}
