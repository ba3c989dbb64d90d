package detector

import (
	"log/slog"
	"time"

	influxdb2 "github.com/influxdata/influxdb-client-go/v2"
	"github.com/influxdata/influxdb-client-go/v2/api"

	"github.com/floodgate-dev/floodgate/pkg/events"
)

// InfluxRecorder writes detections and active penalties to InfluxDB through
// the client's batching, non-blocking write API. Principal ids and IPs are not
// written: tags stay low-cardinality and analytics hold no personal data.
//
//	abuse_detections  tags pattern, severity, mode, principal_kind, detector_version
//	                  fields score, observed_rate, threshold, event_count, distinct_ips,
//	                  multiplier, level, latency_ms (wall clock at decision − event time), count
//	active_penalties  tag pattern; field count (enforced penalties this instance applied, unexpired)
type InfluxRecorder struct {
	w api.WriteAPI
}

var _ Recorder = (*InfluxRecorder)(nil)

// NewInfluxRecorder returns a recorder writing to org/bucket ("db/rp" on InfluxDB 1.8)
// and logging write failures, which the client reports asynchronously.
func NewInfluxRecorder(client influxdb2.Client, org, bucket string, log *slog.Logger) *InfluxRecorder {
	w := client.WriteAPI(org, bucket)
	go func() {
		for err := range w.Errors() {
			log.Warn("influxdb write", "err", err)
		}
	}()
	return &InfluxRecorder{w: w}
}

// RecordDetection queues one point per detection.
func (r *InfluxRecorder) RecordDetection(a *events.Abuse, latency time.Duration) {
	r.w.WritePoint(influxdb2.NewPoint("abuse_detections",
		map[string]string{
			"pattern": string(a.Pattern), "severity": string(a.Severity), "mode": string(a.Penalty.Mode),
			"principal_kind": string(a.Principal.Kind), "detector_version": a.DetectorVersion,
		},
		map[string]any{
			"score": a.Score, "observed_rate": a.Evidence.ObservedRate, "threshold": a.Evidence.Threshold,
			"event_count": a.Evidence.EventCount, "distinct_ips": a.Evidence.DistinctIPs,
			"multiplier": a.Penalty.Multiplier, "level": a.Penalty.Level,
			"latency_ms": float64(latency) / float64(time.Millisecond), "count": 1,
		},
		a.DetectedAt))
}

// RecordActivePenalties queues one point per pattern.
func (r *InfluxRecorder) RecordActivePenalties(n map[events.Pattern]int, at time.Time) {
	for _, p := range []events.Pattern{events.PatternRapidFire, events.PatternDistributedIP, events.PatternBotLike} {
		r.w.WritePoint(influxdb2.NewPoint("active_penalties", map[string]string{"pattern": string(p)},
			map[string]any{"count": n[p]}, at))
	}
}

// Flush writes what is queued.
func (r *InfluxRecorder) Flush() { r.w.Flush() }
