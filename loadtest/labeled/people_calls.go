package labeled

// The calls a person's clients make (the families are described in
// people.go): timers, app and browser boots, screens, retries, reconnects.

import (
	"fmt"
	"math"
	"math/rand/v2"
	"net/netip"
	"sort"
	"time"
)

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
