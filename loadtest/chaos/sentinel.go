package chaos

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/floodgate-dev/floodgate/pkg/redisx/redistest"
)

// limiterMemoryLimit is the limiter's own GOMEMLIMIT default
// (services/limiter/internal/app.defaultMemoryLimit), in force on a machine
// without a cgroup memory limit.
const limiterMemoryLimit = 300 << 20

// RedisSentinelFailover: a master, a replica and a sentinel (down after
// 2 s); the limiter finds the master through Sentinel. The master is
// SIGKILLed under load (a forced failover); once Sentinel has promoted the
// replica, the old master comes back as its replica and SENTINEL FAILOVER
// moves the master back (a graceful failover). Beside the answers it reads
// what an SRE sees (issue 38): the switch in the limiter's own log and
// metrics, /readyz naming the master, at most one log line per cause while
// the master is down, the memory limit still in force after a minute — and
// the checks each failover's old master took that its successor never saw.
func RedisSentinelFailover(ctx context.Context, e *Env, s Size, r *Result) error {
	dir := e.TempDir("sentinel")
	master, err := redistest.StartProc(dir, 0)
	if err != nil {
		return err
	}
	defer master.Kill()
	host, port, _ := strings.Cut(master.Addr, ":")
	replica, err := redistest.StartProc(dir, 0, "--replicaof", host, port)
	if err != nil {
		return err
	}
	defer replica.Kill()
	if err := waitSynced(ctx, replica); err != nil {
		return err
	}
	const name = "floodgate"
	sen, err := redistest.StartSentinel(dir, name, master.Addr, 2*time.Second)
	if err != nil {
		return err
	}
	defer sen.Kill()
	b, err := e.StartBroker(ctx)
	if err != nil {
		return err
	}
	started := time.Now()
	lim, err := e.StartLimiter(ctx, b, &Redis{Addr: master.Addr}, "",
		"FLOODGATE_REDIS_SENTINEL_MASTER="+name, "FLOODGATE_REDIS_SENTINEL_ADDRS="+sen.Addr)
	if err != nil {
		return err
	}
	ps := users("sf", s.Principals)
	load := roundRobin(lim.Addr, s.Rate, ps)
	stop := startLoad(ctx, load)
	defer stop()
	_ = sleep(ctx, s.Before)
	readyBefore, _ := readyzMaster(ctx, lim.Addr)

	// Forced: SIGKILL. What the master took and had not yet sent to its
	// replica is lost: the replication offsets just before the kill say how much.
	mc, rc := master.Client(), replica.Client()
	defer mc.Close()
	defer rc.Close()
	gap, perCheck := replicationGap(ctx, mc, rc, time.Second)
	killed := time.Now()
	master.Kill()
	sc := redis.NewSentinelClient(&redis.Options{Addr: sen.Addr})
	defer sc.Close()
	promoted, err := waitMaster(ctx, sc, name, replica.Addr, time.Minute)
	if err != nil {
		return fmt.Errorf("forced failover: %w", err)
	}
	_ = sleep(ctx, max(s.After, 5*time.Second))
	forcedEnd := time.Now()
	readyForced, _ := readyzMaster(ctx, lim.Addr)

	// Graceful: the old master back as a replica, then SENTINEL FAILOVER.
	if err := master.Start(); err != nil {
		return fmt.Errorf("restart the old master: %w", err)
	}
	mc2 := master.Client()
	defer mc2.Close()
	if err := waitFor(ctx, 30*time.Second, "old master as a synced replica", func() error {
		info, err := mc2.Info(ctx, "replication").Result()
		if err == nil && !(strings.Contains(info, "role:slave") && strings.Contains(info, "master_link_status:up")) {
			err = fmt.Errorf("not a synced replica yet")
		}
		return err
	}); err != nil {
		return err
	}
	graceful, demoted, lostGraceful, err := switchover(ctx, sc, name, rc, mc2, 30*time.Second)
	if err != nil {
		return fmt.Errorf("graceful failover: %w", err)
	}
	_ = sleep(ctx, max(s.After, 5*time.Second))
	stop()
	readyGraceful, _ := readyzMaster(ctx, lim.Addr)

	// The memory limit a minute and more after start (the cgroup is read
	// again every minute).
	_ = sleep(ctx, time.Until(started.Add(65*time.Second)))
	memLimit, merr := lim.Metric(ctx, "go_gc_gomemlimit_bytes")
	if merr != nil {
		return merr
	}
	changes, err := lim.Metric(ctx, "floodgate_redis_master_changes_total")
	if err != nil {
		return err
	}

	lines, err := readLog(lim.LogPath)
	if err != nil {
		return err
	}
	checks := load.Results()
	// Normal again: the start of the first second after the kill in which
	// every answer came from Redis; a stray budget miss later (two shared
	// cores) is counted in "after", not taken for the failover.
	last := normalAgain(checks, killed, time.Second)
	during, after := Summarise(checks, killed, last), Summarise(checks, last, forcedEnd)
	gw := Summarise(checks, graceful.Add(-time.Second), demoted.Add(5*time.Second))
	// The switch itself: from SENTINEL FAILOVER to 2 s after the limiter's
	// switch line (the demotion comes seconds later, and with it a full
	// resync: a fork on two shared cores misses a 50 ms budget now and then).
	gEnd := graceful.Add(5 * time.Second)
	if len(lines.with("redis master changed")) == 2 {
		gEnd = lines.with("redis master changed")[1].at.Add(2 * time.Second)
	}
	gs := Summarise(checks, graceful.Add(-time.Second), gEnd)
	switches := lines.with("redis master changed")
	outage := lines.between(killed, promoted.Add(time.Second))
	worst, worstN := outage.busiestCause(10 * time.Second)
	trip := outage.with("redis circuit breaker opened")
	tripCause := "(breaker did not open)"
	if len(trip) > 0 {
		tripCause = trip[0].str("cause")
	}
	startLine := lines.with("limiter serving")
	var redisConf string
	if len(startLine) > 0 {
		b, _ := json.Marshal(startLine[0].raw["redis"])
		redisConf = string(b)
	}

	r.metric("start line", "redis %s", redisConf)
	r.metric("forced: promotion", "Sentinel promoted the replica %.1f s after the SIGKILL", promoted.Sub(killed).Seconds())
	var firstFromRedis time.Time // the first answer from Redis after the kill
	for _, c := range checks {
		if c.OK && !c.Degraded && c.Start.After(killed) && (firstFromRedis.IsZero() || c.Start.Before(firstFromRedis)) {
			firstFromRedis = c.Start
		}
	}
	switchAt := time.Time{}
	if len(switches) > 0 {
		switchAt = switches[0].at
	}
	r.metric("forced: timeline", "from the promotion: the limiter's switch line %s, its first answer from Redis (a check started) %s, normal again %s",
		ms(switchAt.Sub(promoted)), ms(firstFromRedis.Sub(promoted)), ms(last.Sub(promoted)))
	r.metric("forced: failover", "%d checks, %s answered, %d degraded, normal again %s after the promotion (%.1f s after the kill)",
		during.Sent, during.Availability(), during.Degraded, ms(last.Sub(promoted)), last.Sub(killed).Seconds())
	r.metric("forced: after", "%d checks, %d degraded (stray budget misses), p99 %s", after.Sent, after.Degraded, ms(after.P99))
	r.metric("forced: lost", "replication %d bytes behind the master 0–1 s before the kill (≈ %.0f bytes per check): ≈ %.1f checks' counts not on the replica",
		gap, perCheck, float64(gap)/max(perCheck, 1))
	r.metric("forced: log", "%d lines from killed to 1 s after the promotion; the most of one cause in 10 s: %d (%s); breaker cause %q",
		len(outage), worstN, worst, tripCause)
	r.metric("graceful", "%d checks from 1 s before SENTINEL FAILOVER to 2 s after the limiter's switch, %d degraded; to 5 s after the old master's demotion (%.1f s after the request) %d checks, %d degraded; the old master took %d checks after the promotion",
		gs.Sent, gs.Degraded, demoted.Sub(graceful).Seconds(), gw.Sent, gw.Degraded, lostGraceful)
	r.metric("switch", "%d \"redis master changed\" lines, floodgate_redis_master_changes_total %.0f; /readyz redis_master %s → %s → %s", len(switches), changes,
		readyBefore, readyForced, readyGraceful)
	for i, l := range switches {
		// What followed the limiter's own switch: degraded answers after it
		// are not the failover's but Redis's or this machine's (a 50 ms budget).
		end := forcedEnd
		if i > 0 {
			end = time.Now()
		}
		w := Summarise(checks, l.at, end)
		var lastAfter time.Time
		for _, c := range checks {
			if c.Degraded && !c.Start.Before(l.at) && c.Start.Before(end) && c.Start.Add(c.Latency).After(lastAfter) {
				lastAfter = c.Start.Add(c.Latency)
			}
		}
		r.metric(fmt.Sprintf("switch %d", i+1), "%s → %s via %s; after the line: %d checks, %d degraded, the last %s after it",
			l.str("old_master"), l.str("new_master"), l.str("via"), w.Sent, w.Degraded, ms(max(0, lastAfter.Sub(l.at))))
	}
	r.metric("memory", "GOMEMLIMIT %.0f bytes %.0f s after start", memLimit, time.Since(started).Seconds())

	r.require("forced: enforced from the new master within 0.5 s of the promotion", !last.IsZero() && last.Sub(promoted) <= 500*time.Millisecond, "%s", ms(last.Sub(promoted)))
	r.require("forced: answered throughout", during.Sent > 0 && during.Answered*100 >= during.Sent*99, "%s", during.Availability())
	r.require("graceful: 0 degraded through the switch", gs.Sent > 0 && gs.Degraded == 0, "%d of %d", gs.Degraded, gs.Sent)
	r.require("each switch logged and counted", len(switches) == 2 && changes == 2 &&
		switches[0].str("new_master") == replica.Addr && switches[1].str("new_master") == master.Addr,
		"%d lines, %.0f counted", len(switches), changes)
	r.require("/readyz names the master in use", readyBefore == master.Addr && readyForced == replica.Addr && readyGraceful == master.Addr,
		"%s → %s → %s", readyBefore, readyForced, readyGraceful)
	r.require("start line names Sentinel", strings.Contains(redisConf, `"sentinel_master":"`+name+`"`) && strings.Contains(redisConf, sen.Addr), "%s", redisConf)
	r.require("master down: ≤ 1 log line per cause per 10 s", worstN <= 1, "%d × %s", worstN, worst)
	r.require("GOMEMLIMIT after 60 s is the limiter's default", memLimit == limiterMemoryLimit || cgroupLimited(), "%.0f", memLimit)
	return nil
}

// normalAgain is the start of the first check after from that opens a run of
// at least d in which no answer was degraded (zero if none did).
func normalAgain(checks []Check, from time.Time, d time.Duration) time.Time {
	cs := slices.Clone(checks)
	slices.SortFunc(cs, func(a, b Check) int { return a.Start.Compare(b.Start) })
	var run time.Time
	for _, c := range cs {
		if c.Start.Before(from) {
			continue
		}
		switch {
		case c.Degraded || !c.OK:
			run = time.Time{}
		case run.IsZero():
			run = c.Start
		case c.Start.Sub(run) >= d:
			return run
		}
	}
	return time.Time{}
}

// waitSynced waits for a replica's link to its master.
func waitSynced(ctx context.Context, p *redistest.Proc) error {
	c := p.Client()
	defer c.Close()
	return waitFor(ctx, 10*time.Second, "replica sync", func() error {
		info, err := c.Info(ctx, "replication").Result()
		if err == nil && !strings.Contains(info, "master_link_status:up") {
			err = fmt.Errorf("not synced")
		}
		return err
	})
}

// waitMaster polls Sentinel until it names addr as name's master.
func waitMaster(ctx context.Context, sc *redis.SentinelClient, name, addr string, timeout time.Duration) (time.Time, error) {
	start := time.Now()
	for ctx.Err() == nil && time.Since(start) < timeout {
		if a, err := sc.GetMasterAddrByName(ctx, name).Result(); err == nil && len(a) == 2 && a[0]+":"+a[1] == addr {
			return time.Now(), nil
		}
		_ = sleep(ctx, 10*time.Millisecond)
	}
	return time.Time{}, fmt.Errorf("Sentinel never named %s", addr)
}

// replicationGap samples the master's and the replica's replication offsets
// for d and returns the largest gap seen (bytes the replica had not yet
// received) and the replication stream's bytes per script call over d.
func replicationGap(ctx context.Context, master, replica *redis.Client, d time.Duration) (int64, float64) {
	offset := func(c *redis.Client, field string) int64 {
		info, err := c.Info(ctx, "replication").Result()
		if err != nil {
			return -1
		}
		return infoInt(info, field)
	}
	o0, c0 := offset(master, "master_repl_offset"), scriptCalls(ctx, master)
	var gap int64
	for end := time.Now().Add(d); time.Now().Before(end) && ctx.Err() == nil; {
		m := offset(master, "master_repl_offset")
		rep := offset(replica, "slave_repl_offset")
		if m >= 0 && rep >= 0 {
			gap = max(gap, m-rep)
		}
		_ = sleep(ctx, 5*time.Millisecond)
	}
	o1, c1 := offset(master, "master_repl_offset"), scriptCalls(ctx, master)
	perCheck := 0.0
	if c1 > c0 {
		perCheck = float64(o1-o0) / float64(c1-c0)
	}
	return gap, perCheck
}

// switchover runs SENTINEL FAILOVER (retrying while Sentinel has no replica
// it deems good) from the master behind oldc to the replica behind newc. It
// returns when it was asked, when the old master was demoted, and the script
// calls the old master ran after the new one was promoted: counts its full
// resync then wipes.
func switchover(ctx context.Context, sc *redis.SentinelClient, name string, oldc, newc *redis.Client, timeout time.Duration) (asked, demoted time.Time, lost int64, err error) {
	err = waitFor(ctx, timeout, "SENTINEL FAILOVER", func() error { return sc.Failover(ctx, name).Err() })
	if err != nil {
		return
	}
	asked = time.Now()
	role := func(c *redis.Client) string {
		v, err := c.Do(ctx, "ROLE").Slice()
		if err != nil || len(v) == 0 {
			return ""
		}
		s, _ := v[0].(string)
		return s
	}
	var atPromotion int64 = -1
	for end := time.Now().Add(timeout); time.Now().Before(end) && ctx.Err() == nil; {
		if atPromotion < 0 && role(newc) == "master" {
			atPromotion = scriptCalls(ctx, oldc)
		}
		if atPromotion >= 0 && role(oldc) == "slave" {
			demoted = time.Now()
			return asked, demoted, scriptCalls(ctx, oldc) - atPromotion, nil
		}
		_ = sleep(ctx, 5*time.Millisecond)
	}
	return asked, demoted, 0, fmt.Errorf("no promotion and demotion within %s", timeout)
}

// scriptCalls is how many EVAL and EVALSHA calls c's server ran.
func scriptCalls(ctx context.Context, c *redis.Client) int64 {
	info, err := c.Info(ctx, "commandstats").Result()
	if err != nil {
		return 0
	}
	var n int64
	for _, l := range strings.Split(info, "\n") {
		if strings.HasPrefix(l, "cmdstat_evalsha:") || strings.HasPrefix(l, "cmdstat_eval:") {
			n += infoInt(strings.ReplaceAll(l[strings.IndexByte(l, ':')+1:], ",", "\r\n"), "calls")
		}
	}
	return n
}

// infoInt reads field:<int> from an INFO reply.
func infoInt(info, field string) int64 {
	for _, l := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(l), field+":"); ok {
			n, _ := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			return n
		}
		if v, ok := strings.CutPrefix(strings.TrimSpace(l), field+"="); ok {
			n, _ := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			return n
		}
	}
	return 0
}

// readyzMaster is /readyz's redis_master.
func readyzMaster(ctx context.Context, addr string) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/readyz", nil)
	if err != nil {
		return "", err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	var body struct {
		RedisMaster string `json:"redis_master"`
	}
	err = json.NewDecoder(resp.Body).Decode(&body)
	return body.RedisMaster, err
}

// cgroupLimited reports a cgroup memory limit on this machine (the limiter's
// GOMEMLIMIT then follows it, not its own default).
func cgroupLimited() bool {
	for _, p := range []string{"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"} {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		v := strings.TrimSpace(string(b))
		n, err := strconv.ParseInt(v, 10, 64)
		return v != "max" && err == nil && n < 1<<62
	}
	return false
}

// logLine is one JSON line of a service's log.
type logLine struct {
	at  time.Time
	raw map[string]any
}

func (l logLine) str(k string) string {
	s, _ := l.raw[k].(string)
	return s
}

// cause is what a line's rate limit is per: its message, and go-redis's
// template or the shard it is about.
func (l logLine) cause() string {
	c := l.str("msg")
	for _, k := range []string{"cause", "shard"} {
		if v := l.str(k); v != "" && (k == "shard" || l.str("source") == "go-redis") {
			c += " | " + v
		}
	}
	return c
}

type logLines []logLine

func readLog(path string) (logLines, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("open log: %w", err)
	}
	defer f.Close()
	var out logLines
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var m map[string]any
		if json.Unmarshal(sc.Bytes(), &m) != nil {
			m = map[string]any{"msg": "(a line not in the service's JSON)"} // one cause for all of them
		}
		l := logLine{raw: m}
		if s, ok := m["time"].(string); ok {
			l.at, _ = time.Parse(time.RFC3339Nano, s)
		}
		out = append(out, l)
	}
	return out, sc.Err()
}

func (ls logLines) with(msg string) logLines {
	var out logLines
	for _, l := range ls {
		if l.str("msg") == msg {
			out = append(out, l)
		}
	}
	return out
}

func (ls logLines) between(from, to time.Time) logLines {
	var out logLines
	for _, l := range ls {
		if !l.at.Before(from) && l.at.Before(to) || l.at.IsZero() {
			out = append(out, l)
		}
	}
	return out
}

// busiestCause is the cause with the most lines within any window of d, and
// how many.
func (ls logLines) busiestCause(d time.Duration) (string, int) {
	byCause := map[string][]time.Time{}
	for _, l := range ls {
		byCause[l.cause()] = append(byCause[l.cause()], l.at)
	}
	worst, n := "", 0
	for c, ts := range byCause {
		for i := range ts {
			k := 0
			for j := i; j < len(ts) && ts[j].Sub(ts[i]) < d; j++ {
				k++
			}
			if k > n {
				worst, n = c, k
			}
		}
	}
	return worst, n
}
