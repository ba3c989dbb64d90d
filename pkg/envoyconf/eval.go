package envoyconf

import (
	"context"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/floodgate-dev/floodgate/pkg/redisx"
)

// Code is a descriptor's or a call's answer, numbered as Envoy's
// RateLimitResponse.Code.
type Code int

// The codes.
const (
	CodeUnknown   Code = 0
	CodeOK        Code = 1
	CodeOverLimit Code = 2
)

// Descriptor is one descriptor of a call.
type Descriptor struct {
	Entries []Entry
	// HitsAddend, when set, is this descriptor's own hits (Envoy's
	// descriptor-level hits_addend); otherwise the call's.
	HitsAddend *uint64
	// Override, when set, replaces the configured limit (Envoy's descriptor
	// `limit`, a RateLimitOverride).
	Override *Override
	// Penalize applies the multiplier in the request's PenaltyKey to the
	// descriptor's limit.
	Penalize bool
}

// Override is a limit sent by Envoy with the descriptor.
type Override struct {
	RequestsPerUnit uint32
	Unit            Unit
}

// Request is one ShouldRateLimit call.
type Request struct {
	Domain      string
	Descriptors []Descriptor
	HitsAddend  uint32 // 0 means 1
	// PenaltyKey, when set, is a principal's penalty hash (field m, a
	// multiplier in (0, 1]) read in the counters' pipeline — no round trip
	// of its own — and applied to the descriptors with Penalize set. A
	// missing or unreadable penalty is no penalty.
	PenaltyKey string
	// Scale, when set, is the factor (the adjuster's scale, in (0, 10]) by
	// which descriptor i's counted limit l is multiplied; nil or 0 means 1.
	Scale func(i int, l *Limit) float64
}

// Status is one descriptor's answer.
type Status struct {
	Code Code
	// Limit is the limit that applied (nil: no rule matched, or unlimited).
	Limit          *Limit
	Override       *Override
	LimitRemaining uint32
	ResetAfter     time.Duration // until the end of the limit's window; 0 without a limit
	Unlimited      bool
	// Shadowed is set when the limit is in shadow mode and was exceeded:
	// the code is OK, the counters count.
	Shadowed bool
	// QuotaExceeded is set when a quota-mode limit was exceeded: the code
	// is OK and the call is not failed by it.
	QuotaExceeded bool
	// Count is the window's counter after this call's hits.
	Count uint64
	// Effective is the limit enforced: the configured one (or the override)
	// × scale × penalty, floored, at least 1 — exactly the configured one
	// when neither applies. 0 without a counted limit.
	Effective uint32
	// Penalty is the multiplier applied to this descriptor's limit (1: none,
	// or not penalized); Scale the scale applied (1: none).
	Penalty, Scale float64
}

// RequestsPerUnit and Unit of the limit that applied, override, scale and
// penalty included.
func (s Status) RequestsPerUnit() (uint32, Unit, bool) {
	rpu, u, ok := s.configured()
	if s.Effective > 0 {
		rpu = s.Effective
	}
	return rpu, u, ok
}

// Configured is the limit's requests per unit before scale and penalty.
func (s Status) Configured() uint32 {
	rpu, _, _ := s.configured()
	return rpu
}

func (s Status) configured() (uint32, Unit, bool) {
	switch {
	case s.Override != nil:
		return s.Override.RequestsPerUnit, s.Override.Unit, true
	case s.Limit != nil:
		return s.Limit.RequestsPerUnit, s.Limit.Unit, true
	}
	return 0, UnitUnknown, false
}

// Response is the call's answer.
type Response struct {
	Overall  Code
	Statuses []Status
	// Shadowed is set when global shadow mode turned an over-limit answer into OK.
	Shadowed bool
	// Penalty is the multiplier read from the request's PenaltyKey (1: none,
	// or not read because no counted limit was penalized).
	Penalty float64
	// Now is the time the call was decided at (the evaluator's clock).
	Now time.Time
}

// MaxUint32 is what envoy ratelimit answers as limit_remaining for an
// unlimited descriptor.
const MaxUint32 = math.MaxUint32

// Evaluator answers calls against a configuration with fixed-window
// counters in Redis, as envoy ratelimit does: one INCRBY + EXPIRE per
// limited descriptor, all in one pipeline, and the counter counts every hit
// (over the limit included). Safe for concurrent use.
type Evaluator struct {
	Redis redis.UniversalClient
	// Prefix starts every counter key, e.g. "fg:envoy:".
	Prefix string
	// GlobalShadow answers OK overall whatever the descriptors say (envoy
	// ratelimit's global shadow switch); statuses still tell the truth.
	GlobalShadow bool
	// Coalescer, when set, sends the counters of concurrent calls in shared
	// pipelines (on Redis, not in Prefix's keys); nil: one pipeline per call.
	Coalescer *redisx.Coalescer
	// Now is the clock; time.Now when nil.
	Now func() time.Time
}

// Evaluate answers req with cfg. A domain cfg does not have answers OK for
// every descriptor (envoy ratelimit does the same).
func (e *Evaluator) Evaluate(ctx context.Context, cfg *Config, req Request) (Response, error) {
	if req.Domain == "" {
		return Response{}, fmt.Errorf("rate limit domain must not be empty")
	}
	if len(req.Descriptors) == 0 {
		return Response{}, fmt.Errorf("rate limit descriptor list must not be empty")
	}
	now := time.Now()
	if e.Now != nil {
		now = e.Now()
	}
	statuses := make([]Status, len(req.Descriptors))
	matches := make([]Match, len(req.Descriptors))
	replaced := map[string]bool{}
	for i, d := range req.Descriptors {
		if d.Override != nil {
			if d.Override.Unit.Seconds() == 0 {
				return Response{}, fmt.Errorf("descriptor %d: limit override has no valid unit", i)
			}
			vals := make([]string, len(d.Entries))
			for j, en := range d.Entries {
				vals[j] = en.Value
			}
			matches[i] = Match{Limit: &Limit{RequestsPerUnit: d.Override.RequestsPerUnit, Unit: d.Override.Unit,
				Path: req.Domain + "." + descriptorPath(d.Entries), Route: overrideRoute(req.Domain, d.Entries)}, CounterValues: vals}
			statuses[i].Override = d.Override
			continue
		}
		matches[i] = cfg.Lookup(req.Domain, d.Entries)
		if l := matches[i].Limit; l != nil {
			for _, r := range l.Replaces {
				replaced[r] = true
			}
		}
	}
	type pending struct {
		i    int
		cmd  *redis.IntCmd
		hits uint64
	}
	var todo []pending
	type incr struct {
		key  string
		hits int64
		ttl  time.Duration
	}
	var incrs []incr
	for i, m := range matches {
		l := m.Limit
		switch {
		case l == nil:
			statuses[i].Code = CodeOK
			continue
		case l.Unlimited:
			statuses[i] = Status{Code: CodeOK, LimitRemaining: MaxUint32, Unlimited: true}
			continue
		case l.Name != "" && replaced[l.Name] && statuses[i].Override == nil:
			statuses[i].Code = CodeOK // replaced by another matching limit
			continue
		}
		statuses[i].Limit = l
		hits := uint64(max(req.HitsAddend, 1))
		if h := req.Descriptors[i].HitsAddend; h != nil {
			hits = *h
		}
		secs := l.Unit.Seconds()
		start := now.Unix() / secs * secs
		key := e.counterKey(req.Domain, req.Descriptors[i].Entries, m.CounterValues, start)
		incrs = append(incrs, incr{key: key, hits: int64(hits), ttl: time.Duration(secs) * time.Second})
		todo = append(todo, pending{i: i, hits: hits})
	}
	var pen *redis.StringCmd
	if len(todo) > 0 {
		penalize := false
		for _, p := range todo {
			penalize = penalize || req.Descriptors[p.i].Penalize
		}
		add := func(ctx context.Context, pipe redis.Pipeliner) {
			for k, in := range incrs {
				todo[k].cmd = pipe.IncrBy(ctx, in.key, in.hits)
				pipe.Expire(ctx, in.key, in.ttl)
			}
			if penalize && req.PenaltyKey != "" {
				pen = pipe.HGet(ctx, req.PenaltyKey, "m")
			}
		}
		if e.Coalescer != nil {
			if err := e.Coalescer.Do(ctx, add); err != nil {
				return Response{}, fmt.Errorf("envoy counters: %w", err)
			}
		} else {
			pipe := e.Redis.Pipeline()
			add(ctx, pipe)
			_, _ = pipe.Exec(ctx) // errors per command, below
		}
		for _, p := range todo {
			if err := p.cmd.Err(); err != nil {
				return Response{}, fmt.Errorf("envoy counters: %w", err)
			}
		}
	}
	mult := penaltyOf(pen)
	for _, p := range todo {
		st := &statuses[p.i]
		count := uint64(p.cmd.Val())
		st.Count = count
		d := &req.Descriptors[p.i]
		st.Scale, st.Penalty = 1, 1
		if req.Scale != nil {
			if s := req.Scale(p.i, st.Limit); s > 0 {
				st.Scale = s
			}
		}
		if d.Penalize {
			st.Penalty = mult
		}
		st.Effective = Effective(st.Configured(), st.Scale*st.Penalty)
		limit := uint64(st.Effective)
		_, unit, _ := st.RequestsPerUnit()
		st.ResetAfter = ResetAfter(unit, now)
		if count > limit {
			st.Code = CodeOverLimit
			switch {
			case st.Limit.ShadowMode && st.Override == nil:
				st.Code, st.Shadowed = CodeOK, true
			case st.Limit.QuotaMode && st.Override == nil:
				// Quota mode (envoy ratelimit v1.4.1-…20260122): the
				// violation is reported as OK with no time until reset,
				// and never fails the call.
				st.Code, st.QuotaExceeded, st.ResetAfter = CodeOK, true, 0
			}
			continue
		}
		st.Code = CodeOK
		st.LimitRemaining = uint32(limit - count)
	}
	resp := Response{Overall: CodeOK, Statuses: statuses, Penalty: mult, Now: now}
	for _, st := range statuses {
		if st.Code == CodeOverLimit {
			resp.Overall = CodeOverLimit
		}
	}
	if resp.Overall == CodeOverLimit && e.GlobalShadow {
		resp.Overall, resp.Shadowed = CodeOK, true
	}
	return resp, nil
}

// penaltyOf reads a penalty multiplier: in (0, 1], else 1 (none, missing,
// unreadable — as the own path's check script reads it).
func penaltyOf(cmd *redis.StringCmd) float64 {
	if cmd == nil || cmd.Err() != nil {
		return 1
	}
	m, err := strconv.ParseFloat(cmd.Val(), 64)
	if err != nil || !(m > 0 && m <= 1) {
		return 1
	}
	return m
}

// Effective is a limit multiplied by factor (scale × penalty) as Floodgate's
// own check script computes it: floor(limit × factor), at least 1, and the
// limit itself, untouched, when factor is 1.
func Effective(limit uint32, factor float64) uint32 {
	if factor == 1 || limit == 0 {
		return limit
	}
	return uint32(min(max(1, math.Floor(float64(limit)*factor+1e-9)), math.MaxUint32))
}

// counterKey names a descriptor's counter for the window starting at start:
// the domain, the keys and the counter values, escaped so no value can move
// into another key or another cluster slot, one hash tag per counter.
func (e *Evaluator) counterKey(domain string, entries []Entry, values []string, start int64) string {
	var b strings.Builder
	b.WriteString(e.Prefix)
	b.WriteByte('{')
	b.WriteString(redisx.Escape(domain))
	for i, en := range entries {
		b.WriteByte(':')
		b.WriteString(redisx.Escape(en.Key))
		b.WriteByte('=')
		b.WriteString(redisx.Escape(values[i]))
	}
	b.WriteString("}:")
	b.WriteString(strconv.FormatInt(start, 10))
	return b.String()
}

func descriptorPath(entries []Entry) string {
	parts := make([]string, len(entries))
	for i, en := range entries {
		parts[i] = en.Key
		if en.Value != "" {
			parts[i] += "_" + en.Value
		}
	}
	return strings.Join(parts, ".")
}
