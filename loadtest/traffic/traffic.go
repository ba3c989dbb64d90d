// Package traffic generates gateway traffic against a limiter's HTTP check API:
// actors (normal users, rapid-fire bots) each send checks at their own pace, and
// every answer is tallied by actor class and outcome.
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
	Class  string // "normal", "bot", … — how results are grouped
	Kind   string // principal kind
	ID     string
	IPs    []string // picked at random per request
	Routes []Route
	Rate   float64 // checks per second (a fixed interval when Pace is nil)
	// Pace, when set, chooses the wait before each next check (Poisson
	// arrivals, sessions, jittered polling); it is used by one goroutine.
	Pace Pace
	// Abusive labels the actor for the demo's summary.
	Abusive bool
}

// Pace chooses the wait before an actor's next check.
type Pace interface {
	Next(r *rand.Rand) time.Duration
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
	URL    string // http://host:port/v1/check
	Client *http.Client
	mu     sync.Mutex
	stats  map[string]*Counts
}

// NewRunner returns a runner for the limiter at base (http://host:port).
func NewRunner(base string) *Runner {
	return &Runner{
		URL: base + "/v1/check",
		Client: &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{
			MaxIdleConns: 256, MaxIdleConnsPerHost: 256, IdleConnTimeout: time.Minute,
		}},
		stats: map[string]*Counts{},
	}
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
	rng := rand.New(rand.NewPCG(rand.Uint64(), rand.Uint64()))
	interval := func() time.Duration { return time.Duration(float64(time.Second) / a.Rate) }
	if a.Pace != nil {
		interval = func() time.Duration { return a.Pace.Next(rng) }
	}
	// Desynchronise actors so they do not arrive in lockstep.
	next := time.Now().Add(time.Duration(rng.Int64N(int64(interval()) + 1)))
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Until(next)):
		}
		next = next.Add(interval())
		if now := time.Now(); next.Before(now.Add(-time.Second)) {
			next = now // fell behind (a slow limiter): do not burst to catch up
		}
		route := a.Routes[rand.IntN(len(a.Routes))]
		ip := a.IPs[rand.IntN(len(a.IPs))]
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

// DemoActors is the demo scenario: n normal users at about one check a second each,
// from their own IPs, and one bot firing at botRate checks a second.
func DemoActors(n int, botRate float64, runID string) []Actor {
	actors := make([]Actor, 0, n+1)
	for i := 0; i < n; i++ {
		actors = append(actors, Actor{
			Class: "normal", Kind: "user", ID: fmt.Sprintf("user_%s_%03d", runID, i),
			IPs:    []string{fmt.Sprintf("198.51.100.%d", 1+i%250)},
			Routes: DiscordRoutes, Rate: 0.5 + rand.Float64(),
		})
	}
	actors = append(actors, Actor{
		Class: "bot", Kind: "bot", ID: "bot_spammer_" + runID,
		IPs:    []string{"203.0.113.66"},
		Routes: DiscordRoutes[:1], Rate: botRate,
	})
	return actors
}
