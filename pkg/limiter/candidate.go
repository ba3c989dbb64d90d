package limiter

import (
	"context"
	"strings"
	"time"

	"github.com/floodgate-dev/floodgate/pkg/events"
	"github.com/floodgate-dev/floodgate/pkg/limiter/admission"
	"github.com/floodgate-dev/floodgate/pkg/redisx"
)

// Candidate is a rules version running in shadow beside the enforced rules
// (a rule rollout, docs/rollouts.md): every admitted check is also judged by
// it, on its own buckets (redisx.CandidateKey), without changing the answer.
type Candidate struct {
	Version int64
	Rules   *Ruleset
	Impact  Impact // its would-block counts; nil = not counted
}

// Impact counts a rules version's decisions by priority: a rollout's
// would-block counts (pkg/limiter/candidate). Must be safe for concurrent use
// and must not block: it is called on every check.
type Impact interface {
	// Add counts one decision of priority p, blocked or not.
	Add(p admission.Priority, blocked bool)
	// AddError counts a check the version could not judge (Redis).
	AddError()
	// AddPaired counts a decision both a shadow candidate (cand: blocked)
	// and the enforced rules (parent: blocked) judged, by its full class.
	AddPaired(p admission.Priority, req Request, plan string, cand, parent bool)
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
}

// checkCandidate judges req by the candidate's rules on the candidate's
// buckets: the same script, the same penalty and scales, in one pipelined
// round trip per Redis shard. Its daily quota is judged on the enforced day
// usage — the principal's real usage today, the ledger's key — and never
// counted into it (dayQuotaPeek): a candidate's usage of its own would start
// at zero on the day it begins, and the ledger is the quota service's. Like
// an enforced decision it is all or nothing: when one group would deny, the
// other group's units are given back.
func (e *Engine) checkCandidate(ctx context.Context, c *Candidate, req Request) candidateVerdict {
	pg, ig, _, _ := e.bind(c.Rules, req)
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
		return candidateVerdict{ok: true}
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
		raw, perr, err := e.run(rctx, e.shards.of(gs[0].penaltyKey), gs, time.Time{})
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
	return candidateVerdict{blocked: blocked, ok: true}
}
