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
	"math"
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

// fill runs the person's timers up to its next call and sets a.next.
func (p *person) fill(a *actor) {
	for {
		t, ok := p.nextTimer()
		if !ok || !t.Before(p.end) || len(p.pending) > 0 && p.pending[0].at.Before(t) {
			break
		}
		p.fire(a.rng, t)
	}
	if len(p.pending) == 0 {
		a.next = p.end.Add(100 * 365 * 24 * time.Hour) // done
		return
	}
	a.next = p.pending[0].at
}

func (p *person) nextTimer() (time.Time, bool) {
	t := p.eventAt
	earlier := func(at time.Time) {
		if !at.IsZero() && (t.IsZero() || at.Before(t)) {
			t = at
		}
	}
	for i := range p.dev {
		earlier(p.dev[i].resumeAt)
		earlier(p.dev[i].pageAt)
	}
	return t, !t.IsZero()
}

// fire runs the timer due at t. Every handler moves its timer past t.
func (p *person) fire(r *rand.Rand, t time.Time) {
	if p.eventAt.Equal(t) {
		p.eventAt = time.Time{}
		p.event(r, t)
		return
	}
	for i := range p.dev {
		d := &p.dev[i]
		switch {
		case d.resumeAt.Equal(t):
			d.resumeAt = time.Time{}
			p.resume(r, d, t, false)
			return
		case d.pageAt.Equal(t):
			d.pageAt = time.Time{}
			p.page(r, d, t)
			return
		}
	}
}

// resume opens the app or the site: a cold-start or page-load burst, then a
// session of screens.
func (p *person) resume(r *rand.Rand, d *device, t time.Time, engaged bool) {
	switch {
	case d.firstCell:
		d.cur, d.firstCell = d.cell[r.IntN(len(d.cell))], false
	case d.cell != nil && r.Float64() < d.cellShare:
		d.cur = d.cell[r.IntN(len(d.cell))]
	default:
		d.cur = d.home
	}
	boot := 1 * time.Second
	switch {
	case p.fam == famRetry: // already in the app: its boot was before the run
	case !d.browser:
		p.appBoot(r, t, d.cur)
	case d.restore > 0:
		at := t
		for k := 0; k < d.restore; k++ {
			p.spaBoot(r, at, d, 1+r.IntN(3))
			at = at.Add(time.Duration(100+r.IntN(700)) * time.Millisecond)
		}
		boot, d.restore = at.Sub(t)+time.Second, 0
	default:
		boot = p.spaBoot(r, t, d, p.details(r))
	}
	d.pagesLeft = d.pages[0] + r.IntN(d.pages[1]-d.pages[0]+1)
	if engaged {
		d.pagesLeft = math.MaxInt32
	}
	d.pageAt = t.Add(boot + p.thinkTime(r, d))
}

func (p *person) details(r *rand.Rand) int {
	if p.anon {
		return 1 + r.IntN(3)
	}
	return 3 + r.IntN(6)
}

func (p *person) thinkTime(r *rand.Rand, d *device) time.Duration {
	return time.Duration((d.minThink + r.ExpFloat64()*d.think) * float64(time.Second))
}

// page is one screen of a session; the last schedules the next session.
func (p *person) page(r *rand.Rand, d *device, t time.Time) {
	switch {
	case p.fam == famQuiet && r.Float64() < 0.2: // several items opened at once
		at := t
		for k := 3 + r.IntN(3); k > 0; k-- {
			p.screen(r, d, at, 2+r.IntN(4))
			at = at.Add(time.Duration(200+r.IntN(300)) * time.Millisecond)
		}
	case p.fam == famQuiet:
		p.screen(r, d, t, 2+r.IntN(4))
	case d.browser && p.fam != famRetry && r.Float64() < 0.3:
		p.spaBoot(r, t, d, p.details(r))
	default:
		p.screen(r, d, t, 1+r.IntN(4))
	}
	d.pagesLeft--
	if d.pagesLeft > 0 {
		d.pageAt = t.Add(p.thinkTime(r, d))
		return
	}
	if p.fam == famQuiet {
		return
	}
	d.resumeAt = t.Add(time.Duration((d.minGap + r.ExpFloat64()*d.resumeGap) * float64(time.Second)))
}

// event is the family's own timer: an incident, a notification, the
// quiet person's background refresh and activation.
func (p *person) event(r *rand.Rand, t time.Time) {
	switch p.fam {
	case famReconnect:
		inc := p.group.incidents[p.incident]
		p.incident++
		if p.incident < len(p.group.incidents) {
			p.eventAt = p.group.incidents[p.incident].at
			if !p.eventAt.After(t) {
				p.eventAt = t.Add(time.Millisecond)
			}
		}
		if r.Float64() >= p.group.online {
			return
		}
		p.reconnect(r, t, inc)
	case famNotification:
		c := p.crowd
		var at time.Time
		if r.Float64() < c.foreground {
			at = t.Add(time.Duration(math.Exp(math.Log(0.8)+0.6*r.NormFloat64()) * float64(time.Second)))
		} else {
			at = t.Add(time.Duration(r.ExpFloat64() * (30 + 90*r.Float64()) * float64(time.Second)))
		}
		ip := p.dev[0].home
		if r.Float64() < p.dev[0].cellShare {
			ip = p.dev[0].cell[r.IntN(len(p.dev[0].cell))]
		}
		for k := 1 + r.IntN(5); k > 0; k-- {
			p.add(r, call{at: at, r: c.r, res: c.res, ip: ip})
			at = at.Add(time.Duration(150+r.IntN(1850)) * time.Millisecond)
		}
	case famQuiet:
		d := &p.dev[0]
		if t.Before(p.activeAt) { // a background refresh
			ip := d.home
			if d.cell != nil {
				ip = d.cell[r.IntN(len(d.cell))]
			}
			at := t
			for k := 1 + r.IntN(3); k > 0; k-- {
				p.add(r, call{at: at, r: bgSync[r.IntN(len(bgSync))], ip: ip})
				at = at.Add(time.Duration(50+r.IntN(250)) * time.Millisecond)
			}
			p.eventAt = p.activeAt
			return
		}
		d.think, d.minThink = 1+3*r.Float64(), 1.5
		p.resume(r, d, t, true)
	}
}

var bgSync = []route{{"GET", "/notifications"}, {"GET", "/users/{user_id}/channels"}, {"GET", "/users/{user_id}/settings"}}

// reconnect: a NAT group's client reconnecting after inc, gRPC's backoff
// between attempts, then its cold-start burst.
func (p *person) reconnect(r *rand.Rand, t time.Time, inc incident) {
	backoff := 1.0
	at := t.Add(jittered(r, backoff))
	upAt := inc.at.Add(inc.outage)
	for at.Before(upAt) {
		p.add(r, call{at: at, r: route{"GET", "/gateway"}, ip: p.addr})
		backoff = math.Min(backoff*1.6, 120)
		at = at.Add(jittered(r, backoff))
	}
	p.appBoot(r, at, p.addr)
}

func jittered(r *rand.Rand, s float64) time.Duration {
	return time.Duration(s * (0.8 + 0.4*r.Float64()) * float64(time.Second))
}

// appBoot: an app's cold start or resume, 24–36 calls in three waves within
// one second.
func (p *person) appBoot(r *rand.Rand, t time.Time, ip netip.Addr) {
	in := func(lo, hi int) time.Time { return t.Add(time.Duration(lo+r.IntN(hi-lo)) * time.Millisecond) }
	for _, rt := range bootSession {
		p.add(r, call{at: in(0, 60), r: rt, ip: ip})
	}
	for _, g := range p.guilds {
		p.add(r, call{at: in(100, 400), r: route{"GET", "/guilds/{guild_id}"}, res: g, ip: ip})
		p.add(r, call{at: in(100, 400), r: route{"GET", "/guilds/{guild_id}/channels"}, res: g, ip: ip})
	}
	p.add(r, call{at: in(100, 400), r: route{"GET", "/notifications"}, ip: ip})
	p.add(r, call{at: in(100, 400), r: route{"GET", "/users/{user_id}/relationships"}, ip: ip})
	for k, g := range p.guilds {
		p.add(r, call{at: in(250, 950), r: route{"GET", "/guilds/{guild_id}/members"}, res: g, ip: ip})
		p.add(r, call{at: in(250, 950), r: route{"GET", "/channels/{channel_id}/messages"}, res: p.chans[k], ip: ip})
		p.add(r, call{at: in(250, 950), r: route{"GET", "/channels/{channel_id}"}, res: p.chans[k], ip: ip})
	}
	for _, c := range p.dms {
		p.add(r, call{at: in(250, 950), r: route{"GET", "/channels/{channel_id}/messages"}, res: c, ip: ip})
	}
}

var bootSession = []route{
	{"GET", "/gateway"}, {"GET", "/experiments"}, {"GET", "/users/{user_id}"},
	{"GET", "/users/{user_id}/settings"}, {"GET", "/users/{user_id}/guilds"}, {"GET", "/users/{user_id}/channels"},
}

// spaBoot: a single-page app's boot in a browser (config, user, lists, one
// detail per visible item), queued behind 6 connections over HTTP/1.1. It
// returns how long the boot took.
func (p *person) spaBoot(r *rand.Rand, t time.Time, d *device, details int) time.Duration {
	var slots [6]time.Time
	ready := t.Add(time.Duration(100+r.IntN(500)) * time.Millisecond) // document and scripts
	last := ready
	send := func(rt route, res string, from time.Time) time.Time {
		start, k := from, 0
		if !d.h2 { // the connection that frees first
			for j := range slots {
				if slots[j].Before(slots[k]) {
					k = j
				}
			}
			if slots[k].After(start) {
				start = slots[k]
			}
		}
		done := start.Add(latency(r))
		slots[k] = done
		p.add(r, call{at: start, r: rt, res: res, ip: d.cur})
		if done.After(last) {
			last = done
		}
		return done
	}
	phase := func(from time.Time, calls []call) time.Time {
		end := from
		for _, c := range calls {
			if e := send(c.r, c.res, from); e.After(end) {
				end = e
			}
		}
		return end
	}
	var first, lists []call
	first = append(first, call{r: route{"GET", "/meta"}})
	if !p.anon {
		first = append(first, call{r: route{"GET", "/user"}}, call{r: route{"GET", "/notifications"}})
	}
	lists = append(lists, call{r: route{"GET", "/repos/{owner}/{repo}"}, res: p.repo}, call{r: route{"GET", "/repos/{owner}/{repo}/issues"}, res: p.repo})
	if !p.anon {
		lists = append(lists, call{r: route{"GET", "/repos/{owner}/{repo}/pulls"}, res: p.repo})
	}
	at := phase(ready, first)
	at = phase(at, lists)
	var items []call
	for k := 0; k < details; k++ {
		items = append(items, call{r: route{"GET", "/repos/{owner}/{repo}/issues/{issue_number}"}, res: fmt.Sprintf("issue:%d", 1+r.IntN(40000))})
	}
	for k := 0; k < min(details, 3); k++ {
		items = append(items, call{r: route{"GET", "/users/{username}"}, res: fmt.Sprintf("user:%d", 1+r.Int64N(200000000))})
	}
	phase(at, items)
	return last.Sub(t)
}

// latency is a response's time: log-normal, median 120 ms, 30 ms–1.5 s.
func latency(r *rand.Rand) time.Duration {
	s := math.Exp(math.Log(0.12) + 0.7*r.NormFloat64())
	return time.Duration(math.Max(0.03, math.Min(1.5, s)) * float64(time.Second))
}

// screen: n calls of one screen on distinct routes, 20–300 ms apart.
func (p *person) screen(r *rand.Rand, d *device, t time.Time, n int) {
	set := appNav
	switch {
	case d.browser && p.anon:
		set = webNavAnon
	case d.browser:
		set = webNav
	}
	n = min(n, len(set))
	at := t
	for _, k := range r.Perm(len(set))[:n] {
		rt := set[k]
		p.add(r, call{at: at, r: rt.r, res: p.resource(r, rt.typ), ip: d.cur})
		at = at.Add(time.Duration(20+r.IntN(280)) * time.Millisecond)
	}
}

func (p *person) resource(r *rand.Rand, typ string) string {
	switch typ {
	case "channel":
		return p.chans[r.IntN(len(p.chans))]
	case "guild":
		return p.guilds[r.IntN(len(p.guilds))]
	case "repo":
		return p.repo
	case "issue":
		return fmt.Sprintf("issue:%d", 1+r.IntN(40000))
	case "user":
		return fmt.Sprintf("user:%d", 1+r.Int64N(200000000))
	}
	return ""
}

type navRoute struct {
	r   route
	typ string // resource type, "" for none
}

var (
	appNav = []navRoute{
		{route{"GET", "/channels/{channel_id}/messages"}, "channel"}, {route{"POST", "/channels/{channel_id}/messages"}, "channel"},
		{route{"GET", "/channels/{channel_id}"}, "channel"}, {route{"POST", "/channels/{channel_id}/typing"}, "channel"},
		{route{"GET", "/channels/{channel_id}/pins"}, "channel"}, {route{"GET", "/guilds/{guild_id}/members"}, "guild"},
		{route{"GET", "/users/{username}"}, "user"}, {route{"GET", "/api/conversations.history"}, ""},
	}
	webNav = []navRoute{
		{route{"GET", "/repos/{owner}/{repo}/issues"}, "repo"}, {route{"GET", "/repos/{owner}/{repo}/issues/{issue_number}"}, "issue"},
		{route{"GET", "/repos/{owner}/{repo}/issues/{issue_number}/comments"}, "issue"}, {route{"POST", "/repos/{owner}/{repo}/issues/{issue_number}/comments"}, "issue"},
		{route{"GET", "/repos/{owner}/{repo}/pulls/{pull_number}"}, ""}, {route{"GET", "/search/issues"}, ""},
		{route{"GET", "/users/{username}"}, "user"}, {route{"GET", "/notifications"}, ""},
	}
	webNavAnon = []navRoute{
		{route{"GET", "/repos/{owner}/{repo}/issues"}, "repo"}, {route{"GET", "/repos/{owner}/{repo}/issues/{issue_number}"}, "issue"},
		{route{"GET", "/repos/{owner}/{repo}/issues/{issue_number}/comments"}, "issue"}, {route{"GET", "/search/issues"}, ""},
		{route{"GET", "/users/{username}"}, "user"},
	}
)

// add queues c (dropped at or after the run's end). A retry_storm client's
// call inside an incident window fails and is retried: naive clients as soon
// as the error returns, the others after full-jitter exponential backoff.
func (p *person) add(r *rand.Rand, c call) {
	p.insert(c)
	if p.fam != famRetry {
		return
	}
	win, ok := p.w.failing(c.at)
	if !ok {
		return
	}
	for k := 1; k < p.attempts; k++ {
		if p.naive {
			c.at = c.at.Add(time.Duration(20+r.IntN(70)) * time.Millisecond)
		} else {
			c.at = c.at.Add(time.Duration(r.Float64() * math.Min(p.capDelay, p.base*math.Pow(2, float64(k-1))) * float64(time.Second)))
		}
		p.insert(c)
		if !win.contains(c.at) {
			return // this attempt succeeded
		}
	}
}

func (p *person) insert(c call) {
	if !c.at.Before(p.end) {
		return
	}
	i := sort.Search(len(p.pending), func(i int) bool { return p.pending[i].at.After(c.at) })
	p.pending = append(p.pending, call{})
	copy(p.pending[i+1:], p.pending[i:])
	p.pending[i] = c
}
