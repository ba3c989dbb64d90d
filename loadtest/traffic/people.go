package traffic

import (
	"fmt"
	"math"
	"math/rand/v2"
	"time"
)

// The demo's people and services. Each pace follows how such clients behave
// (the same bases as loadtest/labeled's held-out families), compressed in
// time so a one-minute demo shows several sessions:
//
//   - Poisson: independent arrivals at a mean rate (event-driven bots,
//     webhooks) — exponential gaps.
//   - Session: a person — a burst of page views (each 1–3 API calls 20–300 ms
//     apart) with exponential think times, then an exponential pause.
//   - Poll: an app timer every period, jittered by ±jitter.
//   - Paced: a client-side rate limiter at a steady rate with ±2 % jitter (how
//     bot libraries pace themselves against a published limit).

// Poisson is arrivals at Rate per second.
type Poisson struct{ Rate float64 }

// Next implements Pace.
func (p Poisson) Next(r *rand.Rand) time.Duration {
	return time.Duration(r.ExpFloat64() / p.Rate * float64(time.Second))
}

// Paced is a steady Rate per second with ±2 % jitter.
type Paced struct{ Rate float64 }

// Next implements Pace.
func (p Paced) Next(r *rand.Rand) time.Duration {
	return time.Duration((1 + 0.02*(2*r.Float64()-1)) / p.Rate * float64(time.Second))
}

// Poll is a timer every Period, jittered by ±Jitter (a fraction).
type Poll struct {
	Period time.Duration
	Jitter float64
}

// Next implements Pace.
func (p Poll) Next(r *rand.Rand) time.Duration {
	return time.Duration(float64(p.Period) * (1 + p.Jitter*(2*r.Float64()-1)))
}

// Session is a person: sessions of 3–12 page views with exponential think
// times of mean Think, each page view 1–3 calls, sessions separated by
// exponential pauses of mean Pause. It keeps state: one per actor.
type Session struct {
	Think, Pause time.Duration
	pages, calls int
}

// Next implements Pace.
func (s *Session) Next(r *rand.Rand) time.Duration {
	if s.calls > 0 {
		s.calls--
		return time.Duration(20+r.IntN(280)) * time.Millisecond
	}
	if s.pages > 0 {
		s.pages--
		s.calls = r.IntN(3)
		return time.Duration(r.ExpFloat64() * float64(s.Think))
	}
	s.pages, s.calls = 3+r.IntN(10), r.IntN(3)
	return time.Duration(r.ExpFloat64() * float64(s.Pause))
}

// People is the demo scenario of people and services, runID making the
// principal ids unique:
//
//   - humans people on their own addresses (Poisson sessions);
//   - nat people behind a carrier NAT of 2 addresses;
//   - pollers apps polling every 2–10 s (±5 %);
//   - declared bots (kind bot) paced at 2, 5, 10 and 20 checks/s, inside their limits;
//   - one rapid-fire bot at botRate checks/s (abusive);
//   - one account taken over and driven from 200 addresses at ~3 checks/s (abusive, distributed IP).
func People(humans, nat, pollers int, botRate float64, runID string) []Actor {
	var out []Actor
	for i := 0; i < humans; i++ {
		out = append(out, Actor{Class: "human", Kind: "user", ID: fmt.Sprintf("user_%s_%03d", runID, i),
			IPs: []string{fmt.Sprintf("198.51.100.%d", 1+i%250)}, Routes: DiscordRoutes[:3],
			Pace: &Session{Think: 3 * time.Second, Pause: 20 * time.Second}})
	}
	natIPs := []string{"100.64.12.7", "100.64.12.8"}
	for i := 0; i < nat; i++ {
		out = append(out, Actor{Class: "nat", Kind: "user", ID: fmt.Sprintf("natuser_%s_%03d", runID, i),
			IPs: natIPs, Routes: DiscordRoutes[:3], Pace: &Session{Think: 3 * time.Second, Pause: 20 * time.Second}})
	}
	for i := 0; i < pollers; i++ {
		period := time.Duration(2+math.Mod(float64(i)*1.7, 8)) * time.Second
		out = append(out, Actor{Class: "poller", Kind: "user", ID: fmt.Sprintf("poller_%s_%03d", runID, i),
			IPs: []string{fmt.Sprintf("192.0.2.%d", 1+i%250)}, Routes: DiscordRoutes[1:2], Pace: Poll{Period: period, Jitter: 0.05}})
	}
	for i, rate := range []float64{2, 5, 10, 20} {
		out = append(out, Actor{Class: "declared bot", Kind: "bot", ID: fmt.Sprintf("bot_helper_%s_%d", runID, i),
			IPs: []string{fmt.Sprintf("203.0.113.%d", 10+i)}, Routes: DiscordRoutes[:1], Pace: Paced{Rate: rate}})
	}
	out = append(out, Actor{Class: "rapid-fire bot", Kind: "bot", ID: "bot_spammer_" + runID, Abusive: true,
		IPs: []string{"203.0.113.66"}, Routes: DiscordRoutes[:1], Rate: botRate})
	var pool []string
	for i := 0; i < 200; i++ {
		pool = append(pool, fmt.Sprintf("%d.%d.%d.%d", 11+i%180, (i*37)%256, (i*91)%256, 1+i%254))
	}
	out = append(out, Actor{Class: "taken-over account", Kind: "user", ID: "user_takeover_" + runID, Abusive: true,
		IPs: pool, Routes: DiscordRoutes[:3], Pace: Poisson{Rate: 3}})
	return out
}
