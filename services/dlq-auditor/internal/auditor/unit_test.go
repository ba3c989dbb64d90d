package auditor

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/PagerDuty/go-pagerduty"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/require"

	"github.com/floodgate-dev/floodgate/pkg/events"
	"github.com/floodgate-dev/floodgate/pkg/stream"
)

func TestTruncateIP(t *testing.T) {
	cases := []struct{ name, in, want string }{
		{"ipv4 to /24", "203.0.113.77", "203.0.113.0"},
		{"ipv6 to /64", "2001:db8:4:1:aa:bb:cc:17", "2001:db8:4:1::"},
		{"ipv4-mapped ipv6 is ipv4", "::ffff:198.51.100.9", "198.51.100.0"},
		{"zone dropped", "fe80::1%eth0", "fe80::"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			require.Equal(t, tc.want, TruncateIP(netip.MustParseAddr(tc.in)).String())
		})
	}
}

func TestScrubBytes(t *testing.T) {
	cases := []struct{ name, in, want string }{
		{"json member", `{"ip":"203.0.113.77","x":1}`, `{"ip":"203.0.113.0","x":1}`},
		{"ipv6", `from 2001:db8::42 and more`, `from 2001:db8:: and more`},
		{"sentence end", `client 198.51.100.9.`, `client 198.51.100.0.`},
		{"glued to hex letters", `cafe1.2.3.4`, `cafe1.2.3.0`},
		{"timestamps untouched", `10:00:00.123Z`, `10:00:00.123Z`},
		{"no address", `rate 1.5 over 2.0`, `rate 1.5 over 2.0`},
		{"invalid utf-8 kept", "\xff 10.1.2.3", "\xff 10.1.2.0"},
		{"ipv6 ending in ::", `net 2001:db8:1:2::`, `net 2001:db8:1:2::`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			require.Equal(t, tc.want, string(scrubBytes([]byte(tc.in))))
		})
	}
}

func decision(t testing.TB, id, ip string) []byte {
	t.Helper()
	d := events.Decision{
		ID: id, TS: time.Date(2026, 1, 2, 3, 4, 5, 6_000_000, time.UTC),
		Principal: events.Principal{Kind: events.PrincipalAnonymous, ID: ip}, IP: netip.MustParseAddr(ip),
		Method: "POST", Route: "/channels/{channel_id}/messages", Allowed: true, Tier: events.TierPrincipal,
		Cost: 1, Limit: 50, Remaining: 49, Gateway: "test",
	}
	b, err := events.EncodeDecision(&d)
	require.NoError(t, err)
	return b
}

func TestRedactValue(t *testing.T) {
	abuse, err := os.ReadFile(filepath.Join("..", "..", "..", "..", "schemas", "examples", "abuse.v1.distributed_ip.json"))
	require.NoError(t, err)
	cases := []struct {
		name      string
		in        []byte
		how       string
		mustNot   []string
		mustHave  []string
		eventType string
	}{
		{"decision", decision(t, "d1", "203.0.113.77"), RedactedDecision, []string{"203.0.113.77"}, []string{`"ip":"203.0.113.0"`, `"id":"203.0.113.0"`}, events.TypeDecision},
		{"abuse top ips", abuse, RedactedAbuse, []string{"198.51.100.23", "2001:db8:4:1::17", "192.0.2.200"}, []string{"198.51.100.0", "2001:db8:4:1::", "192.0.2.0"}, events.TypeAbuse},
		{"poison json", []byte(`{"type":"decision.v1","ip":"203.0.113.77","principal":{"kind":"robot"}}`), RedactedScrubbed, []string{"203.0.113.77"}, []string{"203.0.113.0"}, ""},
		{"not json", []byte("\x00\x01 10.9.8.7"), RedactedScrubbed, []string{"10.9.8.7"}, []string{"10.9.8.0"}, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			orig := append([]byte(nil), tc.in...)
			r := redactValue(tc.in)
			require.Equal(t, orig, tc.in, "the input is not modified")
			require.Equal(t, tc.how, r.how)
			require.Equal(t, tc.eventType, r.eventType)
			for _, s := range tc.mustNot {
				require.NotContains(t, string(r.value), s)
			}
			for _, s := range tc.mustHave {
				require.Contains(t, string(r.value), s)
			}
		})
	}
}

func TestParseID(t *testing.T) {
	cases := []struct {
		name, id  string
		topic     string
		partition int
		offset    int64
		ok        bool
	}{
		{"valid", "floodgate.decisions.v1.dlq:2:17", "floodgate.decisions.v1.dlq", 2, 17, true},
		{"not a dlq topic", "floodgate.decisions.v1:2:17", "", 0, 0, false},
		{"negative offset", "a.dlq:1:-1", "", 0, 0, false},
		{"missing offset", "a.dlq:1", "", 0, 0, false},
		{"garbage", "x", "", 0, 0, false},
		{"empty topic", ":1:2", "", 0, 0, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			topic, p, o, err := ParseID(tc.id)
			if !tc.ok {
				require.ErrorIs(t, err, ErrBadID)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tc.topic, topic)
			require.Equal(t, tc.partition, p)
			require.Equal(t, tc.offset, o)
			require.Equal(t, tc.id, RecordID(topic, p, o))
		})
	}
}

func TestIsDLQTopic(t *testing.T) {
	for name, want := range map[string]bool{
		"floodgate.decisions.v1.dlq": true, "floodgate.decisions.v1": false, ".dlq": false,
		"x.dlq.dlq": false, "xdlq": false,
	} {
		t.Run(name, func(t *testing.T) { require.Equal(t, want, IsDLQTopic(name)) })
	}
}

func TestFromMessage(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 0, 0, 0, time.UTC)
	good := stream.DLQRecord{
		Key: []byte("anonymous:203.0.113.77"), Value: decision(t, "d1", "203.0.113.77"),
		Headers:     []kafka.Header{{Key: "ce_id", Value: []byte("d1")}},
		SourceTopic: "floodgate.decisions.v1", Partition: 3, Offset: 42, Timestamp: now.Add(-time.Minute),
		ConsumerGroup: "floodgate-quota", Service: "quota", ErrorClass: stream.ClassTransientExhausted,
		ErrorMessage: "dynamodb 10.0.0.5:8000 unreachable", Attempts: 5, FirstFailure: now.Add(-30 * time.Second),
	}.Message("floodgate.decisions.v1.dlq")
	good.Partition, good.Offset, good.Time = 1, 7, now
	bad := kafka.Message{Topic: "floodgate.abuse.v1.dlq", Partition: 0, Offset: 3, Time: now, Value: []byte("junk")}

	t.Run("valid record", func(t *testing.T) {
		r := fromMessage(good, now, time.Hour)
		require.Equal(t, "floodgate.decisions.v1.dlq:1:7", r.ID)
		require.Equal(t, "quota", r.Service)
		require.Equal(t, "transient_exhausted", r.Class)
		require.Equal(t, 42, int(r.SourceOffset))
		require.Equal(t, "anonymous:203.0.113.0", string(r.Key))
		require.Contains(t, r.ErrorMessage, "10.0.0.0:8000", "IPs in error messages are cut too")
		require.Equal(t, RedactedDecision, r.Redaction)
		require.Equal(t, "d1", r.EventID)
		require.Equal(t, now.Add(time.Hour), r.ExpiresAt)
		require.Equal(t, []Header{{Key: "ce_id", Value: "d1"}}, r.Headers, "dlq_* headers are fields, not headers")
		require.True(t, r.Replayable())
	})
	t.Run("invalid record is kept", func(t *testing.T) {
		r := fromMessage(bad, now, time.Hour)
		require.Equal(t, ClassInvalidRecord, r.Class)
		require.Equal(t, ServiceUnknown, r.Service)
		require.Equal(t, "floodgate.abuse.v1", r.SourceTopic)
		require.Contains(t, r.ErrorMessage, "dlq_source_topic")
		require.False(t, r.Replayable())
	})
}

func TestServiceConfigValidate(t *testing.T) {
	base := map[string]string{}
	cases := []struct {
		name string
		env  map[string]string
		want string
	}{
		{"defaults are valid", base, ""},
		{"bad threshold", map[string]string{"FLOODGATE_DLQ_ALERT_THRESHOLD": "0"}, "FLOODGATE_DLQ_ALERT_THRESHOLD"},
		{"unparsable window", map[string]string{"FLOODGATE_DLQ_ALERT_WINDOW": "soon"}, "FLOODGATE_DLQ_ALERT_WINDOW"},
		{"rate too high", map[string]string{"FLOODGATE_DLQ_REPLAY_RATE": "1e9"}, "FLOODGATE_DLQ_REPLAY_RATE"},
		{"ttl too short", map[string]string{"FLOODGATE_DLQ_RECORD_TTL": "1m"}, "FLOODGATE_DLQ_RECORD_TTL"},
		{"broker without port", map[string]string{"FLOODGATE_KAFKA_BROKERS": "kafka"}, "FLOODGATE_KAFKA_BROKERS"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ServiceConfigFromEnv(func(k string) string { return tc.env[k] })
			if tc.want == "" {
				require.NoError(t, err)
				return
			}
			require.ErrorContains(t, err, tc.want)
		})
	}
}

type fakeSender struct {
	mu     sync.Mutex
	fail   bool
	events []*pagerduty.V2Event
}

func (f *fakeSender) ManageEventWithContext(_ context.Context, e *pagerduty.V2Event) (*pagerduty.V2EventResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.fail {
		return nil, errors.New("pagerduty unreachable")
	}
	f.events = append(f.events, e)
	return &pagerduty.V2EventResponse{Status: "success"}, nil
}

func TestAlerterTriggersRetriesAndResolves(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 0, 0, 0, time.UTC)
	sender := &fakeSender{}
	a := NewAlerter(AlerterConfig{
		Threshold: 4, Window: time.Minute, RoutingKey: "rk", Sender: sender,
		Now: func() time.Time { return now }, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		Metrics: NewMetrics(prometheus.NewRegistry()),
	})
	ctx := context.Background()
	observe := func(n int, at time.Time) {
		for range n {
			a.Observe("floodgate.decisions.v1", "quota", "poison", at)
		}
	}
	steps := []struct {
		name    string
		act     func()
		actions []string
	}{
		{"below the threshold", func() { observe(3, now.Add(-10*time.Second)) }, nil},
		{"old ones do not count", func() { observe(5, now.Add(-2*time.Minute)) }, nil},
		{"send fails: retried next time", func() { sender.fail = true; observe(1, now) }, nil},
		{"at the threshold: one trigger", func() { sender.fail = false }, []string{"trigger"}},
		{"still high: no repeat", func() { observe(2, now) }, []string{"trigger"}},
		{"above half: stays triggered", func() { now = now.Add(55 * time.Second) }, []string{"trigger"}},
		{"window passed: resolve", func() { now = now.Add(10 * time.Second) }, []string{"trigger", "resolve"}},
	}
	for _, s := range steps {
		t.Run(s.name, func(t *testing.T) {
			s.act()
			a.Evaluate(ctx)
			sender.mu.Lock()
			defer sender.mu.Unlock()
			var got []string
			for _, e := range sender.events {
				got = append(got, e.Action)
				require.Equal(t, DedupKey("floodgate.decisions.v1"), e.DedupKey)
			}
			require.Equal(t, s.actions, got)
		})
	}
	require.Contains(t, sender.events[0].Payload.Summary, "dead letters on floodgate.decisions.v1")
}

func FuzzScrubBytes(f *testing.F) {
	for _, s := range []string{`{"ip":"203.0.113.77"}`, "2001:db8::1", "1.2.3.4.5", "::", "cafe1.2.3.4", "\xff"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		out := scrubBytes(b)
		// Idempotent, and no full IPv4 address other than a /24 survives.
		require.Equal(t, out, scrubBytes(out))
		for _, tok := range strings.FieldsFunc(string(out), func(r rune) bool { return !(r == '.' || r >= '0' && r <= '9') }) {
			if a, err := netip.ParseAddr(strings.Trim(tok, ".")); err == nil && a.Is4() {
				require.Equal(t, byte(0), a.As4()[3], "address %s in %q", a, out)
			}
		}
	})
}

func FuzzParseID(f *testing.F) {
	for _, s := range []string{"a.dlq:1:2", "x", "a.dlq:1:-1", "::", "a.dlq:01:2"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, id string) {
		topic, p, o, err := ParseID(id)
		if err != nil {
			return
		}
		_, _, _, err = ParseID(RecordID(topic, p, o))
		require.NoError(t, err)
	})
}

func BenchmarkRedactDecision(b *testing.B) {
	v := decision(b, "d1", "203.0.113.77")
	b.ReportAllocs()
	for b.Loop() {
		_ = redactValue(v)
	}
}

func BenchmarkScrubPoison(b *testing.B) {
	v := []byte(`{"type":"decision.v1","id":"p1","ip":"198.51.100.99","principal":{"kind":"robot","id":"x"},"route":"/a/b"}`)
	b.ReportAllocs()
	for b.Loop() {
		_ = redactValue(v)
	}
}
