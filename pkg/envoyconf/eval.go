package envoyconf

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/floodgate-dev/floodgate/pkg/limiter"

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
	// Also, when set, puts more commands on the call's pipeline (the
	// principal's daily quota); the caller reads them once Evaluate returns.
	Also func(ctx context.Context, pipe redis.Pipeliner)
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
	// Degraded: Redis could not be asked; the limit's fail policy answered.
	Degraded bool
	// Cached: the counter was in the LocalCache, over its limit; Redis was
	// not asked and the hit not counted.
	Cached bool
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
	// Degraded: the counters could not be read and the limits' fail
	// policies answered (see degrade); Err is why.
	Degraded bool
	Err      error
}

// MaxUint32 is what envoy ratelimit answers as limit_remaining for an
// unlimited descriptor.
const MaxUint32 = math.MaxUint32

// Evaluator answers calls against a configuration with fixed-window
// counters in Redis, as envoy ratelimit does: one INCRBY + EXPIRE per
// limited descriptor, all in one pipeline, and the counter counts every hit
// (over the limit included). A limit whose floodgate comment names one of
// Floodgate's algorithms is decided by Algorithms in the same pipeline.
// Safe for concurrent use.
type Evaluator struct {
	Redis redis.UniversalClient
	// Prefix starts every key in Floodgate's own format, e.g. "fg:envoy:":
	// the fixed-window counters (unless EnvoyRatelimitKeys) and the state
	// of Floodgate's algorithms.
	Prefix string
	// EnvoyRatelimitKeys keys the fixed-window counters as envoy ratelimit
	// does, byte for byte: EnvoyRatelimitPrefix (its CACHE_KEY_PREFIX),
	// then domain_key_value_…_window. Floodgate and envoy ratelimit on one
	// Redis then count in the same counters, so a fleet can move from one
	// to the other without a window starting again. Those keys are not
	// escaped, as envoy ratelimit's are not: a value with "_" in it can
	// name another descriptor's counter (Floodgate's own format escapes
	// every part and gives each counter a hash tag of its own).
	EnvoyRatelimitKeys   bool
	EnvoyRatelimitPrefix string
	// GlobalShadow answers OK overall whatever the descriptors say (envoy
	// ratelimit's global shadow switch); statuses still tell the truth.
	GlobalShadow bool
	// GlobalQuota puts every limit in quota mode, a descriptor's limit
	// override included (envoy ratelimit's global QUOTA_MODE): a descriptor
	// over its limit answers OK, its limit and 0 remaining, and never fails
	// the call.
	GlobalQuota bool
	// ExpirationJitter, when positive, lengthens each counter's EXPIRE by a
	// random whole number of seconds below it (envoy ratelimit's
	// EXPIRATION_JITTER_MAX_SECONDS), so that the counters of one window do
	// not all expire in the same second.
	ExpirationJitter time.Duration
	// StopIncrementOverLimit is envoy ratelimit's
	// STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT: a call's fixed-window
	// counters are read first (a round trip of its own), and when one of
	// them would pass its limit, or is in the LocalCache, the call's other
	// counters are not incremented — a call that will be denied does not
	// spend the other descriptors' allowance. The threshold is the limit
	// times the adjuster's scale (the principal's penalty is read with the
	// increments, after it); Floodgate's algorithms are charged as before.
	StopIncrementOverLimit bool
	// LocalCache, when set, answers the fixed-window counters Redis said were
	// over their limit without asking it again until their window ends
	// (envoy ratelimit's LOCAL_CACHE_SIZE_IN_BYTES).
	LocalCache *LocalCache
	// Coalescer, when set, sends the counters of concurrent calls in shared
	// pipelines (on Redis, not in Prefix's keys); nil: one pipeline per call.
	Coalescer *redisx.Coalescer
	// Algorithms runs Floodgate's algorithms (pkg/limiter's check script);
	// a call that reaches a limit naming one fails without it.
	Algorithms AlgorithmRunner
	// Now is the clock; time.Now when nil.
	Now func() time.Time
}

// AlgorithmCheck is one descriptor counted by one of Floodgate's algorithms.
type AlgorithmCheck struct {
	Algorithm limiter.Algorithm
	// Key is the algorithm's state; PenaltyKey, when set, the principal's
	// penalty hash (field m), in Key's hash slot, whose multiplier applies.
	Key, PenaltyKey string
	Limit           uint32 // requests per Period, before scale and penalty
	Burst           uint32 // capacity; 0 means Limit
	Period          time.Duration
	Scale           float64
	Hits            uint64
	// Shadow reports a denial without denying (shadow and quota mode).
	Shadow bool
}

// AlgorithmResult is an AlgorithmCheck's answer.
type AlgorithmResult struct {
	Allowed    bool
	Limit      int64 // enforced: Limit × scale × penalty, floored, at least 1
	Remaining  int64
	ResetAfter time.Duration
	Penalty    float64 // the multiplier applied (1: none)
}

// AlgorithmRunner evaluates AlgorithmChecks. Must be safe for concurrent use.
type AlgorithmRunner interface {
	// Queue puts c on pipe; the returned function reads its answer once the
	// pipeline ran (it may ask Redis again, e.g. after NOSCRIPT).
	Queue(ctx context.Context, pipe redis.Pipeliner, c *AlgorithmCheck) func(ctx context.Context) (AlgorithmResult, error)
}

// ErrRedis marks an answer Redis could not give; the call may be answered by
// fail policies instead (Response.Degraded) or not at all.
var ErrRedis = errors.New("envoy counters: redis")

// Evaluate answers req with cfg. A domain cfg does not have answers OK for
// every descriptor (envoy ratelimit does the same). An error wrapping
// ErrRedis means the counters could not be read and some counted limit has
// no fail policy; any other error is the request's.
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
	todo := make([]pending, 0, len(matches))
	penalizeFixed, algos, asks := false, 0, 0
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
		st := &statuses[i]
		st.Limit = l
		st.Scale, st.Penalty = 1, 1
		if req.Scale != nil {
			if s := req.Scale(i, l); s > 0 {
				st.Scale = s
			}
		}
		d := &req.Descriptors[i]
		hits := uint64(max(req.HitsAddend, 1))
		if d.HitsAddend != nil {
			hits = *d.HitsAddend
		}
		p := pending{i: i, hits: hits, incr: hits}
		if alg := l.Algorithm(); Floodgate(alg) && st.Override == nil {
			if e.Algorithms == nil {
				return Response{}, fmt.Errorf("%s: algorithm %s: the evaluator runs no Floodgate algorithms", l.Source, alg)
			}
			c := &AlgorithmCheck{Algorithm: alg, Limit: l.RequestsPerUnit, Burst: l.Ext.Burst,
				Period: time.Duration(l.Unit.Seconds()) * time.Second, Scale: st.Scale, Hits: hits,
				Shadow: l.ShadowMode || l.QuotaMode || e.GlobalQuota}
			tag := ""
			if d.Penalize && req.PenaltyKey != "" {
				tag, c.PenaltyKey = hashTag(req.PenaltyKey), req.PenaltyKey
			}
			c.Key = e.stateKey(req.Domain, d.Entries, m.CounterValues, tag, alg)
			p.algo = c
			algos++
			asks++
		} else {
			secs := l.Unit.Seconds()
			start := now.Unix() / secs * secs
			p.key = e.counterKey(req.Domain, d.Entries, m.CounterValues, start)
			p.ttl = time.Duration(secs) * time.Second
			if p.cached = e.LocalCache != nil && e.LocalCache.over(p.key, Effective(st.Configured(), st.Scale), now); !p.cached {
				penalizeFixed = penalizeFixed || d.Penalize
				asks++
			}
		}
		todo = append(todo, p)
	}
	var pen *redis.StringCmd
	var failed error
	if e.StopIncrementOverLimit {
		failed = e.stopIncrements(ctx, statuses, todo)
	}
	if failed == nil && (asks > 0 || req.Also != nil) {
		add := func(ctx context.Context, pipe redis.Pipeliner) {
			for k := range todo {
				p := &todo[k]
				if p.algo != nil {
					p.read = e.Algorithms.Queue(ctx, pipe, p.algo)
					continue
				}
				if p.cached {
					continue
				}
				p.cmd = pipe.IncrBy(ctx, p.key, int64(p.incr))
				pipe.Expire(ctx, p.key, p.ttl+e.jitter())
			}
			if penalizeFixed && req.PenaltyKey != "" {
				pen = pipe.HGet(ctx, req.PenaltyKey, "m")
			}
			if req.Also != nil {
				req.Also(ctx, pipe)
			}
		}
		if e.Coalescer != nil {
			failed = e.Coalescer.Do(ctx, add)
		} else {
			pipe := e.Redis.Pipeline()
			add(ctx, pipe)
			_, _ = pipe.Exec(ctx) // errors per command, below
		}
	}
	mult := penaltyOf(pen)
	var results []AlgorithmResult // by todo index, for Floodgate's algorithms
	if algos > 0 {
		results = make([]AlgorithmResult, len(todo))
	}
	for k, p := range todo {
		if failed != nil {
			break
		}
		if p.algo != nil {
			results[k], failed = p.read(ctx)
			if results[k].Penalty > 0 && results[k].Penalty < mult {
				mult = results[k].Penalty
			}
			continue
		}
		if !p.cached {
			failed = p.cmd.Err()
		}
	}
	if failed != nil {
		resp, ok := e.degrade(statuses, matches, now)
		if !ok {
			return Response{}, fmt.Errorf("%w: %w", ErrRedis, failed)
		}
		resp.Err = failed
		return resp, nil
	}
	for k, p := range todo {
		st := &statuses[p.i]
		d := &req.Descriptors[p.i]
		if d.Penalize {
			st.Penalty = mult
		}
		var over bool
		if p.algo != nil {
			r := results[k]
			st.Effective = uint32(min(max(r.Limit, 0), math.MaxUint32))
			st.ResetAfter = r.ResetAfter
			st.Count = uint64(max(r.Limit-r.Remaining, 0))
			if over = !r.Allowed; over {
				st.Count = uint64(r.Limit) + p.hits
			} else {
				st.LimitRemaining = uint32(min(max(r.Remaining, 0), math.MaxUint32))
			}
		} else if p.cached {
			// As envoy ratelimit: over, nothing remaining, the hit not counted.
			st.Effective = Effective(st.Configured(), st.Scale)
			_, unit, _ := st.RequestsPerUnit()
			st.ResetAfter, st.Cached, st.Count, over = ResetAfter(unit, now), true, uint64(st.Effective)+p.hits, true
		} else {
			count := uint64(p.cmd.Val())
			st.Count = count
			st.Effective = Effective(st.Configured(), st.Scale*st.Penalty)
			_, unit, _ := st.RequestsPerUnit()
			st.ResetAfter = ResetAfter(unit, now)
			if over = count > uint64(st.Effective); !over {
				st.LimitRemaining = uint32(uint64(st.Effective) - count)
			} else if e.LocalCache != nil {
				e.LocalCache.put(p.key, Effective(st.Configured(), st.Scale), now.Add(st.ResetAfter), now)
			}
		}
		st.Code = CodeOK
		if !over {
			continue
		}
		st.Code = CodeOverLimit
		switch {
		case st.Limit.ShadowMode && st.Override == nil:
			st.Code, st.Shadowed = CodeOK, true
		case st.Limit.QuotaMode && st.Override == nil, e.GlobalQuota:
			// Quota mode (envoy ratelimit v1.4.1-…20260122): the
			// violation is reported as OK with no time until reset,
			// and never fails the call.
			st.Code, st.QuotaExceeded, st.ResetAfter = CodeOK, true, 0
		}
	}
	resp := Response{Overall: CodeOK, Statuses: statuses, Penalty: mult, Now: now}
	resp.finish(e.GlobalShadow)
	return resp, nil
}

// finish sets the overall code from the statuses.
func (r *Response) finish(globalShadow bool) {
	r.Overall = CodeOK
	for _, st := range r.Statuses {
		if st.Code == CodeOverLimit {
			r.Overall = CodeOverLimit
		}
	}
	if r.Overall == CodeOverLimit && globalShadow {
		r.Overall, r.Shadowed = CodeOK, true
	}
}

// degrade answers a call whose counters could not be read from its limits'
// fail policies, when they decide it: any closed limit denies the call (it
// answers OVER_LIMIT with nothing remaining until its window ends; a limit
// without a policy answers UNKNOWN), and open limits alone allow it (each
// OK with its whole limit remaining). Otherwise ok is false and the call
// fails as envoy ratelimit's does. Shadow, quota and the global modes turn
// a closed limit's denial into OK as they do Redis's.
func (e *Evaluator) degrade(statuses []Status, matches []Match, now time.Time) (Response, bool) {
	out := make([]Status, len(statuses))
	closed, unknown := false, false
	for i, st := range statuses {
		l := matches[i].Limit
		if st.Limit == nil || st.Unlimited || l == nil {
			out[i] = st
			continue
		}
		n := Status{Limit: l, Override: st.Override, Scale: st.Scale, Penalty: 1, Degraded: true}
		policy := l.Fail()
		if st.Override != nil {
			policy = ""
		}
		switch policy {
		case FailClosed:
			n.Effective, n.Code, n.ResetAfter = Effective(l.RequestsPerUnit, st.Scale), CodeOverLimit, ResetAfter(l.Unit, now)
			if l.ShadowMode || l.QuotaMode || e.GlobalQuota {
				n.Code, n.Shadowed = CodeOK, l.ShadowMode
			} else {
				closed = true
			}
		case FailOpen:
			n.Effective, n.Code = Effective(l.RequestsPerUnit, st.Scale), CodeOK
			n.LimitRemaining = n.Effective
		default:
			n.Code, unknown = CodeUnknown, true
		}
		out[i] = n
	}
	if unknown && !closed {
		return Response{}, false
	}
	resp := Response{Statuses: out, Penalty: 1, Now: now, Degraded: true}
	resp.finish(e.GlobalShadow)
	return resp, true
}

// hashTag is the "{…}" of a key.
func hashTag(key string) string {
	i := strings.IndexByte(key, '{')
	if i < 0 {
		return ""
	}
	j := strings.IndexByte(key[i:], '}')
	if j < 0 {
		return ""
	}
	return key[i : i+j+1]
}

// stateKey names a Floodgate algorithm's state for one descriptor: the
// counter's name without a window, and the algorithm, so changing a limit's
// algorithm starts from fresh state. With tag (a principal's "{…}") the key
// lives in the principal's slot, beside its penalty; otherwise it has a tag
// of its own, as a counter has.
func (e *Evaluator) stateKey(domain string, entries []Entry, values []string, tag string, alg limiter.Algorithm) string {
	var b strings.Builder
	b.Grow(len(e.Prefix) + len(tag) + descriptorLen(domain, entries, values) + len(":alg:") + len(alg) + 2)
	b.WriteString(e.Prefix)
	if tag != "" {
		b.WriteString(tag)
		b.WriteByte(':')
	} else {
		b.WriteByte('{')
	}
	writeDescriptor(&b, domain, entries, values)
	if tag == "" {
		b.WriteByte('}')
	}
	b.WriteString(":alg:")
	b.WriteString(string(alg))
	return b.String()
}

// descriptorLen is how long writeDescriptor's text is when nothing in it
// needs escaping: the key builders grow their buffer by it once (escaping,
// rare, grows it again).
func descriptorLen(domain string, entries []Entry, values []string) int {
	n := len(domain)
	for i, en := range entries {
		n += len(en.Key) + len(values[i]) + 2
	}
	return n
}

// writeDescriptor writes domain:key=value:… of a descriptor to b, each part
// escaped so no value can move into another key or another cluster slot.
func writeDescriptor(b *strings.Builder, domain string, entries []Entry, values []string) {
	b.WriteString(redisx.Escape(domain))
	for i, en := range entries {
		b.WriteByte(':')
		b.WriteString(redisx.Escape(en.Key))
		b.WriteByte('=')
		b.WriteString(redisx.Escape(values[i]))
	}
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
	if e.EnvoyRatelimitKeys {
		return envoyRatelimitKey(e.EnvoyRatelimitPrefix, domain, entries, values, start)
	}
	var b strings.Builder
	b.Grow(len(e.Prefix) + descriptorLen(domain, entries, values) + len("{}:") + 20)
	b.WriteString(e.Prefix)
	b.WriteByte('{')
	writeDescriptor(&b, domain, entries, values)
	b.WriteString("}:")
	var num [20]byte
	b.Write(strconv.AppendInt(num[:0], start, 10))
	return b.String()
}

// envoyRatelimitKey is envoy ratelimit's key for a descriptor's counter in
// the window starting at start (its CacheKeyGenerator): prefix, the domain
// and "_", each entry's key and counter value followed by "_", then start.
func envoyRatelimitKey(prefix, domain string, entries []Entry, values []string, start int64) string {
	var b strings.Builder
	b.Grow(len(prefix) + descriptorLen(domain, entries, values) + 1 + 20)
	b.WriteString(prefix)
	b.WriteString(domain)
	b.WriteByte('_')
	for i, en := range entries {
		b.WriteString(en.Key)
		b.WriteByte('_')
		b.WriteString(values[i])
		b.WriteByte('_')
	}
	var num [20]byte
	b.Write(strconv.AppendInt(num[:0], start, 10))
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
