package kafkatest

import (
	"context"
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

func TestStartCreatesTopicsAndNothingElse(t *testing.T) {
	addr := Start(t, map[string]int32{"a": 3, "a.dlq": 1})
	require.Equal(t, map[string]int{"a": 3, "a.dlq": 1}, Partitions(t, addr))

	// Round trip over TCP with acks=all.
	w := &kafka.Writer{Addr: kafka.TCP(addr), RequiredAcks: kafka.RequireAll, BatchTimeout: time.Millisecond}
	defer w.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, w.WriteMessages(ctx, kafka.Message{Topic: "a", Value: []byte("v")}))

	// Automatic topic creation is off.
	require.Error(t, w.WriteMessages(ctx, kafka.Message{Topic: "nope", Value: []byte("v")}))
	require.Equal(t, map[string]int{"a": 3, "a.dlq": 1}, Partitions(t, addr))
}

// A group no consumer has joined yet has nothing committed, as a group
// that has joined and committed nothing; once it commits, its offsets.
func TestCommittedOffsetsOfAGroupNotYetKnown(t *testing.T) {
	addr := Start(t, map[string]int32{"a": 2})
	require.Equal(t, []int64{-1, -1}, CommittedOffsets(t, addr, "not-joined", "a", 2))

	client := &kafka.Client{Addr: kafka.TCP(addr), Timeout: 10 * time.Second}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	g, err := kafka.NewConsumerGroup(kafka.ConsumerGroupConfig{ID: "joined", Brokers: []string{addr}, Topics: []string{"a"}})
	require.NoError(t, err)
	defer g.Close()
	gen, err := g.Next(ctx)
	require.NoError(t, err)
	_, err = client.OffsetCommit(ctx, &kafka.OffsetCommitRequest{GroupID: "joined", GenerationID: int(gen.ID), MemberID: gen.MemberID,
		Topics: map[string][]kafka.OffsetCommit{"a": {{Partition: 1, Offset: 7}}}})
	require.NoError(t, err)
	require.Equal(t, []int64{-1, 7}, CommittedOffsets(t, addr, "joined", "a", 2))
}

func TestStartClusterIsolated(t *testing.T) {
	c1, a1 := StartCluster(t, map[string]int32{"x": 1})
	_, a2 := StartCluster(t, nil)
	require.NotEqual(t, a1, a2, "each call gets its own broker")
	require.NotNil(t, c1)
}

// TestGroupMemberKilledInJoinIsExpired: the test cluster expires a member
// killed while its JoinGroup waited in a rebalance, as the local broker
// program does (kfake alone never does; see ExpectKilledJoinerExpired).
func TestGroupMemberKilledInJoinIsExpired(t *testing.T) {
	ExpectKilledJoinerExpired(t, Start(t, nil))
}

// TestKeeperOfAClosedClusterLeavesTheNextOneAlone: a cluster started on
// the port of a closed one meets the closed cluster's keeper (it runs until
// cleanup), which never hears the new cluster's members: it must not expire
// them. The member heartbeats past the point where it would have.
func TestKeeperOfAClosedClusterLeavesTheNextOneAlone(t *testing.T) {
	const group, session = "restarted", time.Second
	first, addr := StartCluster(t, nil)
	_, port, err := net.SplitHostPort(addr)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	joinAlone := func(addr string) (cl *kgo.Client, member string, gen int32) {
		cl, err := kgo.NewClient(kgo.SeedBrokers(addr))
		require.NoError(t, err)
		t.Cleanup(cl.Close)
		join := kmsg.NewPtrJoinGroupRequest()
		join.Group, join.ProtocolType = group, "consumer"
		join.SessionTimeoutMillis, join.RebalanceTimeoutMillis = int32(session/time.Millisecond), 10_000
		join.Protocols = []kmsg.JoinGroupRequestProtocol{{Name: "range", Metadata: (&kmsg.ConsumerMemberMetadata{}).AppendTo(nil)}}
		resp, err := join.RequestWith(ctx, cl)
		require.NoError(t, err)
		join.MemberID = resp.MemberID // the first join only hands out the id
		resp, err = join.RequestWith(ctx, cl)
		require.NoError(t, err)
		require.NoError(t, kerr.ErrorForCode(resp.ErrorCode))
		sync := kmsg.NewPtrSyncGroupRequest()
		sync.Group, sync.MemberID, sync.Generation = group, resp.MemberID, resp.Generation
		sync.GroupAssignment = []kmsg.SyncGroupRequestGroupAssignment{{MemberID: resp.MemberID, MemberAssignment: []byte{}}}
		sresp, err := sync.RequestWith(ctx, cl)
		require.NoError(t, err)
		require.NoError(t, kerr.ErrorForCode(sresp.ErrorCode))
		return cl, resp.MemberID, resp.Generation
	}

	joinAlone(addr) // the first cluster's keeper now watches the group
	time.Sleep(2 * keeperInterval)
	first.Close()
	_, addr2 := StartCluster(t, nil, kfake.Ports(mustAtoi(t, port)))
	require.Equal(t, addr, addr2)
	cl, member, gen := joinAlone(addr2)
	for end := time.Now().Add(2*session + 6*keeperInterval); time.Now().Before(end); time.Sleep(session / 5) {
		hb := kmsg.NewPtrHeartbeatRequest()
		hb.Group, hb.MemberID, hb.Generation = group, member, gen
		resp, err := hb.RequestWith(ctx, cl)
		require.NoError(t, err)
		require.NoError(t, kerr.ErrorForCode(resp.ErrorCode), "a live member of the second cluster was expired")
	}
}

func mustAtoi(t *testing.T, s string) int {
	n, err := strconv.Atoi(s)
	require.NoError(t, err)
	return n
}
