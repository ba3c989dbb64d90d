package detector

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/require"

	"github.com/floodgate-dev/floodgate/pkg/events"
	"github.com/floodgate-dev/floodgate/pkg/redisx/redistest"
)

type fixedLookup struct {
	off int64
	at  time.Time
}

func (f *fixedLookup) OffsetAt(_ context.Context, _ int, t time.Time) (int64, error) {
	f.at = t
	return f.off, nil
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
