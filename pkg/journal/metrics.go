package journal

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/floodgate-dev/floodgate/pkg/metric"
)

// metrics are the floodgate_stream_journal* collectors, labelled by journal
// name (the names kept from when the journal was part of pkg/stream).
type metrics struct {
	journaled    *prometheus.CounterVec // journal, source
	replayed     *prometheus.CounterVec // journal
	dropped      *prometheus.CounterVec // journal, reason
	bytes        *prometheus.GaugeVec   // journal
	memoryBytes  *prometheus.GaugeVec   // journal
	segments     *prometheus.GaugeVec   // journal
	pending      *prometheus.GaugeVec   // journal
	truncated    *prometheus.CounterVec // journal
	replayErrors *prometheus.CounterVec // journal
	fsyncErrors  *prometheus.CounterVec // journal
	fsyncSeconds *prometheus.HistogramVec
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	v := metric.Shared(reg)
	m := &metrics{
		journaled:    v.CounterVec("floodgate_stream_journaled_total", "Messages the journal took (on disk, or in its memory buffer while the disk refuses writes), by source: failed (the async producer gave up on them) or overflow (its buffer was full).", "journal", "source"),
		replayed:     v.CounterVec("floodgate_stream_journal_replayed_total", "Journaled messages re-published and acknowledged by Kafka (acks=all).", "journal"),
		dropped:      v.CounterVec("floodgate_stream_journal_dropped_total", "Messages the journal lost or refused, by reason: cap (size cap), queue_full, closed, write_error (held in memory at shutdown and the disk still refused them), memory_full (the disk refused them and the memory buffer was full), no_topic, corrupt.", "journal", "reason"),
		bytes:        v.GaugeVec("floodgate_stream_journal_bytes", "Bytes of journal segments on disk.", "journal"),
		memoryBytes:  v.GaugeVec("floodgate_stream_journal_memory_bytes", "Bytes of journal records held in memory because the disk refused them.", "journal"),
		segments:     v.GaugeVec("floodgate_stream_journal_segments", "Journal segment files on disk.", "journal"),
		pending:      v.GaugeVec("floodgate_stream_journal_pending", "Journaled messages not yet acknowledged by Kafka.", "journal"),
		truncated:    v.CounterVec("floodgate_stream_journal_truncated_bytes_total", "Bytes cut from torn or corrupt segment tails when the journal was opened.", "journal"),
		replayErrors: v.CounterVec("floodgate_stream_journal_replay_errors_total", "Failed replay attempts (retried with backoff).", "journal"),
		fsyncErrors:  v.CounterVec("floodgate_stream_journal_fsync_errors_total", "Failed fsyncs of the active journal segment.", "journal"),
		fsyncSeconds: v.HistogramVec("floodgate_stream_journal_fsync_seconds", "Duration of one journal fsync.", prometheus.ExponentialBuckets(0.00005, 4, 9), "journal"), // 50µs .. 3.3s
	}
	if err := v.Err(); err != nil {
		return nil, fmt.Errorf("register journal metrics: %w", err)
	}
	return m, nil
}
