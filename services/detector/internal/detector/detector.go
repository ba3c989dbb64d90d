package detector

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
	"github.com/segmentio/kafka-go"

	"github.com/floodgate-dev/floodgate/pkg/events"
	"github.com/floodgate-dev/floodgate/pkg/stream"
)

// Version is stamped on every abuse event.
const Version = "rapid-fire/0.1"

// Publisher sends messages and returns once the broker acknowledged them.
type Publisher interface {
	Publish(ctx context.Context, msgs ...kafka.Message) error
}

// Recorder receives detections for metrics; it must not block.
type Recorder interface {
	RecordDetection(a *events.Abuse)
}

// PenaltyPolicy is what a rapid-fire detection costs the principal.
type PenaltyPolicy struct {
	Multiplier float64
	TTL        time.Duration
	Enforce    bool // false: simulate — publish what would have been applied, write nothing
}

// Detector is the decisions-topic handler: decode, score, and act on detections.
type Detector struct {
	rapid      *RapidFire
	policy     PenaltyPolicy
	penalties  *PenaltyStore
	pub        Publisher
	abuseTopic string
	rec        Recorder
	log        *slog.Logger
	metrics    *metrics

	mu      sync.Mutex
	pending map[int]pendingDetection // by partition: a detection whose effects are being retried
}

type pendingDetection struct {
	offset int64
	det    *Detection
}

type metrics struct {
	decoded    prometheus.Counter
	detections *prometheus.CounterVec
	penalties  *prometheus.CounterVec
	tracked    prometheus.GaugeFunc
}

// Config wires a Detector.
type Config struct {
	RapidFire  RapidFireConfig
	Policy     PenaltyPolicy
	Penalties  *PenaltyStore
	Publisher  Publisher
	AbuseTopic string
	Recorder   Recorder
	Logger     *slog.Logger
	Registerer prometheus.Registerer
}

// New returns a detector.
func New(c Config) *Detector {
	d := &Detector{
		rapid: NewRapidFire(c.RapidFire), policy: c.Policy, penalties: c.Penalties, pub: c.Publisher,
		abuseTopic: c.AbuseTopic, rec: c.Recorder, log: c.Logger, pending: map[int]pendingDetection{},
	}
	f := promauto.With(c.Registerer)
	d.metrics = &metrics{
		decoded:    f.NewCounter(prometheus.CounterOpts{Name: "floodgate_detector_events_total", Help: "Decision events scored."}),
		detections: f.NewCounterVec(prometheus.CounterOpts{Name: "floodgate_detector_detections_total", Help: "Detections by pattern and severity."}, []string{"pattern", "severity"}),
		penalties:  f.NewCounterVec(prometheus.CounterOpts{Name: "floodgate_detector_penalty_writes_total", Help: "Penalty writes by outcome."}, []string{"outcome"}),
	}
	d.metrics.tracked = f.NewGaugeFunc(prometheus.GaugeOpts{Name: "floodgate_detector_tracked_principals", Help: "Principals held in the rapid-fire window."},
		func() float64 { return float64(d.rapid.Len()) })
	return d
}

// Handle scores one decision event. Malformed events are poison (straight to the
// DLQ); failed side effects are transient and retried by the consume loop. A retry
// of the same message re-uses its detection instead of scoring the event twice.
func (d *Detector) Handle(ctx context.Context, msg kafka.Message) error {
	det, ok := d.takePending(msg)
	if !ok {
		ev, err := events.DecodeDecision(msg.Value)
		if err != nil {
			return stream.Permanent(err)
		}
		d.metrics.decoded.Inc()
		det = d.rapid.Observe(&ev)
		if det == nil {
			return nil
		}
	}
	if err := d.act(ctx, det); err != nil {
		d.setPending(msg, det)
		return err
	}
	return nil
}

func (d *Detector) takePending(msg kafka.Message) (*Detection, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	p, ok := d.pending[msg.Partition]
	if !ok {
		return nil, false
	}
	delete(d.pending, msg.Partition) // an older offset was dead-lettered: its retry is over
	return p.det, p.offset == msg.Offset
}

func (d *Detector) setPending(msg kafka.Message, det *Detection) {
	d.mu.Lock()
	d.pending[msg.Partition] = pendingDetection{offset: msg.Offset, det: det}
	d.mu.Unlock()
}

// act applies the penalty, then publishes the abuse event that describes it. Both
// are idempotent, so a retry after a partial failure repeats them harmlessly.
func (d *Detector) act(ctx context.Context, det *Detection) error {
	abuse := d.abuseEvent(det)
	outcome := "simulated"
	if d.policy.Enforce {
		n, err := d.penalties.Apply(ctx, det.Principal, abuse.ID, abuse.Penalty)
		if err != nil {
			return err
		}
		outcome = penaltyOutcomes[n]
	}
	d.metrics.penalties.WithLabelValues(outcome).Inc()

	value, err := events.EncodeAbuse(&abuse)
	if err != nil {
		return stream.Permanent(fmt.Errorf("encode abuse event: %w", err))
	}
	msg := kafka.Message{
		Topic: d.abuseTopic, Key: []byte(det.Principal.Key()), Value: value,
		Headers: stream.CloudEventHeaders(events.CETypeAbuse, abuse.ID, "floodgate/detector", abuse.DetectedAt),
	}
	if err := d.pub.Publish(ctx, msg); err != nil {
		return fmt.Errorf("publish abuse event %s: %w", abuse.ID, err)
	}
	d.metrics.detections.WithLabelValues(string(abuse.Pattern), string(abuse.Severity)).Inc()
	if d.rec != nil {
		d.rec.RecordDetection(&abuse)
	}
	d.log.Info("rapid fire detected", "principal", det.Principal.Key(), "abuse_id", abuse.ID,
		"rate", det.Rate, "threshold", det.Threshold, "penalty", outcome, "multiplier", abuse.Penalty.Multiplier)
	return nil
}

func (d *Detector) abuseEvent(det *Detection) events.Abuse {
	score := det.Rate / det.Threshold
	mode := events.PenaltySimulated
	if d.policy.Enforce {
		mode = events.PenaltyEnforced
	}
	return events.Abuse{
		ID:           AbuseID(det.Principal, events.PatternRapidFire, det.WindowStart),
		DetectedAt:   det.At,
		Principal:    det.Principal,
		Pattern:      events.PatternRapidFire,
		Severity:     severity(score),
		Score:        score,
		Window:       events.Window{Start: det.WindowStart, End: det.WindowStart.Add(det.Window), Seconds: int64(det.Window / time.Second)},
		FirstEventAt: det.FirstEventAt,
		Evidence: events.Evidence{
			ObservedRate: det.Rate, BaselineRate: 0, Threshold: det.Threshold, EventCount: int64(det.Count),
			DistinctIPs: det.DistinctIPs, DistinctIP24: det.DistinctIP24, DistinctIP64: det.DistinctIP64,
			TopRoutes: det.TopRoutes, TopIPs: det.TopIPs,
		},
		Penalty: events.Penalty{
			Multiplier: d.policy.Multiplier, ExpiresAt: det.At.Add(d.policy.TTL), Level: 1, Mode: mode,
		},
		DetectorVersion: Version,
	}
}

// severity grades how far over the threshold the principal went.
func severity(score float64) events.Severity {
	switch {
	case score >= 10:
		return events.SeverityCritical
	case score >= 4:
		return events.SeverityHigh
	case score >= 2:
		return events.SeverityMedium
	}
	return events.SeverityLow
}

var penaltyOutcomes = map[int]string{PenaltyStale: "stale", PenaltyApplied: "applied", PenaltyUnchanged: "unchanged"}

// Sweep forgets idle principals; Run calls it every interval until ctx is done.
func (d *Detector) Sweep(ctx context.Context, every time.Duration, now func() time.Time) error {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			d.rapid.Sweep(now())
		}
	}
}
