package auditor

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/floodgate-dev/floodgate/pkg/metric"
)

// Metrics are the auditor's floodgate_dlq_auditor_* collectors.
type Metrics struct {
	records     *prometheus.CounterVec // topic, service, class: dead letters stored
	redelivered *prometheus.CounterVec // topic: already stored (redelivery)
	storeErrors prometheus.Counter
	topics      prometheus.Gauge
	alerts      *prometheus.CounterVec // action: trigger, resolve
	alertErrors prometheus.Counter
	replayed    *prometheus.CounterVec // topic, outcome: published, skipped, failed
	purged      prometheus.Counter
}

// NewMetrics registers the auditor's metrics on reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	f := metric.With(reg)
	return &Metrics{
		records: f.CounterVec("floodgate_dlq_auditor_records_total",
			"Dead letters stored, by source topic, service and error class.", "topic", "service", "class"),
		redelivered: f.CounterVec("floodgate_dlq_auditor_redelivered_total",
			"Dead letters read again that were already stored (nothing written).", "topic"),
		storeErrors: f.Counter("floodgate_dlq_auditor_store_errors_total", "Failed attempts to store a dead letter (retried)."),
		topics:      f.Gauge("floodgate_dlq_auditor_topics", "Dead-letter topics being consumed."),
		alerts:      f.CounterVec("floodgate_dlq_auditor_alerts_total", "PagerDuty events sent, by action (trigger, resolve).", "action"),
		alertErrors: f.Counter("floodgate_dlq_auditor_alert_errors_total", "Failed PagerDuty sends (retried at the next evaluation)."),
		replayed: f.CounterVec("floodgate_dlq_auditor_replayed_total",
			"Dead letters handled by replays, by source topic and outcome (published, failed).", "topic", "outcome"),
		purged: f.Counter("floodgate_dlq_auditor_purged_total", "Stored dead letters purged (each with an audit entry)."),
	}
}
