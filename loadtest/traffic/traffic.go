// Package traffic generates gateway traffic against a limiter's HTTP check API:
// actors (people, pollers, declared bots, abusers) each send checks at their own
// pace, and every answer is tallied by actor class and outcome, and per actor
// whether the detector's penalty ever reached it.
package traffic

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"sync"
	"sync/atomic"
	"time"
)

// Actor is one simulated principal.
type Actor struct {
	Class  string // "people", "bots", … — how results are grouped
	Kind   string // principal kind
	ID     string
	IPs    []string // picked at random per request
	Routes []Route
	Rate   float64 // checks per second
	// Poisson sends at exponentially distributed gaps (people arrive at
	// random); otherwise gaps are Rate's interval with Jitter (a fraction).
	Poisson bool
	Jitter  float64
	// Abusive marks the ground truth: the demo reports penalties of
	// legitimate actors as false positives.
	Abusive bool
	// FanOutAfter, when set, turns the actor into an account takeover after
	// that long: from then on every request comes from a network it never
	// used, at FanOutRate checks a second.
	FanOutAfter time.Duration
	FanOutRate  float64
}

// Route is a templated route and the resource it touches.
type Route struct {
	Method, Template, Resource string
}

// Answer is the part of a check response the generator reads.
type Answer struct {
	Allowed           bool    `json:"allowed"`
	Tier              string  `json:"tier"`
	Limit             int     `json:"limit"`
	Remaining         int     `json:"remaining"`
	PenaltyMultiplier float64 `json:"penalty_multiplier"`
}

// Counts are running totals for one class; read them with Snapshot.
type Counts struct {
	Allowed, Denied, Errors atomic.Int64
	Penalized               atomic.Int64 // answers carrying a penalty multiplier < 1
	LastLimit               atomic.Int64
	lastMultiplier          atomic.Uint64 // ×1e6
}

// Multiplier is the last penalty multiplier seen for this class.
func (c *Counts) Multiplier() float64 { return float64(c.lastMultiplier.Load()) / 1e6 }

// Runner drives actors against one limiter. Safe for concurrent reads of Stats.
type Runner struct {
	URL       string // http://host:port/v1/check
	Client    *http.Client
	mu        sync.Mutex
	stats     map[string]*Counts
	penalized map[string]bool // actor id → an answer carried a penalty
}

// NewRunner returns a runner for the limiter at base (http://host:port).
func NewRunner(base string) *Runner {
	return &Runner{
		URL: base + "/v1/check",
		Client: &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{
			MaxIdleConns: 256, MaxIdleConnsPerHost: 256, IdleConnTimeout: time.Minute,
		}},
		stats: map[string]*Counts{}, penalized: map[string]bool{},
	}
}

// Penalized reports which of actors an answer ever showed penalized.
func (r *Runner) Penalized(actors []Actor) (legit, abusive []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, a := range actors {
		if !r.penalized[a.ID] {
			continue
		}
		if a.Abusive {
			abusive = append(abusive, a.ID)
		} else {
			legit = append(legit, a.ID)
		}
	}
	return legit, abusive
}

// Stats returns the counters of class, creating them on first use.
func (r *Runner) Stats(class string) *Counts {
	r.mu.Lock()
	defer r.mu.Unlock()
	c := r.stats[class]
	if c == nil {
		c = &Counts{}
		r.stats[class] = c
	}
	return c
}

// Run sends every actor's checks until ctx is done.
func (r *Runner) Run(ctx context.Context, actors []Actor) {
	var wg sync.WaitGroup
	for _, a := range actors {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r.runActor(ctx, a)
		}()
	}
	wg.Wait()
}

func (r *Runner) runActor(ctx context.Context, a Actor) {
	counts := r.Stats(a.Class)
	interval := time.Duration(float64(time.Second) / a.Rate)
	// Desynchronise actors so they do not arrive in lockstep.
	began := time.Now()
	next := began.Add(time.Duration(rand.Int64N(int64(interval) + 1)))
	fanned := 0
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Until(next)):
		}
		route := a.Routes[rand.IntN(len(a.Routes))]
		ip := a.IPs[rand.IntN(len(a.IPs))]
		switch {
		case a.FanOutAfter > 0 && time.Since(began) >= a.FanOutAfter:
			// A network it never used: a fresh /24 every request.
			fanned++
			ip = fmt.Sprintf("45.%d.%d.%d", 10+fanned/250, fanned%250, 1+rand.IntN(250))
			next = next.Add(time.Duration(float64(time.Second) / a.FanOutRate))
		case a.Poisson:
			next = next.Add(time.Duration(rand.ExpFloat64() * float64(interval)))
		default:
			next = next.Add(time.Duration(float64(interval) * (1 + a.Jitter*(2*rand.Float64()-1))))
		}
		ans, err := r.Check(ctx, a.Kind, a.ID, ip, route)
		switch {
		case err != nil:
			if ctx.Err() == nil {
				counts.Errors.Add(1)
			}
		case ans.Allowed:
			counts.Allowed.Add(1)
		default:
			counts.Denied.Add(1)
		}
		if err == nil {
			counts.LastLimit.Store(int64(ans.Limit))
			counts.lastMultiplier.Store(uint64(ans.PenaltyMultiplier * 1e6))
			if ans.PenaltyMultiplier < 1 {
				counts.Penalized.Add(1)
				r.mu.Lock()
				r.penalized[a.ID] = true
				r.mu.Unlock()
			}
		}
	}
}

// Check sends one check.
func (r *Runner) Check(ctx context.Context, kind, id, ip string, route Route) (Answer, error) {
	body, _ := json.Marshal(map[string]any{
		"principal": map[string]string{"kind": kind, "id": id},
		"ip":        ip, "method": route.Method, "route": route.Template, "resource": route.Resource,
	})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, r.URL, bytes.NewReader(body))
	if err != nil {
		return Answer{}, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := r.Client.Do(req)
	if err != nil {
		return Answer{}, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return Answer{}, fmt.Errorf("check: status %d", resp.StatusCode)
	}
	var ans Answer
	return ans, json.NewDecoder(resp.Body).Decode(&ans)
}

// DiscordRoutes are the routes the demo actors call.
var DiscordRoutes = []Route{
	{"POST", "/channels/{channel_id}/messages", "channel:1001"},
	{"GET", "/channels/{channel_id}/messages", "channel:1001"},
	{"PATCH", "/guilds/{guild_id}/members/{user_id}", "guild:42"},
	{"POST", "/webhooks/{webhook_id}/{webhook_token}", "webhook:7"},
}

// DemoActors is the demo scenario, people and services as they behave:
//   - people: n users arriving at random (Poisson, 0.2–1.5 checks/s), each
//     from their own address;
//   - nat: n/4 users behind a carrier NAT of 2 addresses, otherwise people;
//   - pollers: n/4 apps polling every 5–15 s with ±10 % jitter;
//   - bots: 6 declared bots at steady rates of 2–30 checks/s, inside their
//     limits (50/s in the demo);
//   - spammer (abusive): one bot at botRate checks/s, far past its limit;
//   - takeover (abusive): an account that behaves like a person for 20 s, then
//     uses a new network for every request at 2 checks/s.
func DemoActors(n int, botRate float64, runID string) []Actor {
	var actors []Actor
	for i := 0; i < n; i++ {
		actors = append(actors, Actor{
			Class: "people", Kind: "user", ID: fmt.Sprintf("user_%s_%03d", runID, i),
			IPs:    []string{fmt.Sprintf("198.51.100.%d", 1+i%250)},
			Routes: DiscordRoutes, Rate: 0.2 + 1.3*rand.Float64(), Poisson: true,
		})
	}
	for i := 0; i < max(n/4, 1); i++ {
		actors = append(actors, Actor{
			Class: "people", Kind: "user", ID: fmt.Sprintf("nat_%s_%03d", runID, i),
			IPs:    []string{"100.64.20.1", "100.64.20.2"},
			Routes: DiscordRoutes, Rate: 0.2 + 1.3*rand.Float64(), Poisson: true,
		})
	}
	for i := 0; i < max(n/4, 1); i++ {
		actors = append(actors, Actor{
			Class: "pollers", Kind: "user", ID: fmt.Sprintf("poller_%s_%03d", runID, i),
			IPs:    []string{fmt.Sprintf("198.51.101.%d", 1+i%250)},
			Routes: []Route{{"GET", "/users/@me", ""}}, Rate: 1 / (5 + 10*rand.Float64()), Jitter: 0.1,
		})
	}
	for i, rate := range []float64{2, 5, 10, 15, 20, 30} {
		actors = append(actors, Actor{
			Class: "bots", Kind: "bot", ID: fmt.Sprintf("bot_%s_%d", runID, i),
			IPs:    []string{fmt.Sprintf("192.0.2.%d", 10+i)},
			Routes: DiscordRoutes[:2], Rate: rate, Jitter: 0.05,
		})
	}
	actors = append(actors, Actor{
		Class: "spammer", Kind: "bot", ID: "bot_spammer_" + runID, Abusive: true,
		IPs:    []string{"203.0.113.66"},
		Routes: DiscordRoutes[:1], Rate: botRate, Poisson: true,
	}, Actor{
		Class: "takeover", Kind: "user", ID: "user_takeover_" + runID, Abusive: true,
		IPs:    []string{"198.51.102.9"},
		Routes: DiscordRoutes, Rate: 0.7, Poisson: true, FanOutAfter: 20 * time.Second, FanOutRate: 2,
	})
	return actors
}
