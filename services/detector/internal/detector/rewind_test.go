package detector

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/require"

	"github.com/floodgate-dev/floodgate/pkg/events"
	"github.com/floodgate-dev/floodgate/pkg/kafkatest"
	"github.com/floodgate-dev/floodgate/pkg/redisx/redistest"
	"github.com/floodgate-dev/floodgate/pkg/stacktest"
)

type fixedLookup struct {
	off int64
	at  time.Time
}

func (f *fixedLookup) OffsetAt(_ context.Context, _ int, t time.Time) (int64, error) {
	f.at = t
	return f.off, nil
}

func (f *fixedLookup) TimeAt(context.Context, int, int64) (time.Time, error) { return time.Time{}, nil }

// backlogLookup is a partition whose message i was produced at base + i s.
type backlogLookup struct {
	base time.Time
	end  int64
}

func (b *backlogLookup) OffsetAt(_ context.Context, _ int, t time.Time) (int64, error) {
	off := int64(t.Sub(b.base) / time.Second)
	if off >= b.end {
		return -1, nil // nothing at or after t
	}
	return max(off, 0), nil
}

func (b *backlogLookup) TimeAt(_ context.Context, _ int, off int64) (time.Time, error) {
	return b.base.Add(time.Duration(off) * time.Second), nil
}

// TestRewindDuringABacklog: the group's committed point is an hour behind
// the wall clock (a backlog). The rewind is anchored at the last handled
// message's time, so the new owner rebuilds the window before it instead of
// starting cold (on main the lookup for now − rewind lay past the committed
// offset and no rewind happened).
func TestRewindDuringABacklog(t *testing.T) {
	now := time.Now().UTC().Truncate(time.Second)
	d := newTestDetector(t, &flakyPublisher{}, func(c *Config) { c.Now = func() time.Time { return now } })
	lookup := &backlogLookup{base: now.Add(-2 * time.Hour), end: 7200}
	committed := int64(3600) // produced at now − 1 h
	start, err := d.Rewind(context.Background(), lookup, 2, committed, 5*time.Minute)
	require.NoError(t, err)
	require.Equal(t, committed-1-300, start, "one window before the last handled message")
}

func TestRewindRebuildsStateWithoutRepeatingEffects(t *testing.T) {
	pub := &flakyPublisher{}
	now := time.Now().UTC().Truncate(time.Millisecond)
	d := newTestDetector(t, pub, func(c *Config) { c.Now = func() time.Time { return now } })
	lookup := &fixedLookup{off: 0}
	// Committed at 300: the 300 events before it were handled before the restart.
	start, err := d.Rewind(context.Background(), lookup, 4, 300, 5*time.Minute)
	require.NoError(t, err)
	require.Equal(t, int64(0), start, "rewound to the first offset inside the window")
	require.Equal(t, now.Add(-5*time.Minute), lookup.at)

	bot := events.Principal{Kind: events.PrincipalBot, ID: redistest.Unique(t, "rewind")}
	for i := 0; i < 400; i++ {
		ev := decision(bot, now.Add(-10*time.Second).Add(time.Duration(i)*10*time.Millisecond), "203.0.113.9", "/a")
		ev.ID = fmt.Sprintf("e%d", i)
		require.NoError(t, d.Handle(context.Background(), kafka.Message{Partition: 4, Offset: int64(i), Value: encodeDecision(t, ev)}))
	}
	// 100/s against a floor of 2 × 5 crosses within the first 300 events: that
	// detection was acted on before the restart and is not repeated; the rebuilt
	// window is full, so the cool-down it set holds for the rest.
	require.Empty(t, pub.msgs)

	// Without a rewind (a blind restart) the events after the commit point
	// start from an empty window and the same attack is detected a second
	// time, under another window and so another abuse id.
	blind := newTestDetector(t, &flakyPublisher{}, nil)
	pub2 := blind.cfg.Publisher.(*flakyPublisher)
	for i := 300; i < 400; i++ {
		ev := decision(bot, now.Add(-10*time.Second).Add(time.Duration(i)*10*time.Millisecond), "203.0.113.9", "/a")
		ev.ID = fmt.Sprintf("e%d", i)
		require.NoError(t, blind.Handle(context.Background(), kafka.Message{Partition: 4, Offset: int64(i), Value: encodeDecision(t, ev)}))
	}
	require.Len(t, pub2.msgs, 1, "a blind restart repeats the detection")
}

// TestKafkaOffsetsTimeAt reads a message's timestamp back from a real
// (in-process, Kafka-protocol) broker, as the backlog rewind does.
func TestKafkaOffsetsTimeAt(t *testing.T) {
	stacktest.Needs(t, "starts a broker")
	broker := kafkatest.Start(t, map[string]int32{"rewind-times": 1})
	w := &kafka.Writer{Addr: kafka.TCP(broker), Topic: "rewind-times", RequiredAcks: kafka.RequireAll, BatchTimeout: time.Millisecond}
	defer w.Close()
	base := time.Now().UTC().Add(-time.Hour).Truncate(time.Millisecond)
	for i := range 3 {
		require.NoError(t, w.WriteMessages(context.Background(), kafka.Message{Value: []byte{byte(i)}, Time: base.Add(time.Duration(i) * time.Minute)}))
	}
	k := &KafkaOffsets{Client: &kafka.Client{Addr: kafka.TCP(broker), Timeout: 5 * time.Second}, Topic: "rewind-times"}
	got, err := k.TimeAt(context.Background(), 0, 1)
	require.NoError(t, err)
	require.True(t, got.Equal(base.Add(time.Minute)), "got %s", got)
	off, err := k.OffsetAt(context.Background(), 0, base.Add(90*time.Second))
	require.NoError(t, err)
	require.Equal(t, int64(2), off)
}
