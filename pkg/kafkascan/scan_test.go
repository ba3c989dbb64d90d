package kafkascan

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/require"

	"github.com/floodgate-dev/floodgate/pkg/kafkatest"
)

// fixture is a topic of two partitions: partition 0 holds ten messages
// produced a minute apart from base (key "0", value "m0".."m9"), partition 1
// three (key "1", value "n0".."n2", header h: "h0".."h2") from base.
type fixture struct {
	c     *kafka.Client
	topic string
	base  time.Time
}

func newFixture(t *testing.T) fixture {
	t.Helper()
	const topic = "kafkascan"
	broker := kafkatest.Start(t, map[string]int32{topic: 2})
	base := time.Date(2026, 11, 20, 10, 0, 0, 0, time.UTC)
	w := &kafka.Writer{Addr: kafka.TCP(broker), Topic: topic, RequiredAcks: kafka.RequireAll, BatchTimeout: time.Millisecond,
		Balancer: kafka.BalancerFunc(func(m kafka.Message, _ ...int) int { return int(m.Key[0] - '0') })}
	var msgs []kafka.Message
	for i := range 10 {
		msgs = append(msgs, kafka.Message{Key: []byte("0"), Value: fmt.Appendf(nil, "m%d", i), Time: base.Add(time.Duration(i) * time.Minute)})
	}
	for i := range 3 {
		msgs = append(msgs, kafka.Message{Key: []byte("1"), Value: fmt.Appendf(nil, "n%d", i), Time: base.Add(time.Duration(i) * time.Minute),
			Headers: []kafka.Header{{Key: "h", Value: fmt.Appendf(nil, "h%d", i)}}})
	}
	require.NoError(t, w.WriteMessages(context.Background(), msgs...))
	require.NoError(t, w.Close())
	return fixture{c: &kafka.Client{Addr: kafka.TCP(broker), Timeout: 10 * time.Second}, topic: topic, base: base}
}

// values scans [from, to) of partition 0, stopping after stop messages (0: never).
func (f fixture) values(t *testing.T, from, to int64, stop int) []string {
	t.Helper()
	var got []string
	require.NoError(t, Scan(context.Background(), f.c, f.topic, 0, from, to, func(m kafka.Message) bool {
		require.Equal(t, "0", string(m.Key), "the key is read")
		require.Equal(t, int64(len(got))+from, m.Offset, "in offset order")
		require.Equal(t, f.base.Add(time.Duration(m.Offset)*time.Minute), m.Time.UTC(), "the produce time")
		got = append(got, string(m.Value))
		return stop == 0 || len(got) < stop
	}))
	return got
}

func TestScan(t *testing.T) {
	f := newFixture(t)
	for _, tc := range []struct {
		name     string
		from, to int64
		stop     int
		want     []string
	}{
		{"a range in the middle", 3, 6, 0, []string{"m3", "m4", "m5"}},
		{"the whole partition", 0, 10, 0, []string{"m0", "m1", "m2", "m3", "m4", "m5", "m6", "m7", "m8", "m9"}},
		{"past the end stops at the end", 8, 1000, 0, []string{"m8", "m9"}},
		{"fn false stops", 2, 10, 2, []string{"m2", "m3"}},
		{"an empty range reads nothing", 5, 5, 0, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			require.Equal(t, tc.want, f.values(t, tc.from, tc.to, tc.stop))
		})
	}
	t.Run("headers are read and outlive the fetch", func(t *testing.T) {
		var got []kafka.Header
		require.NoError(t, Scan(context.Background(), f.c, f.topic, 1, 0, 3, func(m kafka.Message) bool {
			got = append(got, m.Headers...)
			return true
		}))
		require.Equal(t, []kafka.Header{{Key: "h", Value: []byte("h0")}, {Key: "h", Value: []byte("h1")}, {Key: "h", Value: []byte("h2")}}, got)
	})
	t.Run("a missing topic is an error", func(t *testing.T) {
		err := Scan(context.Background(), f.c, "nope", 0, 0, 10, func(kafka.Message) bool { return true })
		require.ErrorContains(t, err, "fetch nope/0 at 0")
	})
}

func TestAll(t *testing.T) {
	f := newFixture(t)
	read := func(stop int) []string {
		var got []string
		require.NoError(t, All(context.Background(), f.c, f.topic, func(m kafka.Message) bool {
			got = append(got, fmt.Sprintf("%d:%s", m.Partition, m.Value))
			return stop == 0 || len(got) < stop
		}))
		return got
	}
	require.Equal(t, []string{"0:m0", "0:m1", "0:m2", "0:m3", "0:m4", "0:m5", "0:m6", "0:m7", "0:m8", "0:m9", "1:n0", "1:n1", "1:n2"}, read(0),
		"every partition in order, each to its end")
	require.Equal(t, []string{"0:m0", "0:m1", "0:m2"}, read(3), "fn false stops, the next partition unread")
	err := All(context.Background(), f.c, "nope", func(kafka.Message) bool { return true })
	require.Error(t, err, "a missing topic")
}

func TestPartitionsSinceAndBounds(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	parts, err := Partitions(ctx, f.c, f.topic)
	require.NoError(t, err)
	require.Equal(t, []int{0, 1}, parts)
	_, err = Partitions(ctx, f.c, "nope")
	require.Error(t, err)

	for _, tc := range []struct {
		name string
		at   time.Time
		want []Range
	}{
		{"before everything", f.base.Add(-time.Hour), []Range{{0, 0, 0, 10}, {1, 0, 0, 3}}},
		{"between messages", f.base.Add(150 * time.Second), []Range{{0, 0, 3, 10}, {1, 0, 3, 3}}},
		{"on a message", f.base.Add(7 * time.Minute), []Range{{0, 0, 7, 10}, {1, 0, 3, 3}}},
		{"after everything", f.base.Add(time.Hour), []Range{{0, 0, 10, 10}, {1, 0, 3, 3}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Since(ctx, f.c, f.topic, tc.at)
			require.NoError(t, err)
			require.Equal(t, tc.want, got)
		})
	}

	first, end, err := Bounds(ctx, f.c, f.topic, 1)
	require.NoError(t, err)
	require.Equal(t, [2]int64{0, 3}, [2]int64{first, end})
	_, _, err = Bounds(ctx, f.c, f.topic, 7)
	require.Error(t, err, "a partition the topic does not have")
}

// TestScanExpired: offsets retention deleted (DeleteRecords moves the log
// start) fail with ErrExpired instead of being skipped; the rest still scans.
func TestScanExpired(t *testing.T) {
	const topic = "kafkascan-expired"
	broker := kafkatest.Start(t, map[string]int32{topic: 1})
	w := &kafka.Writer{Addr: kafka.TCP(broker), Topic: topic, RequiredAcks: kafka.RequireAll, BatchTimeout: time.Millisecond}
	var msgs []kafka.Message
	for i := range 5 {
		msgs = append(msgs, kafka.Message{Value: fmt.Appendf(nil, "e%d", i)})
	}
	require.NoError(t, w.WriteMessages(context.Background(), msgs...))
	require.NoError(t, w.Close())

	kafkatest.DeleteRecords(t, broker, topic, 0, 3)

	c := &kafka.Client{Addr: kafka.TCP(broker), Timeout: 10 * time.Second}
	first, _, err := Bounds(context.Background(), c, topic, 0)
	require.NoError(t, err)
	require.EqualValues(t, 3, first, "the log starts at 3")
	err = Scan(context.Background(), c, topic, 0, 1, 5, func(kafka.Message) bool { return true })
	require.ErrorIs(t, err, ErrExpired)
	var got []string
	require.NoError(t, Scan(context.Background(), c, topic, 0, 3, 5, func(m kafka.Message) bool {
		got = append(got, string(m.Value))
		return true
	}))
	require.Equal(t, []string{"e3", "e4"}, got)
}
