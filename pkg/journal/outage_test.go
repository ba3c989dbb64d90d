package journal

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/floodgate-dev/floodgate/pkg/kafkatest"
	"github.com/floodgate-dev/floodgate/pkg/stacktest"
	"github.com/floodgate-dev/floodgate/pkg/stream"
	"github.com/floodgate-dev/floodgate/pkg/stream/streamtest"
)

// outageCase is one run of the broker-outage scenario.
type outageCase struct {
	name       string
	journal    bool
	maxBytes   int64         // journal cap; 0: roomy
	outage     time.Duration // how long the broker is down
	wantLosses bool          // the accounting must find lost events
	// appendPath publishes with TryAppend, as the limiter's Emit does:
	// events encoded into buffers each worker reuses, batched where born.
	appendPath bool
}

// outageResult is what the scenario counted.
type outageResult struct {
	accepted, rejected       int64 // TryPublish true / false
	inKafka, missing         int64 // accepted events found once or more / never
	duplicates, unexpected   int64 // extra copies by ce_id / events in Kafka never accepted
	droppedCap, refusedCount float64
	journaledFailed          float64
	journaledOverflow        float64
	replayed                 float64
	maxTryPublish            time.Duration
}

// accountingErr says whether every accepted event is in Kafka or counted as
// dropped by the journal cap, and every refusal was counted.
func (r outageResult) accountingErr() error {
	switch {
	case r.unexpected > 0:
		return fmt.Errorf("%d events in Kafka that TryPublish refused", r.unexpected)
	case float64(r.missing) > r.droppedCap:
		return fmt.Errorf("%d accepted events missing from Kafka, only %.0f counted as dropped by the journal cap", r.missing, r.droppedCap)
	case float64(r.rejected) != r.refusedCount:
		return fmt.Errorf("TryPublish refused %d events but the metrics count %.0f", r.rejected, r.refusedCount)
	}
	return nil
}

// TestDurableProducerSurvivesBrokerOutage is issue 4's outage test: several
// goroutines publish decision-like events at a steady rate while the broker
// is stopped for 30s (5s with -short) and restarted on the same port with the
// same data directory. Afterwards every event TryPublish accepted must be in
// Kafka — exactly once, or with duplicates (same ce_id) reported separately —
// or counted as dropped by the journal's size cap; every refusal must be
// counted. Without the journal the same scenario loses accepted events, and
// the test checks that its accounting notices.
func TestDurableProducerSurvivesBrokerOutage(t *testing.T) {
	outage := 30 * time.Second
	if testing.Short() {
		outage = 5 * time.Second
	}
	tests := []outageCase{
		{name: "journal keeps every accepted event", journal: true, outage: outage},
		{name: "batched where born, the journal keeps every accepted event", journal: true, outage: outage, appendPath: true},
		{name: "journal at its size cap drops the oldest and counts them", journal: true, maxBytes: 256 << 10, outage: 3 * time.Second},
		{name: "without the journal accepted events are lost", journal: false, outage: 5 * time.Second, wantLosses: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := runOutage(t, tt)
			t.Logf("outage %v: accepted %d, refused %d, in kafka %d, missing %d, duplicates %d, journaled failed %.0f overflow %.0f, replayed %.0f, dropped by cap %.0f, slowest TryPublish %v",
				tt.outage, r.accepted, r.rejected, r.inKafka, r.missing, r.duplicates, r.journaledFailed, r.journaledOverflow, r.replayed, r.droppedCap, r.maxTryPublish)
			err := r.accountingErr()
			if tt.wantLosses {
				require.Error(t, err, "the accounting must catch the events lost without a journal")
				require.Positive(t, r.missing)
				return
			}
			require.NoError(t, err)
			require.Positive(t, r.journaledOverflow+r.journaledFailed, "the outage went through the journal")
			if tt.maxBytes > 0 {
				require.Positive(t, r.droppedCap, "the cap was hit and counted")
			} else {
				require.Zero(t, r.missing, "nothing accepted is lost")
				require.Zero(t, r.droppedCap)
			}
		})
	}
}

func runOutage(t *testing.T, tt outageCase) outageResult {
	const (
		topic      = "decisions.outage"
		partitions = 3
		workers    = 4
		perTick    = 5                    // events per worker per tick
		tick       = 5 * time.Millisecond // 4 workers × 1000/s
	)
	dataDir := t.TempDir()
	cluster, addr := kafkatest.StartCluster(t, map[string]int32{topic: partitions}, kfake.DataDir(dataDir))
	_, portStr, err := net.SplitHostPort(addr)
	require.NoError(t, err)
	port, err := strconv.Atoi(portStr)
	require.NoError(t, err)

	reg := prometheus.NewRegistry()
	log := streamtest.Logger(t, slog.LevelError+1)
	jdir := filepath.Join(t.TempDir(), "journal")
	cfg := DurableProducerConfig{
		Async: stream.AsyncProducerConfig{
			Brokers: []string{addr}, Topic: topic, Name: "outage",
			BufferSize: 2048, BatchSize: 200, WriteAttempts: 2,
			InitialBackoff: 50 * time.Millisecond, MaxBackoff: 200 * time.Millisecond, DrainTimeout: 3 * time.Second,
			Logger: log, Registerer: reg,
		},
	}
	if tt.journal {
		cfg.Journal = Config{
			Dir: jdir, SegmentBytes: 64 << 10, MaxBytes: tt.maxBytes, QueueSize: 4096,
			ReplayInitialBackoff: 50 * time.Millisecond, ReplayMaxBackoff: 500 * time.Millisecond,
		}
		if tt.maxBytes == 0 {
			cfg.Journal.MaxBytes = 256 << 20
			cfg.Journal.SegmentBytes = 1 << 20
		}
	}
	d, err := NewDurableProducer(cfg)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	runDone := make(chan error, 1)
	go func() { runDone <- d.Run(ctx) }()

	// Load: each worker publishes perTick events every tick and remembers
	// which it got accepted.
	var (
		stopLoad = make(chan struct{})
		wg       sync.WaitGroup
		res      outageResult
		maxNanos atomic.Int64
		accepted = make([][]int, workers)
		rejected atomic.Int64
	)
	for w := range workers {
		wg.Go(func() {
			tk := time.NewTicker(tick)
			defer tk.Stop()
			var key, value, idb []byte // reused by the append path
			for n := 0; ; {
				select {
				case <-stopLoad:
					return
				case <-tk.C:
				}
				for range perTick {
					id := fmt.Sprintf("w%d-%d", w, n)
					msg := kafka.Message{
						Key: []byte("p" + strconv.Itoa(n%100)),
						Value: fmt.Appendf(nil, `{"id":%q,"ts":"2026-01-01T00:00:00.000Z","principal":{"kind":"bot","id":"bot_%d"},"ip":"203.0.113.7","method":"POST","route":"/channels/{channel_id}/messages","allowed":true,"tier":"principal","cost":1,"limit":50,"remaining":49,"gateway":"outage"}`,
							id, n%100),
						Headers: stream.CloudEventHeaders("decision.v1", id, "floodgate/limiter/outage", time.Now()),
					}
					start := time.Now()
					var ok bool
					if tt.appendPath {
						key, value, idb = append(key[:0], msg.Key...), append(value[:0], msg.Value...), append(idb[:0], id...)
						msg.Key, msg.Value, msg.Headers[0].Value = key, value, idb
						ok = d.TryAppend(msg)
						clear(key) // TryAppend copied what it keeps
						clear(value)
						clear(idb)
					} else {
						ok = d.TryPublish(msg)
					}
					if el := time.Since(start).Nanoseconds(); el > maxNanos.Load() {
						maxNanos.Store(el) // racy max: good enough for a log line
					}
					if ok {
						accepted[w] = append(accepted[w], n)
					} else {
						rejected.Add(1)
					}
					n++
				}
			}
		})
	}

	time.Sleep(time.Second) // healthy
	cluster.Close()         // the broker goes away; kfake saves its log to dataDir
	t.Logf("broker stopped for %v", tt.outage)
	time.Sleep(tt.outage)
	_, addr2 := kafkatest.StartCluster(t, nil, kfake.Ports(port), kfake.DataDir(dataDir))
	require.Equal(t, addr, addr2, "restarted on the same port")
	t.Log("broker back")
	time.Sleep(2 * time.Second) // healthy again, under load
	close(stopLoad)
	wg.Wait()

	// Let the async buffer and the journal drain, then stop the producer.
	require.Eventually(t, func() bool {
		if streamtest.MetricValue(t, reg, "floodgate_stream_async_queued", nil) > 0 {
			return false
		}
		if j := d.Journal(); j != nil {
			st := j.Stats()
			return st.Pending == 0 && st.Queued == 0
		}
		return true
	}, 2*time.Minute, 20*time.Millisecond, "the backlog drains once the broker is back")
	cancel()
	stacktest.Returned(t, runDone, 30*time.Second, "the producer stops")
	if tt.journal {
		// A restarted process finds in the journal whatever was still
		// in flight at shutdown (usually nothing) and replays it.
		replayLeftovers(t, jdir, addr, topic, reg)
	}

	res.droppedCap = streamtest.MetricValue(t, reg, "floodgate_stream_journal_dropped_total", map[string]string{"reason": "cap"})
	res.journaledFailed = streamtest.MetricValue(t, reg, "floodgate_stream_journaled_total", map[string]string{"source": "failed"})
	res.journaledOverflow = streamtest.MetricValue(t, reg, "floodgate_stream_journaled_total", map[string]string{"source": "overflow"})
	res.replayed = streamtest.MetricValue(t, reg, "floodgate_stream_journal_replayed_total", nil)
	if tt.journal {
		res.refusedCount = streamtest.MetricValue(t, reg, "floodgate_stream_journal_dropped_total", map[string]string{"reason": "queue_full"}) +
			streamtest.MetricValue(t, reg, "floodgate_stream_journal_dropped_total", map[string]string{"reason": "closed"})
	} else {
		res.refusedCount = streamtest.MetricValue(t, reg, "floodgate_stream_async_dropped_total", nil)
	}
	res.rejected = rejected.Load()
	res.maxTryPublish = time.Duration(maxNanos.Load())

	// Read the whole topic back and count events by ce_id.
	counts := map[string]int{}
	ends := kafkatest.EndOffsets(t, addr, topic, partitions)
	for p := range partitions {
		for _, m := range kafkatest.ReadPartition(t, addr, topic, p, int(ends[p])) {
			counts[kafkatest.Headers(m.Headers)[stream.HeaderCEID]]++
		}
	}
	acceptedIDs := map[string]bool{}
	for w, ns := range accepted {
		for _, n := range ns {
			id := fmt.Sprintf("w%d-%d", w, n)
			acceptedIDs[id] = true
			res.accepted++
			switch c := counts[id]; {
			case c == 0:
				res.missing++
			default:
				res.inKafka++
				res.duplicates += int64(c - 1)
			}
		}
	}
	for id := range counts {
		if !acceptedIDs[id] {
			res.unexpected++
		}
	}
	return res
}

// replayLeftovers opens the journal as a restarted process would and replays
// what is in it.
func replayLeftovers(t *testing.T, dir, addr, topic string, reg *prometheus.Registry) {
	t.Helper()
	j, err := Open(Config{Dir: dir, Name: "outage", Registerer: reg, Logger: streamtest.Logger(t, slog.LevelError+1)})
	require.NoError(t, err)
	left := j.Stats().Pending
	if left > 0 {
		t.Logf("journal had %d messages left at shutdown; replaying them", left)
	}
	p := stream.NewProducer(stream.ProducerConfig{Brokers: []string{addr}, Topic: topic})
	defer p.Close()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- j.Run(ctx, p) }()
	require.Eventually(t, func() bool { return j.Stats().Pending == 0 }, time.Minute, 10*time.Millisecond)
	cancel()
	require.NoError(t, <-done)
	require.Empty(t, segmentFiles(t, dir), "a fully replayed journal leaves no segments")
}
