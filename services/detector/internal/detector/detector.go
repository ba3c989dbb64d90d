// Package detector turns the decision stream into penalties, abuse events,
// abuse records, metrics and pages. Scoring lives in the score package.
package detector

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
	"github.com/segmentio/kafka-go"

	"github.com/floodgate-dev/floodgate/pkg/events"
	"github.com/floodgate-dev/floodgate/pkg/stream"
	"github.com/floodgate-dev/floodgate/pkg/tick"
	"github.com/floodgate-dev/floodgate/services/detector/internal/score"
)

// Version is stamped on every abuse event.
const Version = "detector/0.2"

// Publisher sends messages and returns once the broker acknowledged them.
type Publisher interface {
	Publish(ctx context.Context, msgs ...kafka.Message) error
}

// Recorder receives detections for metrics; it must not block.
type Recorder interface {
	RecordDetection(a *events.Abuse, latency time.Duration)
	RecordActivePenalties(n map[events.Pattern]int, at time.Time)
}

// Records is the abuse history: Put must be idempotent by abuse id.
type Records interface {
	Put(ctx context.Context, a *events.Abuse) error
	// PriorIncidents counts p's incidents that were over by at (see DynamoRecords).
	PriorIncidents(ctx context.Context, p events.Principal, at time.Time, lookback, quiet time.Duration, exclude string) (int, error)
}

// Penalties holds the penalties the limiter reads: *PenaltyStore (Redis). It
// must be safe for concurrent use; penaltiesContract (tests) is its contract,
// run against the Redis store and the in-memory double of the tests.
type Penalties interface {
	// Apply merges p into principal's penalty — the strongest multiplier, the
	// highest level and the latest expiry win — and reports PenaltyApplied,
	// PenaltyUnchanged (nothing to merge) or PenaltyStale (p has expired).
	Apply(ctx context.Context, principal events.Principal, abuseID string, p events.Penalty) (int, error)
	// Get returns principal's multiplier and expiry; 1 and the zero time when
	// it has no penalty running.
	Get(ctx context.Context, principal events.Principal) (float64, time.Time, error)
}

var _ Penalties = (*PenaltyStore)(nil)

// Alerter pages on-call about the detector itself (the blast-radius guard).
type Alerter interface {
	Alert(ctx context.Context, dedupKey, summary string, details map[string]any) error
}

// Config wires a Detector. Records, Allowlist, Alerter and Recorder may be nil.
type Config struct {
	Score score.Config
	// MaxEventSkew and MaxEventAge bound an event's time against the clock:
	// later than now + skew or older than now − age, it is dead-lettered and
	// never scored (defaults 5m and 7 days).
	MaxEventSkew time.Duration
	MaxEventAge  time.Duration
	// MaxEventCost bounds an event's cost (issue 22 S3); one over it is
	// dead-lettered and never scored. Default events.DefaultMaxCost.
	MaxEventCost int64
	// SharedIPs, when set, shares per-address principal counts with the other
	// instances of the group (see score.RemoteIPs).
	SharedIPs  score.RemoteIPs
	Policies   map[events.Pattern]PatternPolicy
	Ladder     Ladder // zero: one step, every detection the full policy
	Escalation Escalation
	BlastLimit int // enforced penalties per pattern per minute before enforcement is held
	Penalties  Penalties
	Records    Records
	Allowlist  *Allowlist
	Alerter    Alerter
	Publisher  Publisher
	AbuseTopic string
	Recorder   Recorder
	Logger     *slog.Logger
	Registerer prometheus.Registerer
	Now        func() time.Time
}

// Detector is the decisions-topic handler: decode, score, decide, act.
// Handle is safe for concurrent use by different partitions.
type Detector struct {
	cfg     Config
	ips     *score.IPStore
	blast   *BlastGuard
	log     *slog.Logger
	metrics *metrics
	day     *DayBound // cost and daily bound at the door (daybound.go); nil: cost only

	params paramsHistory // the parameters versions in force (params.go)

	mu             sync.Mutex
	cands          map[int]*candState // a candidate parameters version's scorers, by partition
	candIPs        *score.IPStore     // and their IP store
	candIPsVersion int64
	scorers        map[int]*score.Scorer
	warm           map[int]int64 // partition → first offset whose effects count (after a rewind)
	pending        map[int]pending
	active         map[string]activePenalty // principal|pattern → enforced penalty, for the gauge
	incidents      map[string]incident      // principal|pattern → the incident in progress
}

type pending struct {
	offset int64
	dets   []score.Detection // scored, not yet decided
	abuses []events.Abuse    // decided; their effects are idempotent and retried
}

// incident is one principal × pattern while its penalty runs (and a quiet
// period after): its re-detections share its id and are counted.
type incident struct {
	id    string
	count int64
	step  int64     // the highest ladder step of its detections
	until time.Time // the latest penalty expiry of its detections
}

type activePenalty struct {
	pattern events.Pattern
	until   time.Time
}

type metrics struct {
	decoded    prometheus.Counter
	warmup     prometheus.Counter
	detections *prometheus.CounterVec
	penalties  *prometheus.CounterVec
	suppressed *prometheus.CounterVec
	held       *prometheus.CounterVec
}

// New returns a detector.
func New(c Config) *Detector {
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.MaxEventSkew <= 0 {
		c.MaxEventSkew = 5 * time.Minute
	}
	if c.MaxEventCost <= 0 {
		c.MaxEventCost = events.DefaultMaxCost
	}
	if c.MaxEventAge <= 0 {
		c.MaxEventAge = 7 * 24 * time.Hour
	}
	if c.Ladder.Steps < 1 {
		c.Ladder.Steps = 1
	}
	d := &Detector{
		cfg: c, ips: score.NewIPStore(c.Score), blast: &BlastGuard{Limit: c.BlastLimit, Now: c.Now}, log: c.Logger,
		cands: map[int]*candState{}, scorers: map[int]*score.Scorer{}, warm: map[int]int64{}, pending: map[int]pending{}, active: map[string]activePenalty{}, incidents: map[string]incident{},
	}
	if d.blast.Limit <= 0 {
		d.blast.Limit = 1 << 30
	}
	if c.SharedIPs != nil {
		d.ips.ShareWith(c.SharedIPs)
	}
	f := promauto.With(c.Registerer)
	d.metrics = &metrics{
		decoded:    f.NewCounter(prometheus.CounterOpts{Name: "floodgate_detector_events_total", Help: "Decision events scored."}),
		warmup:     f.NewCounter(prometheus.CounterOpts{Name: "floodgate_detector_warmup_events_total", Help: "Events re-scored after a rewind, without effects."}),
		detections: f.NewCounterVec(prometheus.CounterOpts{Name: "floodgate_detector_detections_total", Help: "Detections by pattern, severity and mode."}, []string{"pattern", "severity", "mode"}),
		penalties:  f.NewCounterVec(prometheus.CounterOpts{Name: "floodgate_detector_penalty_writes_total", Help: "Penalty writes by outcome."}, []string{"outcome"}),
		suppressed: f.NewCounterVec(prometheus.CounterOpts{Name: "floodgate_detector_suppressed_total", Help: "Detections not acted on, by pattern and reason."}, []string{"pattern", "reason"}),
		held:       f.NewCounterVec(prometheus.CounterOpts{Name: "floodgate_detector_blast_radius_held_total", Help: "Enforcements held by the blast-radius guard."}, []string{"pattern"}),
	}
	f.NewGaugeFunc(prometheus.GaugeOpts{Name: "floodgate_detector_tracked_principals", Help: "Principals held in scoring state."},
		func() float64 {
			d.mu.Lock()
			defer d.mu.Unlock()
			n := 0
			for _, s := range d.scorers {
				n += s.Stats().Principals
			}
			return float64(n)
		})
	return d
}

func (d *Detector) scorer(partition int) *score.Scorer {
	d.mu.Lock()
	defer d.mu.Unlock()
	s := d.scorers[partition]
	if s == nil {
		s = score.New(d.cfg.Score, d.ips)
		d.scorers[partition] = s
	}
	return s
}

// Handle scores one decision event. Malformed events are poison (straight to
// the DLQ); failed side effects are transient and retried by the consume loop.
// A retry of the same message re-uses its decided abuse events instead of
// scoring the event twice.
func (d *Detector) Handle(ctx context.Context, msg kafka.Message) error {
	p, ok := d.takePending(msg)
	if !ok {
		ev, err := events.DecodeDecision(msg.Value)
		if err != nil {
			return stream.Permanent(err)
		}
		// Checked at the door: an event dated in the future would move the
		// scorer's clock and sweep away every principal's state (issue 22 S4);
		// one older than retention describes nothing current.
		if err := d.checkEventTime(ev.TS); err != nil {
			return stream.Permanent(err)
		}
		if err := d.day.Admit(&ev, d.cfg.MaxEventCost); err != nil {
			return err // permanent: dead-lettered with the reason, never scored
		}
		d.metrics.decoded.Inc()
		p.dets = d.observe(msg.Partition, &ev)
		if d.warmingUp(msg) {
			d.metrics.warmup.Inc()
			return nil // rebuilding state after a rewind: these were acted on before
		}
	}
	for len(p.dets) > 0 {
		a, act, err := d.decide(ctx, &p.dets[0])
		if err != nil {
			d.setPending(msg, p) // what is decided stays decided
			return err
		}
		// The event that crossed the threshold is this message: the console
		// reads the principal's events backwards from here. A message without
		// a usable position (a test's, a hand-fed one) leaves it out rather
		// than make the event unencodable.
		if events.ValidTopic(msg.Topic) == nil && msg.Offset >= 0 {
			a.Evidence.CrossingEvent = &events.EventRef{Topic: msg.Topic, Partition: int32(msg.Partition), Offset: msg.Offset}
		}
		if act {
			p.abuses = append(p.abuses, a)
		}
		p.dets = p.dets[1:]
	}
	for i := range p.abuses {
		if err := d.effects(ctx, &p.abuses[i]); err != nil {
			d.setPending(msg, p)
			return err
		}
	}
	return nil
}

func (d *Detector) warmingUp(msg kafka.Message) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	until, ok := d.warm[msg.Partition]
	return ok && msg.Offset < until
}

func (d *Detector) takePending(msg kafka.Message) (pending, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	p, ok := d.pending[msg.Partition]
	if !ok {
		return pending{}, false
	}
	delete(d.pending, msg.Partition) // an older offset was dead-lettered: its retry is over
	if p.offset != msg.Offset {
		return pending{}, false
	}
	return p, true
}

func (d *Detector) setPending(msg kafka.Message, p pending) {
	p.offset = msg.Offset
	d.mu.Lock()
	d.pending[msg.Partition] = p
	d.mu.Unlock()
}

// decide turns a detection into the abuse event to act on, applying the
// pattern's policy, the allowlist, escalation and the blast-radius guard. It
// reports false when nothing is to be done.
func (d *Detector) decide(ctx context.Context, det *score.Detection) (events.Abuse, bool, error) {
	pattern := det.Pattern
	policy, ok := d.cfg.Policies[pattern]
	a := d.abuseEvent(det, policy)
	if !ok || !pattern.Valid() {
		// A pattern without a policy or unknown to abuse.v1: counted and logged only.
		d.metrics.suppressed.WithLabelValues(string(pattern), "unpublished_pattern").Inc()
		if d.cfg.Recorder != nil {
			a.Penalty.Mode = events.PenaltySimulated
			d.cfg.Recorder.RecordDetection(&a, d.cfg.Now().Sub(det.At))
		}
		d.log.Info("detection of a pattern abuse.v1 does not carry yet; not published", "pattern", pattern,
			"principal", det.Principal.Key(), "score", det.Score)
		return a, false, nil
	}
	if d.cfg.Allowlist != nil {
		if allowed, why := d.cfg.Allowlist.Allows(det.Principal, a.Evidence.TopIPs, d.cfg.Now()); allowed {
			d.metrics.suppressed.WithLabelValues(string(pattern), "allowlisted_"+why).Inc()
			d.log.Info("detection allowlisted", "pattern", pattern, "principal", det.Principal.Key(), "by", why)
			return a, false, nil
		}
	}
	step, reason := d.step(det)
	mult, stepTTL := d.cfg.Ladder.penalty(policy, step)
	a.Penalty.Multiplier, a.Penalty.Step, a.Penalty.Reason = max(mult, 0.001), int64(step), reason
	a.Penalty.ExpiresAt = det.At.Add(max(stepTTL, time.Second))
	if policy.Enforce && !det.Penalize {
		// A signal that alone harms nobody (regular timing): reported for
		// review, never written as a penalty, never escalated.
		a.Penalty.Mode = events.PenaltySimulated
		d.metrics.suppressed.WithLabelValues(string(pattern), "signal_only").Inc()
	}
	if a.Penalty.Mode == events.PenaltyEnforced {
		if d.cfg.Records != nil {
			n, err := d.cfg.Records.PriorIncidents(ctx, det.Principal, det.At, d.cfg.Escalation.Lookback, d.cfg.Escalation.Quiet, a.ID)
			if err != nil {
				return a, false, err
			}
			a.Penalty.Level = int64(n) + 1
		}
		ttl := d.cfg.Escalation.penaltyTTL(stepTTL, a.Penalty.Level, a.ID)
		a.Penalty.ExpiresAt = det.At.Add(ttl)
		if ok, started := d.blast.Admit(pattern); !ok {
			a.Penalty.Mode = events.PenaltySimulated
			d.metrics.held.WithLabelValues(string(pattern)).Inc()
			if started {
				d.log.Error("blast-radius guard: enforcement held", "pattern", pattern, "limit_per_minute", d.blast.Limit)
				if d.cfg.Alerter != nil {
					if err := d.cfg.Alerter.Alert(ctx, "floodgate:blast_radius:"+string(pattern),
						fmt.Sprintf("Floodgate detector held %s enforcement: more than %d principals a minute", pattern, d.blast.Limit),
						map[string]any{"pattern": pattern, "limit_per_minute": d.blast.Limit}); err != nil {
						d.log.Warn("page blast-radius hold", "err", err)
					}
				}
			}
		}
	}
	d.assignIncident(&a)
	return a, true, nil
}

// effects applies the penalty, records the detection, then publishes the abuse
// event that describes it. All are idempotent, so a retry after a partial
// failure repeats them harmlessly.
func (d *Detector) effects(ctx context.Context, a *events.Abuse) error {
	outcome := "simulated"
	if a.Penalty.Mode == events.PenaltyEnforced {
		n, err := d.cfg.Penalties.Apply(ctx, a.Principal, a.ID, a.Penalty)
		if err != nil {
			return err
		}
		outcome = penaltyOutcomes[n]
	}
	if d.cfg.Records != nil {
		if err := d.cfg.Records.Put(ctx, a); err != nil {
			return err
		}
	}
	// The abuse topic keeps 30 days: client addresses leave as networks, an
	// IPv4 /24 or an IPv6 /48, never as a person's address (issue 22 S15).
	published := truncateTopIPs(*a, 48)
	value, err := events.EncodeAbuse(&published)
	if err != nil {
		return stream.Permanent(fmt.Errorf("encode abuse event: %w", err))
	}
	msg := kafka.Message{
		Topic: d.cfg.AbuseTopic, Key: []byte(a.Principal.Key()), Value: value,
		Headers: stream.CloudEventHeaders(events.CETypeAbuse, a.ID, "floodgate/detector", a.DetectedAt),
	}
	if err := d.cfg.Publisher.Publish(ctx, msg); err != nil {
		return fmt.Errorf("publish abuse event %s: %w", a.ID, err)
	}
	d.metrics.penalties.WithLabelValues(outcome).Inc()
	d.metrics.detections.WithLabelValues(string(a.Pattern), string(a.Severity), string(a.Penalty.Mode)).Inc()
	if a.Penalty.Mode == events.PenaltyEnforced {
		d.mu.Lock()
		k := a.Principal.Key() + "|" + string(a.Pattern)
		if cur, ok := d.active[k]; !ok || cur.until.Before(a.Penalty.ExpiresAt) {
			d.active[k] = activePenalty{pattern: a.Pattern, until: a.Penalty.ExpiresAt}
		}
		d.mu.Unlock()
	}
	if d.cfg.Recorder != nil {
		d.cfg.Recorder.RecordDetection(a, d.cfg.Now().Sub(a.DetectedAt))
	}
	d.log.Info("abuse detected", "pattern", a.Pattern, "principal", a.Principal.Key(), "abuse_id", a.ID,
		"score", a.Score, "penalty", outcome, "multiplier", a.Penalty.Multiplier, "level", a.Penalty.Level,
		"until", a.Penalty.ExpiresAt)
	return nil
}

func (d *Detector) abuseEvent(det *score.Detection, policy PatternPolicy) events.Abuse {
	mode := events.PenaltySimulated
	if policy.Enforce {
		mode = events.PenaltyEnforced
	}
	ev := events.Evidence{
		ObservedRate: det.ObservedRate, EventCount: max(det.Count, 1),
		DistinctIPs: det.DistinctIPs, DistinctIP24: det.DistinctIP24, DistinctIP64: det.DistinctIP64,
		TopRoutes: det.TopRoutes, TopIPs: det.TopIPs,
	}
	if det.Pattern == score.RapidFire {
		ev.BaselineRate, ev.Threshold = det.ExpectedRate, det.ExpectedRate*det.Threshold
	}
	if det.BaselineSource != "" {
		ev.Basis = &events.Basis{Source: det.BaselineSource, BaselineKind: det.Principal.Kind, DenialRatio: min(max(det.DenialRatio, 0), 1),
			NewNetworks: det.NewNetworks, NetworkThreshold: det.NetworkThreshold}
	}
	if !det.Severity.Valid() {
		det.Severity = score.SeverityOf(det.Score)
	}
	id := AbuseID(det.Principal, det.Pattern, det.WindowStart)
	return events.Abuse{
		ID: id, DetectedAt: det.At, Principal: det.Principal, Pattern: det.Pattern,
		Severity: det.Severity, Score: det.Score,
		Window:       events.Window{Start: det.WindowStart, End: det.WindowStart.Add(det.Window), Seconds: max(int64(det.Window/time.Second), 1)},
		FirstEventAt: det.FirstEventAt,
		Evidence:     ev,
		Penalty: events.Penalty{
			Multiplier: max(policy.Multiplier, 0.001), ExpiresAt: det.At.Add(max(policy.TTL, time.Second)), Level: 1, Mode: mode,
		},
		DetectorVersion: Version,
	}
}

var penaltyOutcomes = map[int]string{PenaltyStale: "stale", PenaltyApplied: "applied", PenaltyUnchanged: "unchanged"}

// AbuseID is the deterministic id of a detection: the same principal, pattern
// and window always give the same id, so a replayed detection is recognisably
// the same (and its penalty, record and page are written once).
// IncidentID names the incident a principal's detection of pattern at
// (event time) opens.
func IncidentID(p events.Principal, pattern events.Pattern, at time.Time) string {
	h := sha256.Sum256([]byte(p.Key() + "\x00" + string(pattern) + "\x00incident\x00" + at.UTC().Format(time.RFC3339Nano)))
	return "in_" + hex.EncodeToString(h[:12])
}

// assignIncident gives a its incident: the one in progress for its principal
// and pattern when a comes before that incident's penalty ended plus the quiet
// period (its count goes up, its end moves to the later expiry), else a new one.
func (d *Detector) assignIncident(a *events.Abuse) {
	k := a.Principal.Key() + "|" + string(a.Pattern)
	d.mu.Lock()
	defer d.mu.Unlock()
	inc, ok := d.incidents[k]
	if ok && !a.DetectedAt.After(inc.until.Add(d.cfg.Escalation.Quiet)) {
		inc.count++
		if a.Penalty.ExpiresAt.After(inc.until) {
			inc.until = a.Penalty.ExpiresAt
		}
		inc.step = max(inc.step, a.Penalty.Step)
	} else {
		inc = incident{id: IncidentID(a.Principal, a.Pattern, a.DetectedAt), count: 1, step: a.Penalty.Step, until: a.Penalty.ExpiresAt}
	}
	d.incidents[k] = inc
	a.IncidentID, a.DetectionCount = inc.id, inc.count
}

// step is the ladder step of det: the one its evidence earns, or one up
// from its incident's when the principal is detected again within an
// incident in progress (the behaviour persisted), never above the last.
func (d *Detector) step(det *score.Detection) (int, string) {
	first, why := d.cfg.Ladder.firstStep(det)
	d.mu.Lock()
	inc, ok := d.incidents[det.Principal.Key()+"|"+string(det.Pattern)]
	d.mu.Unlock()
	if ok && inc.step > 0 && !det.At.After(inc.until.Add(d.cfg.Escalation.Quiet)) {
		if up := min(int(inc.step)+1, d.cfg.Ladder.Steps); up >= first {
			why = fmt.Sprintf("step %d of %d, persisted: detected again within its incident (after step %d); %s",
				up, d.cfg.Ladder.Steps, inc.step, why)
			first = up
		}
	}
	if r := []rune(why); len(r) > events.MaxStepReasonLen {
		why = string(r[:events.MaxStepReasonLen])
	}
	return first, why
}

func AbuseID(p events.Principal, pattern events.Pattern, windowStart time.Time) string {
	h := sha256.Sum256([]byte(p.Key() + "\x00" + string(pattern) + "\x00" + windowStart.UTC().Format(time.RFC3339Nano)))
	return "ab_" + hex.EncodeToString(h[:12])
}

// Maintain sweeps the shared IP store and reports active penalties every
// interval until ctx is done.
func (d *Detector) Maintain(ctx context.Context, every time.Duration) error {
	return tick.Every(ctx, every, func(context.Context) { d.maintain() })
}

// maintain is one round of Maintain.
func (d *Detector) maintain() {
	d.mu.Lock()
	var newest time.Time
	for _, s := range d.scorers {
		if w := s.Watermark(); w.After(newest) {
			newest = w
		}
	}
	now := d.cfg.Now()
	counts := map[events.Pattern]int{}
	for k, p := range d.active {
		if !p.until.After(now) {
			delete(d.active, k)
			continue
		}
		counts[p.pattern]++
	}
	for k, inc := range d.incidents {
		if inc.until.Add(d.cfg.Escalation.Quiet).Before(now) {
			delete(d.incidents, k)
		}
	}
	d.mu.Unlock()
	if !newest.IsZero() {
		d.ips.Sweep(newest.UnixMilli())
	}
	if d.cfg.Recorder != nil {
		d.cfg.Recorder.RecordActivePenalties(counts, now)
	}
}

// OffsetLookup finds, in one partition of the decisions topic, the first
// offset whose timestamp is at or after t.
type OffsetLookup interface {
	OffsetAt(ctx context.Context, partition int, t time.Time) (int64, error)
	// TimeAt is the timestamp of the message at offset (zero when there is none).
	TimeAt(ctx context.Context, partition int, offset int64) (time.Time, error)
}

// Rewind is the hook a consumer calls when it is assigned partition with the
// group's committed offset: it drops the partition's old state and returns
// where to start fetching — far enough back (by rewind) that the windows are
// full again. Events before committed are re-scored without effects: they
// were acted on before the restart or rebalance.
func (d *Detector) Rewind(ctx context.Context, lookup OffsetLookup, partition int, committed int64, rewind time.Duration) (int64, error) {
	start := committed
	if committed > 0 && rewind > 0 {
		off, err := lookup.OffsetAt(ctx, partition, d.cfg.Now().Add(-rewind))
		if err != nil {
			return 0, fmt.Errorf("rewind partition %d: %w", partition, err)
		}
		if off < 0 || off >= committed {
			// A backlog: the committed point is older than now − rewind, so
			// the window to rebuild ends there, not now. Anchor the rewind
			// at the last handled message's time, or the new owner starts
			// cold (issue 21: a rebalance during a backlog skipped it).
			last, err := lookup.TimeAt(ctx, partition, committed-1)
			if err != nil {
				return 0, fmt.Errorf("rewind partition %d: %w", partition, err)
			}
			off = committed
			if !last.IsZero() {
				if off, err = lookup.OffsetAt(ctx, partition, last.Add(-rewind)); err != nil {
					return 0, fmt.Errorf("rewind partition %d: %w", partition, err)
				}
			}
		}
		if off >= 0 && off < committed {
			start = off
		}
	}
	d.mu.Lock()
	delete(d.scorers, partition)
	delete(d.cands, partition)
	delete(d.pending, partition)
	d.warm[partition] = committed
	d.mu.Unlock()
	return start, nil
}

// Revoked drops a partition's state when it moves to another instance.
func (d *Detector) Revoked(partition int) {
	d.mu.Lock()
	delete(d.scorers, partition)
	delete(d.cands, partition)
	delete(d.pending, partition)
	delete(d.warm, partition)
	d.mu.Unlock()
}

// KafkaOffsets looks offsets up by time with a kafka-go client.
type KafkaOffsets struct {
	Client *kafka.Client
	Topic  string
}

var _ OffsetLookup = (*KafkaOffsets)(nil)

// OffsetAt implements OffsetLookup; -1 means no message at or after t.
func (k *KafkaOffsets) OffsetAt(ctx context.Context, partition int, t time.Time) (int64, error) {
	resp, err := k.Client.ListOffsets(ctx, &kafka.ListOffsetsRequest{Topics: map[string][]kafka.OffsetRequest{
		k.Topic: {kafka.TimeOffsetOf(partition, t)},
	}})
	if err != nil {
		return 0, fmt.Errorf("list offsets of %s/%d at %s: %w", k.Topic, partition, t.Format(time.RFC3339), err)
	}
	for _, p := range resp.Topics[k.Topic] {
		if p.Partition != partition {
			continue
		}
		if p.Error != nil {
			return 0, fmt.Errorf("list offsets of %s/%d: %w", k.Topic, partition, p.Error)
		}
		best := int64(-1)
		for off := range p.Offsets {
			if best < 0 || off < best {
				best = off
			}
		}
		if best < 0 && p.LastOffset >= 0 {
			best = p.LastOffset
		}
		return best, nil
	}
	return 0, errors.New("list offsets: partition missing from the answer")
}

// TimeAt implements OffsetLookup: it fetches the message at offset.
func (k *KafkaOffsets) TimeAt(ctx context.Context, partition int, offset int64) (time.Time, error) {
	if offset < 0 {
		return time.Time{}, nil
	}
	resp, err := k.Client.Fetch(ctx, &kafka.FetchRequest{Topic: k.Topic, Partition: partition, Offset: offset, MinBytes: 1, MaxBytes: 1 << 20, MaxWait: 500 * time.Millisecond})
	if err != nil {
		return time.Time{}, fmt.Errorf("fetch %s/%d@%d: %w", k.Topic, partition, offset, err)
	}
	if resp.Error != nil {
		return time.Time{}, fmt.Errorf("fetch %s/%d@%d: %w", k.Topic, partition, offset, resp.Error)
	}
	for {
		rec, err := resp.Records.ReadRecord()
		if err != nil {
			return time.Time{}, nil //nolint:nilerr // nothing at that offset any more (retention): no time, not a failure
		}
		if rec.Offset >= offset {
			return rec.Time, nil
		}
	}
}

// checkEventTime refuses an event time outside [now − MaxEventAge, now + MaxEventSkew].
func (d *Detector) checkEventTime(ts time.Time) error {
	now := d.cfg.Now()
	switch {
	case ts.After(now.Add(d.cfg.MaxEventSkew)):
		return fmt.Errorf("event time %s is %s in the future, beyond the %s allowed", events.FormatTime(ts), ts.Sub(now).Round(time.Second), d.cfg.MaxEventSkew)
	case ts.Before(now.Add(-d.cfg.MaxEventAge)):
		return fmt.Errorf("event time %s is older than %s", events.FormatTime(ts), d.cfg.MaxEventAge)
	}
	return nil
}
