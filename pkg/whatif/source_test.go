package whatif

import (
	"context"
	"net/netip"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/require"

	"github.com/floodgate-dev/floodgate/pkg/events"
	"github.com/floodgate-dev/floodgate/pkg/kafkatest"
)

// Read keeps exactly the decisions whose ts is in [from, to), in ts order, and
// starts each partition at the offset ListOffsets gives for from − Slack (the
// broker supports ListOffsets by timestamp): decisions well before the range
// are not even scanned.
func TestReadKeepsTheRangeAndSeeksByTime(t *testing.T) {
	const topic = "whatif-read"
	broker := kafkatest.Start(t, map[string]int32{topic: 3})
	base := time.Date(2026, 11, 20, 10, 0, 0, 0, time.UTC)
	var ds []events.Decision
	ip := netip.MustParseAddr("192.0.2.1")
	for i := range 3000 { // one decision every 2 s over 100 minutes
		p := events.Principal{Kind: events.PrincipalBot, ID: []string{"a", "b", "c", "d"}[i%4]}
		ds = append(ds, decision(i, base.Add(time.Duration(i)*2*time.Second), p, ip, "GET", "/x", true, ""))
	}
	// A message that is not a decision inside the range is skipped and counted.
	from, to := base.Add(40*time.Minute), base.Add(50*time.Minute)
	publish(t, broker, topic, ds[:1350])
	w := &kafka.Writer{Addr: kafka.TCP(broker), Topic: topic, Balancer: &kafka.Hash{}, RequiredAcks: kafka.RequireAll, BatchTimeout: time.Millisecond}
	require.NoError(t, w.WriteMessages(context.Background(), kafka.Message{Key: []byte("bot:a"), Value: []byte(`{"type":"nope"}`), Time: base.Add(45 * time.Minute)}))
	require.NoError(t, w.Close())
	publish(t, broker, topic, ds[1350:])
	src := &Source{Client: client(broker), Topic: topic, Slack: time.Minute}
	got, st, err := src.Read(context.Background(), from, to)
	require.NoError(t, err)
	require.Len(t, got, 300, "ten minutes at one per 2 s")
	require.Equal(t, from, got[0].TS)
	require.Equal(t, to.Add(-2*time.Second), got[len(got)-1].TS)
	for i := 1; i < len(got); i++ {
		require.False(t, got[i].TS.Before(got[i-1].TS), "ts order")
	}
	require.Equal(t, 3, st.Partitions)
	require.Less(t, st.Scanned, 400, "scanning began near from − slack and stopped near to + slack, not at the partition ends")
	require.Equal(t, 1, st.Undecoded)
	require.Equal(t, st.Scanned-len(got)-1, st.OutOfRange)

	t.Run("too many", func(t *testing.T) {
		src := &Source{Client: client(broker), Topic: topic, MaxEvents: 100}
		_, _, err := src.Read(context.Background(), from, to)
		require.ErrorIs(t, err, ErrTooMany)
	})
	t.Run("empty range and bad range", func(t *testing.T) {
		got, _, err := src.Read(context.Background(), base.Add(-time.Hour), base.Add(-30*time.Minute))
		require.NoError(t, err)
		require.Empty(t, got)
		_, _, err = src.Read(context.Background(), to, from)
		require.ErrorContains(t, err, "is not before")
	})
}
