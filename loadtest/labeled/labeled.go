// Package labeled generates decision streams with ground truth, for measuring
// the detector's recall, false-positive rate and detection latency.
//
// Populations (all sizes scale with Scenario):
//
//   - normal: bursty people — sessions of 3–40 clicks a few hundred ms apart on
//     1–3 routes, then pauses of 5 s to 5 min; one home IP (a fifth on IPv6
//     with a new privacy address per session inside their /64).
//   - nat: ~1,000 people behind a carrier NAT of 8 addresses, each request
//     leaving from any of the 8 (address pooling), otherwise normal.
//   - roaming: phones that change address every 30 s – 3 min across a mobile
//     carrier's ranges, otherwise normal.
//   - pollers: people whose app polls a route every 30 s on top of their clicks.
//   - integrations: API keys at a steady 1–6 req/s (Poisson) on their own route.
//   - rapid_fire (abusive): bots at 25–300 req/s (against a limit of 10/s) and
//     scripted users at 20–300 req/s, on one route.
//   - botnet (abusive): one principal spread over 50–400 addresses, one to a
//     few requests per address, 1–4 req/s in total.
//   - low_and_slow (abusive): scripted user accounts, one request every 2–6 s
//     with ±3 % jitter — under every rate limit, too regular for a person.
//
// Every decision carries what the limiter would have answered: each principal
// has a token bucket (a per-second limit by kind, burst equal to the limit:
// user 20/s, bot 10/s, api_key 20/s, anonymous 5/s), so a client past its
// limit is denied (allowed=false, remaining 0) and one close to it is
// flagged near_limit, as the real limiter's events are.
//
// Abusive actors start at a random time in the first 30 % of the run, so the
// slowest (low_and_slow at one request per 6 s needs 64 gaps) can be seen.
package labeled

import (
	"container/heap"
	"fmt"
	"math"
	"math/rand/v2"
	"net/netip"
	"time"

	"github.com/floodgate-dev/floodgate/pkg/events"
)

// Scenario sizes a run. Zero counts leave a population out.
type Scenario struct {
	Seed         uint64
	Start        time.Time
	Duration     time.Duration
	Normal       int
	NAT          int // people behind the carrier NAT
	NATAddresses int
	Roaming      int
	Pollers      int
	Integrations int
	RapidFire    int
	Botnets      int
	LowAndSlow   int
}

// Default is the scenario the report in docs/detector.md uses, times scale.
// Its start is a fixed date, so the scorers see the same stream on every run;
// traffic sent where event times meet the wall clock (the detector's
// FLOODGATE_DETECTOR_MAX_EVENT_AGE, a TTL) must set Start relative to now.
func Default(scale float64) Scenario {
	n := func(x int) int { return max(1, int(math.Round(float64(x)*scale))) }
	return Scenario{
		Seed: 1, Start: time.Date(2026, 11, 22, 10, 0, 0, 0, time.UTC), Duration: 10 * time.Minute,
		Normal: n(100_000), NAT: n(1000), NATAddresses: 8, Roaming: n(2000), Pollers: n(2000), Integrations: n(200),
		RapidFire: n(200), Botnets: n(100), LowAndSlow: n(100),
	}
}

// Label is the ground truth of one principal.
type Label struct {
	Principal  events.Principal
	Population string
	Abusive    bool
	AbuseStart time.Time // first abusive event (zero for legitimate principals)

	// Held-out streams (NewHeldOut) also set:
	Family  string         // the family (same as Population)
	Pattern events.Pattern // the pattern expected ("" for legitimate principals)
}

// Stream yields events in time order. It is not safe for concurrent use.
type Stream struct {
	sc     Scenario
	rng    *rand.Rand
	end    time.Time
	actors actorHeap
	labels map[string]*Label
	n      int64
	// limiter: held-out stream, decisions from the per-kind token buckets.
	limiter bool
	people  *peopleWorld // held-out people families' shared state
}

// New builds a stream for sc.
func New(sc Scenario) *Stream {
	s := &Stream{sc: sc, rng: rand.New(rand.NewPCG(sc.Seed, sc.Seed^0x9E3779B97F4A7C15)), end: sc.Start.Add(sc.Duration), labels: map[string]*Label{}}
	add := func(pop string, abusive bool, kind events.PrincipalKind, count int, mk func(a *actor)) {
		for i := 0; i < count; i++ {
			a := &actor{p: events.Principal{Kind: kind, ID: fmt.Sprintf("%s_%06d", pop, i)}, pop: pop, rng: rand.New(rand.NewPCG(s.rng.Uint64(), uint64(i)))}
			mk(a)
			l := &Label{Principal: a.p, Population: pop, Abusive: abusive}
			if abusive {
				l.AbuseStart = a.next
			}
			s.labels[a.p.Key()] = l
			heap.Push(&s.actors, a)
		}
	}
	routes := []string{"/channels/{channel_id}/messages", "/channels/{channel_id}", "/users/me", "/guilds/{guild_id}/members", "/gateway", "/invites/{code}"}
	person := func(a *actor) {
		a.routes = []string{routes[a.rng.IntN(len(routes))], routes[a.rng.IntN(len(routes))], routes[0]}
		a.home = s.homeIP(a.rng)
		a.next = sc.Start.Add(time.Duration(a.rng.Int64N(int64(2 * time.Minute))))
		a.behave = (*actor).person
	}
	add("normal", false, events.PrincipalUser, sc.Normal, person)
	natPool := make([]netip.Addr, max(sc.NATAddresses, 1))
	for i := range natPool {
		natPool[i] = netip.AddrFrom4([4]byte{100, 64, 7, byte(10 + i)})
	}
	add("nat", false, events.PrincipalUser, sc.NAT, func(a *actor) { person(a); a.pool = natPool })
	add("roaming", false, events.PrincipalUser, sc.Roaming, func(a *actor) { person(a); a.roam = true; a.home = s.mobileIP(a.rng) })
	add("poller", false, events.PrincipalUser, sc.Pollers, func(a *actor) { person(a); a.pollEvery = 30 * time.Second; a.nextPoll = a.next })
	add("integration", false, events.PrincipalAPIKey, sc.Integrations, func(a *actor) {
		a.routes = []string{"/integrations/{id}/sync"}
		a.home = s.homeIP(a.rng)
		a.rate = 1 + 5*a.rng.Float64()
		a.next = sc.Start.Add(time.Duration(a.rng.Int64N(int64(time.Second))))
		a.behave = (*actor).poisson
	})
	abuseStart := func(a *actor) time.Time {
		return sc.Start.Add(time.Duration(a.rng.Int64N(int64(sc.Duration * 3 / 10))))
	}
	add("rapid_fire", true, events.PrincipalBot, sc.RapidFire/2, func(a *actor) {
		// 25–300/s against a bot limit of 10/s: most requests denied.
		a.routes, a.home, a.rate, a.next, a.behave = []string{routes[a.rng.IntN(len(routes))]}, s.homeIP(a.rng), 25+275*a.rng.Float64(), abuseStart(a), (*actor).poisson
	})
	add("rapid_fire_user", true, events.PrincipalUser, sc.RapidFire-sc.RapidFire/2, func(a *actor) {
		a.routes, a.home, a.rate, a.next, a.behave = []string{routes[a.rng.IntN(len(routes))]}, s.homeIP(a.rng), 20+280*a.rng.Float64(), abuseStart(a), (*actor).poisson
	})
	add("botnet", true, events.PrincipalUser, sc.Botnets, func(a *actor) {
		a.routes = []string{"/invites/{code}", "/users/me"}
		a.botnet = make([]netip.Addr, 50+a.rng.IntN(351))
		for i := range a.botnet {
			a.botnet[i] = netip.AddrFrom4([4]byte{byte(11 + a.rng.IntN(180)), byte(a.rng.IntN(256)), byte(a.rng.IntN(256)), byte(1 + a.rng.IntN(254))})
		}
		a.rate, a.next, a.behave = 1+3*a.rng.Float64(), abuseStart(a), (*actor).botnetStep
	})
	add("low_and_slow", true, events.PrincipalUser, sc.LowAndSlow, func(a *actor) {
		a.routes, a.home = []string{"/users/me", "/guilds/{guild_id}/members"}, s.homeIP(a.rng)
		a.period = time.Duration(2+4*a.rng.Float64()) * time.Second
		a.next, a.behave = abuseStart(a), (*actor).regular
	})
	return s
}

// Labels returns the ground truth of every principal, by principal key.
func (s *Stream) Labels() map[string]*Label { return s.labels }

// All returns the events Next has left to give, in order, held in memory
// (for a new stream, the whole run; Next keeps memory flat).
func (s *Stream) All() []events.Decision {
	var out []events.Decision
	var d events.Decision
	for s.Next(&d) {
		out = append(out, d)
	}
	return out
}

// Next fills d with the next event and reports false at the end of the run.
func (s *Stream) Next(d *events.Decision) bool {
	for s.actors.Len() > 0 {
		a := s.actors[0]
		if !a.next.Before(s.end) {
			heap.Pop(&s.actors)
			continue
		}
		at := a.next
		if s.limiter {
			ip, r := a.behaveH(a)
			s.n++
			*d = events.Decision{ID: fmt.Sprintf("ho_%d", s.n), TS: at, Principal: a.p, IP: ip, Route: r.path, Resource: a.res, Gateway: "labeled"}
			s.decide(a, r, at, d)
			heap.Fix(&s.actors, 0)
			return true
		}
		ip, route := a.behave(a)
		s.n++
		allowed, remaining, limit := a.take(at)
		*d = events.Decision{ID: fmt.Sprintf("lab_%d", s.n), TS: at, Principal: a.p, IP: ip, Method: "GET", Route: route,
			Allowed: allowed, Tier: events.TierPrincipal, Cost: 1, Limit: limit, Remaining: remaining, Gateway: "labeled",
			NearLimit: remaining*10 < limit}
		heap.Fix(&s.actors, 0)
		return true
	}
	return false
}

func (s *Stream) homeIP(rng *rand.Rand) netip.Addr {
	if rng.IntN(5) == 0 {
		var b [16]byte
		b[0], b[1] = 0x2a, 0x02
		for i := 2; i < 16; i++ {
			b[i] = byte(rng.IntN(256))
		}
		return netip.AddrFrom16(b)
	}
	return netip.AddrFrom4([4]byte{byte(1 + rng.IntN(9)), byte(rng.IntN(256)), byte(rng.IntN(256)), byte(1 + rng.IntN(254))})
}

func (s *Stream) mobileIP(rng *rand.Rand) netip.Addr {
	return netip.AddrFrom4([4]byte{100, byte(80 + rng.IntN(16)), byte(rng.IntN(256)), byte(1 + rng.IntN(254))})
}

// kindLimits are the per-second limits of the modelled limiter.
var kindLimits = map[events.PrincipalKind]int64{
	events.PrincipalUser: 20, events.PrincipalBot: 10, events.PrincipalAPIKey: 20, events.PrincipalAnonymous: 5,
}

// take spends one token of the actor's bucket at t and reports the limiter's
// answer: allowed, the tokens remaining and the limit.
func (a *actor) take(t time.Time) (bool, int64, int64) {
	limit := kindLimits[a.p.Kind]
	if a.bucketAt.IsZero() {
		a.tokens = float64(limit)
	} else if dt := t.Sub(a.bucketAt).Seconds(); dt > 0 {
		a.tokens = math.Min(float64(limit), a.tokens+dt*float64(limit))
	}
	a.bucketAt = t
	if a.tokens < 1 {
		return false, 0, limit
	}
	a.tokens--
	return true, int64(a.tokens), limit
}

type actor struct {
	tokens   float64
	bucketAt time.Time

	p      events.Principal
	pop    string
	rng    *rand.Rand
	next   time.Time
	behave func(a *actor) (netip.Addr, string)

	routes    []string
	home      netip.Addr
	pool      []netip.Addr
	roam      bool
	roamAt    time.Time
	burstLeft int
	route     string
	pollEvery time.Duration
	nextPoll  time.Time
	rate      float64
	period    time.Duration
	botnet    []netip.Addr
	botnetIdx int

	// held-out families (heldout.go)
	behaveH    func(a *actor) (netip.Addr, route)
	label      *Label
	buckets    map[route]*bucket
	routeSet   []route
	sessionGap float64 // mean seconds between sessions
	think      float64 // mean seconds between page views
	pageLeft   int
	callsLeft  int
	humanNext  time.Time
	v6priv     bool
	v6rotate   netip.Addr
	roamEvery  [2]float64 // seconds between network changes, min and max
	pollJitter float64
	pollRoute  route
	paced      bool
	stopAt     time.Time
	rampFrom   time.Time
	rampDur    time.Duration
	pulseOn    time.Duration
	pulseOff   time.Duration
	pulseEnd   time.Time
	takeover   time.Time
	hroute     route
	natPool    []netip.Addr

	// people families (people.go)
	pp  *person
	res string // the resource of the call behaveH returned ("" for none)
}

// person: bursts of clicks, then a pause; IPv6 hosts take a new privacy
// address per session inside their /64.
func (a *actor) person() (netip.Addr, string) {
	at := a.next
	if a.pollEvery > 0 && !a.nextPoll.After(at) {
		a.nextPoll = a.nextPoll.Add(a.pollEvery + time.Duration(a.rng.IntN(200))*time.Millisecond)
		a.next = minTime(a.nextPoll, a.next.Add(time.Duration(a.rng.IntN(100))*time.Millisecond+time.Millisecond))
		if a.burstLeft == 0 {
			a.next = a.nextPoll
			a.scheduleBurst(at)
		}
		return a.ip(at), "/users/me"
	}
	if a.burstLeft == 0 {
		a.burstLeft = 3 + a.rng.IntN(38)
		a.route = a.routes[a.rng.IntN(len(a.routes))]
		if a.home.Is6() {
			b := a.home.As16()
			for i := 8; i < 16; i++ {
				b[i] = byte(a.rng.IntN(256))
			}
			a.home = netip.AddrFrom16(b)
		}
	}
	a.burstLeft--
	if a.rng.IntN(4) == 0 {
		a.route = a.routes[a.rng.IntN(len(a.routes))]
	}
	if a.burstLeft > 0 {
		a.next = at.Add(time.Duration(80+a.rng.IntN(1500)) * time.Millisecond)
	} else {
		a.scheduleBurst(at)
	}
	if a.pollEvery > 0 {
		a.next = minTime(a.next, a.nextPoll)
	}
	return a.ip(at), a.route
}

func (a *actor) scheduleBurst(at time.Time) {
	pause := time.Duration(math.Exp(math.Log(5)+a.rng.Float64()*math.Log(60)) * float64(time.Second)) // 5 s .. 5 min, log-uniform
	a.next = at.Add(pause)
}

func (a *actor) ip(at time.Time) netip.Addr {
	switch {
	case a.pool != nil:
		return a.pool[a.rng.IntN(len(a.pool))]
	case a.roam:
		if !at.Before(a.roamAt) {
			a.home = netip.AddrFrom4([4]byte{100, byte(80 + a.rng.IntN(16)), byte(a.rng.IntN(256)), byte(1 + a.rng.IntN(254))})
			a.roamAt = at.Add(time.Duration(30+a.rng.IntN(150)) * time.Second)
			if a.roamEvery[1] > 0 {
				a.roamAt = at.Add(time.Duration((a.roamEvery[0] + a.rng.Float64()*(a.roamEvery[1]-a.roamEvery[0])) * float64(time.Second)))
			}
		}
	}
	return a.home
}

func (a *actor) poisson() (netip.Addr, string) {
	at := a.next
	a.next = at.Add(time.Duration(a.rng.ExpFloat64() / a.rate * float64(time.Second)))
	return a.home, a.routes[0]
}

func (a *actor) botnetStep() (netip.Addr, string) {
	at := a.next
	a.next = at.Add(time.Duration(a.rng.ExpFloat64() / a.rate * float64(time.Second)))
	ip := a.botnet[a.botnetIdx%len(a.botnet)]
	a.botnetIdx++
	return ip, a.routes[a.rng.IntN(len(a.routes))]
}

func (a *actor) regular() (netip.Addr, string) {
	at := a.next
	a.next = at.Add(time.Duration(float64(a.period) * (1 + 0.03*(2*a.rng.Float64()-1))))
	return a.home, a.routes[a.rng.IntN(len(a.routes))]
}

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

type actorHeap []*actor

func (h actorHeap) Len() int           { return len(h) }
func (h actorHeap) Less(i, j int) bool { return h[i].next.Before(h[j].next) }
func (h actorHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *actorHeap) Push(x any)        { *h = append(*h, x.(*actor)) }
func (h *actorHeap) Pop() any {
	old := *h
	a := old[len(old)-1]
	*h = old[:len(old)-1]
	return a
}
