package chaos

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/floodgate-dev/floodgate/pkg/config"
	"github.com/floodgate-dev/floodgate/pkg/dynamo"
	"github.com/floodgate-dev/floodgate/pkg/events"
	"github.com/floodgate-dev/floodgate/pkg/redisx"
	"github.com/floodgate-dev/floodgate/pkg/stacktest"
)

// Size scales the scenarios.
type Size struct {
	Rate          int           // limiter checks/s of the normal load
	Principals    int           // normal principals
	Outage        time.Duration // how long a component stays down
	Events        int           // decision events of the ledger scenarios
	KillRounds    int           // SIGKILL rounds of the consumer scenario
	FaultRate     float64       // share of DynamoDB writes failed
	Before, After time.Duration // load before the fault and after recovery
	// Saturation, when set, is what the overload scenarios offer 1.3× and
	// 2× of and judge against, instead of the saturation they measure: two
	// limiter configurations compared at the same offered load.
	Saturation int
	// GRPCConns, when set, is how many connections overload-grpc's
	// open-loop phases use instead of 64 (Envoy's workers' one each): a
	// fleet of gateways opens many more.
	GRPCConns int
	// OverloadRepeat, when above 1, runs the overload scenarios' 1.3× and
	// 2× phases that many times in turn against the same limiter and
	// reports each phase's spread: one phase at 2× moves with the
	// machine's speed from run to run (docs/chaos.md, 2026-11-30).
	OverloadRepeat int
	// CriticalLimiter, in overload-grpc, serves the critical cluster from a
	// second limiter of its own on the same core, in the same CPU quota,
	// against the same Redis and rules: the deployment that keeps a
	// CRITICAL call out of the run queue the rest of the traffic fills.
	CriticalLimiter bool
	// CriticalQuota, when set with CriticalLimiter, gives the critical
	// cluster's limiter a CPU quota of its own of that many cores (as a
	// pod of its own would have) instead of a share of the first one's.
	CriticalQuota float64
	// QuotaPeriod, when set, is the overload scenarios' CPU quota period
	// instead of overloadQuotaPeriod: a throttled limiter stalls for up to
	// (1 − quota) of it at a time.
	QuotaPeriod time.Duration
	// Trace, when set, takes a runtime execution trace of the limiter this
	// long from the middle of each open-loop phase (its pprof listener's
	// /debug/pprof/trace, beside the phase's CPU profiles), and adds to the
	// phase's line how long its goroutines waited to run once runnable, by
	// how they were woken (loadtest/internal/schedwait). Tracing costs the
	// limiter CPU: a run with it is a diagnosis, not a measurement of the
	// targets.
	Trace time.Duration
	// Perf, when set, samples the limiters with perf (linux-perf) this
	// many times a second of their CPU, call chains and kernel frames
	// included, over each interleaved phase, and sorts the samples into
	// the slices of each rate (loadtest/internal/perfsplit): where a call's
	// CPU goes at each rate, on the same moments of the machine. Like
	// Trace, a diagnosis.
	Perf int
}

// Quick is sized for CI; Full for make chaos.
var (
	Quick = Size{Rate: 400, Principals: 100, Outage: 4 * time.Second, Events: 4000, KillRounds: 4, FaultRate: 0.3, Before: 2 * time.Second, After: 3 * time.Second}
	Full  = Size{Rate: 1500, Principals: 300, Outage: 20 * time.Second, Events: 40000, KillRounds: 10, FaultRate: 0.3, Before: 5 * time.Second, After: 10 * time.Second}
)

// Scenario is one fault scenario.
type Scenario struct {
	Name  string
	Fault string
	Quick bool // part of the CI subset
	Run   func(ctx context.Context, e *Env, s Size, r *Result) error
}

// Scenarios lists every scenario in report order.
func Scenarios() []Scenario {
	return []Scenario{
		{"broker-kill", "Kafka broker SIGKILLed under limiter load (journal on), down for the outage, restarted on its data dir", true, BrokerKill},
		{"redis-restart", "Redis SIGKILLed under limiter load and restarted empty", false, RedisRestart},
		{"redis-slow", "Redis replies delayed by 20 ms, then 40 ms (the budget is 50 ms), then one 60 ms stall", false, RedisSlow},
		{"redis-slow-grpc", "Redis replies delayed by 20 ms, then 40 ms, under Envoy-shaped gRPC checks with a 50 ms deadline: what a slow Redis does to the gRPC entry gate (FLOODGATE_LIMITER_GRPC_GATE_MAX from the environment)", false, RedisSlowGRPC},
		{"redis-cluster-failover", "a master of a 3-master Redis Cluster with replicas SIGKILLed under load; its replica takes over", false, RedisClusterFailover},
		{"journal-disk-full", "the limiter's journal on a 4 MiB disk while the broker is down under load", false, JournalDiskFull},
		{"redis-flushall", "rapid-fire bots penalized, then stopped; Redis FLUSHALLed: penalties must come back without re-detection", false, RedisFlushAll},
		{"detector-kill", "one of two detectors in a consumer group SIGKILLed while rapid-fire bots run; more bots start at the kill", false, DetectorKill},
		{"overload", "the limiter alone on core 1: open-loop load at 1.3× and 2× its pinned saturation over 1,024 connections, every caller giving up after 50 ms; a tenth from an abusive bot under a fail-open rule, a tenth critical", false, Overload},
		{"overload-grpc", "overload with every check an Envoy ShouldRateLimit call over 1,024 HTTP/2 connections (-overload-grpc-conns sets another number), the caller's 50 ms deadline as the call's gRPC deadline (a caller that gives up cancels its stream and keeps its connection)", false, OverloadGRPC},
		{"redis-sentinel-failover", "the Redis master behind Sentinel SIGKILLed under load; Sentinel promotes the replica; the old master back as a replica, then a graceful SENTINEL FAILOVER to it", false, RedisSentinelFailover},
		{"consumer-kill", "quota consumers SIGKILLed at random points, two members at once every other round (rebalances)", true, ConsumerKill},
		{"dynamodb-errors", "a share of DynamoDB writes throttled (400), failed (500) or applied with the answer lost (500)", true, DynamoErrors},
		{"deferred-kill", "5,000 orders at 5× their limit through the reverse proxy on a deferring route; the broker SIGKILLed mid-burst and restarted, the deferred-work worker SIGKILLed during the replay and restarted", false, DeferredKill},
		{"shed-release", "Redis replies delayed 46 ms (the limiters' Redis latency signal near its budget) under prioritised load for 30 s, then the delay removed; no CPU or error-rate writer: shedding must engage, keep critical answered, and let go within the stated release time", false, ShedRelease},
		{"rollout-class-harm", "a rules candidate that would block almost every declared bot (best_effort) with CRITICAL untouched, in shadow beside its parent under load; the adjuster's controller must abort it on the class's rise before any of it is enforced", false, RolloutClassHarm},
		{"rollout-step-harm", "a rules candidate that passes its shadow on people's traffic alone, then meets 1,000 declared bots (best_effort) it would block at its first step (1 % of principals); the controller must roll it back at that step, with the bot checks affected ≤ 1 %", false, RolloutStepHarm},
		{"influx-pagerduty-down", "detector with InfluxDB on a closed port and PagerDuty answering 500 while rapid-fire bots run", false, InfluxPagerDown},
	}
}

// RunAll runs the scenarios (only the quick ones when quick) and returns
// their results; a scenario that fails to run does not stop the others.
// Names, when given, select scenarios by name.
func RunAll(ctx context.Context, e *Env, s Size, quick bool, report func(Result), names ...string) []Result {
	var out []Result
	for _, sc := range Scenarios() {
		if quick && !sc.Quick || len(names) > 0 && !slices.Contains(names, sc.Name) {
			continue
		}
		r := Result{Name: sc.Name, Fault: sc.Fault}
		start := time.Now()
		sctx, cancel := context.WithTimeout(ctx, scenarioTimeout(s))
		r.Err = sc.Run(sctx, e, s, &r)
		cancel()
		r.Elapsed = time.Since(start)
		if report != nil {
			report(r)
		}
		out = append(out, r)
	}
	return out
}

// scenarioTimeout bounds one scenario's run: 5 minutes, and 2 more for each
// overload repeat past the first (Size.OverloadRepeat; a repeat of
// overload-grpc, interleaved phase included, takes about 75 s).
func scenarioTimeout(s Size) time.Duration {
	return 5*time.Minute + time.Duration(max(s.OverloadRepeat-1, 0))*2*time.Minute
}

func sleep(ctx context.Context, d time.Duration) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(d):
		return nil
	}
}

func users(prefix string, n int) []events.Principal {
	run := time.Now().UnixNano()
	out := make([]events.Principal, n)
	for i := range out {
		out[i] = events.Principal{Kind: events.PrincipalUser, ID: fmt.Sprintf("%s%d_%d", prefix, run, i)}
	}
	return out
}

// roundRobin is a load at rate through the limiter at addr, eight workers
// taking the principals in turn.
func roundRobin(addr string, rate int, ps []events.Principal) *Load {
	return &Load{URL: "http://" + addr, Rate: rate, Workers: 8, Next: func(w, i int) events.Principal { return ps[(w*7919+i)%len(ps)] }}
}

// outage takes a process down under a running load: before, then kill,
// length of outage, restart, after; then stop stops the load (also when
// the restart or the wait before fails). It returns when the process went
// down and came back.
func outage(ctx context.Context, stop func(), what string, before, length, after time.Duration, kill func(), restart func(context.Context) error) (down, up time.Time, err error) {
	if err := sleep(ctx, before); err != nil {
		stop()
		return down, up, err
	}
	down = time.Now()
	kill()
	_ = sleep(ctx, length)
	up = time.Now()
	if err := restart(ctx); err != nil {
		stop()
		return down, up, fmt.Errorf("restart %s: %w", what, err)
	}
	_ = sleep(ctx, after)
	stop()
	return down, up, nil
}

// ackedLost counts the checks answered OK and, of those, the ones whose
// decision event is not among counts (events by ce_id).
func ackedLost(checks []Check, counts map[string]int) (acked, lost int) {
	for _, c := range checks {
		if c.OK {
			acked++
			if counts[c.ID] == 0 {
				lost++
			}
		}
	}
	return acked, lost
}

// caughtUp waits up to within until the quota group has no lag on the
// decisions topic.
func caughtUp(ctx context.Context, b *Broker, group string, within time.Duration) error {
	return waitFor(ctx, within, "quota caught up", func() error {
		lag, err := b.Lag(ctx, group, config.DefaultDecisionsTopic)
		if err == nil && lag > 0 {
			err = fmt.Errorf("lag %d", lag)
		}
		return err
	})
}

// startLoad runs l in the background; the returned stop waits for it.
func startLoad(ctx context.Context, l *Load) (stop func()) {
	lctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { l.Run(lctx); close(done) }()
	return func() { cancel(); <-done }
}

// BrokerKill: limiter load with a rapid-fire bot that fires only while the
// broker is down; afterwards every check answered 200 must have its decision
// event in Kafka (by ce_id), and the bot must be penalized.
func BrokerKill(ctx context.Context, e *Env, s Size, r *Result) error {
	rd, b, err := e.StartStack(ctx)
	if err != nil {
		return err
	}
	// A principal limit of 50/s: the normal principals send 4–5/s each, the
	// scripted account below 200/s, three calls in four refused.
	lim, err := e.StartLimiter(ctx, b, rd, e.TempDir("journal"), "FLOODGATE_LIMITER_PRINCIPAL_LIMIT=50")
	if err != nil {
		return err
	}
	group := fmt.Sprintf("chaos-detector-%d", time.Now().UnixNano())
	if _, err := e.StartDetector(ctx, b, rd, group, closedURL()); err != nil {
		return err
	}
	ps := users("bk", s.Principals)
	normal := roundRobin(lim.Addr, s.Rate, ps)
	// A scripted user account past its limit: rate alone never penalizes a
	// person inside their limits (docs/detector.md), and a burst of a few
	// seconds is what people's clients do; refused again and again, it is
	// rapid fire.
	bot := events.Principal{Kind: events.PrincipalUser, ID: fmt.Sprintf("bk_bot_%d", time.Now().UnixNano())}
	botLoad := &Load{URL: "http://" + lim.Addr, Rate: 200, Workers: 2, Route: "/v1/messages", Next: func(int, int) events.Principal { return bot }}

	var stopBot func()
	down, up, err := outage(ctx, startLoad(ctx, normal), "broker", s.Before, s.Outage, s.After,
		func() { b.Kill9(); stopBot = startLoad(ctx, botLoad) }, // the bot fires only while the broker is down
		func(ctx context.Context) error { stopBot(); return b.Start(ctx) })
	if err != nil {
		return err
	}

	// Let the journal replay, then shut the limiter down cleanly (it drains
	// the async producer) before counting.
	drainStart := time.Now()
	if err := waitFor(ctx, 2*time.Minute, "journal drained", func() error {
		v, err := lim.Metric(ctx, "floodgate_stream_journal_pending")
		if err != nil {
			return err
		}
		if v > 0 {
			return fmt.Errorf("%v events pending", v)
		}
		return nil
	}); err != nil {
		return err
	}
	drained := time.Since(drainStart)
	journaled, _ := lim.Metric(ctx, "floodgate_stream_journaled_total")
	if err := lim.Stop(30 * time.Second); err != nil {
		return err
	}

	counts := map[string]int{}
	total, err := b.ReadAll(ctx, config.DefaultDecisionsTopic, func(m kafka.Message) { counts[Header(m, "ce_id")]++ })
	if err != nil {
		return err
	}
	checks := append(normal.Results(), botLoad.Results()...)
	acked, lost := ackedLost(checks, counts)
	dups := 0
	for _, n := range counts {
		dups += n - 1
	}
	during := Summarise(normal.Results(), down, up)

	// The bot fired only while the broker was down: the detector sees its
	// events once the journal replays them.
	rc := rd.Client()
	defer rc.Close()
	var detectedAfter time.Duration
	penalized := waitFor(ctx, 30*time.Second, "bot penalty", func() error {
		n, err := rc.Exists(ctx, redisx.PenaltyKey(string(bot.Kind), bot.ID)).Result()
		if err != nil || n == 0 {
			return fmt.Errorf("no penalty yet (err %w)", err)
		}
		return nil
	}) == nil
	if penalized {
		detectedAfter = time.Since(up)
	}
	missed := 0
	if !penalized {
		missed = 1
	}
	r.metric("outage", "%.0f s", up.Sub(down).Seconds())
	r.metric("checks answered 200", "%d", acked)
	r.metric("limiter during outage", "%s answered, p50 %s, p99 %s", during.Availability(), ms(during.P50), ms(during.P99))
	r.metric("events journaled", "%.0f", journaled)
	r.metric("journal drained", "%.1f s after the load stopped", drained.Seconds())
	r.metric("decision events in Kafka", "%d", total)
	r.metric("acknowledged events lost", "%d", lost)
	r.metric("duplicates", "%d", dups)
	r.metric("detections missed", "%d of 1 (bot fired %d checks only during the outage; penalty in Redis %.0f s after the broker returned)",
		missed, len(botLoad.Results()), detectedAfter.Seconds())
	r.require("0 acknowledged decision events lost", lost == 0, "%d of %d missing from Kafka", lost, acked)
	r.require("bot penalized", penalized, "rapid-fire during the outage")
	return nil
}

// RedisRestart: limiter load while Redis is killed and restarted empty; the
// limiter answers by its fail policy, and quota re-seeds the day counters
// from the ledger.
func RedisRestart(ctx context.Context, e *Env, s Size, r *Result) error {
	rd, b, prefix, err := e.StartStackTables(ctx)
	if err != nil {
		return err
	}
	lim, err := e.StartLimiter(ctx, b, rd, "")
	if err != nil {
		return err
	}
	group := fmt.Sprintf("chaos-quota-%d", time.Now().UnixNano())
	if _, err := e.StartQuota(ctx, b, rd, e.DynamoEndpoint, prefix, group); err != nil {
		return err
	}
	ps := users("rr", s.Principals)
	load := roundRobin(lim.Addr, s.Rate, ps)
	down, up, err := outage(ctx, startLoad(ctx, load), "redis", s.Before, s.Outage, s.After, rd.Kill9, rd.Start)
	if err != nil {
		return err
	}
	checks := load.Results()
	before, during, after := Summarise(checks, time.Time{}, down), Summarise(checks, down, up), Summarise(checks, up, time.Time{})

	if err := caughtUp(ctx, b, group, 3*time.Minute); err != nil {
		return err
	}
	_ = sleep(ctx, time.Second) // the re-seed follows the flush
	keys := make([]string, len(ps))
	for i, p := range ps {
		keys[i] = p.Key()
	}
	ledger, err := LedgerTotals(ctx, e.DB(), prefix+dynamo.TableQuotaLedger, keys)
	if err != nil {
		return err
	}
	rc := rd.Client()
	defer rc.Close()
	reseeded, withLedger := 0, 0
	for _, p := range ps {
		for k, units := range ledger {
			if k.Principal != p.Key() {
				continue
			}
			withLedger++
			v, err := rc.Get(ctx, redisx.DayUsageKey(string(p.Kind), p.ID, k.Day)).Int64()
			if err == nil && v == units {
				reseeded++
			}
		}
	}
	r.metric("outage", "%.0f s", up.Sub(down).Seconds())
	r.metric("before", "%s answered, p50 %s, p99 %s", before.Availability(), ms(before.P50), ms(before.P99))
	r.metric("during outage", "%d checks, %s answered, %d degraded (X-RateLimit-Error), p50 %s, p99 %s, max %s",
		during.Sent, during.Availability(), during.Degraded, ms(during.P50), ms(during.P99), ms(during.Max))
	r.metric("after restart", "%s answered, %d degraded, p99 %s", after.Availability(), after.Degraded, ms(after.P99))
	r.metric("day counters re-seeded from the ledger", "%d of %d principal-days", reseeded, withLedger)
	r.require("limiter answered during the outage", during.Sent > 0 && during.Answered*100 >= during.Sent*99, "%s", during.Availability())
	r.require("day counters equal the ledger", withLedger > 0 && reseeded == withLedger, "%d of %d", reseeded, withLedger)
	return nil
}

// ledgerRun produces a workload into a fresh broker while quota instances run
// (started by drive), then lets one instance finish and compares the ledger.
func ledgerRun(ctx context.Context, e *Env, s Size, r *Result, dynamoEndpoint string,
	drive func(ctx context.Context, start func() (*Service, error)) error) error {
	rd, b, prefix, err := e.StartStackTables(ctx)
	if err != nil {
		return err
	}
	group := fmt.Sprintf("chaos-quota-%d", time.Now().UnixNano())
	w := NewWorkload(uint64(time.Now().UnixNano()), s.Principals, "cq")
	msgs := w.Messages(s.Events)
	writer := b.Writer()
	defer writer.Close()
	var prodErr error
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		const chunks = 8
		per := (len(msgs) + chunks - 1) / chunks
		for i := 0; i < len(msgs) && prodErr == nil; i += per {
			prodErr = b.Produce(ctx, writer, config.DefaultDecisionsTopic, msgs[i:min(i+per, len(msgs))])
			_ = sleep(ctx, 300*time.Millisecond)
		}
	}()
	start := func() (*Service, error) { return e.StartQuota(ctx, b, rd, dynamoEndpoint, prefix, group) }
	driveErr := drive(ctx, start)
	wg.Wait()
	if driveErr != nil {
		return driveErr
	}
	if prodErr != nil {
		return prodErr
	}
	last, err := e.StartQuota(ctx, b, rd, e.DynamoEndpoint, prefix, group)
	if err != nil {
		return err
	}
	catchUp := time.Now()
	if err := caughtUp(ctx, b, group, 4*time.Minute); err != nil {
		return err
	}
	r.metric("caught up", "%.1f s after the faults", time.Since(catchUp).Seconds())
	if err := last.Stop(30 * time.Second); err != nil {
		return err
	}
	keys := make([]string, len(w.Principals))
	for i, p := range w.Principals {
		keys[i] = p.Key()
	}
	got, err := LedgerTotals(ctx, e.DB(), prefix+dynamo.TableQuotaLedger, keys)
	if err != nil {
		return err
	}
	wrong, wantSum, gotSum := CompareLedger(w.Expected, got)
	r.metric("events", "%d over %d principals", len(msgs), len(w.Principals))
	r.metric("ledger exact", "%s (%d of %d principal-days wrong; %d units expected, %d in the ledger)",
		map[bool]string{true: "yes", false: "no"}[wrong == 0], wrong, len(w.Expected), wantSum, gotSum)
	r.require("ledger exact", wrong == 0 && wantSum == gotSum, "%d principal-days wrong, %d vs %d units", wrong, gotSum, wantSum)
	return nil
}

// ConsumerKill: quota instances SIGKILLed at random points while decisions
// arrive; two members at once in every other round force rebalances.
func ConsumerKill(ctx context.Context, e *Env, s Size, r *Result) error {
	started := 0
	err := ledgerRun(ctx, e, s, r, e.DynamoEndpoint, func(ctx context.Context, start func() (*Service, error)) error {
		rnd := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 9))
		for round := range s.KillRounds {
			a, err := start()
			if err != nil {
				return err
			}
			started++
			var bb *Service
			if round%2 == 1 {
				if bb, err = start(); err != nil {
					return err
				}
				started++
			}
			_ = sleep(ctx, time.Duration(300+rnd.IntN(1200))*time.Millisecond)
			a.Kill()
			if bb != nil {
				_ = sleep(ctx, time.Duration(200+rnd.IntN(800))*time.Millisecond)
				bb.Kill()
			}
		}
		return nil
	})
	r.Metrics = append([]Metric{{"SIGKILLs", fmt.Sprintf("%d instances in %d rounds", started, s.KillRounds)}}, r.Metrics...)
	return err
}

// DynamoErrors: quota writes through the fault proxy while it fails a share
// of the writes; once the faults stop the ledger must be exact.
func DynamoErrors(ctx context.Context, e *Env, s Size, r *Result) error {
	proxy, err := NewDynamoFaults(e.DynamoEndpoint)
	if err != nil {
		return err
	}
	defer proxy.Close()
	proxy.SetRate(s.FaultRate)
	err = ledgerRun(ctx, e, s, r, proxy.URL, func(ctx context.Context, start func() (*Service, error)) error {
		q, err := start()
		if err != nil {
			return err
		}
		_ = sleep(ctx, 3*time.Second+s.Outage)
		counts, writes := proxy.Counts()
		proxy.SetRate(0)
		r.metric("injected", "%d throttled, %d 500s, %d lost answers of %d writes (%.0f %% while on)",
			counts["throttled"], counts["server_error"], counts["lost_answer"], writes, s.FaultRate*100)
		_ = sleep(ctx, 2*time.Second)
		return q.Stop(30 * time.Second)
	})
	return err
}

// InfluxPagerDown: rapid-fire bots while the detector's InfluxDB is a closed
// port and PagerDuty answers 500; detections must still penalize, the
// consumer must not stall, and pages must arrive once PagerDuty is back.
func InfluxPagerDown(ctx context.Context, e *Env, s Size, r *Result) error {
	rd, b, err := e.StartStack(ctx)
	if err != nil {
		return err
	}
	pager := stacktest.NewPagerDuty()
	defer pager.Close()
	pager.SetDown(true)
	group := fmt.Sprintf("chaos-detector-%d", time.Now().UnixNano())
	det, err := e.StartDetector(ctx, b, rd, group, closedURL(),
		"FLOODGATE_PAGERDUTY_ROUTING_KEY=chaos", "FLOODGATE_PAGERDUTY_URL="+pager.URL, "FLOODGATE_PAGERDUTY_MIN_SEVERITY=low")
	if err != nil {
		return err
	}
	const nBots = 5
	bots := make([]events.Principal, nBots)
	for i := range bots {
		bots[i] = events.Principal{Kind: events.PrincipalBot, ID: fmt.Sprintf("ip_bot_%d_%d", time.Now().UnixNano(), i)}
	}
	ps := users("ipd", s.Principals)
	writer := b.Writer()
	defer writer.Close()
	seq := 0
	decision := func(p events.Principal, route string) kafka.Message {
		seq++
		return ScriptedDecision(p, route, seq)
	}
	// Real time: every 100 ms each bot sends 20 decisions (200/s), and a
	// tenth of the normal principals one each.
	end := time.Now().Add(s.Outage + 6*time.Second)
	produced := 0
	for tick := 0; time.Now().Before(end); tick++ {
		var batch []kafka.Message
		for _, bot := range bots {
			for range 20 {
				batch = append(batch, decision(bot, "/channels/{channel_id}/messages"))
			}
		}
		for i := tick % 10; i < len(ps); i += 10 {
			batch = append(batch, decision(ps[i], "/v1/things"))
		}
		if err := b.Produce(ctx, writer, config.DefaultDecisionsTopic, batch); err != nil {
			return err
		}
		produced += len(batch)
		_ = sleep(ctx, 100*time.Millisecond)
	}
	rc := rd.Client()
	defer rc.Close()
	penalized := 0
	_ = waitFor(ctx, 30*time.Second, "bot penalties", func() error {
		penalized = 0
		for _, bot := range bots {
			if n, _ := rc.Exists(ctx, redisx.PenaltyKey(string(bot.Kind), bot.ID)).Result(); n == 1 {
				penalized++
			}
		}
		if penalized < nBots {
			return fmt.Errorf("%d of %d penalized", penalized, nBots)
		}
		return nil
	})
	var lag int64 = -1
	lagErr := waitFor(ctx, 30*time.Second, "detector lag", func() error {
		var err error
		if lag, err = b.Lag(ctx, group, config.DefaultDecisionsTopic); err == nil && lag > 0 {
			err = fmt.Errorf("lag %d", lag)
		}
		return err
	})
	failedPages := pager.Failed()
	pager.SetDown(false)
	pagedAfter := 0
	_ = waitFor(ctx, 30*time.Second, "pages", func() error {
		pagedAfter = 0
		for _, bot := range bots {
			if pager.Triggered("floodgate:rapid_fire:" + bot.Key()) {
				pagedAfter++
			}
		}
		if pagedAfter < nBots {
			return fmt.Errorf("%d of %d paged", pagedAfter, nBots)
		}
		return nil
	})
	deadPages := 0
	if _, err := b.ReadAll(ctx, config.DefaultAbuseTopic+".dlq", func(kafka.Message) { deadPages++ }); err != nil {
		return err
	}
	capped, _ := det.Metric(ctx, "floodgate_detector_pages_dropped_total")
	r.metric("decisions produced", "%d (%d rapid-fire bots at 200/s, %d normal principals)", produced, nBots, len(ps))
	r.metric("penalized during the outage", "%d of %d bots (detections missed: %d)", penalized, nBots, nBots-penalized)
	r.metric("detector lag after", "%d", lag)
	r.metric("PagerDuty requests failed while down", "%d", failedPages)
	r.metric("pages delivered after PagerDuty returned", "%d of %d (abuse events dead-lettered: %d; dropped by the per-minute cap: %.0f)", pagedAfter, nBots, deadPages, capped)
	r.require("detections penalize", penalized == nBots, "%d of %d", penalized, nBots)
	r.require("consumer lag returns to 0", lagErr == nil, "lag %d", lag)
	r.require("pages delivered once PagerDuty returns", pagedAfter == nBots, "%d of %d; %d in %s.dlq", pagedAfter, nBots, deadPages, config.DefaultAbuseTopic)
	return nil
}
