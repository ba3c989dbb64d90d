// Package loop runs the adjuster's control loop: every tick it reads the
// runtime settings and the signals, steps the controller, and applies the
// changes — scales to Redis first, then adjustment events, then the series.
package loop

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/floodgate-dev/floodgate/pkg/adjusterapi"
	"github.com/floodgate-dev/floodgate/pkg/events"
	"github.com/floodgate-dev/floodgate/pkg/metric"
	"github.com/floodgate-dev/floodgate/services/adjuster/internal/control"
	"github.com/floodgate-dev/floodgate/services/adjuster/internal/effects"
	"github.com/floodgate-dev/floodgate/services/adjuster/internal/settings"
)

// Source reads the signals over the window ending at now.
type Source interface {
	Read(ctx context.Context, now time.Time, window time.Duration) (control.Signals, error)
}

// ShedSource is a Source that can read only the shed signals, faster; the
// shed tick uses it when the Source implements it.
type ShedSource interface {
	ReadShed(ctx context.Context, now time.Time, window time.Duration) (control.Signals, error)
}

// Scales is where the limiter reads the scales from.
type Scales interface {
	Load(ctx context.Context) (map[string]float64, error)
	Set(ctx context.Context, scales map[string]float64) error
}

// Publisher publishes adjustment.v1 events and returns once they are acknowledged.
type Publisher interface {
	Publish(ctx context.Context, adj []events.Adjustment) error
}

// ShedWriter is where the limiter reads the shed level from.
type ShedWriter interface {
	Set(ctx context.Context, level int, retry time.Duration, reason string, ttl time.Duration) error
}

// Series records each tick's scales and signals.
type Series interface {
	Record(ctx context.Context, p effects.Point) error
}

// Alerter pages on-call; key identifies the alert (one incident per key).
type Alerter interface {
	Trigger(ctx context.Context, key, summary string, details map[string]any) error
	Resolve(ctx context.Context, key string) error
}

// SettingsSource returns the stored runtime settings (found false: none stored).
type SettingsSource interface {
	Get(ctx context.Context) (settings.Settings, bool, error)
}

// Config wires a Loop. Series and Alerter are optional.
type Config struct {
	Source Source
	Scales Scales
	// Shed receives the shed level every tick; nil: no priority shedding.
	Shed      ShedWriter
	Publisher Publisher
	Series    Series
	Alerter   Alerter
	Settings  SettingsSource
	// Defaults are the rules from the YAML file, used until settings are stored.
	Defaults control.Rules
	// ActorID names this loop in adjustment events, e.g. "adjuster@host-1".
	ActorID string
	Now     func() time.Time
	Logger  *slog.Logger
	// Registerer gets the floodgate_adjuster_* loop metrics; nil leaves them unregistered.
	Registerer prometheus.Registerer
}

// maxPending bounds the adjustment events kept for retry while Kafka is down.
const maxPending = 10000

// Loop is the control loop. Its methods are safe for concurrent use.
type Loop struct {
	cfg   Config
	m     *metrics
	nudge chan struct{}

	// tickMu serializes ticks and owns what only a tick touches.
	tickMu   sync.Mutex
	ctrl     *control.Controller
	alerting map[string]bool
	pending  []events.Adjustment
	wasDry   bool
	started  bool

	// shedMu serializes shed ticks (their own cadence, shed.tick) and owns
	// the shedder and its alerts.
	shedMu       sync.Mutex
	shed         control.Shedder
	shedAlerting map[string]bool
	shedNudge    chan struct{}

	// mu guards what the admin API reads and writes while a tick runs.
	mu       sync.Mutex
	settings settings.Settings
	status   Status
	lastShed control.ShedStep
}

// Status is what the last tick saw and did (GET /v1/status).
type Status = adjusterapi.Status

// New returns a loop; call Start (or Run) before Tick.
func New(cfg Config) *Loop {
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return &Loop{cfg: cfg, m: newMetrics(cfg.Registerer), nudge: make(chan struct{}, 1), alerting: map[string]bool{},
		shedNudge: make(chan struct{}, 1), shedAlerting: map[string]bool{}}
}

// Start loads the settings and the current scales, so the controller resumes
// from what the limiter applies now.
func (l *Loop) Start(ctx context.Context) error {
	s, err := l.loadSettings(ctx)
	if err != nil {
		return err
	}
	scales, err := l.cfg.Scales.Load(ctx)
	if err != nil {
		return err
	}
	l.tickMu.Lock()
	defer l.tickMu.Unlock()
	l.mu.Lock()
	l.settings = s
	l.mu.Unlock()
	l.ctrl = control.NewController(s.Rules, scales)
	l.wasDry = s.DryRun
	l.started = true
	return nil
}

func (l *Loop) loadSettings(ctx context.Context) (settings.Settings, error) {
	return settings.Current(ctx, l.cfg.Settings, l.cfg.Defaults)
}

// Nudge asks for a tick and a shed tick now (after a settings change).
func (l *Loop) Nudge() {
	for _, c := range []chan struct{}{l.nudge, l.shedNudge} {
		select {
		case c <- struct{}{}:
		default:
		}
	}
}

// Use makes s the current settings at once (the admin API calls it after a
// successful write, before the next refresh would see it).
func (l *Loop) Use(s settings.Settings) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if s.Version >= l.settings.Version {
		l.settings = s
	}
}

// Status returns what the last tick saw and did, with the last shed tick's decision.
func (l *Loop) Status() Status {
	l.mu.Lock()
	defer l.mu.Unlock()
	st := l.status
	st.Shed = l.lastShed
	return st
}

// Settings returns the settings the loop runs with.
func (l *Loop) Settings() settings.Settings {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.settings.Clone()
}

// Run ticks every rules.tick, shed ticks every shed.tick (and both on
// Nudge) until ctx is done.
func (l *Loop) Run(ctx context.Context) error {
	l.tickMu.Lock()
	started := l.started
	l.tickMu.Unlock()
	if !started {
		if err := l.Start(ctx); err != nil {
			return fmt.Errorf("start adjuster loop: %w", err)
		}
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		l.runShed(ctx)
	}()
	defer wg.Wait()
	for {
		tickCtx, cancel := context.WithTimeout(ctx, 20*time.Second)
		l.Tick(tickCtx)
		cancel()
		l.mu.Lock()
		tick := l.settings.Rules.Tick.D()
		l.mu.Unlock()
		t := time.NewTimer(tick)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		case <-l.nudge:
			t.Stop()
		}
	}
}

// runShed shed-ticks every shed.tick (and on Nudge) until ctx is done; a
// tick's own duration is part of the period, not added to it.
func (l *Loop) runShed(ctx context.Context) {
	for {
		tick := l.Settings().Rules.Shed.Tick.D()
		if tick <= 0 {
			tick = l.Settings().Rules.Tick.D()
		}
		began := time.Now()
		tickCtx, cancel := context.WithTimeout(ctx, 2*tick)
		l.ShedTick(tickCtx)
		cancel()
		t := time.NewTimer(max(tick-time.Since(began), 0))
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		case <-l.shedNudge:
			t.Stop()
		}
	}
}

// ShedTick decides the shed level: it reads the signals over shed.window,
// steps the shedder, alerts on the shed signals that are unknown, and writes
// the level for the limiters (0 in a dry run) with a time to live of three
// shed ticks, so shedding ends if this loop stops.
func (l *Loop) ShedTick(ctx context.Context) {
	l.shedMu.Lock()
	defer l.shedMu.Unlock()
	st := l.Settings()
	r := st.Rules.Shed
	now := l.cfg.Now()
	var sig control.Signals
	if !r.Disabled && !st.Frozen {
		read := l.cfg.Source.Read
		if ss, ok := l.cfg.Source.(ShedSource); ok {
			read = ss.ReadShed
		}
		var err error
		if sig, err = read(ctx, now, r.Window.D()); err != nil {
			l.cfg.Logger.Error("adjuster shed tick", "step", "shed_signals", "err", err)
			l.m.errors.WithLabelValues("shed_signals").Inc()
			sig = control.Signals{} // every signal unknown: nothing holds a level
		}
	}
	shed := l.shed.Step(r, now, sig, func(rd control.Reading) bool { return st.Rules.Fresh(now, rd) }, st.Frozen)
	l.shedAlert(ctx, now, r, shed.Unknown, sig)
	if l.cfg.Shed != nil {
		level := shed.Level
		if st.DryRun {
			level = 0 // a dry run applies nothing
		}
		// Written every shed tick: the hash's time to live (three shed
		// ticks) is what ends shedding if this loop stops.
		if err := l.cfg.Shed.Set(ctx, level, r.RetryAfter.D(), shed.Why, 3*r.Tick.D()); err != nil {
			l.cfg.Logger.Error("adjuster shed tick", "step", "write_shed", "err", err)
			l.m.errors.WithLabelValues("write_shed").Inc()
		}
	}
	if shed.Changed() {
		l.cfg.Logger.Info("shed level change", "old", shed.Old, "new", shed.Level, "why", shed.Why, "unknown", shed.Unknown, "dry_run", st.DryRun)
	}
	l.m.shedLevel.WithLabelValues(fmt.Sprint(st.DryRun)).Set(float64(shed.Level))
	l.mu.Lock()
	l.lastShed = shed
	l.mu.Unlock()
}

// shedAlert counts, logs and pages when a signal the shed rule reads is
// unknown (missing or stale) — shedding is then blind to it — and resolves
// when it is known again.
func (l *Loop) shedAlert(ctx context.Context, now time.Time, r control.ShedRule, unknown []string, sig control.Signals) {
	names := r.Signals()
	for name := range l.shedAlerting {
		if !slices.Contains(names, name) {
			names = append(names, name) // no longer shed on: resolve below
		}
	}
	for _, name := range names {
		key := "shed:" + name
		l.page(ctx, l.shedAlerting, name, slices.Contains(unknown, name), signalPage{key: key, label: key,
			bad: l.m.shedUnknown, good: l.m.shedKnown,
			missing: "shed signal missing or stale: it neither raises nor holds a shed level", known: "shed signal known again",
			summary: fmt.Sprintf("Floodgate adjuster: shed signal %s is missing or stale; shedding cannot see it (levels come down on the others)", name),
			last:    sig.Get(name).At, details: map[string]any{"checked_at": now, "use": "shedding"}})
	}
}

// signalPage is what the loop says of a signal gone missing or stale, and
// back: key is the alerter's key, label the alerts counter's; bad counts
// the ticks the signal was bad, good is 1 while it is good (by signal).
type signalPage struct {
	key, label     string
	bad            *prometheus.CounterVec
	good           *prometheus.GaugeVec
	missing, known string // what it logs
	summary        string // the page's
	last           time.Time
	details        map[string]any // beside "signal" and "last_point"
}

// page acts once when signal name turns bad (pages, logs and counts it) and
// once when it turns good again (resolves the page, logs it); open holds the
// signals paged for.
func (l *Loop) page(ctx context.Context, open map[string]bool, name string, bad bool, p signalPage) {
	if bad {
		p.bad.WithLabelValues(name).Inc()
		p.good.WithLabelValues(name).Set(0)
	} else {
		p.good.WithLabelValues(name).Set(1)
	}
	switch {
	case bad && !open[name]:
		open[name] = true
		l.cfg.Logger.Warn(p.missing, "signal", name, "last_point", p.last)
		l.m.alerts.WithLabelValues(p.label).Inc()
		if l.cfg.Alerter != nil {
			details := map[string]any{"signal": name, "last_point": p.last}
			maps.Copy(details, p.details)
			if err := l.cfg.Alerter.Trigger(ctx, p.key, p.summary, details); err != nil {
				l.cfg.Logger.Error("page", "signal", name, "err", err)
			}
		}
	case !bad && open[name]:
		delete(open, name)
		l.cfg.Logger.Info(p.known, "signal", name)
		if l.cfg.Alerter != nil {
			if err := l.cfg.Alerter.Resolve(ctx, p.key); err != nil {
				l.cfg.Logger.Error("resolve page", "signal", name, "err", err)
			}
		}
	}
}

// Tick runs one step of the loop. Failures are logged, counted and kept in
// Status; a scale change that could not be written is retried next tick.
func (l *Loop) Tick(ctx context.Context) {
	l.tickMu.Lock()
	defer l.tickMu.Unlock()
	var errs []string
	fail := func(what string, err error) {
		l.cfg.Logger.Error("adjuster tick", "step", what, "err", err)
		l.m.errors.WithLabelValues(what).Inc()
		errs = append(errs, what+": "+err.Error())
	}

	// Settings: the stored document wins over the in-memory copy when newer.
	stored, found, err := l.cfg.Settings.Get(ctx)
	if err != nil {
		fail("settings", err)
	}
	l.mu.Lock()
	if found && stored.Version > l.settings.Version {
		l.settings = stored
	}
	st := l.settings.Clone()
	l.mu.Unlock()
	now := l.cfg.Now()
	var current map[string]float64
	if loaded, err := l.cfg.Scales.Load(ctx); err != nil {
		fail("load_scales", err)
	} else {
		current = loaded
	}
	l.ctrl.SetRules(st.Rules, current)
	if l.wasDry && !st.DryRun && current != nil {
		// Back from a dry run: continue from the scales actually applied (a scope
		// never written is at its maximum, where every scope starts).
		for scope, b := range st.Rules.Scopes {
			v, ok := current[scope]
			if !ok {
				v = b.Max
			}
			l.ctrl.Reset(scope, v)
		}
		l.cfg.Logger.Info("dry run ended; resuming from applied scales", "scales", l.ctrl.Scales())
	}
	l.wasDry = st.DryRun

	sig, err := l.cfg.Source.Read(ctx, now, st.Rules.Window.D())
	if err != nil {
		fail("signals", err)
		sig = control.Signals{}
	}
	overrides := st.Active(now)
	out := l.ctrl.Step(control.Input{Now: now, Signals: sig, Overrides: overrides, Frozen: st.Frozen})
	l.alert(ctx, now, out.Stale, sig)

	// Which changes take effect: all of them live; only operator overrides in a dry run.
	write := map[string]float64{}
	if !st.DryRun {
		maps.Copy(write, l.ctrl.Scales())
	}
	var applied []control.Change
	for _, ch := range out.Changes {
		if !st.DryRun || ch.Rule == control.RuleOverride {
			write[ch.Scope] = ch.New
			applied = append(applied, ch)
		}
	}
	writeOK := true
	if len(write) > 0 && current != nil && !equalScales(write, current) {
		if err := l.cfg.Scales.Set(ctx, write); err != nil {
			fail("write_scales", err)
			writeOK = false
		}
	} else if len(applied) > 0 && current == nil {
		// Redis could not even be read: do not pretend anything was applied.
		writeOK = false
	}
	var adj []events.Adjustment
	for _, ch := range out.Changes {
		dry := st.DryRun && ch.Rule != control.RuleOverride
		if !dry && !writeOK {
			continue // retried next tick: the controller did not move
		}
		l.ctrl.Commit(now, ch)
		adj = append(adj, l.event(now, ch, dry, sig, st))
		l.m.adjustments.WithLabelValues(ch.Scope, ch.Rule, fmt.Sprint(dry)).Inc()
		l.cfg.Logger.Info("scale change", "scope", ch.Scope, "old", ch.Old, "new", ch.New, "rule", ch.Rule, "why", ch.Why, "dry_run", dry)
	}
	l.pending = append(l.pending, adj...)
	if len(l.pending) > maxPending {
		l.m.dropped.Add(float64(len(l.pending) - maxPending))
		l.pending = l.pending[len(l.pending)-maxPending:]
	}
	if len(l.pending) > 0 {
		if err := l.cfg.Publisher.Publish(ctx, l.pending); err != nil {
			fail("publish", err)
		} else {
			l.pending = nil
		}
	}
	l.mu.Lock()
	shedLevel := l.lastShed.Level
	l.mu.Unlock()
	scales := l.ctrl.Scales()
	if l.cfg.Series != nil {
		if err := l.cfg.Series.Record(ctx, effects.Point{At: now, Scales: scales, Signals: sig, DryRun: st.DryRun, Frozen: st.Frozen, ShedLevel: shedLevel}); err != nil {
			fail("series", err)
		}
	}
	for scope, v := range scales {
		l.m.scale.WithLabelValues(scope, fmt.Sprint(st.DryRun)).Set(v)
	}
	outcome := "ok"
	switch {
	case len(errs) > 0:
		outcome = "error"
	case st.Frozen:
		outcome = "frozen"
	case st.DryRun:
		outcome = "dry_run"
	}
	l.m.ticks.WithLabelValues(outcome).Inc()
	l.mu.Lock()
	defer l.mu.Unlock()
	l.status = Status{
		At: now, Version: st.Version, DryRun: st.DryRun, Frozen: st.Frozen, Scales: scales,
		Signals: signalMap(sig), Stale: out.Stale, Engaged: l.ctrl.Engaged(), Held: out.Held,
		Changes: out.Changes, Override: overrides, Errors: errs, Pending: len(l.pending),
	}
}

// alert logs, counts and pages when a signal goes missing or stale, and resolves when it returns.
func (l *Loop) alert(ctx context.Context, now time.Time, stale []string, sig control.Signals) {
	for _, name := range control.AllSignals {
		isStale := slices.Contains(stale, name)
		if r := sig.Get(name); !isStale && r.OK {
			l.m.signal.WithLabelValues(name).Set(r.Value)
		}
		l.page(ctx, l.alerting, name, isStale, signalPage{key: "signal:" + name, label: name,
			bad: l.m.stale, good: l.m.fresh,
			missing: "signal missing or stale: holding scales that depend on it", known: "signal fresh again",
			summary: fmt.Sprintf("Floodgate adjuster: signal %s is missing or stale; limits will not rise", name),
			last:    sig.Get(name).At, details: map[string]any{"checked_at": now}})
	}
}

func (l *Loop) event(now time.Time, ch control.Change, dry bool, sig control.Signals, st settings.Settings) events.Adjustment {
	actor := events.Actor{Kind: events.ActorLoop, ID: l.cfg.ActorID}
	reason := ch.Why
	if ch.Rule == control.RuleOverride {
		if o, ok := st.Overrides[ch.Scope]; ok {
			actor = events.Actor{Kind: events.ActorOperator, ID: o.Actor}
			reason = fmt.Sprintf("%s until %s: %s", ch.Why, o.ExpiresAt.UTC().Format(time.RFC3339), o.Reason)
		}
	}
	if sig.AbuseRate.OK {
		reason += fmt.Sprintf(" (abuse share of decisions %.4g)", sig.AbuseRate.Value)
	}
	if len(reason) > events.MaxReasonLen {
		reason = reason[:events.MaxReasonLen]
	}
	value := func(r control.Reading) float64 {
		if r.OK {
			return r.Value
		}
		return 0
	}
	return events.Adjustment{
		ID: uuid.NewString(), TS: now, Scope: ch.Scope, OldScale: ch.Old, NewScale: ch.New,
		Signals: events.Signals{CPU: value(sig.CPU), ErrorRate: value(sig.ErrorRate), AbuseRate: sig.AbusePerSec},
		Rule:    ch.Rule, DryRun: dry, Actor: actor, Reason: strings.ToValidUTF8(reason, "?"),
	}
}

func equalScales(want, have map[string]float64) bool {
	for k, v := range want {
		if h, ok := have[k]; !ok || h != v {
			return false
		}
	}
	return true
}

func signalMap(sig control.Signals) map[string]*float64 {
	out := map[string]*float64{}
	for _, name := range append(control.AllSignals, control.SignalRedisLatency) {
		if r := sig.Get(name); r.OK {
			v := r.Value
			out[name] = &v
		} else {
			out[name] = nil
		}
	}
	return out
}

type metrics struct {
	ticks       *prometheus.CounterVec
	adjustments *prometheus.CounterVec
	errors      *prometheus.CounterVec
	stale       *prometheus.CounterVec
	alerts      *prometheus.CounterVec
	dropped     prometheus.Counter
	fresh       *prometheus.GaugeVec
	signal      *prometheus.GaugeVec
	scale       *prometheus.GaugeVec
	shedLevel   *prometheus.GaugeVec
	shedUnknown *prometheus.CounterVec
	shedKnown   *prometheus.GaugeVec
}

func newMetrics(reg prometheus.Registerer) *metrics {
	f := metric.With(reg)
	return &metrics{
		ticks:       f.CounterVec("floodgate_adjuster_ticks_total", "Loop ticks by outcome (ok, dry_run, frozen, error).", "outcome"),
		adjustments: f.CounterVec("floodgate_adjuster_adjustments_total", "Scale changes by scope, rule and dry_run.", "scope", "rule", "dry_run"),
		errors:      f.CounterVec("floodgate_adjuster_errors_total", "Tick step failures by step (settings, signals, load_scales, write_scales, publish, series).", "step"),
		stale:       f.CounterVec("floodgate_adjuster_stale_signals_total", "Ticks at which a signal was missing or stale.", "signal"),
		alerts:      f.CounterVec("floodgate_adjuster_alerts_total", "Alerts raised because a signal went missing or stale (signal shed:<name> for a shed signal).", "signal"),
		dropped:     f.Counter("floodgate_adjuster_dropped_events_total", "Adjustment events dropped because too many were waiting for Kafka."),
		fresh:       f.GaugeVec("floodgate_adjuster_signal_fresh", "1 when the signal was fresh at the last tick.", "signal"),
		signal:      f.GaugeVec("floodgate_adjuster_signal", "The signal's value at the last tick (fraction).", "signal"),
		scale:       f.GaugeVec("floodgate_adjuster_scale", "Each scope's scale after the last tick.", "scope", "dry_run"),
		shedLevel:   f.GaugeVec("floodgate_adjuster_shed_level", "The shed level the last shed tick decided (0 none, 1 bulk, 2 also best_effort, 3 also degraded); written as 0 in a dry run.", "dry_run"),
		shedUnknown: f.CounterVec("floodgate_adjuster_shed_unknown_signals_total", "Shed ticks at which a shed signal was missing or stale (unknown: it neither raised nor held a level).", "signal"),
		shedKnown:   f.GaugeVec("floodgate_adjuster_shed_signal_known", "1 when the shed signal was known (fresh) at the last shed tick.", "signal"),
	}
}
