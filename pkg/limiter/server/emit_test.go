package server

import (
	"bytes"
	"cmp"
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
	"github.com/floodgate-dev/floodgate/pkg/limiter/admission"
	"github.com/floodgate-dev/floodgate/pkg/limiter/checkapi"
	"github.com/floodgate-dev/floodgate/pkg/promtest"
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

// FuzzDecisionEventIsValid: the event of a check that validated, with any
// answer the engine can give (its tiers, rule ids and priorities, any
// numbers), is a valid decision.v1 event — what lets Emit encode it
// without validating it again — and that encoding is AppendDecision's.
func FuzzDecisionEventIsValid(f *testing.F) {
	f.Add("bot", "b1", "203.0.113.7", "POST", "/channels/{channel_id}/messages", "channel:1", "pro", 1,
		true, uint8(0), uint8(0), 100, 42, 1.0, uint8(1), false, false, uint64(7), uint64(0), int64(1_764_400_000_000))
	f.Add("user", "ü", "::1", "GET", "/", "", "", 1_000_000,
		false, uint8(4), uint8(2), -5, -1, 0.0, uint8(4), true, true, uint64(0), uint64(1<<60), int64(0))
	f.Add("api_key", "k", "10.0.0.1", "DELETE", "/x", "", "", 3,
		false, uint8(5), uint8(3), 1<<62, 3, -0.5, uint8(0), true, false, uint64(1), uint64(2), int64(-1))
	tiers := []events.Tier{events.TierIP, events.TierPrincipal, events.TierEndpoint, events.TierResource, events.TierQuota, events.TierPenalty}
	f.Fuzz(func(t *testing.T, kind, id, ip, method, route, resource, plan string, cost int,
		allowed bool, tier, rule uint8, limit, remaining int, penalty float64, prio uint8, shadow, degraded bool,
		rulesVersion, candidateVersion uint64, nowMS int64) {
		req := checkapi.CheckRequest{Principal: events.Principal{Kind: events.PrincipalKind(kind), ID: id}, IP: ip,
			Method: method, Route: route, Resource: resource, Plan: plan, Cost: cost}
		if req.Validate() != nil {
			return // refused before it is decided
		}
		res := limiter.Result{Allowed: allowed, Tier: tiers[int(tier)%len(tiers)], Limit: limit, Remaining: remaining,
			Penalty: penalty, Shadow: shadow, Degraded: degraded, Cost: req.Cost, Plan: cmp.Or(req.Plan, limiter.DefaultPlan),
			Priority: admission.Priority(int(prio) % int(admission.PriorityBulk+1)),
			// versions are those of valid rules.v1 events; the clock is Redis's or the engine's
			RulesVersion: int64(rulesVersion % events.MaxSafeInteger), CandidateVersion: int64(candidateVersion % events.MaxSafeInteger),
			Now: time.UnixMilli(nowMS % (253402300799999 + 1)).UTC()}
		if res.Now.Before(time.Unix(0, 0)) {
			res.Now = time.Unix(0, 0).UTC()
		}
		// rule ids: a rules file's ([a-z0-9][a-z0-9_-]{0,63}), a daily quota's, or none
		switch rule % 3 {
		case 0:
			res.Rule = "channel-messages_2"
		case 1:
			res.Rule = "quota-" + kind + "-" + res.Plan
		}
		if shadow && res.Rule == "" {
			res.ShadowRule = "shadow_rule"
		}
		ev := DecisionEvent(NewDecisionID(), "fuzz-gateway", engineRequest(&req), res)
		require.NoError(t, ev.Validate())
		want, err := events.AppendDecision(nil, &ev)
		require.NoError(t, err)
		require.Equal(t, string(want), string(events.AppendDecisionUnchecked(nil, &ev)))
	})
}

// A server whose gateway is not a valid event member validates every
// event, so none leaves invalid: it is counted as an encode error instead.
func TestEmitValidatesUnderAnInvalidGateway(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	app := &copyAppender{}
	s := New(Config{Publisher: app, Topic: "decisions", Gateway: "bad\x01gateway", Logger: slog.New(slog.DiscardHandler), Registry: reg})
	ev := emitEvent(1)
	ev.Gateway = s.Gateway()
	s.Emit(context.Background(), &ev)
	require.Empty(t, app.appended)
	require.Equal(t, 1.0, promtest.Value(t, reg, "floodgate_limiter_errors_total", map[string]string{"kind": "encode"}))
	good := New(Config{Publisher: app, Topic: "decisions", Gateway: "emit-test", Logger: slog.New(slog.DiscardHandler), Registry: prometheus.NewRegistry()})
	ev = emitEvent(2)
	good.Emit(context.Background(), &ev)
	require.Len(t, app.appended, 1)
	_, err := events.DecodeDecision(app.appended[0].Value)
	require.NoError(t, err)
}
