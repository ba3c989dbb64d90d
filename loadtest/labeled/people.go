package labeled

// People: legitimate persons whose clients burst — the behaviour of real
// apps and browsers, not of the detector's thresholds. Every family is kind
// user (page_fanout also anonymous: logged-out page loads) and stays inside
// the person's limits as the held-out limiter judges them (a token bucket per
// principal × route, user 10/s with a capacity of 10, anonymous 5/5): a burst
// spreads over the client's routes, a few calls per route, as real clients'
// bursts do. Where a number is assumed rather than taken from a source, it
// says so.
//
//   - app_cold_start: a phone app opened, and reopened on every resume.
//     An app's start (Android vitals' cold and warm starts; iOS apps
//     coming back to the foreground) refreshes its state at once: over
//     HTTP/2 (one multiplexed connection, so nothing is queued behind a
//     per-host limit) the client sends its boot calls in three dependent
//     waves — session (gateway, experiments, current user, settings,
//     guild and DM lists) in the first 60 ms, per-guild state at 100–400
//     ms, per-guild members and per-channel messages at 250–950 ms:
//     24–36 calls within one second, over 13 routes, at most 8 on one
//     route (3–5 guilds, 1–3 DMs; the call plan is assumed, modelled on
//     a chat client's start: the current user, its guilds and channels,
//     and the recent messages of what is on screen). Resumes are
//     Poisson, minutes apart (mean 1–6 min, log-uniform, at least 30 s
//     after the last session ends; assumed for people using this app
//     during the run — Deloitte's 2017 Global Mobile Consumer Survey put
//     US phone checks at about 47 a day over all apps). After the burst,
//     an ordinary session: 2–10 screens, 1.5 s plus an exponential think
//     time of mean 2–10 s apart (assumed), 1–4 calls per screen on
//     distinct routes, 20–300 ms apart. 60 % of sessions leave through a
//     carrier NAT (RFC 6598 100.64.0.0/10; 200–500 subscribers over 4–16
//     public addresses, one address per session as RFC 4787 paired
//     pooling keeps it), the rest through the home's Wi-Fi address.
//   - reconnect_storm: the same app, behind carrier NATs whose
//     subscribers share few public addresses (1–3 addresses, 120–300
//     subscribers each — port-block CGN deployments put hundreds of
//     subscribers on one address; the figure is assumed). At each
//     incident every connected client of the NAT group (60–90 % of them,
//     assumed: apps in the foreground or holding a socket) reconnects
//     and then runs its cold-start burst. Reconnects follow gRPC's
//     connection backoff (grpc/doc/connection-backoff.md: initial 1 s,
//     multiplier 1.6, jitter ±20 %, max 120 s): after a network change
//     (the carrier's NAT or the cell drops every flow at once; 1–2 per
//     group, at random times) the first attempt succeeds, so a whole
//     address's clients burst within 0.8–1.2 s of the same instant;
//     after a platform incident (the run's incident windows, below) each
//     attempt inside the outage is a GET /gateway the platform fails,
//     and the first one after it succeeds — the group's bursts land
//     within a few seconds of each other.
//   - retry_storm: people in ordinary app or web sessions (visits mean
//     1–4 min apart, 5–20 screens spaced as app_cold_start's, no boot
//     burst (they are already in the app); assumed so that most are
//     active during an incident) when the platform fails. The run has
//     one or two incident windows of 10–60 s (assumed; the platform
//     answers 5xx to every call). Half the clients retry as SDKs do by
//     default, with full-jitter exponential backoff (the AWS
//     Architecture Blog's "Exponential Backoff and Jitter": sleep
//     uniform in [0, min(cap, base·2^attempt)]; the AWS SDK for Go v2's
//     standard retryer makes 3 attempts with at most 20 s of backoff):
//     here 3–5 attempts, base 100 ms–1 s, cap 5–20 s (assumed ranges
//     around those defaults). The other half are naive: they retry as
//     soon as the error comes back (20–90 ms, the 5xx's own latency;
//     urllib3's Retry sleeps nothing by default, backoff_factor 0), 3–5
//     attempts in all. A retry that lands after the window succeeds and
//     ends the chain.
//   - page_fanout: single-page web apps booting in a browser: the
//     document and scripts take 100–600 ms (assumed), then the app
//     fetches its config, the current user and notifications, then its
//     lists (repository, issues, pulls), then one detail request per
//     visible item (3–8, assumed: what is above the fold; lazy loading
//     fetches the rest on scroll) and the items' authors. Responses take
//     30 ms–1.5 s (log-normal, median 120 ms, assumed); over HTTP/1.1 a
//     browser keeps at most 6 connections per host (Chrome, Firefox and
//     Safari all use 6), so calls queue behind them; over HTTP/2 (70 %
//     of visits, assumed; the HTTP Archive's Web Almanac finds most
//     requests served over HTTP/2 or later) all go at once; a boot is
//     three dependent round trips after the document, mostly 0.4–2 s.
//     Sessions: 2–8 pages (a full load on the first and 30 % of the
//     rest, otherwise an in-app navigation of 1–4 calls), 2 s plus an
//     exponential think time of mean 5–30 s apart (assumed; reading). 25
//     % are anonymous (logged out: config, repository and issue list,
//     1–3 details, no user calls).
//   - notification_fanout: thousands of people react to one message or
//     push notification within seconds: crowds of ~2,500 (each run's
//     family split into crowds; every crowd one instant, one route and
//     resource — a channel's messages, an issue, a release). 75–90 % of
//     a crowd have the app in the foreground or a live socket (assumed)
//     and fetch as soon as the gateway event or a high-priority push
//     arrives (log-normal, median 0.8 s — FCM and APNs deliver
//     high-priority messages in about a second when the device is
//     reachable; assumed); the rest open the notification later
//     (exponential, mean 30–120 s, assumed). Each responder makes 1–5
//     calls on that route and resource, 150 ms–2 s apart (the message,
//     older messages, reactions). Outside the crowd: occasional app
//     sessions (mean 5–30 min apart).
//   - multi_device: one person, one principal, on several devices: a
//     phone (the app, as app_cold_start, its first session over the
//     carrier NAT, later ones 70 % cellular and 30 % home Wi-Fi), a
//     desktop browser restoring 2–6 tabs at its first open (browsers
//     restore a session's tabs together; each tab boots as page_fanout,
//     tabs 100–800 ms apart, 1–3 details each: assumed) and a laptop at
//     work for 40 % of people (an office address). Two or three
//     addresses per principal; the devices' bursts overlap on the
//     person's buckets.
//   - quiet_then_active: a person idle for most of the run — the run's
//     beginning is all the history the detector has, and it holds one
//     background refresh (1–3 calls; Android WorkManager's periodic work
//     has a minimum interval of 15 minutes and iOS background app
//     refresh runs at the system's discretion, so an idle phone syncs
//     rarely) — who opens the app or site 45–75 % into the run and stays
//     engaged until its end: a cold-start or page-load burst, then fast
//     navigation (1.5 s plus an exponential of mean 1–4 s between
//     screens, assumed) of 2–5 calls per screen, with 20 % of screens a
//     burst of 3–5 page views within 2 s (opening several items at
//     once).
//
// Denials: the limiter model denies what a real client would get a 429 for;
// each family stays at or below 0.1 % of its events (TestPeople reports the
// shares).

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"sort"
	"time"

	"github.com/floodgate-dev/floodgate/pkg/events"
)

// call is one request a person's client will make.
type call struct {
	at  time.Time
	r   route
	res string
	ip  netip.Addr
}

// device is one client of a person: an app or a browser, with its own
// sessions.
type device struct {
	browser   bool
	h2        bool         // browser over HTTP/2 (else HTTP/1.1, 6 connections)
	home      netip.Addr   // Wi-Fi or office address
	cell      []netip.Addr // carrier NAT pool (nil: none)
	cellShare float64      // share of sessions over the carrier NAT
	firstCell bool         // the first session goes over the carrier NAT
	cur       netip.Addr   // this session's address
	resumeGap float64      // mean seconds between sessions
	minGap    float64      // at least this many seconds between sessions
	think     float64      // mean seconds between screens
	minThink  float64      // at least this many seconds between screens
	pages     [2]int       // screens per session, min and max
	pagesLeft int
	restore   int // tabs restored at the first open (browsers)
	resumeAt  time.Time
	pageAt    time.Time
}

type peopleFamily uint8

const (
	famAppColdStart peopleFamily = iota
	famReconnect
	famRetry
	famPageFanout
	famNotification
	famMultiDevice
	famQuiet
)

// peopleFamilies names the people families of Families().
var peopleFamilies = map[string]peopleFamily{
	"app_cold_start": famAppColdStart, "reconnect_storm": famReconnect, "retry_storm": famRetry,
	"page_fanout": famPageFanout, "notification_fanout": famNotification, "multi_device": famMultiDevice,
	"quiet_then_active": famQuiet,
}

// person is the state of a people family's principal.
type person struct {
	w       *peopleWorld
	fam     peopleFamily
	anon    bool
	end     time.Time
	pending []call // sorted by at
	dev     []device

	guilds, chans, dms []string // resources of the person's app
	repo               string

	eventAt time.Time // the family's own timer (incidents, notification, activation)

	// reconnect_storm
	group    *natGroup
	addr     netip.Addr
	incident int
	// retry_storm
	naive    bool
	attempts int
	base     float64 // seconds
	capDelay float64 // seconds
	// notification_fanout
	crowd *crowd
	// quiet_then_active
	activeAt time.Time
}

// window is an incident of the platform: every call in [at, at+dur) fails.
type window struct {
	at  time.Time
	dur time.Duration
}

func (w window) contains(t time.Time) bool { return !t.Before(w.at) && t.Before(w.at.Add(w.dur)) }

// natGroup is a carrier NAT's group of subscribers for reconnect_storm.
type natGroup struct {
	addrs     []netip.Addr
	online    float64
	incidents []incident
	left      int
}

type incident struct {
	at     time.Time
	outage time.Duration // 0: a network change (the first reconnect succeeds)
}

// crowd is one notification: an instant, a route and a resource.
type crowd struct {
	at         time.Time
	r          route
	res        string
	foreground float64
}

// peopleWorld is what people share: NAT pools, incidents, crowds. Its random
// source is its own, so the stream stays deterministic per seed.
type peopleWorld struct {
	rng        *rand.Rand
	start, end time.Time
	windows    []window // the platform's incidents
	cellPool   []netip.Addr
	cellLeft   int
	group      *natGroup
	crowds     []*crowd
}

func newPeopleWorld(h HeldOut) *peopleWorld {
	w := &peopleWorld{rng: rand.New(rand.NewPCG(h.Seed^0x5EED0F9E0B1E5, 0xC0FFEE)), start: h.Start, end: h.Start.Add(h.Duration)}
	// One incident in each half of the run after its first minute (one if
	// the run is short), 10–60 s long.
	span := h.Duration - time.Minute
	n := 2
	if h.Duration < 3*time.Minute {
		n = 1
	}
	for i := 0; i < n; i++ {
		d := time.Duration((10 + 50*w.rng.Float64()) * float64(time.Second))
		lo := h.Start.Add(time.Minute + span*time.Duration(i)/time.Duration(n))
		room := span/time.Duration(n) - d - 20*time.Second
		if room < time.Second {
			d, room = 10*time.Second, max(time.Second, span/time.Duration(n)-30*time.Second)
		}
		w.windows = append(w.windows, window{at: lo.Add(time.Duration(w.rng.Int64N(int64(room)))), dur: d})
	}
	return w
}

// failing is the incident window t falls in, if any.
func (w *peopleWorld) failing(t time.Time) (window, bool) {
	for _, win := range w.windows {
		if win.contains(t) {
			return win, true
		}
	}
	return window{}, false
}

// carrier returns a carrier NAT pool: 200–500 subscribers share 4–16
// addresses (as the cgnat family).
func (w *peopleWorld) carrier() []netip.Addr {
	if w.cellLeft == 0 {
		r := w.rng
		w.cellPool = make([]netip.Addr, 4+r.IntN(13))
		b2 := byte(r.IntN(200))
		for j := range w.cellPool {
			w.cellPool[j] = netip.AddrFrom4([4]byte{100, 64 + byte(r.IntN(64)), b2, byte(1 + r.IntN(254))})
		}
		w.cellLeft = 200 + r.IntN(301)
	}
	w.cellLeft--
	return w.cellPool
}

// reconnectGroup returns the NAT group of the next reconnect_storm member and
// the member's address in it.
func (w *peopleWorld) reconnectGroup() (*natGroup, netip.Addr) {
	r := w.rng
	if w.group == nil || w.group.left == 0 {
		g := &natGroup{addrs: make([]netip.Addr, 1+r.IntN(3)), online: 0.6 + 0.3*r.Float64()}
		for j := range g.addrs {
			g.addrs[j] = netip.AddrFrom4([4]byte{100, 64 + byte(r.IntN(64)), byte(r.IntN(256)), byte(1 + r.IntN(254))})
		}
		g.left = len(g.addrs) * (120 + r.IntN(181))
		// 1–2 network changes after everyone's first open, and the
		// platform's incidents.
		span := w.end.Sub(w.start) - 85*time.Second
		for k := 1 + r.IntN(2); k > 0; k-- {
			g.incidents = append(g.incidents, incident{at: w.start.Add(70*time.Second + time.Duration(r.Int64N(int64(span))))})
		}
		for _, win := range w.windows {
			g.incidents = append(g.incidents, incident{at: win.at, outage: win.dur})
		}
		sort.Slice(g.incidents, func(i, j int) bool { return g.incidents[i].at.Before(g.incidents[j].at) })
		w.group = g
	}
	g := w.group
	g.left--
	return g, g.addrs[g.left%len(g.addrs)]
}

// crowdOf returns the crowd of the i-th of n notification_fanout members:
// crowds of about 2,500, one instant in [start+30 s, end−40 s] each.
func (w *peopleWorld) crowdOf(i, n int) *crowd {
	if w.crowds == nil {
		r := w.rng
		k := max(1, n/2500)
		span := w.end.Sub(w.start) - 70*time.Second
		targets := []struct {
			r   route
			typ string
		}{
			{route{"GET", "/channels/{channel_id}/messages"}, "channel"},
			{route{"GET", "/repos/{owner}/{repo}/issues/{issue_number}"}, "issue"},
			{route{"GET", "/repos/{owner}/{repo}/releases/{release_id}"}, "release"},
			{route{"GET", "/channels/{channel_id}/messages/{message_id}"}, "message"},
		}
		for j := 0; j < k; j++ {
			t := targets[r.IntN(len(targets))]
			w.crowds = append(w.crowds, &crowd{
				at: w.start.Add(30*time.Second + time.Duration(r.Int64N(int64(span)))), r: t.r,
				res: fmt.Sprintf("%s:%d", t.typ, 100000000+r.Int64N(900000000)), foreground: 0.75 + 0.15*r.Float64(),
			})
		}
	}
	return w.crowds[i*len(w.crowds)/n]
}

// newPerson sets a up as a person of family f (the i-th of n) and schedules
// its first call.
func (w *peopleWorld) newPerson(a *actor, f peopleFamily, i, n int) {
	r := a.rng
	p := &person{w: w, fam: f, end: w.end}
	a.pp = p
	a.p.Kind = events.PrincipalUser
	a.behaveH = (*actor).people
	for k := 3 + r.IntN(3); k > 0; k-- {
		p.guilds = append(p.guilds, fmt.Sprintf("guild:%d", 80000000000+r.Int64N(900000000000)))
		p.chans = append(p.chans, fmt.Sprintf("channel:%d", 90000000000+r.Int64N(900000000000)))
	}
	for k := 1 + r.IntN(3); k > 0; k-- {
		p.dms = append(p.dms, fmt.Sprintf("channel:%d", 70000000000+r.Int64N(900000000000)))
	}
	p.repo = fmt.Sprintf("repo:%d", 1000+r.Int64N(900000000))
	first := w.start.Add(time.Duration(r.Int64N(int64(time.Minute))))
	phone := func() device {
		return device{home: residentialIP(r), cell: w.carrier(), cellShare: 0.6, resumeGap: logUniform(r, 60, 360), minGap: 30,
			think: 2 + 8*r.Float64(), minThink: 1.5, pages: [2]int{2, 10}, resumeAt: first}
	}
	browser := func() device {
		return device{browser: true, h2: r.Float64() < 0.7, home: residentialIP(r), resumeGap: logUniform(r, 120, 900), minGap: 30,
			think: 5 + 25*r.Float64(), minThink: 2, pages: [2]int{2, 8}, resumeAt: first}
	}
	switch f {
	case famAppColdStart:
		p.dev = []device{phone()}
	case famReconnect:
		p.group, p.addr = w.reconnectGroup()
		d := phone()
		d.cell, d.cellShare, d.resumeGap = []netip.Addr{p.addr}, 1, logUniform(r, 180, 900)
		p.dev = []device{d}
		p.eventAt = p.group.incidents[0].at
	case famRetry:
		d := phone()
		if r.IntN(2) == 0 {
			d = browser()
		}
		d.resumeGap, d.think, d.pages = logUniform(r, 60, 240), 2+8*r.Float64(), [2]int{5, 20}
		p.dev = []device{d}
		p.naive = i%2 == 1
		p.attempts = 3 + r.IntN(3)
		p.base, p.capDelay = logUniform(r, 0.1, 1), 5+15*r.Float64()
	case famPageFanout:
		if r.IntN(4) == 0 {
			p.anon = true
			a.p.Kind = events.PrincipalAnonymous
		}
		p.dev = []device{browser()}
	case famNotification:
		d := phone()
		d.resumeGap = logUniform(r, 300, 1800)
		d.resumeAt = first.Add(time.Duration(r.ExpFloat64() * d.resumeGap * float64(time.Second)))
		p.dev = []device{d}
		p.crowd = w.crowdOf(i, n)
		p.eventAt = p.crowd.at
	case famMultiDevice:
		ph := phone()
		ph.cellShare, ph.firstCell = 0.7, true
		desk := browser()
		desk.restore = 2 + r.IntN(5)
		desk.home = ph.home
		desk.resumeAt = w.start.Add(time.Duration(r.Int64N(int64(time.Minute))))
		p.dev = []device{ph, desk}
		if r.Float64() < 0.4 {
			lap := browser()
			lap.resumeAt = w.start.Add(time.Duration(r.Int64N(int64(2 * time.Minute))))
			p.dev = append(p.dev, lap)
		}
	case famQuiet:
		d := phone()
		if r.IntN(2) == 0 {
			d = browser()
		}
		d.resumeAt = time.Time{}
		p.dev = []device{d}
		run := w.end.Sub(w.start)
		p.activeAt = w.start.Add(time.Duration((0.45 + 0.30*r.Float64()) * float64(run)))
		p.eventAt = w.start.Add(time.Duration(r.Int64N(int64(p.activeAt.Sub(w.start) - 10*time.Second))))
	}
	p.fill(a)
}

// people: the next call of a person's clients.
func (a *actor) people() (netip.Addr, route) {
	p := a.pp
	c := p.pending[0]
	copy(p.pending, p.pending[1:])
	p.pending = p.pending[:len(p.pending)-1]
	a.res = c.res
	p.fill(a)
	return c.ip, c.r
}
