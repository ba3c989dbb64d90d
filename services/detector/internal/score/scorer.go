package score

import (
	"hash/maphash"
	"math"
	"net/netip"
	"sort"
	"time"

	"github.com/DataDog/sketches-go/ddsketch"
	"github.com/axiomhq/hyperloglog"

	"github.com/floodgate-dev/floodgate/pkg/events"
)

// Pattern names.
const (
	RapidFire     events.Pattern = events.PatternRapidFire
	DistributedIP events.Pattern = events.PatternDistributedIP
	BotLike       events.Pattern = events.PatternBotLike
)

const (
	pRapid = iota
	pDistributed
	pBotLike
	numPatterns
)

// Detection is what a scorer found; the detector turns it into a penalty and
// an abuse event. Everything in it is derived from event time, so replaying a
// partition yields the same detections.
type Detection struct {
	Pattern      events.Pattern
	Principal    events.Principal
	At           time.Time // event time of the event that crossed the threshold
	FirstEventAt time.Time // start of the oldest bucket (or IP) that counted
	WindowStart  time.Time
	Window       time.Duration
	Score        float64 // higher is worse; the pattern fires above Threshold
	Threshold    float64
	ObservedRate float64 // events/s over the window
	ExpectedRate float64 // rapid_fire: max(baseline × k, route quantile, floor)
	Baseline     float64 // the principal's own EWMA rate on Route
	RouteRate    float64 // the route's population quantile (0: not enough samples)
	Count        int64   // events in the window (rapid_fire: on Route)
	Route        string
	DistinctIPs  int64 // IPv4 addresses + IPv6 /64s in the IP window
	UnsharedIPs  int64 // of those, not shared with SharedIPPrincipals principals
	DistinctIP24 int64
	DistinctIP64 int64
	Diversity    float64 // distinct IPs / requests in the IP window
	GapMean      float64 // bot_like: mean inter-arrival gap, seconds
	GapCV        float64 // bot_like: coefficient of variation of gaps
	TopRoutes    []events.RouteCount
	TopIPs       []events.IPCount

	// Severity grades the harm: the rate against the principal's own limit
	// (its denial ratio) for automated kinds, the rate against the floor or
	// the human population for people, breadth for distributed_ip. Regular
	// timing alone (bot_like) is low.
	Severity events.Severity
	// Penalize is false for a signal that alone must not throttle anyone
	// (bot_like): the detector reports it without writing a penalty.
	Penalize bool
	// BaselineSource says which expectation the score was measured against:
	// "principal_history", "route_population", "kind_floor" or "limit"
	// (rapid_fire), "networks" (distributed_ip); empty for bot_like.
	BaselineSource string
	// DenialRatio is the share of the principal's decisions in about one
	// window that the limiter denied (penalty denials excluded), and Denials
	// how many that was.
	DenialRatio float64
	Denials     int64
	// Sustained is how long, within rapid_fire's window, the principal's
	// rate was above the line (whole buckets).
	Sustained time.Duration
	// NewNetworks is distributed_ip's new-network velocity: networks new to
	// the principal within FanoutInterval (0 when diversity fired).
	NewNetworks int64
	// NetworkThreshold is the count of unshared networks at which
	// distributed_ip fired: the diversity minimum or the fan-out one.
	NetworkThreshold int64
}

// AllRoutes is the route of a person's rapid_fire over all their routes
// together (Detection.Route); it is no route template, which start with "/".
const AllRoutes = "*"

// The recent rate: the newest burstBuckets buckets of a rapid_fire window,
// counted at 1/burstDiscount of their rate (see rapid).
const (
	burstBuckets  = 2
	burstDiscount = 1.6
)

// Baseline sources.
const (
	SourceHistory    = "principal_history"
	SourcePopulation = "route_population"
	SourceFloor      = "kind_floor"
	SourceLimit      = "limit"
	SourceNetworks   = "networks"
)

// automated reports whether a kind is automated by design: bots and API keys
// run steadily and near their limits; people are bursty.
func automated(k events.PrincipalKind) bool {
	return k == events.PrincipalBot || k == events.PrincipalAPIKey
}

// pState is one principal: a compact windowed IP set, request counts for
// diversity, inter-arrival statistics and per-pattern cool-downs. No pointers.
type pState struct {
	ips     [inlineIPs]slot
	reqCur  uint16 // requests in the current IP-window epoch (saturating)
	reqPrev uint16 // and in the previous one
	epoch   uint32
	lastSec uint32
	lastMs  uint32 // newest event, ms since baseMs modulo 2^32 (gaps)
	gapMean float32
	gapVar  float32
	gaps    uint16
	// bits: bit 0 says the IP set is a bigIPSet (isBig); bits 1–7 hold
	// the all-routes hold mark (holdMark).
	bits uint8
	// New-network velocity: the seconds between the newest new networks
	// (IPv4 /24 runs, IPv6 /64s) of the principal, newest first, and when the
	// newest arrived. A gap of FanoutInterval or more ends the run (stored
	// as maxFanGap), so the span of the last k new networks is exact to the
	// second, with no sliding-epoch estimate. Held in the padding after bits.
	fanGaps    [maxFanGaps]uint8
	cool       [numPatterns]uint32 // second before which the pattern does not fire again
	lastNewSec uint32              // second of the newest new network (0: none yet)
	lastNewNet uint32              // the last new network, so a pool inside one /24 counts once
	// Denial ratio over the rapid-fire window, all routes: decisions and
	// denials (not by a penalty) in Window epochs, sliding like reqCur/reqPrev.
	decCur, decPrev uint16
	denCur, denPrev uint16
	decEpoch        uint32
	// all is a person's rapid-fire window over all routes together (unused
	// for automation): in the record, so scoring it costs no second lookup.
	all rfState
}

func (p *pState) isBig() bool { return p.bits&1 != 0 }

func (p *pState) setBig() { p.bits |= 1 }

// holdMark is 0 while a person's all-routes window does not hold the line,
// else 1 + the bucket index (mod holdMod) at which it began to: no new
// bytes per principal (see rapidOn).
func (p *pState) holdMark() uint8 { return p.bits >> 1 }

func (p *pState) setHoldMark(m uint8) { p.bits = p.bits&1 | m<<1 }

// holdMod bounds how long a hold can be measured: 126 buckets (157 s with
// the defaults), far past PersonSustain.
const holdMod = 127

// Flags in the low bits of a bigIPSet key.
const (
	v6Full   = 1
	v6Folded = 3
)

const (
	inlineIPs = 3
	// maxFanGaps bounds FanoutMinNetworks at maxFanGaps+1; maxFanGap marks a
	// gap too long to matter (FanoutInterval is at most maxFanGap-1 seconds).
	maxFanGaps  = 5
	maxFanGap   = math.MaxUint8
	maxExactIPs = 1024
	maxEvidence = 32
	routeEpoch  = 600 // seconds per route-sketch epoch
	maxRoutes   = 4096
	sweepEvery  = 10 // seconds of event time between sweeps
)

// evidence is collected only for hot principals (close to a threshold): the
// busiest routes and IPs a reviewer needs, bounded by maxEvidence keys each.
type evidence struct {
	since  uint32
	routes map[string]int64
	ips    map[netip.Addr]int64
}

type routeStats struct {
	id         uint32
	cur, prev  *ddsketch.DDSketch
	who        [2]*hyperloglog.Sketch // distinct principals that fed cur, prev
	epoch      uint32
	q          float64
	qSec       uint32
	lastSample uint32
}

// Scorer scores one partition's events. It is not safe for concurrent use:
// a partition's messages are handled one at a time. The IPStore it is given is
// shared by every partition of the instance.
type Scorer struct {
	cfg       Config
	ips       *IPStore
	widthMs   int64
	windowSec float64
	decay     []float64 // decay[g] = d^g for EWMA over g buckets, g < len
	ipWinSec  uint32
	coolSec   uint32
	// tuned holds the decision parameters per kind and route (params.go):
	// the process's configuration until SetTuned swaps a version in.
	tuned     *Tuned
	fanSec    uint32
	rf        table[rfState] // principal × route windows
	ps        table[pState]  // principals
	big       map[uint64]*bigIPSet
	ev        map[uint64]*evidence
	routes    [2]map[string]*routeStats // people's routes, automation's routes
	watermark int64                     // newest event time seen, ms
	lastSweep uint32
}

// New returns a scorer for one partition. cfg must be valid.
func New(cfg Config, ips *IPStore) *Scorer {
	width := cfg.Window.Milliseconds() / NumBuckets
	d := math.Pow(0.5, float64(width)/float64(cfg.BaselineHalfLife.Milliseconds()))
	decay := make([]float64, 4*NumBuckets)
	for g := range decay {
		decay[g] = math.Pow(d, float64(g))
	}
	return &Scorer{
		cfg: cfg, ips: ips, widthMs: width, windowSec: cfg.Window.Seconds(), decay: decay,
		ipWinSec: uint32(cfg.IPWindow.Seconds()), coolSec: uint32(cfg.Cooldown.Seconds()),
		big: map[uint64]*bigIPSet{},
		ev:  map[uint64]*evidence{}, routes: [2]map[string]*routeStats{{}, {}},
		fanSec: uint32(cfg.FanoutInterval.Seconds()),
		tuned:  Untuned(cfg),
	}
}

// SetTuned makes t the decision parameters of the events observed from now
// on (nil: the scorer's configuration). t must be compiled over the
// scorer's configuration (its state-shaping fields are the scorer's).
func (s *Scorer) SetTuned(t *Tuned) {
	if t == nil {
		t = Untuned(s.cfg)
	}
	s.tuned = t
}

// Tuned is the decision parameters in use.
func (s *Scorer) Tuned() *Tuned { return s.tuned }

func (s *Scorer) principalHash(p events.Principal) uint64 {
	var h maphash.Hash
	h.SetSeed(s.ips.seed)
	_, _ = h.WriteString(string(p.Kind))
	_ = h.WriteByte(0)
	_, _ = h.WriteString(p.ID)
	return h.Sum64()
}

// Observe scores one decision and appends its detections (at most one per
// pattern) to out.
func (s *Scorer) Observe(d *events.Decision, out []Detection) []Detection {
	ms := d.TS.UnixMilli()
	if ms < baseMs {
		return out
	}
	sec := seconds(ms)
	s.watermark = max(s.watermark, ms)
	if wsec := seconds(s.watermark); wsec >= s.lastSweep+sweepEvery {
		s.lastSweep = wsec
		s.Sweep()
	}
	ph := s.principalHash(d.Principal)
	// The unspecified address (0.0.0.0, ::) is a gateway's "client address
	// unknown" (an Envoy call without one): no address at all, so it
	// neither joins the principal's addresses nor makes one address shared
	// by every such principal (never touched, it counts no principals, so
	// the shared-address exemptions do not apply to it either).
	known := !d.IP.IsUnspecified()
	p := s.ps.Ref(ph) // valid to the end: nothing below adds to or removes from s.ps
	newIP := false
	if known {
		key, v6 := ipKey(d.IP)
		s.ips.touch(key, ph, sec)
		if s.ips.remote != nil {
			s.ips.remote.Add(key, StableHash(d.Principal), sec)
		}
		if newIP = s.touchIPs(ph, p, key, v6, sec); newIP {
			s.countNewNetwork(p, key, v6, sec)
		}
	}
	s.countRequest(p, sec)
	s.countDecision(p, d, sec)
	s.gap(p, ms)
	p.lastSec = max(p.lastSec, sec)

	auto := automated(d.Principal.Kind)
	if auto {
		s.countRecentDenial(&p.all, d, ms)
	}
	rt := s.route(d.Route, auto)
	rfScore, det := s.rapid(d, ph, rt, p, ms, sec)
	if !auto {
		// People are also judged over all their routes together: a scraper
		// walking four routes at 8 req/s each stays under every route's
		// line while sending 32 req/s, four times the line a person crosses
		// on one route. The cool-down keeps it to one rapid_fire a window.
		allScore, allDet := s.rapidOn(&p.all, d, ph, nil, rt, p, ms, sec, AllRoutes)
		rfScore = max(rfScore, allScore)
		if det == nil {
			det = allDet
		}
	}
	if det != nil {
		out = append(out, *det)
	}
	hot := rfScore > s.cfg.Threshold/2
	if newIP || (p.isBig() && s.big[ph].lastEval != sec) {
		var near bool
		if det, near = s.distributed(d, ph, p, sec); det != nil {
			out = append(out, *det)
		}
		hot = hot || near
	}
	if det, near := s.botLike(d, ph, p, sec); det != nil {
		out = append(out, *det)
	} else {
		hot = hot || near
	}
	if e := s.ev[ph]; e != nil || hot {
		if e == nil {
			e = &evidence{since: sec, routes: map[string]int64{}, ips: map[netip.Addr]int64{}}
			s.ev[ph] = e
		}
		if _, ok := e.routes[d.Route]; ok || len(e.routes) < maxEvidence {
			e.routes[d.Route]++
		}
		if _, ok := e.ips[d.IP]; known && (ok || len(e.ips) < maxEvidence) {
			e.ips[d.IP]++
		}
	}
	for i := range out {
		if out[i].Principal == d.Principal && out[i].At.Equal(d.TS) && out[i].TopRoutes == nil {
			s.fillEvidence(&out[i], ph, d)
		}
	}
	return out
}

// route interns a route and its population sketch for one class of
// principals: people and automation are baselined apart, so a crowd of fast
// bots never sets a person's bar.
func (s *Scorer) route(r string, auto bool) *routeStats {
	class := 0
	if auto {
		class = 1
	}
	m := s.routes[class]
	if rt := m[r]; rt != nil {
		return rt
	}
	if len(s.routes[0])+len(s.routes[1]) >= maxRoutes {
		return nil
	}
	cur, _ := ddsketch.NewDefaultDDSketch(0.01)
	prev, _ := ddsketch.NewDefaultDDSketch(0.01)
	rt := &routeStats{id: uint32(len(s.routes[0]) + len(s.routes[1]) + 1), cur: cur, prev: prev,
		who: [2]*hyperloglog.Sketch{newDenseHLL(), newDenseHLL()}}
	m[r] = rt
	return rt
}

// newDenseHLL is a 1 KiB dense sketch (±3%): enough to tell whether a route
// has RouteMinPrincipals, and inserts never pay the sparse list's merges.
func newDenseHLL() *hyperloglog.Sketch {
	sk, _ := hyperloglog.NewSketch(10, false)
	return sk
}

// sample adds one principal's window rate to the route's population.
func (rt *routeStats) sample(ph uint64, rate float64, sec uint32, cfg *Config) {
	e := sec / routeEpoch
	if e > rt.epoch {
		rt.prev, rt.cur = rt.cur, rt.prev
		rt.who[0], rt.who[1] = rt.who[1], rt.who[0]
		rt.cur.Clear()
		rt.who[0].Reset()
		if e > rt.epoch+1 {
			rt.prev.Clear()
			rt.who[1].Reset()
		}
		rt.epoch = e
	}
	_ = rt.cur.Add(rate)
	rt.who[0].InsertHash(ph)
	rt.lastSample = sec
	if sec < rt.qSec+5 {
		return
	}
	rt.qSec = sec
	rt.q = 0
	who := rt.who[0].Clone()
	_ = who.Merge(rt.who[1])
	if who.Estimate() >= uint64(cfg.RouteMinPrincipals) {
		m := rt.prev.Copy()
		_ = m.MergeWith(rt.cur)
		rt.q, _ = m.GetValueAtQuantile(cfg.RouteQuantile)
	}
}

// fillEvidence adds top routes, top IPs (with how many other principals share
// each) and IP counts to a detection.
func (s *Scorer) fillEvidence(det *Detection, ph uint64, d *events.Decision) {
	sec := seconds(d.TS.UnixMilli())
	if det.DistinctIPs == 0 {
		p, _ := s.ps.Get(ph)
		c := s.countIPs(ph, &p, sec, false)
		det.DistinctIPs, det.DistinctIP24, det.DistinctIP64 = max(c.distinct, 1), c.nets24, c.nets64
		if det.Diversity == 0 {
			det.Diversity = math.Min(float64(c.distinct)/max(s.requests(&p, sec), 1), 1)
		}
	}
	e := s.ev[ph]
	if e == nil {
		e = &evidence{routes: map[string]int64{d.Route: 1}, ips: map[netip.Addr]int64{d.IP: 1}}
	}
	for r, n := range e.routes {
		det.TopRoutes = append(det.TopRoutes, events.RouteCount{Route: r, Count: n})
	}
	sort.Slice(det.TopRoutes, func(i, j int) bool {
		a, b := det.TopRoutes[i], det.TopRoutes[j]
		return a.Count > b.Count || (a.Count == b.Count && a.Route < b.Route)
	})
	det.TopRoutes = det.TopRoutes[:min(len(det.TopRoutes), 10)]
	for ip, n := range e.ips {
		det.TopIPs = append(det.TopIPs, events.IPCount{IP: ip, Count: n})
	}
	sort.Slice(det.TopIPs, func(i, j int) bool {
		a, b := det.TopIPs[i], det.TopIPs[j]
		return a.Count > b.Count || (a.Count == b.Count && a.IP.Less(b.IP))
	})
	det.TopIPs = det.TopIPs[:min(len(det.TopIPs), 10)]
	for i := range det.TopIPs {
		det.TopIPs[i].SharedPrincipals = max(s.ips.principals(ipKeyOnly(det.TopIPs[i].IP), sec)-1, 0)
	}
}

// Sweep forgets what left every window before the newest event time seen:
// idle principal × route windows (keeping baselines that still matter for
// a few half-lives), idle principals, their IP sets and evidence.
func (s *Scorer) Sweep() {
	now := seconds(s.watermark)
	nowB := uint32((s.watermark - baseMs) / s.widthMs)
	keepB := uint32(4 * s.cfg.BaselineHalfLife.Milliseconds() / s.widthMs)
	s.rf.DeleteFunc(func(_ uint64, st *rfState) bool {
		idle := nowB - min(st.head, nowB)
		return idle >= NumBuckets && (float64(st.ewma)*s.cfg.BaselineK < s.cfg.Floor || idle > keepB)
	})
	keep := max(s.ipWinSec, uint32(s.windowSec), uint32(4*s.cfg.BotLikeMaxMeanGap.Seconds()))
	s.ps.DeleteFunc(func(k uint64, p *pState) bool {
		cooling := false
		for _, c := range p.cool {
			cooling = cooling || c > now
		}
		if p.lastSec+keep < now && !cooling {
			delete(s.big, k)
			delete(s.ev, k)
			return true
		}
		if p.isBig() {
			if b := s.big[k]; b.exact != nil {
				b.prune(now, s.ipWinSec)
			}
		}
		return false
	})
	for k, e := range s.ev {
		if e.since+s.ipWinSec < now {
			delete(s.ev, k)
		}
	}
}

// Stats describes what a scorer holds.
type Stats struct {
	Windows, Principals, BigIPSets, Evidence, Routes int
}

// Stats returns the sizes of the scorer's maps.
func (s *Scorer) Stats() Stats {
	return Stats{Windows: s.rf.Len(), Principals: s.ps.Len(), BigIPSets: len(s.big), Evidence: len(s.ev), Routes: len(s.routes[0]) + len(s.routes[1])}
}

// Watermark is the newest event time seen.
func (s *Scorer) Watermark() time.Time { return time.UnixMilli(s.watermark).UTC() }
