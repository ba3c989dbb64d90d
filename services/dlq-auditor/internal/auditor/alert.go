package auditor

import (
	"context"
	"fmt"
	"log/slog"
	"sort"
	"sync"
	"time"

	"github.com/PagerDuty/go-pagerduty"

	"github.com/floodgate-dev/floodgate/pkg/tick"
)

// EventSender sends PagerDuty Events API v2 events; *pagerduty.Client is one.
// It must be safe for concurrent use.
type EventSender interface {
	ManageEventWithContext(ctx context.Context, e *pagerduty.V2Event) (*pagerduty.V2EventResponse, error)
}

var _ EventSender = (*pagerduty.Client)(nil)

// AlerterConfig configures an Alerter.
type AlerterConfig struct {
	// Threshold dead letters of one source topic within Window trigger an
	// incident; it resolves when the count falls below half the threshold.
	Threshold int
	Window    time.Duration
	// RoutingKey of the PagerDuty service; empty logs instead of paging.
	RoutingKey string
	Sender     EventSender
	Now        func() time.Time
	Logger     *slog.Logger
	Metrics    *Metrics
}

// Alerter counts newly stored dead letters per source topic over a sliding
// window of dead-lettering time and pages when a topic crosses the threshold.
// Observe is cheap and never blocks on PagerDuty; Evaluate (called by Run on
// a ticker) sends the trigger and resolve events, retrying failed ones at the
// next evaluation. Safe for concurrent use.
type Alerter struct {
	cfg AlerterConfig

	mu     sync.Mutex
	topics map[string]*topicWindow
}

type topicWindow struct {
	buckets   map[int64]map[string]int // unix second -> "service/class" -> count
	triggered bool
}

// NewAlerter returns an alerter.
func NewAlerter(cfg AlerterConfig) *Alerter {
	return &Alerter{cfg: cfg, topics: map[string]*topicWindow{}}
}

// Observe counts one new dead letter of topic at time at.
func (a *Alerter) Observe(topic, service, class string, at time.Time) {
	a.mu.Lock()
	defer a.mu.Unlock()
	w := a.topics[topic]
	if w == nil {
		w = &topicWindow{buckets: map[int64]map[string]int{}}
		a.topics[topic] = w
	}
	sec := at.Unix()
	b := w.buckets[sec]
	if b == nil {
		b = map[string]int{}
		w.buckets[sec] = b
	}
	b[service+"/"+class]++
}

// Run evaluates every interval until ctx is done.
func (a *Alerter) Run(ctx context.Context, interval time.Duration) error {
	return tick.Every(ctx, interval, a.Evaluate)
}

type alertChange struct {
	topic   string
	trigger bool
	count   int
	by      map[string]int
}

// Evaluate prunes the windows and sends the events whose state changed.
func (a *Alerter) Evaluate(ctx context.Context) {
	now := a.cfg.Now()
	oldest := now.Add(-a.cfg.Window).Unix()
	var changes []alertChange
	a.mu.Lock()
	for topic, w := range a.topics {
		count, by := 0, map[string]int{}
		for sec, b := range w.buckets {
			if sec <= oldest {
				delete(w.buckets, sec)
				continue
			}
			if sec > now.Unix() {
				continue // from the future (clock skew): counted once it is due
			}
			for k, n := range b {
				count += n
				by[k] += n
			}
		}
		switch {
		case !w.triggered && count >= a.cfg.Threshold:
			changes = append(changes, alertChange{topic: topic, trigger: true, count: count, by: by})
		case w.triggered && count*2 < a.cfg.Threshold:
			changes = append(changes, alertChange{topic: topic, count: count, by: by})
		}
		if !w.triggered && len(w.buckets) == 0 {
			delete(a.topics, topic)
		}
	}
	a.mu.Unlock()
	sort.Slice(changes, func(i, j int) bool { return changes[i].topic < changes[j].topic })
	for _, c := range changes {
		if err := a.send(ctx, c); err != nil {
			a.cfg.Metrics.alertErrors.Inc()
			a.cfg.Logger.Warn("dead-letter alert not sent; retrying at the next evaluation", "topic", c.topic, "err", err)
			continue
		}
		a.mu.Lock()
		if w := a.topics[c.topic]; w != nil {
			w.triggered = c.trigger
		}
		a.mu.Unlock()
	}
}

// DedupKey is the PagerDuty dedup key of a source topic's dead-letter incident.
func DedupKey(topic string) string { return "floodgate:dlq:" + topic }

func (a *Alerter) send(ctx context.Context, c alertChange) error {
	action := "resolve"
	if c.trigger {
		action = "trigger"
	}
	if a.cfg.RoutingKey == "" || a.cfg.Sender == nil {
		a.cfg.Logger.Warn("dead-letter rate alert (paging disabled)", "topic", c.topic, "action", action,
			"count", c.count, "window", a.cfg.Window.String(), "threshold", a.cfg.Threshold)
		a.cfg.Metrics.alerts.WithLabelValues(action).Inc()
		return nil
	}
	ev := &pagerduty.V2Event{RoutingKey: a.cfg.RoutingKey, Action: action, DedupKey: DedupKey(c.topic), Client: "Floodgate dlq-auditor"}
	if c.trigger {
		details := map[string]any{"count": c.count, "threshold": a.cfg.Threshold, "window": a.cfg.Window.String()}
		for k, n := range c.by {
			details["by_service_class."+k] = n
		}
		ev.Payload = &pagerduty.V2Payload{
			Summary: fmt.Sprintf("%d dead letters on %s in the last %s (threshold %d)",
				c.count, c.topic, a.cfg.Window, a.cfg.Threshold),
			Source:    "floodgate-dlq-auditor",
			Severity:  "error",
			Timestamp: a.cfg.Now().UTC().Format(time.RFC3339Nano),
			Component: c.topic,
			Class:     "dead_letters",
			Details:   details,
		}
	}
	if _, err := a.cfg.Sender.ManageEventWithContext(ctx, ev); err != nil {
		return fmt.Errorf("send pagerduty %s for %s: %w", action, c.topic, err)
	}
	a.cfg.Metrics.alerts.WithLabelValues(action).Inc()
	a.cfg.Logger.Info("dead-letter alert sent", "topic", c.topic, "action", action, "count", c.count)
	return nil
}
