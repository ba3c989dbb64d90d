package kafkatest

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// ReadPartition reads n messages of one partition from its start, without a
// consumer group, failing the test if they do not all arrive within 20s.
func ReadPartition(t testing.TB, addr, topic string, partition, n int) []kafka.Message {
	t.Helper()
	r := kafka.NewReader(kafka.ReaderConfig{
		Brokers: []string{addr}, Topic: topic, Partition: partition, MaxWait: 100 * time.Millisecond,
	})
	defer r.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	out := make([]kafka.Message, 0, n)
	for len(out) < n {
		m, err := r.FetchMessage(ctx)
		require.NoError(t, err, "read %s/%d: got %d of %d messages", topic, partition, len(out), n)
		out = append(out, m)
	}
	return out
}

// EndOffsets returns the high watermark of partitions 0 .. partitions-1.
func EndOffsets(t testing.TB, addr, topic string, partitions int) []int64 {
	t.Helper()
	out := make([]int64, partitions)
	for p := range partitions {
		conn, err := kafka.DialLeader(context.Background(), "tcp", addr, topic, p)
		require.NoError(t, err)
		last, err := conn.ReadLastOffset()
		conn.Close()
		require.NoError(t, err)
		out[p] = last
	}
	return out
}

// CommittedOffsets returns the group's committed offset (the next to read)
// of partitions 0 .. partitions-1, -1 where nothing is committed. A group
// the broker does not know yet (GROUP_ID_NOT_FOUND: its consumer has not
// joined or committed) has nothing committed: a caller polling for a
// consumer's progress may ask before the consumer has joined.
func CommittedOffsets(t testing.TB, addr, group, topic string, partitions int) []int64 {
	t.Helper()
	ids := make([]int, partitions)
	for i := range ids {
		ids[i] = i
	}
	client := &kafka.Client{Addr: kafka.TCP(addr), Timeout: 10 * time.Second}
	resp, err := client.OffsetFetch(context.Background(), &kafka.OffsetFetchRequest{
		GroupID: group, Topics: map[string][]int{topic: ids},
	})
	require.NoError(t, err)
	out := make([]int64, partitions)
	for i := range out {
		out[i] = -1
	}
	if errors.Is(resp.Error, kafka.GroupIdNotFound) {
		return out
	}
	require.NoError(t, resp.Error)
	for _, p := range resp.Topics[topic] {
		require.NoError(t, p.Error)
		out[p.Partition] = p.CommittedOffset
	}
	return out
}

// DeadAddr is a loopback address nothing listens on: a broker that is down.
func DeadAddr(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	a := ln.Addr().String()
	require.NoError(t, ln.Close())
	return a
}

// Headers maps a message's header keys to their values (the last one of a
// key repeated).
func Headers(hs []kafka.Header) map[string]string {
	m := make(map[string]string, len(hs))
	for _, h := range hs {
		m[h.Key] = string(h.Value)
	}
	return m
}

// Partitions maps each topic the broker at addr has to its partition count.
func Partitions(t testing.TB, addr string) map[string]int {
	t.Helper()
	conn, err := kafka.Dial("tcp", addr)
	require.NoError(t, err)
	defer conn.Close()
	parts, err := conn.ReadPartitions()
	require.NoError(t, err)
	counts := map[string]int{}
	for _, p := range parts {
		counts[p.Topic]++
	}
	return counts
}

// DeleteRecords deletes topic/partition's messages before offset, as
// retention does (the log then starts at offset), failing the test when the
// broker refuses.
func DeleteRecords(t testing.TB, addr, topic string, partition int32, offset int64) {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(addr))
	require.NoError(t, err)
	defer cl.Close()
	req := kmsg.NewPtrDeleteRecordsRequest()
	rt := kmsg.NewDeleteRecordsRequestTopic()
	rt.Topic = topic
	rp := kmsg.NewDeleteRecordsRequestTopicPartition()
	rp.Partition, rp.Offset = partition, offset
	rt.Partitions = append(rt.Partitions, rp)
	req.Topics = append(req.Topics, rt)
	res, err := req.RequestWith(context.Background(), cl)
	require.NoError(t, err)
	require.NoError(t, kerr.ErrorForCode(res.Topics[0].Partitions[0].ErrorCode), "delete %s/%d before %d", topic, partition, offset)
}
