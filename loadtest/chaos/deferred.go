package chaos

import (
	"context"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/floodgate-dev/floodgate/loadtest/internal/promtext"
	"github.com/floodgate-dev/floodgate/pkg/deferred"
	"github.com/floodgate-dev/floodgate/pkg/redisx"
)

// The deferral scenario's rule: orders at 20/s per principal, deferred for
// up to 2 minutes when over it.
const deferredRules = `version: 1
rules:
  - id: orders
    tier: endpoint
    method: POST
    route: /orders
    limit: 20
    period: 1s
    on_limit: defer
    defer:
      max_age: 2m
      max_queued: {principal: 1000, route: 100000}
      headers: [Content-Type, X-Order]
`

const deferredLimit = 20 // per principal per second, as in deferredRules

// orderUpstream is the real HTTP upstream of the scenario: it applies each
// order once, dedupes replays by Idempotency-Key (answering a repeat from its
// store), checks the signed principal, and refuses to start a replay past its
// X-Floodgate-Deadline.
type orderUpstream struct {
	key []byte

	mu         sync.Mutex
	byKey      map[string]int
	applied    map[string]int
	late       []string // orders applied after their deadline
	replays    []time.Time
	duplicates int // replays answered from the dedupe store
	badSig     int
}

func (u *orderUpstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	order := r.Header.Get("X-Order")
	_, _ = io.Copy(io.Discard, r.Body)
	key := r.Header.Get(deferred.HeaderIdempotency)
	u.mu.Lock()
	defer u.mu.Unlock()
	if key != "" {
		if _, err := deferred.VerifyPrincipal(r, u.key, time.Now(), time.Minute); err != nil {
			u.badSig++
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		if u.byKey[key]++; u.byKey[key] > 1 {
			u.duplicates++
			w.WriteHeader(http.StatusCreated)
			return
		}
		dl, err := time.Parse(time.RFC3339Nano, r.Header.Get(deferred.HeaderDeadline))
		if err != nil || time.Now().After(dl) {
			u.late = append(u.late, order)
			w.WriteHeader(http.StatusGone)
			return
		}
		u.replays = append(u.replays, time.Now())
	}
	u.applied[order]++
	w.WriteHeader(http.StatusCreated)
}

// DeferredKill: a burst of orders at 5× their limit through the limiter's
// reverse proxy on a route that defers; the broker is SIGKILLed during the
// burst and the replay and restarted on its data directory, the worker
// SIGKILLed during the replay and restarted. Every order answered 201 or 202
// must be applied exactly once before its deadline (or be visibly expired and
// never applied), and no order answered 429 may be applied.
func DeferredKill(ctx context.Context, e *Env, s Size, r *Result) error {
	principals, perPrincipal := 10, 500 // 5,000 orders
	rd, err := e.StartRedis(ctx)
	if err != nil {
		return err
	}
	b, err := e.StartBroker(ctx)
	if err != nil {
		return err
	}
	signKey := strings.Repeat("s", 32)
	up := &orderUpstream{key: []byte(signKey), byKey: map[string]int{}, applied: map[string]int{}}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	upSrv := &http.Server{Handler: up, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = upSrv.Serve(ln) }()
	defer upSrv.Close()
	upURL := "http://" + ln.Addr().String()

	rules, err := e.RulesFile("rules", deferredRules)
	if err != nil {
		return err
	}
	proxyAddr, err := FreeAddr()
	if err != nil {
		return err
	}
	proxy := "http://" + proxyAddr
	lim, err := e.startService(ctx, "limiter", []string{
		"FLOODGATE_KAFKA_BROKERS=" + b.Addr, "FLOODGATE_REDIS_ADDRS=" + rd.Addr, "FLOODGATE_LIMITER_RULES=" + rules,
		"FLOODGATE_LIMITER_INFLUX_INTERVAL=0", "FLOODGATE_GATEWAY=chaos-deferred", "FLOODGATE_JOURNAL_DIR=" + e.TempDir("journal"),
		"FLOODGATE_LIMITER_GRPC_ADDR=off",
		"FLOODGATE_LIMITER_PROXY_ADDR=" + proxyAddr, "FLOODGATE_LIMITER_PROXY_UPSTREAM=" + upURL,
		"FLOODGATE_LIMITER_PROXY_ROUTES=POST /orders", "FLOODGATE_LIMITER_PROXY_TRUSTED=127.0.0.1",
		// The load generator is the authenticating layer: without this every
		// order was anonymous:127.0.0.1, one principal at 50× its limit.
		"FLOODGATE_LIMITER_PROXY_IDENTITY_TRUSTED=127.0.0.1",
		"FLOODGATE_LIMITER_DEFER_WRITE_TIMEOUT=2s",
	})
	if err != nil {
		return err
	}
	group := fmt.Sprintf("chaos-deferred-%d", time.Now().UnixNano())
	workerEnv := []string{
		"FLOODGATE_KAFKA_BROKERS=" + b.Addr, "FLOODGATE_REDIS_ADDRS=" + rd.Addr, "FLOODGATE_DEFERRED_GROUP=" + group,
		"FLOODGATE_DEFERRED_UPSTREAM=" + upURL, "FLOODGATE_DEFERRED_SIGNING_KEY=" + signKey,
		"FLOODGATE_DEFERRED_LIMITER_URL=http://" + lim.Addr, "FLOODGATE_DEFERRED_MAX_BACKOFF=500ms",
		"FLOODGATE_DEFERRED_DRAIN_TIMEOUT=3s",
	}
	wk, err := e.startService(ctx, "deferred", workerEnv)
	if err != nil {
		return err
	}

	type outcome struct {
		order, user, location string
		status                int
		at                    time.Time
	}
	var mu sync.Mutex
	var outcomes []outcome
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	run := time.Now().UnixNano()
	send := func(user string, i int) {
		order := fmt.Sprintf("%s-%d", user, i)
		req, _ := http.NewRequestWithContext(ctx, "POST", proxy+"/orders", strings.NewReader(`{"order":"`+order+`"}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("X-Order", order)
		req.Header.Set("X-Principal-Kind", "user")
		req.Header.Set("X-Principal-Id", user)
		req.Header.Set("Authorization", "Bearer client-secret")
		o := outcome{order: order, user: user, at: time.Now()}
		if resp, err := client.Do(req); err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			o.status, o.location = resp.StatusCode, resp.Header.Get("Location")
		}
		mu.Lock()
		outcomes = append(outcomes, o)
		mu.Unlock()
	}
	burstStart := time.Now()
	var wg sync.WaitGroup
	for p := range principals {
		wg.Add(1)
		go func() {
			defer wg.Done()
			user := fmt.Sprintf("dk%d_%d", run, p)
			tick := time.NewTicker(time.Second / (5 * deferredLimit)) // 5× the limit, open loop
			defer tick.Stop()
			slots := make(chan struct{}, 64)
			var inflight sync.WaitGroup
			defer inflight.Wait()
			for i := range perPrincipal {
				select {
				case <-ctx.Done():
					return
				case <-tick.C:
				}
				slots <- struct{}{}
				inflight.Add(1)
				go func() {
					defer func() { <-slots; inflight.Done() }()
					send(user, i)
				}()
			}
		}()
	}

	// The broker dies mid-burst (the replay has begun) and comes back.
	if err := sleep(ctx, s.Before); err != nil {
		return err
	}
	b.Kill9()
	killedAt := time.Now()
	if err := sleep(ctx, 3*time.Second); err != nil {
		return err
	}
	if err := b.Start(ctx); err != nil {
		return fmt.Errorf("restart broker: %w", err)
	}
	restartedAt := time.Now()
	wg.Wait()
	burst := time.Since(burstStart)
	r.metric("queues at the end of the burst", "%s", queueDepths(ctx, rd.Addr, run, principals))
	// The worker dies during the replay and comes back.
	if err := sleep(ctx, 2*time.Second); err != nil {
		return err
	}
	wk.Kill()
	if err := sleep(ctx, time.Second); err != nil {
		return err
	}
	if _, err := e.startService(ctx, "deferred", workerEnv); err != nil {
		return fmt.Errorf("restart worker: %w", err)
	}

	counts := map[int]int{}
	for _, o := range outcomes {
		counts[o.status]++
	}
	r.metric("orders", "%d in %.1fs: %d applied directly (201), %d deferred (202), %d refused (429), %d other",
		len(outcomes), burst.Seconds(), counts[201], counts[202], counts[429], len(outcomes)-counts[201]-counts[202]-counts[429])
	var firstRefused, lastRefused time.Time
	for _, o := range outcomes {
		if o.status == http.StatusTooManyRequests {
			if firstRefused.IsZero() || o.at.Before(firstRefused) {
				firstRefused = o.at
			}
			if o.at.After(lastRefused) {
				lastRefused = o.at
			}
		}
	}
	if !firstRefused.IsZero() {
		r.metric("429 window", "requests sent from %.1fs to %.1fs after the broker kill (down %.1fs); refusals by reason at the edge: %s",
			firstRefused.Sub(killedAt).Seconds(), lastRefused.Sub(killedAt).Seconds(), restartedAt.Sub(killedAt).Seconds(), refusedByReason(ctx, lim))
	}

	sent := make([]sentAnswer, 0, len(outcomes))
	for _, o := range outcomes {
		sent = append(sent, sentAnswer{at: o.at, status: o.status})
	}
	r.metric("answers per second from the broker kill (202/429)", "%s", perSecond(sent, killedAt))

	// Every deferred order ends; its client sees how.
	final := map[string]string{}
	deadline := time.Now().Add(3 * time.Minute)
	for _, o := range outcomes {
		if o.status != http.StatusAccepted {
			continue
		}
		for {
			req, _ := http.NewRequestWithContext(ctx, "GET", proxy+o.location, nil)
			req.Header.Set("X-Principal-Kind", "user")
			req.Header.Set("X-Principal-Id", o.user)
			st := ""
			if resp, err := client.Do(req); err == nil {
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				st = resp.Header.Get(deferred.HeaderDeferredStatus)
			}
			if st != "" && st != string(deferred.StateQueued) && st != string(deferred.StateSending) {
				final[o.order] = st
				break
			}
			if time.Now().After(deadline) {
				final[o.order] = "unfinished:" + st
				break
			}
			if err := sleep(ctx, 200*time.Millisecond); err != nil {
				return err
			}
		}
	}
	replayEnd := time.Now()

	up.mu.Lock()
	defer up.mu.Unlock()
	var dup, missing, refusedApplied, badEnd []string
	byState := map[string]int{}
	for _, o := range outcomes {
		n := up.applied[o.order]
		switch o.status {
		case http.StatusCreated:
			if n != 1 {
				dup = append(dup, fmt.Sprintf("%s×%d", o.order, n))
			}
		case http.StatusAccepted:
			st := final[o.order]
			byState[st]++
			switch {
			case st == string(deferred.StateDone) && n != 1:
				dup = append(dup, fmt.Sprintf("%s×%d", o.order, n))
			case st == string(deferred.StateExpired) && n != 0:
				dup = append(dup, fmt.Sprintf("%s expired but applied ×%d", o.order, n))
			case st != string(deferred.StateDone) && st != string(deferred.StateExpired):
				badEnd = append(badEnd, o.order+" "+st)
			}
		default:
			if n != 0 {
				refusedApplied = append(refusedApplied, o.order)
			}
			if o.status == 0 {
				missing = append(missing, o.order)
			}
		}
	}
	r.metric("deferred outcomes", "%v", byState)
	r.metric("replays deduped by the upstream", "%d (a worker killed between send and commit)", up.duplicates)
	if n := len(up.replays); n > 1 {
		sort.Slice(up.replays, func(i, j int) bool { return up.replays[i].Before(up.replays[j]) })
		span := up.replays[n-1].Sub(up.replays[0]).Seconds()
		r.metric("replay pace", "%d replays in %.1fs = %.1f/s; the rule allows %d/s (%d principals × %d/s, less their direct traffic while the burst ran); the replay ended %.1fs after the burst",
			n, span, float64(n)/span, principals*deferredLimit, principals, deferredLimit, replayEnd.Sub(burstStart.Add(burst)).Seconds())
	}
	r.require("each accepted order applied exactly once", len(dup) == 0, "%d wrong: %v", len(dup), first(dup))
	r.require("each deferred order ended visibly (done or expired)", len(badEnd) == 0, "%d not: %v", len(badEnd), first(badEnd))
	r.require("no refused order applied", len(refusedApplied) == 0, "%d applied: %v", len(refusedApplied), first(refusedApplied))
	r.metric("replays first seen past their deadline", "%d (refused by the upstream: X-Floodgate-Deadline)", len(up.late))
	r.require("every replay's principal signature verified", up.badSig == 0, "%d bad", up.badSig)
	r.require("every request answered", len(missing) == 0, "%d without an answer: %v", len(missing), first(missing))
	return nil
}

func first(s []string) []string { return s[:min(len(s), 5)] }

// queueDepths reads the route's and each principal's deferral queue (entries
// counted against max_queued) from Redis.
func queueDepths(ctx context.Context, addr string, run int64, principals int) string {
	c := redis.NewClient(&redis.Options{Addr: addr})
	defer c.Close()
	route := deferred.RouteKey("POST", "/orders")
	n, err := c.ZCard(ctx, "fg:dfr:qr:"+redisx.Escape(route)).Result()
	if err != nil {
		return err.Error()
	}
	var per []string
	for p := range principals {
		k, err := c.ZCard(ctx, "fg:dfr:qp:{"+redisx.Escape(fmt.Sprintf("user:dk%d_%d", run, p))+"}:"+redisx.Escape(route)).Result()
		if err != nil {
			return err.Error()
		}
		per = append(per, strconv.FormatInt(k, 10))
	}
	return fmt.Sprintf("route %d; per principal %s", n, strings.Join(per, " "))
}

type sentAnswer struct {
	at     time.Time
	status int
}

// perSecond lists, for each second of the burst relative to t0, how many
// requests sent in it were deferred (202) and refused (429): "-1s 80/0, 0s 12/60, …".
func perSecond(answers []sentAnswer, t0 time.Time) string {
	if len(answers) == 0 {
		return ""
	}
	type n struct{ deferred, refused int }
	by := map[int]*n{}
	lo, hi := 1<<30, -1<<30
	for _, a := range answers {
		s := int(math.Floor(a.at.Sub(t0).Seconds()))
		lo, hi = min(lo, s), max(hi, s)
		if by[s] == nil {
			by[s] = &n{}
		}
		switch a.status {
		case http.StatusAccepted:
			by[s].deferred++
		case http.StatusTooManyRequests:
			by[s].refused++
		}
	}
	var out []string
	for s := lo; s <= hi; s++ {
		c := by[s]
		if c == nil {
			c = &n{}
		}
		out = append(out, fmt.Sprintf("%ds %d/%d", s, c.deferred, c.refused))
	}
	return strings.Join(out, ", ")
}

// refusedByReason reads floodgate_deferred_refused_total (and the 202s with
// status unknown) from a service's /metrics.
func refusedByReason(ctx context.Context, s *Service) string {
	e, err := promtext.Get(ctx, "http://"+s.Addr+"/metrics")
	if err != nil {
		return err.Error()
	}
	out := e.Series("floodgate_deferred_refused_total")
	for _, u := range e.Series("floodgate_deferred_unknown_total") {
		out = append(out, "unknown"+u)
	}
	return strings.Join(out, "; ")
}
