package auditor

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
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
	f := promauto.With(reg)
	return &Metrics{
		records: f.NewCounterVec(prometheus.CounterOpts{
			Name: "floodgate_dlq_auditor_records_total",
			Help: "Dead letters stored, by source topic, service and error class.",
		}, []string{"topic", "service", "class"}),
		redelivered: f.NewCounterVec(prometheus.CounterOpts{
			Name: "floodgate_dlq_auditor_redelivered_total",
			Help: "Dead letters read again that were already stored (nothing written).",
		}, []string{"topic"}),
		storeErrors: f.NewCounter(prometheus.CounterOpts{
			Name: "floodgate_dlq_auditor_store_errors_total",
			Help: "Failed attempts to store a dead letter (retried).",
		}),
		topics: f.NewGauge(prometheus.GaugeOpts{
			Name: "floodgate_dlq_auditor_topics",
			Help: "Dead-letter topics being consumed.",
		}),
		alerts: f.NewCounterVec(prometheus.CounterOpts{
			Name: "floodgate_dlq_auditor_alerts_total",
			Help: "PagerDuty events sent, by action (trigger, resolve).",
		}, []string{"action"}),
		alertErrors: f.NewCounter(prometheus.CounterOpts{
			Name: "floodgate_dlq_auditor_alert_errors_total",
			Help: "Failed PagerDuty sends (retried at the next evaluation).",
		}),
		replayed: f.NewCounterVec(prometheus.CounterOpts{
			Name: "floodgate_dlq_auditor_replayed_total",
			Help: "Dead letters handled by replays, by source topic and outcome (published, failed).",
		}, []string{"topic", "outcome"}),
		purged: f.NewCounter(prometheus.CounterOpts{
			Name: "floodgate_dlq_auditor_purged_total",
			Help: "Stored dead letters purged (each with an audit entry).",
		}),
	}
}
