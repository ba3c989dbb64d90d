package web

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/require"

	"github.com/floodgate-dev/floodgate/pkg/config"
	"github.com/floodgate-dev/floodgate/pkg/events"
	"github.com/floodgate-dev/floodgate/pkg/kafkatest"
	"github.com/floodgate-dev/floodgate/services/console/internal/consoletest"
	"github.com/floodgate-dev/floodgate/services/console/internal/store"
)

const decisionsTopic = config.DefaultDecisionsTopic

// produce writes records to one partition of the decisions topic, as the
// limiter does (key = principal, value = decision.v1), and returns the
// offset of the first.
func produce(t *testing.T, brokerAddr string, partition int, ds []*events.Decision) int64 {
	t.Helper()
	recs := make([]kafka.Record, 0, len(ds))
	for _, d := range ds {
		b, err := events.EncodeDecision(d)
		require.NoError(t, err)
		recs = append(recs, kafka.Record{Time: d.TS, Key: kafka.NewBytes([]byte(d.Principal.Key())), Value: kafka.NewBytes(b)})
	}
	c := &kafka.Client{Addr: kafka.TCP(brokerAddr), Timeout: 10 * time.Second}
	res, err := c.Produce(context.Background(), &kafka.ProduceRequest{Topic: decisionsTopic, Partition: partition,
		RequiredAcks: kafka.RequireAll, Records: kafka.NewRecordReader(recs...)})
	require.NoError(t, err)
	require.NoError(t, res.Error)
	return res.BaseOffset
}

func sampleDecision(p events.Principal, i int, at time.Time, ip string) *events.Decision {
	d := &events.Decision{ID: fmt.Sprintf("d%d", i), TS: at, Principal: p, IP: netip.MustParseAddr(ip), Method: "POST",
		Route: "/channels/{channel_id}/messages", Allowed: i%3 != 0, Tier: events.TierPrincipal, Cost: 1, Limit: 50, Remaining: 1, Gateway: "gw-test"}
	if !d.Allowed {
		d.Tier = events.TierPenalty
	}
	return d
}

var sampleRowRE = regexp.MustCompile(`(?s)<tr[^>]*><td class="num">(\d+)</td><td class="num">(\d+)</td>`)

// TestSampleEvents reads an alert's sample events from a real broker (kfake
// over TCP, the decisions topic from migrations): the principal's decisions
// at and before the crossing offset, newest first, other principals'
// messages skipped, addresses truncated; and the empty and error states.
func TestSampleEvents(t *testing.T) {
	b := consoletest.Broker(t)
	e := newEnvWith(t, func(cfg *Config, _ string) {
		cfg.Samples = &store.SampleReader{Client: &kafka.Client{Addr: kafka.TCP(b), Timeout: 5 * time.Second}, Topic: decisionsTopic,
			MaxScan: 200, Keep: 20, Chunk: 15} // several backward steps
	})
	now := time.Now().UTC().Truncate(time.Millisecond)
	a := e.seed(t, "samples", now, events.PatternRapidFire, events.SeverityHigh, true)
	kind, id := a.PrincipalParts()
	p := events.Principal{Kind: events.PrincipalKind(kind), ID: id}
	other := events.Principal{Kind: events.PrincipalUser, ID: e.run + "_other"}

	// Partition 5: 5 of another principal's, then 30 of ours interleaved with
	// 30 of theirs, then 5 of ours after the detection.
	var batch []*events.Decision
	for i := 0; i < 5; i++ {
		batch = append(batch, sampleDecision(other, i, now.Add(-time.Minute), "198.51.100.9"))
	}
	for i := 0; i < 30; i++ {
		d := sampleDecision(p, i, now.Add(-time.Duration(30-i)*time.Second), "203.0.113.77")
		if i == 28 { // refused by priority shedding: shown as shed, not as the principal's denial
			d.Allowed, d.Shed, d.Tier, d.Priority = false, true, events.TierPrincipal, events.PriorityBulk
		}
		batch = append(batch, d)
		batch = append(batch, sampleDecision(other, 100+i, now.Add(-time.Duration(30-i)*time.Second), "198.51.100.9"))
	}
	base := produce(t, b, 5, batch)
	crossing := base + 5 + 2*29 // our 30th event
	produce(t, b, 5, []*events.Decision{sampleDecision(p, 99, now.Add(time.Second), "203.0.113.77")})
	a = e.setCrossing(t, a, &events.EventRef{Topic: decisionsTopic, Partition: 5, Offset: crossing})

	c := e.signedIn(t, "viewer1")

	t.Run("newest first from the crossing offset, truncated addresses", func(t *testing.T) {
		code, body := c.get(alertPath(a))
		require.Equal(t, http.StatusOK, code, body)
		require.Contains(t, body, `id="samples"`)
		rows := sampleRowRE.FindAllStringSubmatch(body[strings.Index(body, `id="samples"`):], -1)
		require.Len(t, rows, 20, "Keep = 20 of the principal's 30 events at or before the crossing")
		for i, r := range rows {
			require.Equal(t, "5", r[1])
			require.Equal(t, fmt.Sprint(crossing-int64(2*i)), r[2], "row %d: every other offset is the other principal's", i)
		}
		require.Contains(t, body, "crossed the threshold")
		require.Contains(t, body, "203.0.113.0", "the /24")
		require.NotContains(t, body, "203.0.113.77", "never the full address")
		require.NotContains(t, body, "198.51.100.9", "another principal's event is not shown")
		require.Contains(t, body, "<strong>denied</strong> · penalty")
		require.Contains(t, body, "<strong>shed</strong> (platform short of capacity) · priority bulk")
		require.Contains(t, body, "POST /channels/{channel_id}/messages")
	})
	t.Run("older than retention", func(t *testing.T) {
		kafkatest.DeleteRecords(t, b, decisionsTopic, 5, crossing+1)
		code, body := c.get(alertPath(a))
		require.Equal(t, http.StatusOK, code, body)
		require.Contains(t, body, "older than the decisions topic&#39;s retention")
		require.NotContains(t, body, `id="samples"`)
	})
	t.Run("beyond the end and no decisions of the principal", func(t *testing.T) {
		a2 := e.setCrossing(t, e.seed(t, "beyond", now.Add(-time.Second), events.PatternRapidFire, events.SeverityHigh, false),
			&events.EventRef{Topic: decisionsTopic, Partition: 5, Offset: 1 << 40})
		_, body := c.get(alertPath(a2))
		require.Contains(t, body, "past the end of the partition")
		a3 := e.setCrossing(t, e.seed(t, "none", now.Add(-2*time.Second), events.PatternRapidFire, events.SeverityHigh, false),
			&events.EventRef{Topic: decisionsTopic, Partition: 5, Offset: crossing + 1})
		_, body = c.get(alertPath(a3))
		require.Contains(t, body, "none of this principal&#39;s decisions were found")
		a4 := e.setCrossing(t, e.seed(t, "othertopic", now.Add(-3*time.Second), events.PatternRapidFire, events.SeverityHigh, false),
			&events.EventRef{Topic: "someone.else", Partition: 0, Offset: 0})
		_, body = c.get(alertPath(a4))
		require.Contains(t, body, "another topic than the console")
	})
	t.Run("a record without a crossing event", func(t *testing.T) {
		old := e.seed(t, "old", now.Add(-4*time.Second), events.PatternRapidFire, events.SeverityHigh, false)
		_, body := c.get(alertPath(old))
		require.Contains(t, body, "does not record where its crossing event was read")
	})
}

// TestSampleEventsBrokerDown: the section shows an error, the page still renders.
func TestSampleEventsBrokerDown(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	dead := ln.Addr().String()
	require.NoError(t, ln.Close())
	e := newEnvWith(t, func(cfg *Config, _ string) {
		cfg.Samples = &store.SampleReader{Client: &kafka.Client{Addr: kafka.TCP(dead), Timeout: time.Second}, Topic: decisionsTopic, Timeout: time.Second}
	})
	a := e.seed(t, "down", time.Now().UTC(), events.PatternRapidFire, events.SeverityHigh, true)
	a = e.setCrossing(t, a, &events.EventRef{Topic: decisionsTopic, Partition: 0, Offset: 7})
	c := e.signedIn(t, "analyst1")
	code, body := c.get(alertPath(a))
	require.Equal(t, http.StatusOK, code, body)
	require.Contains(t, body, "Sample events could not be read from Kafka")
	require.Contains(t, body, `id="lift-form"`, "the rest of the page renders")
}
