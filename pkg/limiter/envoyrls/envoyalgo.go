package envoyrls

import (
	"context"
	"slices"

	"github.com/redis/go-redis/v9"

	"github.com/floodgate-dev/floodgate/pkg/envoyconf"
	"github.com/floodgate-dev/floodgate/pkg/events"
	"github.com/floodgate-dev/floodgate/pkg/limiter"
)

// EnvoyAlgorithms runs Floodgate's own algorithms for envoy-configured
// limits that name one (`# floodgate: {algorithm: …}`) with the engine's
// check script, one rule per call, in the envoy call's pipeline: a
// penalized descriptor's state lives in the principal's slot and the script
// applies the penalty as it does on the own path. Safe for concurrent use.
type EnvoyAlgorithms struct {
	run *limiter.ScriptRunner
}

var _ envoyconf.AlgorithmRunner = (*EnvoyAlgorithms)(nil)

// NewEnvoyAlgorithms returns the runner on rdb.
func NewEnvoyAlgorithms(rdb redis.UniversalClient) *EnvoyAlgorithms {
	return &EnvoyAlgorithms{run: limiter.NewScriptRunner(rdb)}
}

// Queue implements envoyconf.AlgorithmRunner.
func (a *EnvoyAlgorithms) Queue(ctx context.Context, pipe redis.Pipeliner, c *envoyconf.AlgorithmCheck) func(context.Context) (envoyconf.AlgorithmResult, error) {
	read := a.run.Queue(ctx, pipe, c.PenaltyKey, limiter.OneRule{
		Algorithm: limiter.Algorithm(c.Algorithm), Limit: int64(c.Limit), Period: c.Period, Burst: int64(c.Burst),
		Scale: c.Scale, Cost: int64(min(c.Hits, 1<<53)), Shadow: c.Shadow, Key: c.Key,
	})
	return func(ctx context.Context) (envoyconf.AlgorithmResult, error) {
		t, mult, err := read(ctx)
		if err != nil {
			return envoyconf.AlgorithmResult{}, err
		}
		return envoyconf.AlgorithmResult{Allowed: t.Allowed, Limit: t.Limit, Remaining: t.Remaining,
			ResetAfter: t.ResetAfter, Penalty: mult}, nil
	}
}

// decideQuota puts the quota's verdict in the call's decision event: the
// units it counted, and a denial (or, for a shadow quota, a would-be
// denial) as the quota's — the denial a client waits out longest, until the
// UTC day ends, as the engine's finish picks it on the own path.
func decideQuota(a *limiter.QuotaAnswer, ev *events.Decision) {
	ev.Cost = min(max(a.Units, 1), 1_000_000)
	if !a.WouldDeny {
		return
	}
	if a.Allowed {
		ev.Shadow = true
		if ev.Rule == "" {
			ev.Rule = a.ID
		}
		return
	}
	ev.Tier, ev.Rule, ev.Limit, ev.Remaining, ev.NearLimit = events.TierQuota, a.ID, a.Limit, 0, false
}

// envoyUnits is what a call counts against the principal's daily quota: the
// hits of the principal's own descriptor (its hits_addend, else the
// call's).
func envoyUnits(req *envoyconf.Request, tiers []events.Tier) int64 {
	hits := uint64(max(req.HitsAddend, 1))
	if i := slices.Index(tiers, events.TierPrincipal); i >= 0 && req.Descriptors[i].HitsAddend != nil {
		hits = *req.Descriptors[i].HitsAddend
	}
	return int64(min(hits, 1_000_000))
}
