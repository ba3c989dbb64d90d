package limiter

import (
	"context"
	"strings"
	"time"

	"github.com/floodgate-dev/floodgate/pkg/events"
	"github.com/floodgate-dev/floodgate/pkg/limiter/admission"
	"github.com/floodgate-dev/floodgate/pkg/redisx"
	"github.com/floodgate-dev/floodgate/pkg/rollout"
)

// Candidate is a rules version running in shadow beside the enforced rules
// (a rule rollout, docs/rollouts.md): every admitted check is also judged by
// it, on its own buckets (redisx.CandidateKey), without changing the answer.
type Candidate struct {
	Version int64
	Rules   *Ruleset
	Impact  Impact // its would-block counts; nil = not counted
	// SliceBP, at a step of a gradual rollout, is the slice of principals
	// the candidate answers for, in basis points of the principal-hash
	// space (PrincipalSlice): 0 answers for none (shadow), 10000 for all.
	// The enforced rules still judge every request beside it.
	SliceBP int64
}

// Enforces reports whether the candidate answers for principal p: its
// hash falls in the candidate's slice.
func (c *Candidate) Enforces(p events.Principal) bool {
	return c.SliceBP > 0 && PrincipalSlice(p) < c.SliceBP
}

// PrincipalSlice places principal p in the principal-hash space of gradual
// rollouts: [0, 10000), from FNV-1a (64-bit) of its key ("kind:id"). Every
// limiter replica places a principal the same, and a step's slice holds the
// slices of the steps before it (a principal once in stays in).
func PrincipalSlice(p events.Principal) int64 { return rollout.PrincipalSlice(p) }

// Impact counts a rules version's decisions by priority: a rollout's
// would-block counts (pkg/limiter/candidate). Must be safe for concurrent use
// and must not block: it is called on every check.
type Impact interface {
	// Add counts one decision of priority p, blocked or not.
	Add(p admission.Priority, blocked bool)
	// AddError counts a check the version could not judge (Redis).
	AddError()
	// AddPaired counts a decision both a shadow candidate (cand: blocked)
	// and the enforced rules (parent: blocked) judged, by its full class;
	// answered: the candidate's verdict was the answer (its step's slice).
	AddPaired(p admission.Priority, req Request, plan string, cand, parent, answered bool)
}

// candidateSource is a RuleSource that may also hold a candidate.
type candidateSource interface {
	Candidate() *Candidate
}

var _ candidateSource = (*RuleStore)(nil)

// Candidate returns the candidate in shadow, or nil.
func (s *RuleStore) Candidate() *Candidate { return s.cand.Load() }

// SetCandidate replaces the candidate (nil: none).
func (s *RuleStore) SetCandidate(c *Candidate) { s.cand.Store(c) }

// candidateVerdict is what the candidate would have answered.
type candidateVerdict struct {
	blocked bool
	ok      bool // false: the candidate could not be asked (Redis)
	// res is its answer, built only when it answers (Candidate.Enforces).
	res Result
}

// checkCandidate judges req by the candidate's rules on the candidate's
// buckets: the same script, the same penalty and scales, in one pipelined
// round trip per Redis shard. Its daily quota is judged on the enforced day
// usage — the principal's real usage today, the ledger's key — and never
// counted into it (dayQuotaPeek): a candidate's usage of its own would start
// at zero on the day it begins, and the ledger is the quota service's. Like
// an enforced decision it is all or nothing: when one group would deny, the
// other group's units are given back.
//
// With answer, its verdict is built into the Result the caller gets (the
// candidate answers for the principal at a step): its tiers as Redis gave
// them, without teaching the engine's local state (over-limit cache, leases,
// local buckets), which follows the enforced rules' keys.
func (e *Engine) checkCandidate(ctx context.Context, c *Candidate, req Request, answer bool) candidateVerdict {
	pg, ig, cost, plan := e.bind(c.Rules, req)
	groups := make([]*group, 0, 2)
	for _, g := range []*group{&pg, &ig} {
		rules := g.rules[:0]
		for _, b := range g.rules {
			if b.tier == events.TierQuota {
				b.alg = dayQuotaPeek // the enforced usage, read only: its keys stay the ledger's
				rules = append(rules, b)
				continue
			}
			keys := make([]string, len(b.keys))
			for i, k := range b.keys {
				keys[i] = redisx.CandidateKey(c.Version, k)
			}
			b.keys, b.lease = keys, 0 // a candidate is judged exactly: nothing leased on its keys
			rules = append(rules, b)
		}
		if g.rules = rules; len(rules) > 0 {
			groups = append(groups, g)
		}
	}
	if len(groups) == 0 {
		v := candidateVerdict{ok: true}
		if answer {
			v.res = finish(Result{Allowed: true, Tier: events.TierPrincipal, Penalty: 1, Scale: 1, Now: e.localNow(req.At).UTC(), Cost: int(cost), Plan: plan}, c.Rules.NearLimit)
		}
		return v
	}
	rctx, cancel := context.WithTimeout(ctx, e.budget+e.queueWait)
	defer cancel()
	outs := make([]scriptOut, len(groups))
	sh0 := e.shards.of(groups[0].penaltyKey)
	var parts [][]int
	if len(groups) == 2 && e.shards.of(groups[1].penaltyKey) != sh0 {
		parts = [][]int{{0}, {1}}
	} else {
		parts = [][]int{make([]int, len(groups))}
		for i := range groups {
			parts[0][i] = i
		}
	}
	for _, idx := range parts {
		gs := make([]*group, len(idx))
		for j, i := range idx {
			gs[j] = groups[i]
		}
		raw, perr, err := e.run(rctx, e.shards.of(gs[0].penaltyKey), gs, time.Time{}, 0, req.Priority == admission.PriorityCritical)
		if err != nil {
			return candidateVerdict{}
		}
		for j, i := range idx {
			if perr[j] != nil {
				return candidateVerdict{}
			}
			o, err := parseOut(raw[j], len(groups[i].rules))
			if err != nil {
				return candidateVerdict{}
			}
			outs[i] = o
		}
	}
	blocked := false
	for _, o := range outs {
		blocked = blocked || !o.allowed
	}
	if blocked && len(groups) == 2 {
		for i, g := range groups {
			if outs[i].allowed && strings.Contains(outs[i].mask, "1") {
				e.refund(ctx, g, outs[i].mask)
			}
		}
	}
	v := candidateVerdict{blocked: blocked, ok: true}
	if answer {
		v.res = candidateResult(groups, outs, blocked, cost, plan, c.Rules.NearLimit)
	}
	return v
}

// candidateResult is the answer of a candidate that answers for the
// principal: its tiers, penalty and time as Redis gave them.
func candidateResult(groups []*group, outs []scriptOut, blocked bool, cost int64, plan string, near float64) Result {
	r := Result{Allowed: !blocked, Penalty: 1, Cost: int(cost), Plan: plan}
	for i, g := range groups {
		o := outs[i]
		if g.penalize {
			r.Penalty = o.mult
		}
		r.Now = o.now
		for j, t := range o.tiers {
			b := g.rules[j]
			t.Rule, t.Tier, t.Algorithm, t.Shadow, t.Period, t.Scale, t.Quota = b.id, b.tier, b.alg, b.shadow, b.period, b.scale, b.limit
			if !t.Allowed && t.RetryAfter < 0 {
				t.RetryAfter = max(t.ResetAfter, b.period)
			}
			r.Tiers = append(r.Tiers, t)
		}
	}
	return finish(r, near)
}
