package chaos

import (
	"bufio"
	"context"
	"fmt"
	"math"
	"net/netip"
	"os"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/floodgate-dev/floodgate/loadtest/internal/promtext"
	"github.com/floodgate-dev/floodgate/pkg/events"
	"github.com/floodgate-dev/floodgate/pkg/redisx"
	"github.com/floodgate-dev/floodgate/pkg/redisx/redistest"
)

// Redis faults of issue 21 as an SRE meets them: a slower Redis, a stall, a
// Redis Cluster master SIGKILLed with replicas to take over, a Sentinel
// failover. The limiter runs as the built binary with its defaults (50 ms
// Redis budget, a breaker per shard); the load is the HTTP load generator.

// RedisSlow: Redis replies delayed by 20 ms, then 40 ms (a budget of 50 ms),
// then one 60 ms stall of every reply.
func RedisSlow(ctx context.Context, e *Env, s Size, r *Result) error {
	rd, b, err := e.StartStack(ctx)
	if err != nil {
		return err
	}
	lim, px, err := e.StartLimiterBehindFaultProxy(ctx, b, rd)
	if err != nil {
		return err
	}
	defer px.Kill()
	ps := users("rs", s.Principals)
	// Enough workers that a check taking 45 ms still leaves the offered rate
	// at s.Rate (each worker waits for its answer).
	load := &Load{URL: "http://" + lim.Addr, Rate: s.Rate, Workers: max(8, s.Rate/15), Next: func(w, i int) events.Principal { return ps[(w*7919+i)%len(ps)] }}
	stop := startLoad(ctx, load)
	phase := max(s.Outage/2, 3*time.Second)
	_ = sleep(ctx, s.Before)
	var ferr error
	try := func(err error) {
		if ferr == nil {
			ferr = err
		}
	}
	accepted := func() int64 {
		n, err := px.Accepted(ctx)
		try(err)
		return n
	}
	t20, dial20 := time.Now(), accepted()
	slowUp20, _, err := px.Upstream(ctx)
	try(err)
	try(px.SetDelay(ctx, 20*time.Millisecond))
	_ = sleep(ctx, phase)
	t40, dial40 := time.Now(), accepted()
	pipes40, within40 := pipelines(ctx, lim)
	miss40, sched40 := poolMisses(ctx, lim), schedLatencies(ctx, lim)
	try(px.SetDelay(ctx, 40*time.Millisecond))
	_ = sleep(ctx, phase)
	calm, dialCalm := time.Now(), accepted()
	pipesCalm, withinCalm := pipelines(ctx, lim)
	missCalm, schedCalm := poolMisses(ctx, lim), schedLatencies(ctx, lim)
	late, lateMost, err := px.Late(ctx)
	try(err)
	slowUp, slowUpMost, err := px.Upstream(ctx)
	try(err)
	try(px.SetDelay(ctx, 0))
	_ = sleep(ctx, 2*time.Second)
	stalled := time.Now()
	try(px.Stall(ctx, 60*time.Millisecond))
	_ = sleep(ctx, 3*time.Second)
	stop()
	if ferr != nil {
		return ferr
	}
	checks := load.Results()
	w20, w40 := Summarise(checks, t20.Add(200*time.Millisecond), t40), Summarise(checks, t40.Add(200*time.Millisecond), calm)
	var lastDegraded time.Time
	stallWindow := Summarise(checks, stalled, time.Time{})
	for _, c := range checks {
		if c.Degraded && !c.Start.Before(stalled) && c.Start.Add(c.Latency).After(lastDegraded) {
			lastDegraded = c.Start.Add(c.Latency)
		}
	}
	span := time.Duration(0)
	if !lastDegraded.IsZero() {
		span = lastDegraded.Sub(stalled)
	}
	trips, errLines, err := countLines(lim.LogPath, stalled.Add(-time.Second), "redis circuit breaker opened", "redis call failed")
	if err != nil {
		return err
	}
	r.metric("+20 ms", "%d checks, %d degraded, p50 %s, p99 %s; %d Redis connections dialed", w20.Sent, w20.Degraded, ms(w20.P50), ms(w20.P99), dial40-dial20)
	r.metric("+40 ms", "%d checks, %d degraded, p50 %s, p99 %s; %d Redis connections dialed, %.0f of them for a command that found none idle; %.0f pipelines, %.0f of them past the 50 ms budget",
		w40.Sent, w40.Degraded, ms(w40.P50), ms(w40.P99), dialCalm-dial40, missCalm-miss40, pipesCalm-pipes40, (pipesCalm-pipes40)-(withinCalm-within40))
	priority := "normal priority (chrt refused)"
	if px.RealTime {
		priority = "real-time (chrt -f 1)"
	}
	r.metric("fault proxy", "%s; %d delayed replies (+20 and +40 ms) passed on more than %s late, the latest by %s",
		priority, late, redistest.LateBy, ms(lateMost))
	r.metric("Redis", "%d replies (+20 and +40 ms) sent more than %s after their request, before the proxy's delay; the slowest of the run %s",
		slowUp-slowUp20, redistest.LateBy, ms(slowUpMost))
	waits, over, longest := promtext.Above(sched40, schedCalm, 0.004)
	r.metric("limiter at +40 ms", "%.0f goroutine wake-ups waited over %s for a CPU, the longest under %s",
		waits, ms(seconds(over)), ms(seconds(longest)))
	r.metric("60 ms stall", "%d degraded answers, the last one %s after the stall began; log lines: %d breaker opened, %d redis call failed",
		stallWindow.Degraded, ms(span), trips, errLines)
	r.require("+40 ms: no degraded answers", w40.Sent > 0 && w40.Degraded == 0, "%d of %d", w40.Degraded, w40.Sent)
	r.require("60 ms stall: degraded for at most 300 ms", span <= 300*time.Millisecond, "%s", ms(span))
	r.require("60 ms stall: at most one line per kind", trips <= 1 && errLines <= 1, "%d breaker, %d errors", trips, errLines)
	return nil
}

// poolMisses reads how many of the limiter's Redis commands so far found no
// idle connection (NaN when /metrics cannot be read).
func poolMisses(ctx context.Context, lim *Service) float64 {
	n, err := lim.Metric(ctx, "floodgate_redis_pool_misses_total")
	if err != nil {
		return math.NaN()
	}
	return n
}

// schedLatencies reads how long the limiter's goroutines have waited for a
// CPU (the Go runtime's go_sched_latencies_seconds; nil when /metrics cannot
// be read).
func schedLatencies(ctx context.Context, lim *Service) []promtext.Bucket {
	return lim.Buckets(ctx, "go_sched_latencies_seconds")
}

// seconds is s as a Duration (+Inf as the largest).
func seconds(s float64) time.Duration {
	if s >= math.MaxInt64/float64(time.Second) {
		return math.MaxInt64
	}
	return time.Duration(s * float64(time.Second))
}

// pipelines reads the limiter's pipeline round trips so far: all of them, and
// those within 50 ms (NaN when /metrics cannot be read).
func pipelines(ctx context.Context, lim *Service) (all, within50ms float64) {
	const h = "floodgate_limiter_redis_pipeline_seconds"
	all, err := lim.Metric(ctx, h+"_count")
	if err != nil {
		return math.NaN(), math.NaN()
	}
	if within50ms, err = lim.Metric(ctx, h+`_bucket{le="0.05"}`); err != nil {
		return math.NaN(), math.NaN()
	}
	return all, within50ms
}

// RedisClusterFailover: a 3-master Redis Cluster with one replica each
// (node timeout 2 s, cluster-require-full-coverage no); one master is
// SIGKILLed under load and its replica takes over.
func RedisClusterFailover(ctx context.Context, e *Env, s Size, r *Result) error {
	cl, err := redistest.StartCluster(e.TempDir("cluster"), 3, 1, 2*time.Second)
	if err != nil {
		return err
	}
	defer cl.Kill()
	masters := cl.Addrs()[:3]
	b, err := e.StartBroker(ctx)
	if err != nil {
		return err
	}
	lim, err := e.StartLimiter(ctx, b, &Redis{Addr: strings.Join(masters, ",")}, "")
	if err != nil {
		return err
	}
	owner, err := slotOwners(ctx, masters[1])
	if err != nil {
		return err
	}
	// Every principal's keys and its client address on one master, so each
	// check touches one shard and can be told apart by it.
	ps := users("cf", s.Principals)
	ipOf, shardOf := map[events.Principal]string{}, map[events.Principal]string{}
	next := 0
	for _, p := range ps {
		m := owner[redisx.Slot(redisx.PenaltyKey(string(p.Kind), p.ID))]
		for ; ; next++ {
			ip := netip.AddrFrom4([4]byte{198, 18, byte(next >> 8), byte(next)}).String()
			if owner[redisx.Slot(redisx.BucketKey("ip", ip, "x"))] == m {
				ipOf[p], shardOf[p] = ip, m
				next++
				break
			}
		}
	}
	load := roundRobin(lim.Addr, s.Rate, ps)
	load.IP = func(p events.Principal) string { return ipOf[p] }
	stop := startLoad(ctx, load)
	_ = sleep(ctx, s.Before)
	victim := masters[0]
	killed := time.Now()
	cl.Nodes[0].Kill()
	survivor := redis.NewClient(&redis.Options{Addr: masters[1]})
	defer survivor.Close()
	var promoted time.Time
	for promoted.IsZero() && ctx.Err() == nil && time.Since(killed) < time.Minute {
		if o, err := slotOwners(ctx, masters[1]); err == nil && !containsValue(o, victim) {
			promoted = time.Now()
		}
		_ = sleep(ctx, 20*time.Millisecond)
	}
	_ = sleep(ctx, max(s.After, 5*time.Second))
	stop()
	if promoted.IsZero() {
		return fmt.Errorf("the replica of %s was never promoted", victim)
	}
	var others, dead Window
	var lastDead time.Time
	for _, c := range load.Results() {
		w := &others
		if shardOf[c.Principal] == victim {
			w = &dead
			if c.Degraded && c.Start.Add(c.Latency).After(lastDead) {
				lastDead = c.Start.Add(c.Latency)
			}
		}
		w.Sent++
		if c.OK {
			w.Answered++
			if c.Degraded {
				w.Degraded++
			}
		}
	}
	back := lastDead.Sub(promoted)
	r.metric("promotion", "replica promoted %.1f s after the SIGKILL", promoted.Sub(killed).Seconds())
	r.metric("other shards", "%d checks, %s answered, %d degraded", others.Sent, others.Availability(), others.Degraded)
	r.metric("dead shard", "%d checks, %d degraded; enforced from Redis again %s after the promotion", dead.Sent, dead.Degraded, ms(back))
	r.require("other shards: 0 degraded", others.Sent > 0 && others.Degraded == 0, "%d of %d", others.Degraded, others.Sent)
	r.require("dead shard back within 2 s of the promotion", dead.Sent > 0 && back <= 2*time.Second, "%s", ms(back))
	return nil
}

// slotOwners maps every slot to the address of its master, from addr's CLUSTER SLOTS.
func slotOwners(ctx context.Context, addr string) (map[int]string, error) {
	c := redis.NewClient(&redis.Options{Addr: addr, DialTimeout: time.Second})
	defer c.Close()
	slots, err := c.ClusterSlots(ctx).Result()
	if err != nil {
		return nil, fmt.Errorf("cluster slots of %s: %w", addr, err)
	}
	out := make(map[int]string, redisx.Slots)
	for _, r := range slots {
		if len(r.Nodes) == 0 {
			continue
		}
		for i := r.Start; i <= r.End; i++ {
			out[int(i)] = r.Nodes[0].Addr
		}
	}
	return out, nil
}

func containsValue(m map[int]string, v string) bool {
	for _, x := range m {
		if x == v {
			return true
		}
	}
	return false
}

// countLines counts, per needle, the log lines at or after since that
// contain it (JSON lines with a "time" field; lines without one count).
func countLines(path string, since time.Time, needles ...string) (int, int, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, 0, fmt.Errorf("open log: %w", err)
	}
	defer f.Close()
	var n [2]int
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if i := strings.Index(line, `"time":"`); i >= 0 && len(line) > i+8+20 {
			if t, err := time.Parse(time.RFC3339Nano, line[i+8:i+8+strings.IndexByte(line[i+8:], '"')]); err == nil && t.Before(since) {
				continue
			}
		}
		for k, s := range needles[:min(len(needles), 2)] {
			if strings.Contains(line, s) {
				n[k]++
			}
		}
	}
	return n[0], n[1], sc.Err()
}
