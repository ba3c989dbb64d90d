package labeled

// Held-out traffic: families the detector was not tuned on, with the limiter's
// view of every request (a token bucket per principal × route, limits per
// kind), so a limit-aware scorer sees the limit, remaining, near_limit and
// allowed the limiter would have produced.
//
// The basis of each family's parameters (real-world behaviour, not the
// detector's thresholds):
//
//   - human: sessions start as a Poisson process (mean gap 3–30 min, log-
//     uniform), 3–20 page views per session (analytics put the mean of pages
//     per session at 2–5 on most sites, longer on apps) with exponential think times
//     (mean 3–15 s; web think-time studies put medians at a few seconds, with
//     long tails), each page view fanning out into 1–4 API calls 20–300 ms
//     apart (a single-page app's fetches).
//   - ipv6_privacy: humans on IPv6 whose interface identifier changes within
//     one /64 every session (RFC 8981 temporary addresses; browsers pick a new
//     one per connection burst).
//   - nat / cgnat: humans behind carrier-grade NAT (RFC 6598, 100.64.0.0/10):
//     groups of 200–500 subscribers share 4–16 public addresses; paired pooling
//     (RFC 4787 REQ-2) keeps a subscriber on one address for a session, a new
//     session may map to another.
//   - mobile_roaming: humans whose network changes every 2–8 minutes (cell
//     handover, Wi-Fi ↔ cellular), each network a different /24 of a carrier.
//   - poller: apps polling one route every 2–30 s (mail, dashboards, CI status
//     pages), timers jittered by 1–10 %, plus occasional human use.
//   - bot_established / bot_new: declared bots (kind bot) at a steady 1–50
//     req/s (log-uniform; Discord's global bot limit is 50 req/s), half paced
//     by a client-side rate limiter (fixed interval, ±2 % jitter), half driven
//     by events (Poisson). New bots appear at a random time of the run and send
//     at their rate from their first request.
//   - integration_ramp: API keys of a new integration ramping linearly from
//     0.2 req/s to 2–40 req/s over 1–5 min (a sync backfilling), then steady.
//   - ci_webhook: API keys idle most of the time; every 1–5 min a burst of
//     10–60 requests at 5–25 req/s (a CI job posting statuses, a webhook
//     fan-out), inside the limit.
//   - batch_job: API keys running a job at 70–95 % of their limit for 1–4 min
//     (a nightly export paced by the client against the published limit).
//
// The people families (app_cold_start, reconnect_storm, retry_storm,
// page_fanout, notification_fanout, multi_device, quiet_then_active) are
// documented, with their sources, in people.go.
//
// Abusive families and the pattern expected:
//
//   - scraper (rapid_fire): one address, 20–150 req/s walking resource routes
//     of a public API (GitHub issues, users) — scraping tools run at whatever
//     the target answers.
//   - pulse (rapid_fire): bursts of 100–300 req/s for 2–5 s every 20–60 s
//     (pulse-wave attacks, Imperva 2018), quiet in between.
//   - cold_blast (rapid_fire): a new principal whose first request starts a
//     100–500 req/s flood lasting 15–60 s (hit-and-run floods).
//   - credential_stuffing (distributed_ip): attacker clients (kind anonymous)
//     posting to the sign-in route at 1–5 req/s through residential proxy
//     pools of 50–500 addresses (OWASP OAT-008).
//   - slow_botnet (distributed_ip): one account driven from 200–2,000
//     addresses, each used rarely, 1–3 req/s in total.
//   - ipv6_rotation (distributed_ip): 2–20 req/s, each request from a new /64
//     of a hosting provider's /32.
//   - ato_fanout (distributed_ip; its latency is reported separately): an
//     account with normal human history that, at the takeover, starts using a
//     new network per request at 1–5 req/s.
//
// Limits per kind (token bucket per principal × route, capacity = limit,
// refill = limit per second): user 10, anonymous 5, bot 60, api_key 100;
// the sign-in route 1 per second with a capacity of 5 for every kind.

import (
	"container/heap"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"net/netip"
	"sort"
	"time"

	"github.com/floodgate-dev/floodgate/pkg/events"
)

// HeldOut sizes a held-out run. Legit and Abusive principals are split over
// the families by fixed shares.
type HeldOut struct {
	Seed     uint64
	Start    time.Time
	Duration time.Duration
	Legit    int // legitimate principals
	Abusive  int // abusive principals
	// RFC3986Routes adds routes whose literal segments hold RFC 3986 pchars
	// such as "@" (Discord's /users/@me). They are valid only with the route
	// grammar of branch events; leave false until that is merged.
	RFC3986Routes bool
	// Prefix is put in front of every principal id (unique per run, so Redis
	// keys never collide with another run's); "" for none.
	Prefix string
}

// Validate checks the sizes.
func (h HeldOut) Validate() error {
	var errs []error
	if h.Duration < 2*time.Minute {
		errs = append(errs, fmt.Errorf("duration %s: must be at least 2m (abuse starts in the first 40 %%)", h.Duration))
	}
	if h.Legit != 0 && h.Legit < 100 || h.Abusive < 0 {
		errs = append(errs, errors.New("legit must be 0 or at least 100 (every family gets one), abusive >= 0"))
	}
	if h.Start.IsZero() {
		errs = append(errs, errors.New("start must be set"))
	}
	return errors.Join(errs...)
}

// Family describes one family of principals.
type Family struct {
	Name    string
	Abusive bool
	Pattern events.Pattern // expected pattern; "" for legitimate families
	Share   float64        // of Legit or of Abusive
}

// Families lists the held-out families in a stable order.
func Families() []Family {
	return []Family{
		{Name: "human", Share: 0.22}, // whatever the other legitimate shares leave
		{Name: "ipv6_privacy", Share: 0.08},
		{Name: "cgnat", Share: 0.15},
		{Name: "mobile_roaming", Share: 0.10},
		{Name: "poller", Share: 0.10},
		{Name: "bot_established", Share: 0.0015},
		{Name: "bot_new", Share: 0.0010},
		{Name: "integration_ramp", Share: 0.0010},
		{Name: "ci_webhook", Share: 0.0040},
		{Name: "batch_job", Share: 0.0004},
		{Name: "app_cold_start", Share: 0.06}, // people families: people.go
		{Name: "reconnect_storm", Share: 0.06},
		{Name: "retry_storm", Share: 0.04},
		{Name: "page_fanout", Share: 0.06},
		{Name: "notification_fanout", Share: 0.06},
		{Name: "multi_device", Share: 0.04},
		{Name: "quiet_then_active", Share: 0.03},
		{Name: "scraper", Abusive: true, Pattern: events.PatternRapidFire, Share: 0.15},
		{Name: "pulse", Abusive: true, Pattern: events.PatternRapidFire, Share: 0.10},
		{Name: "cold_blast", Abusive: true, Pattern: events.PatternRapidFire, Share: 0.15},
		{Name: "credential_stuffing", Abusive: true, Pattern: events.PatternDistributedIP, Share: 0.15},
		{Name: "slow_botnet", Abusive: true, Pattern: events.PatternDistributedIP, Share: 0.15},
		{Name: "ipv6_rotation", Abusive: true, Pattern: events.PatternDistributedIP, Share: 0.10},
		{Name: "ato_fanout", Abusive: true, Pattern: events.PatternDistributedIP, Share: 0.20},
	}
}

// routeTables are route templates of real public APIs (Discord, GitHub,
// Stripe, Slack, Twilio).
type routeTables struct {
	human, automation, poll, scrape, atMe []route
}

func tables() routeTables {
	return routeTables{
		human: []route{
			{"GET", "/channels/{channel_id}/messages"}, {"POST", "/channels/{channel_id}/messages"},
			{"GET", "/guilds/{guild_id}/members"}, {"GET", "/repos/{owner}/{repo}/issues"},
			{"GET", "/repos/{owner}/{repo}/pulls/{pull_number}"}, {"GET", "/users/{username}"},
			{"GET", "/search/issues"}, {"GET", "/api/conversations.history"},
		},
		automation: []route{
			{"POST", "/channels/{channel_id}/messages"}, {"GET", "/repos/{owner}/{repo}/commits"},
			{"POST", "/repos/{owner}/{repo}/statuses/{sha}"}, {"POST", "/v1/charges"},
			{"GET", "/v1/customers/{customer}"}, {"POST", "/api/chat.postMessage"},
			{"POST", "/2010-04-01/Accounts/{account_sid}/Messages.json"}, {"GET", "/v1/events"},
		},
		poll:   []route{{"GET", "/v1/events"}, {"GET", "/repos/{owner}/{repo}/actions/runs"}, {"GET", "/api/conversations.history"}, {"GET", "/notifications"}},
		scrape: []route{{"GET", "/repos/{owner}/{repo}/issues"}, {"GET", "/users/{username}"}, {"GET", "/repos/{owner}/{repo}/stargazers"}, {"GET", "/search/repositories"}},
		atMe:   []route{{"GET", "/users/@me"}, {"GET", "/users/@me/guilds"}, {"GET", "/oauth2/applications/@me"}},
	}
}

// signIn is the sign-in route credential stuffing hits.
const signInMethod, signInPath = "POST", "/session"

type route struct{ method, path string }

func (r route) isSignIn() bool { return r.method == signInMethod && r.path == signInPath }

// RefillPerSecond is the model limiter's refill rate for a decision of the
// held-out stream: its limit per second, one per second on the sign-in route
// (the bucket's capacity is the decision's limit).
func RefillPerSecond(d *events.Decision) float64 {
	if d.Method == signInMethod && d.Route == signInPath {
		return 1
	}
	return float64(d.Limit)
}

// kindLimit is the per-second limit (and bucket capacity) per principal kind.
func kindLimit(k events.PrincipalKind, r route) int64 {
	if r.isSignIn() {
		return 5
	}
	switch k {
	case events.PrincipalBot:
		return 60
	case events.PrincipalAPIKey:
		return 100
	case events.PrincipalAnonymous:
		return 5
	}
	return 10
}

// bucket is the limiter's token bucket for one principal × route.
type bucket struct {
	tokens float64
	at     time.Time
}

// NewHeldOut builds a held-out stream. The same HeldOut gives the same events.
func NewHeldOut(h HeldOut) (*Stream, error) {
	if err := h.Validate(); err != nil {
		return nil, fmt.Errorf("held-out scenario: %w", err)
	}
	s := &Stream{rng: rand.New(rand.NewPCG(h.Seed, h.Seed^0xD1B54A32D192ED03)), end: h.Start.Add(h.Duration), labels: map[string]*Label{}, limiter: true}
	s.sc = Scenario{Seed: h.Seed, Start: h.Start, Duration: h.Duration}
	rt := tables()
	hr, ar, pollRoutes, scrapeRoutes := rt.human, rt.automation, rt.poll, rt.scrape
	if h.RFC3986Routes {
		hr = append(hr, rt.atMe...)
		ar = append(ar, rt.atMe[:1]...)
	}
	s.people = newPeopleWorld(h)
	var natGroup []netip.Addr
	natLeft := 0
	for _, f := range Families() {
		total := h.Legit
		if f.Abusive {
			total = h.Abusive
		}
		n := int(math.Round(f.Share * float64(total)))
		if total > 0 && n == 0 {
			n = 1
		}
		if f.Name == "human" {
			n = h.Legit - otherLegit(h.Legit)
		}
		for i := 0; i < n; i++ {
			a := &actor{pop: f.Name, rng: rand.New(rand.NewPCG(s.rng.Uint64(), uint64(i)))}
			r := a.rng
			a.p = events.Principal{Kind: events.PrincipalUser, ID: fmt.Sprintf("%sho_%s_%06d", h.Prefix, f.Name, i)}
			a.home = residentialIP(r)
			start := h.Start.Add(time.Duration(r.Int64N(int64(time.Minute))))
			abuseAt := h.Start.Add(time.Minute + time.Duration(r.Int64N(int64(h.Duration*4/10))))
			human := func() {
				a.routeSet = hr
				a.sessionGap = logUniform(r, 3*60, 30*60)
				a.think = logUniform(r, 3, 15)
				a.next = start
				a.behaveH = (*actor).human
			}
			if pf, ok := peopleFamilies[f.Name]; ok {
				s.people.newPerson(a, pf, i, n)
			}
			switch f.Name {
			case "human":
				human()
			case "ipv6_privacy":
				human()
				a.home = ipv6(r, 0x2a00+uint16(r.IntN(0x100)))
				a.v6priv = true
			case "cgnat":
				human()
				if natLeft == 0 {
					natGroup = make([]netip.Addr, 4+r.IntN(13))
					b2 := byte(r.IntN(200))
					for j := range natGroup {
						natGroup[j] = netip.AddrFrom4([4]byte{100, 64 + byte(r.IntN(64)), b2, byte(1 + r.IntN(254))})
					}
					natLeft = 200 + r.IntN(301)
				}
				natLeft--
				a.natPool = natGroup
				a.home = natGroup[r.IntN(len(natGroup))]
			case "mobile_roaming":
				human()
				a.roam = true
				a.roamEvery = [2]float64{120, 480}
			case "poller":
				human()
				a.pollEvery = time.Duration(logUniform(r, 2, 30) * float64(time.Second))
				a.pollJitter = 0.01 + 0.09*r.Float64()
				a.pollRoute = pollRoutes[r.IntN(len(pollRoutes))]
				a.nextPoll = start
				a.humanNext = start.Add(time.Duration(r.ExpFloat64() * a.sessionGap * float64(time.Second)))
			case "bot_established", "bot_new":
				a.p.Kind = events.PrincipalBot
				a.rate = logUniform(r, 1, 50)
				a.paced = r.IntN(2) == 0
				a.routeSet = []route{ar[r.IntN(len(ar))]}
				a.next = h.Start.Add(time.Duration(r.Int64N(int64(time.Second))))
				if f.Name == "bot_new" {
					a.next = h.Start.Add(time.Duration(r.Int64N(int64(h.Duration * 8 / 10))))
				}
				a.home = hostingIP(r)
				a.behaveH = (*actor).steady
			case "integration_ramp":
				a.p.Kind = events.PrincipalAPIKey
				a.rate = 2 + 38*r.Float64()
				a.rampFrom, a.rampDur = a.next, time.Duration(logUniform(r, 60, 300)*float64(time.Second))
				a.next = h.Start.Add(time.Duration(r.Int64N(int64(h.Duration / 2))))
				a.rampFrom = a.next
				a.routeSet = []route{ar[r.IntN(len(ar))], ar[r.IntN(len(ar))]}
				a.home = hostingIP(r)
				a.behaveH = (*actor).ramp
			case "ci_webhook":
				a.p.Kind = events.PrincipalAPIKey
				a.routeSet = []route{{"POST", "/repos/{owner}/{repo}/statuses/{sha}"}, {"POST", "/repos/{owner}/{repo}/check-runs"}}
				a.home = hostingIP(r)
				a.next = start
				a.behaveH = (*actor).ciBurst
			case "batch_job":
				a.p.Kind = events.PrincipalAPIKey
				a.routeSet = []route{ar[r.IntN(len(ar))]}
				a.rate = (0.70 + 0.25*r.Float64()) * float64(kindLimit(events.PrincipalAPIKey, a.routeSet[0]))
				a.paced = true
				a.next = h.Start.Add(time.Duration(r.Int64N(int64(h.Duration / 2))))
				a.stopAt = a.next.Add(time.Duration(logUniform(r, 60, 240) * float64(time.Second)))
				a.home = hostingIP(r)
				a.behaveH = (*actor).steady
			case "scraper":
				a.routeSet = scrapeRoutes
				a.rate = 20 + 130*r.Float64()
				a.next = abuseAt
				a.stopAt = abuseAt.Add(episode(r))
				a.home = hostingIP(r)
				a.behaveH = (*actor).scrape
			case "pulse":
				a.routeSet = []route{hr[r.IntN(len(hr))]}
				a.rate = 100 + 200*r.Float64()
				a.next = abuseAt
				a.pulseOn = time.Duration((2 + 3*r.Float64()) * float64(time.Second))
				a.pulseOff = time.Duration((20 + 40*r.Float64()) * float64(time.Second))
				a.pulseEnd = a.next.Add(a.pulseOn)
				a.behaveH = (*actor).pulse
			case "cold_blast":
				if r.IntN(2) == 0 {
					a.p.Kind = events.PrincipalBot
				}
				a.routeSet = []route{ar[r.IntN(len(ar))]}
				a.rate = 100 + 400*r.Float64()
				a.next = abuseAt
				a.stopAt = abuseAt.Add(time.Duration((15 + 45*r.Float64()) * float64(time.Second)))
				a.home = hostingIP(r)
				a.behaveH = (*actor).steady
			case "credential_stuffing":
				a.p.Kind = events.PrincipalAnonymous
				a.routeSet = []route{{signInMethod, signInPath}}
				a.botnet = proxyPool(r, 50+r.IntN(451))
				a.rate = 1 + 4*r.Float64()
				a.next = abuseAt
				a.behaveH = (*actor).fanOut
			case "slow_botnet":
				a.routeSet = hr
				a.botnet = proxyPool(r, 200+r.IntN(1801))
				a.rate = 1 + 2*r.Float64()
				a.next = abuseAt
				a.behaveH = (*actor).fanOut
			case "ipv6_rotation":
				a.routeSet = scrapeRoutes
				a.rate = 2 + 18*r.Float64()
				a.next = abuseAt
				a.v6rotate = ipv6(r, 0x2600+uint16(r.IntN(0x100)))
				a.behaveH = (*actor).fanOut
			case "ato_fanout":
				human()
				a.takeover = abuseAt
				a.rate = 1 + 4*r.Float64()
			}
			l := &Label{Principal: a.p, Population: f.Name, Family: f.Name, Pattern: f.Pattern, Abusive: f.Abusive}
			if f.Abusive {
				l.AbuseStart = abuseAt
				if f.Name == "ato_fanout" {
					// The takeover's first request is the first event at or
					// after abuseAt; set when it is emitted.
					l.AbuseStart = time.Time{}
				}
			}
			a.label = l
			s.labels[a.p.Key()] = l
			heap.Push(&s.actors, a)
		}
	}
	return s, nil
}

// otherLegit is how many legitimate principals the families other than
// human take out of legit.
func otherLegit(legit int) int {
	n := 0
	for _, f := range Families() {
		if !f.Abusive && f.Name != "human" {
			n += max(1, int(math.Round(f.Share*float64(legit))))
		}
	}
	return n
}

// FamilyNames returns the families present in labels, sorted.
func FamilyNames(labels map[string]*Label) []string {
	seen := map[string]bool{}
	for _, l := range labels {
		seen[l.Population] = true
	}
	out := make([]string, 0, len(seen))
	for f := range seen {
		out = append(out, f)
	}
	sort.Strings(out)
	return out
}

// decide applies the limiter's token bucket for a's request on r at t.
func (s *Stream) decide(a *actor, r route, t time.Time, d *events.Decision) {
	limit := kindLimit(a.p.Kind, r)
	if a.buckets == nil {
		a.buckets = map[route]*bucket{}
	}
	b := a.buckets[r]
	rate := float64(limit)
	if r.isSignIn() {
		rate = 1
	}
	if b == nil {
		b = &bucket{tokens: float64(limit), at: t}
		a.buckets[r] = b
	}
	b.tokens = math.Min(float64(limit), b.tokens+t.Sub(b.at).Seconds()*rate)
	b.at = t
	d.Limit, d.Tier, d.Cost = limit, events.TierPrincipal, 1
	if b.tokens >= 1 {
		b.tokens--
		d.Allowed = true
	} else {
		d.Allowed = false
	}
	d.Remaining = int64(b.tokens)
	d.NearLimit = float64(d.Remaining) < 0.1*float64(limit)
	d.Method = r.method
}

// episode is how long a high-rate abuser keeps going: 30–120 s (most HTTP
// floods are short; Cloudflare's DDoS reports put the majority under 10
// minutes, and a run needs only the onset and a few windows of it).
func episode(r *rand.Rand) time.Duration {
	return time.Duration((30 + 90*r.Float64()) * float64(time.Second))
}

func logUniform(r *rand.Rand, lo, hi float64) float64 {
	return math.Exp(math.Log(lo) + r.Float64()*(math.Log(hi)-math.Log(lo)))
}

func residentialIP(r *rand.Rand) netip.Addr {
	return netip.AddrFrom4([4]byte{byte(24 + r.IntN(150)), byte(r.IntN(256)), byte(r.IntN(256)), byte(1 + r.IntN(254))})
}

func hostingIP(r *rand.Rand) netip.Addr {
	return netip.AddrFrom4([4]byte{byte(3 + r.IntN(50)), byte(r.IntN(256)), byte(r.IntN(256)), byte(1 + r.IntN(254))})
}

// ipv6 is an address in a random /64 under the /16 given by hi.
func ipv6(r *rand.Rand, hi uint16) netip.Addr {
	var b [16]byte
	b[0], b[1] = byte(hi>>8), byte(hi)
	for i := 2; i < 16; i++ {
		b[i] = byte(r.IntN(256))
	}
	return netip.AddrFrom16(b)
}

func proxyPool(r *rand.Rand, n int) []netip.Addr {
	p := make([]netip.Addr, n)
	for i := range p {
		p[i] = residentialIP(r)
	}
	return p
}

// human: Poisson sessions of page views, each page view 1–4 API calls.
func (a *actor) human() (netip.Addr, route) {
	at := a.next
	r := a.rng
	if !a.takeover.IsZero() && !at.Before(a.takeover) {
		if a.label.AbuseStart.IsZero() {
			a.label.AbuseStart = at
		}
		a.next = at.Add(time.Duration(r.ExpFloat64() / a.rate * float64(time.Second)))
		return residentialIP(r), a.routeSet[r.IntN(len(a.routeSet))]
	}
	if a.pollEvery > 0 && !a.nextPoll.After(at) {
		a.nextPoll = at.Add(time.Duration(float64(a.pollEvery) * (1 + a.pollJitter*(2*r.Float64()-1))))
		a.next = minTime(a.nextPoll, a.humanNext)
		return a.ip(at), a.pollRoute
	}
	if a.pageLeft == 0 && a.callsLeft == 0 { // a new session
		a.pageLeft = 3 + r.IntN(18)
		if a.v6priv {
			b := a.home.As16()
			for i := 8; i < 16; i++ {
				b[i] = byte(r.IntN(256))
			}
			a.home = netip.AddrFrom16(b)
		}
		if a.natPool != nil && r.IntN(3) == 0 {
			a.home = a.natPool[r.IntN(len(a.natPool))]
		}
	}
	if a.callsLeft == 0 {
		a.pageLeft--
		a.callsLeft = 1 + r.IntN(4)
		a.hroute = a.routeSet[r.IntN(len(a.routeSet))]
	}
	rt := a.hroute
	a.callsLeft--
	var nxt time.Time
	switch {
	case a.callsLeft > 0:
		nxt = at.Add(time.Duration(20+r.IntN(280)) * time.Millisecond)
		a.hroute = a.routeSet[r.IntN(len(a.routeSet))]
	case a.pageLeft > 0:
		nxt = at.Add(time.Duration(r.ExpFloat64() * a.think * float64(time.Second)))
	default:
		nxt = at.Add(time.Duration(r.ExpFloat64() * a.sessionGap * float64(time.Second)))
	}
	if !a.takeover.IsZero() && nxt.After(a.takeover) && at.Before(a.takeover) {
		nxt = a.takeover
	}
	a.humanNext = nxt
	a.next = nxt
	if a.pollEvery > 0 {
		a.next = minTime(nxt, a.nextPoll)
	}
	return a.ip(at), rt
}

// steady: a fixed rate, paced (±2 %) or Poisson, until stopAt (if set).
func (a *actor) steady() (netip.Addr, route) {
	at := a.next
	gap := 1 / a.rate
	if a.paced {
		gap *= 1 + 0.02*(2*a.rng.Float64()-1)
	} else {
		gap *= a.rng.ExpFloat64()
	}
	a.next = at.Add(time.Duration(gap * float64(time.Second)))
	if !a.stopAt.IsZero() && a.next.After(a.stopAt) {
		a.next = a.stopAt.Add(100 * 365 * 24 * time.Hour) // done
	}
	return a.home, a.routeSet[0]
}

// ramp: Poisson at a rate rising linearly from 0.2/s to rate over rampDur.
func (a *actor) ramp() (netip.Addr, route) {
	at := a.next
	f := math.Min(1, float64(at.Sub(a.rampFrom))/float64(a.rampDur))
	rate := 0.2 + f*(a.rate-0.2)
	a.next = at.Add(time.Duration(a.rng.ExpFloat64() / rate * float64(time.Second)))
	return a.home, a.routeSet[a.rng.IntN(len(a.routeSet))]
}

// ciBurst: 10–60 requests at 5–25 req/s every 1–5 min.
func (a *actor) ciBurst() (netip.Addr, route) {
	at := a.next
	r := a.rng
	if a.pageLeft == 0 {
		a.pageLeft = 10 + r.IntN(51)
		a.rate = 5 + 20*r.Float64()
	}
	a.pageLeft--
	if a.pageLeft > 0 {
		a.next = at.Add(time.Duration(r.ExpFloat64() / a.rate * float64(time.Second)))
	} else {
		a.next = at.Add(time.Duration(logUniform(r, 60, 300) * float64(time.Second)))
	}
	return a.home, a.routeSet[r.IntN(len(a.routeSet))]
}

// scrape: Poisson at rate over the scrape routes.
func (a *actor) scrape() (netip.Addr, route) {
	at := a.next
	a.next = at.Add(time.Duration(a.rng.ExpFloat64() / a.rate * float64(time.Second)))
	if a.next.After(a.stopAt) {
		a.next = a.stopAt.Add(100 * 365 * 24 * time.Hour) // done
	}
	return a.home, a.routeSet[a.rng.IntN(len(a.routeSet))]
}

// pulse: Poisson at rate while on, quiet for pulseOff between pulses.
func (a *actor) pulse() (netip.Addr, route) {
	at := a.next
	a.next = at.Add(time.Duration(a.rng.ExpFloat64() / a.rate * float64(time.Second)))
	if a.next.After(a.pulseEnd) {
		a.next = a.pulseEnd.Add(a.pulseOff)
		a.pulseEnd = a.next.Add(a.pulseOn)
	}
	if !a.home.IsValid() {
		a.home = hostingIP(a.rng)
	}
	return a.home, a.routeSet[0]
}

// fanOut: Poisson at rate, each request from the next address of the pool
// (or a new /64 of the rotation prefix).
func (a *actor) fanOut() (netip.Addr, route) {
	at := a.next
	r := a.rng
	a.next = at.Add(time.Duration(r.ExpFloat64() / a.rate * float64(time.Second)))
	rt := a.routeSet[r.IntN(len(a.routeSet))]
	if a.v6rotate.IsValid() {
		b := a.v6rotate.As16()
		for i := 4; i < 16; i++ { // same /32, new /64 and interface id
			b[i] = byte(r.IntN(256))
		}
		return netip.AddrFrom16(b), rt
	}
	ip := a.botnet[a.botnetIdx%len(a.botnet)]
	a.botnetIdx++
	return ip, rt
}
