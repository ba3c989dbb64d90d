package chaos

// redis-slow-grpc: Redis slowed under Envoy-shaped gRPC load, to tell a
// limiter short of CPU from one waiting for Redis. The gRPC entry gate
// (FLOODGATE_LIMITER_GRPC_GATE_MAX, passed through from this process's
// environment, as every FLOODGATE_* is) aims at a time from the gate to the
// answer above Redis's shortest round trip of late: a slow Redis must move
// its target, not shrink its limit as CPU overload does (docs/chaos.md,
// 2026-12-02 15:30–15:35 and the session after).

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/floodgate-dev/floodgate/pkg/events"
)

// The phases of redis-slow-grpc: Redis's extra delay, each held for
// redisSlowGRPCPhase, the first second of each not counted.
var redisSlowGRPCDelays = []time.Duration{0, 20 * time.Millisecond, 40 * time.Millisecond}

const redisSlowGRPCPhase = 8 * time.Second

// RedisSlowGRPC offers s.Rate checks a second as ShouldRateLimit calls over
// 64 connections, each with the caller's 50 ms deadline, while Redis's
// replies come as they do, then 20 ms late, then 40 ms late. It reports the
// share decided within the deadline in each phase, and what the rest got:
// the entry gate's UNAVAILABLE, a degraded answer, or none in time.
func RedisSlowGRPC(ctx context.Context, e *Env, s Size, r *Result) error {
	rd, b, err := e.StartStack(ctx)
	if err != nil {
		return err
	}
	grpcAddr, err := FreeAddr()
	if err != nil {
		return err
	}
	lim, px, err := e.StartLimiterBehindFaultProxy(ctx, b, rd, "FLOODGATE_LIMITER_GRPC_ADDR="+grpcAddr)
	if err != nil {
		return err
	}
	defer px.Kill()
	gate := "no entry gate"
	switch g := os.Getenv("FLOODGATE_LIMITER_GRPC_GATE_MAX"); g {
	case "0":
	case "":
		gate = fmt.Sprintf("entry gate of the default size (64 per processor), paced reads %q (empty: the default)", os.Getenv("FLOODGATE_LIMITER_GRPC_GATE_PACE"))
	default:
		gate = fmt.Sprintf("entry gate %s, paced reads %q (empty: the default)", g, os.Getenv("FLOODGATE_LIMITER_GRPC_GATE_PACE"))
	}
	r.metric("limiter", "%s, transport %q (empty: the default), both cores, %d checks/s over 64 connections, deadline %s",
		gate, os.Getenv("FLOODGATE_LIMITER_GRPC_TRANSPORT"), s.Rate, overloadDeadline)
	ps := users("rsg", s.Principals)
	load := &Load{URL: "http://" + lim.Addr, GRPCAddr: grpcAddr, Conns: 64, Rate: s.Rate, Workers: 1024, Deadline: overloadDeadline,
		Next: func(w, i int) events.Principal { return ps[(w*7919+i)%len(ps)] }}
	stop := startLoad(ctx, load)
	marks := make([]time.Time, 0, len(redisSlowGRPCDelays)+1)
	gateAt := make([]string, len(redisSlowGRPCDelays)) // the gate's limit and target near each phase's end
	engine := make([]string, len(redisSlowGRPCDelays)) // the engine's check and pipeline times over each phase
	for k, d := range redisSlowGRPCDelays {
		if err := px.SetDelay(ctx, d); err != nil {
			stop()
			return err
		}
		marks = append(marks, time.Now())
		check0, pipe0 := checkSeconds(ctx, lim), lim.Buckets(ctx, "floodgate_limiter_redis_pipeline_seconds")
		_ = sleep(ctx, redisSlowGRPCPhase-time.Second)
		engine[k] = "; " + tailNote("checks decided by the engine (floodgate_limiter_check_seconds)", check0, checkSeconds(ctx, lim), d.Seconds()+0.005, 0.05) +
			"; " + tailNote("Redis pipelines (floodgate_limiter_redis_pipeline_seconds)", pipe0, lim.Buckets(ctx, "floodgate_limiter_redis_pipeline_seconds"), d.Seconds()+0.005, 0.05)
		if m, err := lim.Metrics(ctx); err == nil {
			l, okL := m.Sum("floodgate_limiter_grpc_gate_limit")
			tg, okT := m.Sum("floodgate_limiter_grpc_gate_target_seconds")
			if okL && okT {
				gateAt[k] = fmt.Sprintf("; the entry gate near the phase's end: limit %.0f, target %.1f ms", l, 1000*tg)
			}
		}
		_ = sleep(ctx, time.Second)
	}
	marks = append(marks, time.Now())
	stop()
	if err := px.SetDelay(ctx, 0); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	checks := load.Results()
	for k, d := range redisSlowGRPCDelays {
		t := tallyRedisSlow(checks, marks[k].Add(time.Second), marks[k+1])
		name := fmt.Sprintf("+%d ms", d.Milliseconds())
		r.metric(name, "%d checks: %.1f %% decided from Redis within the deadline; %.1f %% answered degraded within it (local state: shed, or the rule's fail policy), %.1f %% UNAVAILABLE from the entry gate, %.1f %% with no answer within the deadline%s",
			t.sent, t.pct(t.inTime), t.pct(t.degraded), t.pct(t.overloaded), t.pct(t.none), gateAt[k]+engine[k])
		if d == 0 {
			r.require(name+": decided within the deadline ≥ 99 %", t.pct(t.inTime) >= 99, "%.1f %%", t.pct(t.inTime))
		} else if d < overloadDeadline/2 {
			r.metric(name+" target", "decided within the deadline ≥ 99 %% while Redis takes less than half the deadline: %s (%.1f %%)", metOrNot(t.pct(t.inTime) >= 99), t.pct(t.inTime))
		}
	}
	return nil
}

// redisSlowTally is what the checks of one redis-slow-grpc phase got.
type redisSlowTally struct{ sent, inTime, overloaded, degraded, none int }

func (t redisSlowTally) pct(n int) float64 { return 100 * float64(n) / float64(max(t.sent, 1)) }

// tallyRedisSlow counts the checks sent in [from, to): decided from Redis
// within the deadline, answered degraded within it (from local state: shed,
// or the rule's fail policy), refused by the entry gate, or none of these.
func tallyRedisSlow(checks []Check, from, to time.Time) redisSlowTally {
	var t redisSlowTally
	for _, c := range checks {
		if c.Start.Before(from) || !c.Start.Before(to) {
			continue
		}
		t.sent++
		switch {
		case answeredInTime(c) && !c.Degraded:
			t.inTime++
		case answeredInTime(c):
			t.degraded++
		case c.Overloaded:
			t.overloaded++
		default:
			t.none++
		}
	}
	return t
}
