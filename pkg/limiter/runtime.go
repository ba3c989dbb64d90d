package limiter

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
	"github.com/redis/go-redis/v9"

	"github.com/floodgate-dev/floodgate/pkg/events"
	"github.com/floodgate-dev/floodgate/pkg/limiter/admission"
	"github.com/floodgate-dev/floodgate/pkg/redisx"
	"github.com/floodgate-dev/floodgate/pkg/tick"
)

// OverridesKey is the Redis hash of runtime overrides, changed without a
// redeploy and polled by every limiter together with the scales:
//
//	principal:<kind>:<id>  → {"plan":"pro","limits":{"bot-global":200},"quota":200000}
//	plan:<name>            → {"limits":{"bot-global":100},"quota":172800}
//
// "limits" maps rule ids to a new limit (and "bursts" to a new burst); "quota"
// replaces the daily quota. A principal's override beats its plan's, which beats
// the rules file. Entries that do not parse are skipped, logged and counted.
const OverridesKey = "fg:overrides"

// Scales are the adjuster's limit scales by scope: "global", "tier:<tier>" and
// "route:<METHOD> <template>". A rule's scale is the product of the scopes that
// apply to it (route scopes only to endpoint and resource rules), within (0, 10].
type Scales map[string]float64

// For returns the scale of a rule of tier t on a route.
func (s Scales) For(t events.Tier, method, route string) float64 {
	if len(s) == 0 {
		return 1
	}
	v := 1.0
	if g, ok := s["global"]; ok {
		v *= g
	}
	if g, ok := s["tier:"+string(t)]; ok {
		v *= g
	}
	if t == events.TierEndpoint || t == events.TierResource {
		if g, ok := s["route:"+method+" "+route]; ok {
			v *= g
		}
	}
	return min(max(v, 1e-6), 10)
}

// Override changes limits for one principal or one plan.
type Override struct {
	Plan   string           `json:"plan,omitempty"` // principal overrides only
	Limits map[string]int64 `json:"limits,omitempty"`
	Bursts map[string]int64 `json:"bursts,omitempty"`
	Quota  int64            `json:"quota,omitempty"`
}

func (o *Override) apply(rule string, limit, burst int64) (int64, int64) {
	if v, ok := o.Limits[rule]; ok {
		limit = v
		if burst != 0 && burst < v {
			burst = v
		}
	}
	if v, ok := o.Bursts[rule]; ok && v >= limit {
		burst = v
	}
	return limit, burst
}

func (o *Override) validate() error {
	if o.Plan != "" && !events.ValidPlan(o.Plan) {
		return fmt.Errorf("plan %q: want [a-z0-9][a-z0-9_-]{0,31}", o.Plan)
	}
	for id, v := range o.Limits {
		if v < 1 || v > 1_000_000_000 {
			return fmt.Errorf("limits.%s: %d must be in 1..1000000000", id, v)
		}
	}
	for id, v := range o.Bursts {
		if v < 1 || v > 1_000_000_000 {
			return fmt.Errorf("bursts.%s: %d must be in 1..1000000000", id, v)
		}
	}
	if o.Quota < 0 || o.Quota > events.MaxSafeInteger {
		return fmt.Errorf("quota %d: must be positive", o.Quota)
	}
	return nil
}

// Overrides is one snapshot of the overrides hash.
type Overrides struct {
	principals map[string]*Override // by principal key kind:id
	plans      map[string]*Override
}

// Principal returns p's override or nil.
func (o *Overrides) Principal(p events.Principal) *Override {
	if o == nil || len(o.principals) == 0 {
		return nil
	}
	return o.principals[p.Key()]
}

// Plan returns plan's override or nil.
func (o *Overrides) Plan(plan string) *Override {
	if o == nil || len(o.plans) == 0 {
		return nil
	}
	return o.plans[plan]
}

// ParseOverrides reads the overrides hash; bad entries are returned as errors and skipped.
func ParseOverrides(h map[string]string) (*Overrides, []error) {
	o := &Overrides{principals: map[string]*Override{}, plans: map[string]*Override{}}
	var errs []error
	for field, v := range h {
		var ov Override
		dec := json.NewDecoder(strings.NewReader(v))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&ov); err != nil {
			errs = append(errs, fmt.Errorf("override %q: %w", field, err))
			continue
		}
		if err := ov.validate(); err != nil {
			errs = append(errs, fmt.Errorf("override %q: %w", field, err))
			continue
		}
		switch {
		case strings.HasPrefix(field, "principal:"):
			p, err := events.ParsePrincipalKey(strings.TrimPrefix(field, "principal:"))
			if err != nil {
				errs = append(errs, fmt.Errorf("override %q: %w", field, err))
				continue
			}
			o.principals[p.Key()] = &ov
		case strings.HasPrefix(field, "plan:"):
			name := strings.TrimPrefix(field, "plan:")
			if !events.ValidPlan(name) || ov.Plan != "" {
				errs = append(errs, fmt.Errorf("override %q: not a plan name, or a plan override naming a plan", field))
				continue
			}
			o.plans[name] = &ov
		default:
			errs = append(errs, fmt.Errorf("override %q: field must start with principal: or plan:", field))
		}
	}
	return o, errs
}

// Runtime holds the adjuster's scales and the overrides, refreshed from Redis
// about once a second. Safe for concurrent use.
type Runtime struct {
	// ScalesKey and OverridesKey are redisx.ScalesKey and OverridesKey unless a
	// test points them at keys of its own.
	ScalesKey    string
	OverridesKey string
	// ShedKey is redisx.ShedKey unless a test points it at a key of its own.
	ShedKey string

	rdb       redis.UniversalClient
	log       *slog.Logger
	scales    atomic.Pointer[Scales]
	overrides atomic.Pointer[Overrides]
	shedding  atomic.Pointer[admission.Shedding]
	badEntry  prometheus.Counter
	errors    prometheus.Counter
	shedLevel prometheus.Gauge
}

// NewRuntime returns a runtime with no scales and no overrides until Refresh.
func NewRuntime(rdb redis.UniversalClient, log *slog.Logger, reg prometheus.Registerer) *Runtime {
	f := promauto.With(reg)
	r := &Runtime{rdb: rdb, log: log, ScalesKey: redisx.ScalesKey, OverridesKey: OverridesKey, ShedKey: redisx.ShedKey,
		badEntry: f.NewCounter(prometheus.CounterOpts{Name: "floodgate_limiter_bad_runtime_entries_total", Help: "Scale or override entries in Redis that did not parse and were skipped."}),
		errors:   f.NewCounter(prometheus.CounterOpts{Name: "floodgate_limiter_runtime_refresh_errors_total", Help: "Failed refreshes of scales and overrides; the last good ones stay."}),
		shedLevel: f.NewGauge(prometheus.GaugeOpts{Name: "floodgate_limiter_shed_level",
			Help: "The adjuster's shed level as this limiter applies it: 0 none, 1 bulk, 2 also best_effort, 3 also degraded (critical is never shed)."}),
	}
	r.scales.Store(&Scales{})
	r.overrides.Store(&Overrides{})
	r.shedding.Store(&admission.Shedding{})
	return r
}

// Shedding returns the adjuster's shed state (level 0 until Refresh finds one).
func (r *Runtime) Shedding() admission.Shedding { return *r.shedding.Load() }

// Scales returns the current scales; the caller must not modify them.
func (r *Runtime) Scales() Scales { return *r.scales.Load() }

// Overrides returns the current overrides.
func (r *Runtime) Overrides() *Overrides { return r.overrides.Load() }

// Refresh reads fg:scales, fg:overrides and fg:shed once. On error the
// previous values stay; a shed hash that does not parse keeps the previous
// shed state.
func (r *Runtime) Refresh(ctx context.Context) error {
	sc, err := r.rdb.HGetAll(ctx, r.ScalesKey).Result()
	if err != nil {
		r.errors.Inc()
		return fmt.Errorf("read %s: %w", r.ScalesKey, err)
	}
	ov, err := r.rdb.HGetAll(ctx, r.OverridesKey).Result()
	if err != nil {
		r.errors.Inc()
		return fmt.Errorf("read %s: %w", r.OverridesKey, err)
	}
	sh, err := r.rdb.HGetAll(ctx, r.ShedKey).Result()
	if err != nil {
		r.errors.Inc()
		return fmt.Errorf("read %s: %w", r.ShedKey, err)
	}
	if shed, err := admission.ParseShedding(sh); err != nil {
		r.badEntry.Inc()
		r.log.Warn("keeping the shed state: bad shed hash", "key", r.ShedKey, "err", err)
	} else {
		r.shedding.Store(&shed)
		r.shedLevel.Set(float64(shed.Level))
	}
	scales := Scales{}
	for scope, v := range sc {
		f, err := strconv.ParseFloat(v, 64)
		if err != nil || !(f > 0 && f <= 10) || !validScope(scope) {
			r.badEntry.Inc()
			r.log.Warn("skipping bad limit scale", "scope", scope, "value", v)
			continue
		}
		scales[scope] = f
	}
	o, errs := ParseOverrides(ov)
	for _, err := range errs {
		r.badEntry.Inc()
		r.log.Warn("skipping bad override", "err", err)
	}
	r.scales.Store(&scales)
	r.overrides.Store(o)
	return nil
}

func validScope(s string) bool {
	switch {
	case s == "global":
		return true
	case strings.HasPrefix(s, "tier:"):
		return events.Tier(strings.TrimPrefix(s, "tier:")).Valid()
	case strings.HasPrefix(s, "route:"):
		m, route, ok := strings.Cut(strings.TrimPrefix(s, "route:"), " ")
		return ok && events.ValidMethod(m) == nil && events.ValidRoute(route) == nil
	}
	return false
}

// Run refreshes every interval until ctx is done. A failed refresh is
// logged at most once per 10 s, with the count held back (a Redis outage
// made it a line a second).
func (r *Runtime) Run(ctx context.Context, every time.Duration) error {
	var errLog rateLog
	return tick.Every(ctx, every, func(ctx context.Context) {
		rctx, cancel := context.WithTimeout(ctx, every)
		defer cancel()
		if err := r.Refresh(rctx); err != nil && ctx.Err() == nil {
			if ok, held := errLog.allow(time.Now(), 10*time.Second); ok {
				r.log.Warn("refresh scales and overrides", "err", err, "errors_not_logged", held)
			}
		}
	})
}
