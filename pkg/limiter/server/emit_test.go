package server

import (
	"bytes"
	"context"
	"log/slog"
	"net/netip"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/require"

	"github.com/floodgate-dev/floodgate/pkg/events"
	"github.com/floodgate-dev/floodgate/pkg/kafkatest"
	"github.com/floodgate-dev/floodgate/pkg/limiter"
)

// copyAppender is an Appender that keeps a copy of what TryAppend gives it
// (the caller reuses its buffers), or nothing when discard is set.
type copyAppender struct {
	kafkatest.Capture
	discard  bool
	appended []kafka.Message
}

func (c *copyAppender) TryAppend(m kafka.Message) bool {
	if c.discard {
		return true
	}
	m.Key, m.Value = bytes.Clone(m.Key), bytes.Clone(m.Value)
	hs := make([]kafka.Header, len(m.Headers))
	for i, h := range m.Headers {
		hs[i] = kafka.Header{Key: h.Key, Value: bytes.Clone(h.Value)}
	}
	m.Headers = hs
	c.appended = append(c.appended, m)
	return true
}

func emitEvent(i int) events.Decision {
	res := limiter.Result{Allowed: i%3 != 0, Tier: events.TierPrincipal, Rule: "p", Limit: 100, Remaining: 42, Penalty: 1, Scale: 1, Cost: 1,
		Now: time.Date(2026, 11, 29, 11, 0, 0, i*1e6, time.UTC)}
	req := limiter.Request{Principal: events.Principal{Kind: events.PrincipalBot, ID: "bot_" + string(rune('a'+i%26))},
		IP: netip.AddrFrom4([4]byte{203, 0, 113, byte(i)}), Method: "POST", Route: "/channels/{channel_id}/messages"}
	return DecisionEvent(NewDecisionID(), "emit-test", req, res)
}

// Through an Appender, Emit hands over the message TryPublish would get
// (same topic, key, value, headers; the record's time is the event's ts),
// every event through TryAppend and
// none through TryPublish.
func TestEmitThroughAnAppenderIsTheSameMessage(t *testing.T) {
	t.Parallel()
	log := slog.New(slog.DiscardHandler)
	plain, app := &kafkatest.Capture{}, &copyAppender{}
	sp := New(Config{Publisher: plain, Topic: "decisions", Gateway: "emit-test", Logger: log, Registry: prometheus.NewRegistry()})
	sa := New(Config{Publisher: app, Topic: "decisions", Gateway: "emit-test", Logger: log, Registry: prometheus.NewRegistry()})
	var tss []time.Time
	for i := range 50 {
		ev := emitEvent(i)
		tss = append(tss, ev.TS)
		sp.Emit(context.Background(), &ev)
		sa.Emit(context.Background(), &ev)
	}
	require.Empty(t, app.Messages(), "nothing through TryPublish")
	want := plain.Messages()
	require.Len(t, app.appended, len(want))
	for i, m := range app.appended {
		require.Equal(t, want[i].Topic, m.Topic)
		require.Equal(t, string(want[i].Key), string(m.Key))
		require.JSONEq(t, string(want[i].Value), string(m.Value))
		require.Equal(t, kafkatest.Headers(want[i].Headers), kafkatest.Headers(m.Headers))
		require.True(t, m.Time.Equal(tss[i]), "message %d: the record's time is the event's", i)
	}
}

// An event emitted through an Appender allocates nothing (the event itself
// is built by the caller). Under -race sync.Pool drops some scratches on
// purpose, so the count is checked in builds without it (make test).
func TestEmitThroughAnAppenderAllocatesNothing(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts do not hold under -race (sync.Pool drops items on purpose)")
	}
	s := New(Config{Publisher: &copyAppender{discard: true}, Topic: "decisions", Gateway: "emit-test",
		Logger: slog.New(slog.DiscardHandler), Registry: prometheus.NewRegistry()})
	ev := emitEvent(7)
	ctx := context.Background()
	s.Emit(ctx, &ev) // the scratch is made once
	require.Zero(t, testing.AllocsPerRun(1000, func() { s.Emit(ctx, &ev) }))
}
