package detector

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/PagerDuty/go-pagerduty"
	"github.com/segmentio/kafka-go"

	"github.com/floodgate-dev/floodgate/pkg/events"
	"github.com/floodgate-dev/floodgate/pkg/stream"
)

// Pager is the abuse-topic handler that pages on-call for serious, enforced,
// still-active detections through PagerDuty Events API v2. The dedup key is the
// principal and pattern, so a burst of detections for one bot is one incident and
// a redelivered event is absorbed by PagerDuty.
type Pager struct {
	client     *pagerduty.Client
	routingKey string
	minLevel   int
	now        func() time.Time
	log        *slog.Logger
}

var severityRank = map[events.Severity]int{events.SeverityLow: 0, events.SeverityMedium: 1, events.SeverityHigh: 2, events.SeverityCritical: 3}

// NewPager returns a pager; endpoint overrides the Events API URL (tests use a local receiver).
func NewPager(routingKey, endpoint, minSeverity string, now func() time.Time, log *slog.Logger) (*Pager, error) {
	rank, ok := severityRank[events.Severity(minSeverity)]
	if !ok {
		return nil, fmt.Errorf("minimum page severity %q is not one of low|medium|high|critical", minSeverity)
	}
	var opts []pagerduty.ClientOptions
	if endpoint != "" {
		opts = append(opts, pagerduty.WithV2EventsAPIEndpoint(endpoint))
	}
	return &Pager{client: pagerduty.NewClient("", opts...), routingKey: routingKey, minLevel: rank, now: now, log: log}, nil
}

// Handle pages for one abuse event when it deserves it.
func (p *Pager) Handle(ctx context.Context, msg kafka.Message) error {
	a, err := events.DecodeAbuse(msg.Value)
	if err != nil {
		return stream.Permanent(err)
	}
	if severityRank[a.Severity] < p.minLevel || a.Penalty.Mode != events.PenaltyEnforced || !a.Penalty.ExpiresAt.After(p.now()) {
		return nil
	}
	pdSeverity := "warning"
	if a.Severity == events.SeverityCritical {
		pdSeverity = "critical"
	} else if a.Severity == events.SeverityHigh {
		pdSeverity = "error"
	}
	ev := &pagerduty.V2Event{
		RoutingKey: p.routingKey,
		Action:     "trigger",
		DedupKey:   "floodgate:" + string(a.Pattern) + ":" + a.Principal.Key(),
		Client:     "Floodgate detector",
		Payload: &pagerduty.V2Payload{
			Summary: fmt.Sprintf("%s abuse by %s: %.1f req/s vs threshold %.1f; limits cut to %.0f%% until %s",
				a.Pattern, a.Principal.Key(), a.Evidence.ObservedRate, a.Evidence.Threshold,
				a.Penalty.Multiplier*100, a.Penalty.ExpiresAt.Format(time.RFC3339)),
			Source:    "floodgate-detector",
			Severity:  pdSeverity,
			Timestamp: a.DetectedAt.Format(time.RFC3339Nano),
			Component: "detector",
			Group:     string(a.Principal.Kind),
			Class:     string(a.Pattern),
			Details: map[string]any{
				"abuse_id": a.ID, "score": a.Score, "event_count": a.Evidence.EventCount,
				"distinct_ips": a.Evidence.DistinctIPs, "top_routes": a.Evidence.TopRoutes,
				"penalty_level": a.Penalty.Level, "detector_version": a.DetectorVersion,
			},
		},
	}
	if _, err := p.client.ManageEventWithContext(ctx, ev); err != nil {
		return fmt.Errorf("page %s: %w", a.ID, err)
	}
	p.log.Info("paged", "abuse_id", a.ID, "principal", a.Principal.Key(), "severity", a.Severity)
	return nil
}
