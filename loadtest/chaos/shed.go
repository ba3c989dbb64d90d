package chaos

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/floodgate-dev/floodgate/pkg/adjusterapi"
	"github.com/floodgate-dev/floodgate/pkg/config"
	"github.com/floodgate-dev/floodgate/pkg/events"
	"github.com/floodgate-dev/floodgate/pkg/httpapi"
)

// shedReleaseBound is the release time docs/adjuster.md states for the
// default shed rule with the limiter's 5 s flush (ShedRule.ReleaseBound),
// and shedReleaseTarget the target.
const (
	shedReleaseBound  = 24 * time.Second
	shedReleaseTarget = 30 * time.Second
	// shedCalmLine is level 1's release line for Redis latency (0.5 × 0.95).
	shedCalmLine = 0.475
)

// shedPriorities is the load's split: 40 % critical, 30 % degraded, 20 %
// best_effort, 10 % bulk.
var shedPriorities = [10]string{"critical", "critical", "critical", "critical", "degraded", "degraded", "degraded", "best_effort", "best_effort", "bulk"}

// shedSample is the shed level the adjuster reported at a time.
type shedSample struct {
	at    time.Time
	level int
	step  adjusterapi.ShedStep
}

// ShedRelease runs the limiter (through the fault proxy to its Redis,
// flushing its Redis latency to the shared InfluxDB under a gateway tag of
// its own) and the adjuster (reading only that gateway's points, with host
// and HTTP filters no writer matches: no CPU or error-rate signal). A
// prioritised load runs throughout; Redis replies are delayed 46 ms (the
// limiters' p99 near the 50 ms budget) for 30 s, then not. Shedding must
// engage, keep critical ≥ 99.5 % answered, name cpu and error_rate unknown,
// and be back to 0 within the stated release time of the delay's end.
func ShedRelease(ctx context.Context, e *Env, s Size, r *Result) error {
	influxURL := config.DefaultInfluxURL
	if err := ping(ctx, influxURL+"/ping"); err != nil {
		return fmt.Errorf("shed-release needs the local InfluxDB (make up): %w", err)
	}
	rd, b, prefix, err := e.StartStackTables(ctx)
	if err != nil {
		return err
	}
	gateway := fmt.Sprintf("chaos-shed-%d", time.Now().UnixNano())
	lim, px, err := e.StartLimiterBehindFaultProxy(ctx, b, rd, "FLOODGATE_GATEWAY="+gateway,
		"FLOODGATE_INFLUX_URL="+influxURL, "FLOODGATE_LIMITER_INFLUX_INTERVAL=5s")
	if err != nil {
		return err
	}
	defer px.Kill()
	token, err := httpapi.NewToken("fga_")
	if err != nil {
		return err
	}
	adj, err := e.startService(ctx, "adjuster", []string{
		"FLOODGATE_REDIS_ADDRS=" + rd.Addr, "FLOODGATE_KAFKA_BROKERS=" + b.Addr,
		"FLOODGATE_DYNAMODB_ENDPOINT=" + e.DynamoEndpoint, "FLOODGATE_DYNAMODB_TABLE_PREFIX=" + prefix,
		"FLOODGATE_INFLUX_URL=" + influxURL, "FLOODGATE_ADJUSTER_TOKENS=chaos:viewer:" + httpapi.HashToken(token),
		"FLOODGATE_ADJUSTER_DECISION_TAGS=gateway=" + gateway,
		"FLOODGATE_ADJUSTER_HOST_TAGS=host=" + gateway + "-none", "FLOODGATE_ADJUSTER_HTTP_TAGS=service=" + gateway + "-none",
	})
	if err != nil {
		return err
	}

	// The adjuster's shed decisions, polled twice a second.
	var mu sync.Mutex
	var samples []shedSample
	pctx, cancel := context.WithCancel(ctx)
	defer cancel()
	polled := make(chan struct{})
	go func() {
		defer close(polled)
		client := &http.Client{Timeout: time.Second}
		for pctx.Err() == nil {
			if st, err := adjusterStatus(pctx, client, "http://"+adj.Addr, token); err == nil {
				mu.Lock()
				samples = append(samples, shedSample{at: time.Now(), level: st.Shed.Level, step: st.Shed})
				mu.Unlock()
			}
			_ = sleep(pctx, 500*time.Millisecond)
		}
	}()

	ps := users("shed", s.Principals)
	rate := min(s.Rate, 200)
	load := &Load{URL: "http://" + lim.Addr, Rate: rate, Workers: max(16, rate/15),
		Next:     func(w, i int) events.Principal { return ps[(w*7919+i)%len(ps)] },
		Priority: func(w, i int) string { return shedPriorities[(w+i)%len(shedPriorities)] }}
	stop := startLoad(ctx, load)
	// Calm first: the level must have been 0 for 10 s (a cold start's first
	// flushes, or a machine too busy for Redis to answer in time, are not
	// the overload this scenario makes).
	calmSince := time.Now()
	err = waitFor(ctx, 90*time.Second, "a calm level 0 before the overload", func() error {
		mu.Lock()
		defer mu.Unlock()
		if len(samples) == 0 || samples[len(samples)-1].level != 0 {
			calmSince = time.Now()
			return fmt.Errorf("shed level not 0")
		}
		if time.Since(calmSince) < 10*time.Second {
			return fmt.Errorf("calm for %s", time.Since(calmSince).Round(time.Second))
		}
		return nil
	})
	if err != nil {
		stop()
		return err
	}
	overloadStart := time.Now()
	if err := px.SetDelay(ctx, 46*time.Millisecond); err != nil {
		stop()
		return err
	}
	_ = sleep(ctx, 30*time.Second)
	overloadEnd := time.Now()
	if err := px.SetDelay(ctx, 0); err != nil {
		stop()
		return err
	}
	_ = sleep(ctx, shedReleaseTarget+15*time.Second)
	stop()
	cancel()
	<-polled
	unknownTotal, _ := adj.Metric(ctx, "floodgate_adjuster_shed_unknown_signals_total")
	alerts, _ := adj.Metric(ctx, `floodgate_adjuster_alerts_total{signal="shed:cpu"}`)

	mu.Lock()
	defer mu.Unlock()
	var engagedAt, zeroAt time.Time
	peak := 0
	var atPeak adjusterapi.ShedStep
	for _, x := range samples {
		if x.at.After(overloadStart) && x.at.Before(overloadEnd) && x.level > 0 && engagedAt.IsZero() {
			engagedAt = x.at
		}
		if x.at.After(overloadStart) && x.level > peak {
			peak, atPeak = x.level, x.step
		}
	}
	// When the signal itself calmed after the fault: the first status whose
	// Redis latency (the shed window's median) is under level 1's release
	// line. On a machine busy enough that Redis stays slow after the fault
	// ends, the overload has not ended, and nothing can be judged.
	relapsed := false
	var calmAt time.Time
	for _, x := range samples {
		v, ok := x.step.Signals["redis_latency"]
		switch {
		case !x.at.After(overloadEnd):
		case x.level == 0 && zeroAt.IsZero():
			zeroAt = x.at
		case x.level > 0 && !zeroAt.IsZero():
			relapsed = true // the calm's own Redis latency over a line: reported, the release stands
		}
		if x.at.After(overloadEnd) && ok && v < shedCalmLine && calmAt.IsZero() {
			calmAt = x.at
		}
	}
	var trace []string
	last := -1
	for _, x := range samples {
		if x.level != last {
			trace = append(trace, fmt.Sprintf("%+.1fs L%d", x.at.Sub(overloadEnd).Seconds(), x.level))
			last = x.level
		}
	}
	checks := load.Results()
	byPrio := func(prio string, from, to time.Time) (sent, answered, shed int) {
		for _, c := range checks {
			if c.Priority != prio || c.Start.Before(from) || !c.Start.Before(to) {
				continue
			}
			sent++
			if c.OK {
				answered++
				if c.PriorityShed {
					shed++
				}
			}
		}
		return sent, answered, shed
	}
	during := func(prio string) string {
		sent, answered, shed := byPrio(prio, overloadStart, overloadEnd)
		return fmt.Sprintf("%s %d sent, %.2f %% answered, %.1f %% shed", prio, sent, pct(answered, sent), pct(shed, answered))
	}
	critSent, critAnswered, critShed := byPrio("critical", overloadStart, overloadEnd)
	release, afterCalm, calmAfter := time.Duration(-1), time.Duration(-1), time.Duration(-1)
	if !zeroAt.IsZero() {
		release = zeroAt.Sub(overloadEnd)
	}
	if !calmAt.IsZero() {
		calmAfter = calmAt.Sub(overloadEnd)
		if !zeroAt.IsZero() {
			afterCalm = zeroAt.Sub(calmAt)
		}
	}
	r.metric("load", "%d checks/s through the limiter, 40/30/20/10 %% critical/degraded/best_effort/bulk; Redis +46 ms for 30 s", rate)
	r.metric("engaged", "%.1f s after the delay began; peak level %d (%s%s)", engagedAt.Sub(overloadStart).Seconds(), peak, atPeak.Why, atPeak.Held)
	r.metric("while overloaded", "%s; %s; %s; %s", during("critical"), during("degraded"), during("best_effort"), during("bulk"))
	r.metric("released", "level 0 %s after the delay ended (stated bound %s, target %s); raised again afterwards: %t; levels (seconds from the delay's end) %s",
		release.Round(100*time.Millisecond), shedReleaseBound, shedReleaseTarget, relapsed, strings.Join(trace, ", "))
	r.metric("signal calm", "the shed window's Redis latency under %.3g %s after the delay ended; level 0 %s after that",
		shedCalmLine, calmAfter.Round(100*time.Millisecond), afterCalm.Round(100*time.Millisecond))
	r.metric("unknown signals", "%v at the peak; %.0f shed ticks counted a signal unknown; %.0f shed:cpu alerts", atPeak.Unknown, unknownTotal, alerts)
	r.require("shedding engaged while overloaded", !engagedAt.IsZero(), "no level above 0 between %s and %s", overloadStart.Format(time.TimeOnly), overloadEnd.Format(time.TimeOnly))
	r.require("critical ≥ 99.5 % answered while overloaded", critSent > 0 && critAnswered*1000 >= critSent*995 && critShed == 0, "%d of %d, %d shed", critAnswered, critSent, critShed)
	r.require("cpu and error_rate unknown, not holding", slices.Contains(atPeak.Unknown, "cpu") && slices.Contains(atPeak.Unknown, "error_rate"), "unknown %v", atPeak.Unknown)
	if calmAt.IsZero() || calmAfter > shedReleaseBound {
		// Redis stayed slow after the fault: the machine, not the fault, is
		// overloaded, and the release cannot be judged.
		return fmt.Errorf("the overload did not end with the fault: Redis latency still over %.3g %s after the delay was removed (a busy machine); levels %s",
			shedCalmLine, calmAfter, strings.Join(trace, ", "))
	}
	r.require("level 0 ≤ 30 s after the overload ends", release >= 0 && release <= shedReleaseTarget, "%s", release)
	r.require("shed signals alerted", alerts >= 1, "%.0f", alerts)
	return nil
}

// adjusterStatus reads GET /v1/status.
func adjusterStatus(ctx context.Context, client *http.Client, base, token string) (adjusterapi.Status, error) {
	var st adjusterapi.Status
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/v1/status", nil)
	if err != nil {
		return st, err
	}
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := client.Do(req)
	if err != nil {
		return st, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return st, fmt.Errorf("status %d", resp.StatusCode)
	}
	return st, json.NewDecoder(resp.Body).Decode(&st)
}

func ping(ctx context.Context, url string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := (&http.Client{Timeout: 2 * time.Second}).Do(req)
	if err != nil {
		return err
	}
	_ = resp.Body.Close()
	if resp.StatusCode >= 300 {
		return fmt.Errorf("%s: status %d", url, resp.StatusCode)
	}
	return nil
}
