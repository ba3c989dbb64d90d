package detector

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/PagerDuty/go-pagerduty"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"github.com/segmentio/kafka-go"

	"github.com/floodgate-dev/floodgate/pkg/events"
	"github.com/floodgate-dev/floodgate/pkg/metric"
	"github.com/floodgate-dev/floodgate/pkg/redisx"
	"github.com/floodgate-dev/floodgate/pkg/stream"
	"github.com/floodgate-dev/floodgate/pkg/tick"
)

// OpenIncidentsKey is the Redis hash of incidents the pager triggered and has
// not resolved yet: dedup key → "principal_key|abuse_id|penalty_expires_ms".
const OpenIncidentsKey = "fg:detector:pager:open"

// Pager is the abuse-topic handler that pages on-call for serious, enforced,
// still-active detections through PagerDuty Events API v2, and resolves the
// incident once the penalty is gone (expired, or lifted: its key deleted). The
// dedup key is the principal and pattern, so a burst of detections for one bot
// is one incident and a redelivered event is absorbed by PagerDuty. At most
// PerMinute triggers are sent a minute; the rest are counted and logged.
type Pager struct {
	client     *pagerduty.Client
	routingKey string
	minLevel   int
	perMinute  int
	rdb        redis.Cmdable
	openKey    string
	now        func() time.Time
	log        *slog.Logger

	mu     sync.Mutex
	recent []time.Time

	sent    *prometheus.CounterVec
	dropped prometheus.Counter
}

var severityRank = map[events.Severity]int{events.SeverityLow: 0, events.SeverityMedium: 1, events.SeverityHigh: 2, events.SeverityCritical: 3}

// PagerConfig configures a Pager.
type PagerConfig struct {
	RoutingKey  string
	Endpoint    string // overrides the Events API URL (tests use a local receiver)
	MinSeverity string
	PerMinute   int
	Redis       redis.Cmdable
	OpenKey     string // the open-incidents hash; default OpenIncidentsKey (tests use their own)
	Now         func() time.Time
	Logger      *slog.Logger
	Registerer  prometheus.Registerer
}

// NewPager returns a pager.
func NewPager(c PagerConfig) (*Pager, error) {
	rank, ok := severityRank[events.Severity(c.MinSeverity)]
	if !ok {
		return nil, fmt.Errorf("minimum page severity %q is not one of low|medium|high|critical", c.MinSeverity)
	}
	var opts []pagerduty.ClientOptions
	if c.Endpoint != "" {
		opts = append(opts, pagerduty.WithV2EventsAPIEndpoint(c.Endpoint))
	}
	f := metric.With(c.Registerer)
	return &Pager{
		client: pagerduty.NewClient("", opts...), routingKey: c.RoutingKey, minLevel: rank, perMinute: max(c.PerMinute, 1),
		rdb: c.Redis, openKey: cmp.Or(c.OpenKey, OpenIncidentsKey), now: c.Now, log: c.Logger,
		sent:    f.CounterVec("floodgate_detector_pages_total", "PagerDuty events sent, by action.", "action"),
		dropped: f.Counter("floodgate_detector_pages_dropped_total", "Triggers over the per-minute cap."),
	}, nil
}

func (p *Pager) admit() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := p.now()
	i := 0
	for i < len(p.recent) && now.Sub(p.recent[i]) >= time.Minute {
		i++
	}
	p.recent = p.recent[i:]
	if len(p.recent) >= p.perMinute {
		return false
	}
	p.recent = append(p.recent, now)
	return true
}

// release gives back the slot admit took for a page that was not delivered, so
// failed attempts during a PagerDuty outage do not use up the cap and drop the
// pages that follow once it is back.
func (p *Pager) release() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if n := len(p.recent); n > 0 {
		p.recent = p.recent[:n-1]
	}
}

// DedupKey is the PagerDuty dedup key of a principal's pattern.
func DedupKey(pattern events.Pattern, p events.Principal) string {
	return "floodgate:" + string(pattern) + ":" + p.Key()
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
	dedup := DedupKey(a.Pattern, a.Principal)
	// Remember the incident before triggering it: a resolve for an incident
	// that was never opened is harmless, an open one never resolved is not.
	open := a.Principal.Key() + "|" + a.ID + "|" + strconv.FormatInt(a.Penalty.ExpiresAt.UnixMilli(), 10)
	if err := p.rdb.HSet(ctx, p.openKey, dedup, open).Err(); err != nil {
		return fmt.Errorf("record open incident %s: %w", dedup, err)
	}
	if !p.admit() {
		p.dropped.Inc()
		p.log.Warn("page dropped: over the per-minute cap", "abuse_id", a.ID, "principal", a.Principal.Key(), "cap", p.perMinute)
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
		DedupKey:   dedup,
		Client:     "Floodgate detector",
		Payload: &pagerduty.V2Payload{
			Summary: fmt.Sprintf("%s abuse by %s: score %.1f (%s); limits cut to %.0f%% until %s",
				a.Pattern, a.Principal.Key(), a.Score, a.EvidenceSummary(),
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
		p.release()
		return fmt.Errorf("page %s: %w", a.ID, err) // retried by the consume loop
	}
	p.sent.WithLabelValues("trigger").Inc()
	p.log.Info("paged", "abuse_id", a.ID, "principal", a.Principal.Key(), "severity", a.Severity)
	return nil
}

// Alert triggers a page about the detector itself (Alerter).
func (p *Pager) Alert(ctx context.Context, dedupKey, summary string, details map[string]any) error {
	_, err := p.client.ManageEventWithContext(ctx, &pagerduty.V2Event{
		RoutingKey: p.routingKey, Action: "trigger", DedupKey: dedupKey, Client: "Floodgate detector",
		Payload: &pagerduty.V2Payload{Summary: summary, Source: "floodgate-detector", Severity: "critical",
			Timestamp: p.now().UTC().Format(time.RFC3339Nano), Component: "detector", Details: details},
	})
	if err != nil {
		return fmt.Errorf("alert %s: %w", dedupKey, err)
	}
	p.sent.WithLabelValues("alert").Inc()
	return nil
}

// ResolveOnce resolves every open incident whose penalty is gone: expired, or
// lifted (the console deletes the penalty key). It returns how many it resolved.
func (p *Pager) ResolveOnce(ctx context.Context) (int, error) {
	open, err := p.rdb.HGetAll(ctx, p.openKey).Result()
	if err != nil {
		return 0, fmt.Errorf("read open incidents: %w", err)
	}
	now := p.now()
	resolved := 0
	for dedup, v := range open {
		parts := strings.Split(v, "|")
		if len(parts) != 3 {
			p.rdb.HDel(ctx, p.openKey, dedup)
			continue
		}
		principal, err := events.ParsePrincipalKey(parts[0])
		if err != nil {
			p.rdb.HDel(ctx, p.openKey, dedup)
			continue
		}
		exp, err := p.rdb.HGet(ctx, redisx.PenaltyKey(string(principal.Kind), principal.ID), "expires_at").Int64()
		switch {
		case errors.Is(err, redis.Nil): // lifted or expired: the key is gone
		case err != nil:
			return resolved, fmt.Errorf("read penalty of %s: %w", parts[0], err)
		case time.UnixMilli(exp).After(now):
			continue // still in force (possibly extended by a later detection)
		}
		if _, err := p.client.ManageEventWithContext(ctx, &pagerduty.V2Event{RoutingKey: p.routingKey, Action: "resolve", DedupKey: dedup}); err != nil {
			return resolved, fmt.Errorf("resolve %s: %w", dedup, err)
		}
		p.sent.WithLabelValues("resolve").Inc()
		// Delete only what was read: a trigger in between keeps its incident open.
		if err := p.rdb.Eval(ctx, `if redis.call('HGET', KEYS[1], ARGV[1]) == ARGV[2] then return redis.call('HDEL', KEYS[1], ARGV[1]) end return 0`,
			[]string{p.openKey}, dedup, v).Err(); err != nil {
			return resolved, fmt.Errorf("close incident %s: %w", dedup, err)
		}
		resolved++
		p.log.Info("incident resolved", "dedup_key", dedup, "principal", parts[0])
	}
	return resolved, nil
}

// Resolve runs ResolveOnce every interval until ctx is done.
func (p *Pager) Resolve(ctx context.Context, every time.Duration) error {
	return tick.Every(ctx, every, func(ctx context.Context) {
		if _, err := p.ResolveOnce(ctx); err != nil {
			p.log.Warn("resolve incidents", "err", err)
		}
	})
}
