package score

import (
	"encoding/binary"
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
	// window that the limiter denied (penalty denials excluded).
	DenialRatio float64
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

// rfState is one principal × route: NumBuckets counts over the window, the
// newest bucket's index and the EWMA baseline. 24 bytes, no pointers.
type rfState struct {
	counts [NumBuckets]uint16
	head   uint32  // bucket index of the newest bucket
	ewma   float32 // events/s
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
	big     bool
	// New-network velocity: the seconds between the newest new networks
	// (IPv4 /24 runs, IPv6 /64s) of the principal, newest first, and when the
	// newest arrived. A gap of FanoutInterval or more ends the run (stored
	// as maxFanGap), so the span of the last k new networks is exact to the
	// second, with no sliding-epoch estimate. Held in the padding after big.
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

// bigIPSet holds the IPs of a principal with more than inlineIPs in the
// window: exact up to maxExactIPs, then two HyperLogLog epochs.
type bigIPSet struct {
	exact    map[uint64]uint32 // ipKey<<2 | v6Full or v6Folded → last second
	hll      [2]*hyperloglog.Sketch
	hll24    [2]*hyperloglog.Sketch
	epoch    uint32
	lastEval uint32
}

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
	}
}

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
	p, _ := s.ps.Get(ph)
	newIP := false
	if known {
		key, v6 := ipKey(d.IP)
		s.ips.touch(key, ph, sec)
		if s.ips.remote != nil {
			s.ips.remote.Add(key, StableHash(d.Principal), sec)
		}
		if newIP = s.touchIPs(ph, &p, key, v6, sec); newIP {
			s.countNewNetwork(&p, key, v6, sec)
		}
	}
	s.countRequest(&p, sec)
	s.countDecision(&p, d, sec)
	s.gap(&p, ms)
	p.lastSec = max(p.lastSec, sec)

	auto := automated(d.Principal.Kind)
	if auto {
		s.countRecentDenial(&p.all, d, ms)
	}
	rt := s.route(d.Route, auto)
	rfScore, det := s.rapid(d, ph, rt, &p, ms, sec)
	if !auto {
		// People are also judged over all their routes together: a scraper
		// walking four routes at 8 req/s each stays under every route's
		// line while sending 32 req/s, four times the line a person crosses
		// on one route. The cool-down keeps it to one rapid_fire a window.
		allScore, allDet := s.rapidOn(&p.all, d, ph, nil, rt, &p, ms, sec, AllRoutes)
		rfScore = max(rfScore, allScore)
		if det == nil {
			det = allDet
		}
	}
	if det != nil {
		out = append(out, *det)
	}
	hot := rfScore > s.cfg.Threshold/2
	if newIP || (p.big && s.big[ph].lastEval != sec) {
		var near bool
		if det, near = s.distributed(d, ph, &p, sec); det != nil {
			out = append(out, *det)
		}
		hot = hot || near
	}
	if det, near := s.botLike(d, ph, &p, sec); det != nil {
		out = append(out, *det)
	} else {
		hot = hot || near
	}
	s.ps.Put(ph, p)
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

// rapid updates the principal × route window and reports its score and a
// detection when the score crosses the threshold outside the cool-down.
func (s *Scorer) rapid(d *events.Decision, ph uint64, rt *routeStats, p *pState, ms int64, sec uint32) (float64, *Detection) {
	var rid uint32
	if rt != nil {
		rid = rt.id
	}
	key := ph ^ (uint64(rid)+1)*0x9E3779B97F4A7C15
	st, _ := s.rf.Get(key)
	score, det := s.rapidOn(&st, d, ph, rt, rt, p, ms, sec, d.Route)
	s.rf.Put(key, st)
	return score, det
}

// rapidOn counts the event in the window st and scores it. feed is the
// route whose population sketch the window's closed rates feed (nil: none);
// pop is the route whose population quantile the score is measured against.
// A person's window over all routes (pState.all) feeds nothing and is
// measured against the route of the event: a population of all-route rates
// mixes light and heavy callers of every route, and the fast abusers it
// should catch feed it (up to threshold × its quantile) until it hides them;
// the event's route keeps a busy route's bar.
func (s *Scorer) rapidOn(st *rfState, d *events.Decision, ph uint64, feed, pop *routeStats, p *pState, ms int64, sec uint32, route string) (float64, *Detection) {
	b := uint32((ms - baseMs) / s.widthMs)
	switch {
	case st.head == 0 && st.counts == [NumBuckets]uint16{}:
		st.head = b
	case b > st.head:
		s.advance(st, ph, b, feed, sec)
	case b+NumBuckets <= st.head:
		return 0, nil // older than the window: a late event does not count
	}
	if c := &st.counts[b%NumBuckets]; *c < math.MaxUint16 {
		*c++
	}
	sum := int64(0)
	for _, c := range st.counts {
		sum += int64(c)
	}
	// The window's rate lags an onset: 10 s after a flood began it still
	// averages the quiet before. The newest burstBuckets buckets (the
	// current one partial) give a recent rate; it counts discounted by
	// burstDiscount, since fewer events carry more noise. A person at 4×
	// the line is seen in about a second and a half, not after a window.
	recent := int64(st.counts[st.head%NumBuckets])
	for i := uint32(1); i < burstBuckets; i++ {
		recent += int64(st.counts[(st.head-i)%NumBuckets])
	}
	observed := max(float64(sum)/s.windowSec, float64(recent)*1000/float64(burstBuckets*s.widthMs)/burstDiscount)
	baseline := float64(st.ewma)
	denialRatio := s.denialRatio(p, sec)
	auto := automated(d.Principal.Kind)
	if auto {
		// The window's ratio counts from the onset, so the full bucket a
		// new bot spends first dilutes it for seconds; the newest buckets
		// say at once how much of what it sends now is refused.
		denialRatio = max(denialRatio, s.recentDenialRatio(&p.all, ms))
	}
	routeRate := 0.0
	if pop != nil && !auto {
		routeRate = pop.q
	}
	expected := max(baseline*s.cfg.BaselineK, routeRate, s.cfg.Floor)
	score := observed / expected
	if sec < p.cool[pRapid] {
		return score, nil
	}
	var sev events.Severity
	threshold := s.cfg.Threshold
	source := SourceFloor
	switch {
	case baseline*s.cfg.BaselineK >= max(routeRate, s.cfg.Floor):
		source = SourceHistory
	case routeRate > s.cfg.Floor:
		source = SourcePopulation
	}
	if auto {
		// Automation is judged against its own limit and history, never
		// against people's floors: fast and steady inside its limit is what
		// a bot is for. It is rapid fire when it keeps hammering past its
		// limit (most of its requests denied), or when one with a history
		// jumps far above it while already being denied.
		hammering := denialRatio >= s.cfg.AutomatedDenialRatio
		// Without a history the floor is the expectation, so a principal
		// whose first requests already run past its limit (a cold flood)
		// is a jump too; a new integration ramping inside its limits is
		// never denied and never fires.
		jump := denialRatio >= s.cfg.AutomatedDenialRatio/2 && score > s.cfg.Threshold
		if observed <= s.cfg.Floor*s.cfg.Threshold || !(hammering || jump) {
			return score, nil
		}
		source = SourceLimit
		// Measured against the limit: expected is what the limiter let
		// through, the score the rate against it, 1 / (1 - denial ratio),
		// and the line is where AutomatedDenialRatio puts it.
		expected = max(observed*(1-denialRatio), 1e-3)
		score = observed / expected
		threshold = 1 / max(1-s.cfg.AutomatedDenialRatio, 0.01)
		if !hammering {
			threshold = 1 / max(1-s.cfg.AutomatedDenialRatio/2, 0.01)
		}
		switch {
		case denialRatio >= 0.9:
			sev = events.SeverityCritical
		case denialRatio >= 0.75:
			sev = events.SeverityHigh
		default:
			sev = events.SeverityMedium
		}
	} else {
		if score <= s.cfg.Threshold {
			return score, nil
		}
		sev = SeverityOf(score)
	}
	// A shared IP alone never penalizes: an anonymous principal is usually
	// identified by its address, so on a shared one it is many people.
	if d.Principal.Kind == events.PrincipalAnonymous && s.ips.principals(ipKeyOnly(d.IP), sec) >= int64(s.cfg.SharedIPPrincipals) {
		return score, nil
	}
	p.cool[pRapid] = sec + s.coolSec
	oldest := st.head + 1 - NumBuckets
	if st.head+1 < NumBuckets {
		oldest = 0
	}
	first := oldest
	for i := oldest; i <= st.head; i++ {
		if st.counts[i%NumBuckets] > 0 {
			first = i
			break
		}
	}
	return score, &Detection{
		Pattern: RapidFire, Principal: d.Principal, At: d.TS,
		FirstEventAt: minTime(bucketTime(first, s.widthMs), d.TS), WindowStart: bucketTime(oldest, s.widthMs), Window: s.cfg.Window,
		Score: score, Threshold: threshold, ObservedRate: observed, ExpectedRate: expected,
		Baseline: baseline, RouteRate: routeRate, Count: sum, Route: route,
		Severity: sev, Penalize: true, BaselineSource: source, DenialRatio: denialRatio,
	}
}

// advanceEpoch moves a two-epoch sliding counter's epoch to e and reports
// how far it moved (0: same epoch, 1: the next, 2: later), or false for an
// event of an older epoch, which is not counted. slide applies the move to a
// current/previous pair.
func advanceEpoch(epoch *uint32, e uint32) (uint32, bool) {
	if e < *epoch {
		return 0, false
	}
	step := min(e-*epoch, 2)
	*epoch = e
	return step, true
}

func slide(cur, prev *uint16, step uint32) {
	switch step {
	case 1:
		*prev, *cur = *cur, 0
	case 2:
		*prev, *cur = 0, 0
	}
}

// SeverityOf grades a score on the scale of the default threshold (5):
// 10 × the expected rate or more is critical.
func SeverityOf(score float64) events.Severity {
	switch {
	case score >= 10:
		return events.SeverityCritical
	case score >= 4:
		return events.SeverityHigh
	case score >= 2:
		return events.SeverityMedium
	}
	return events.SeverityLow
}

// countDecision counts a decision, and a denial, in the denial-ratio epochs.
// Denials by a penalty are the detector's own doing: counting them would
// make a penalty its own evidence.
func (s *Scorer) countDecision(p *pState, d *events.Decision, sec uint32) {
	step, ok := advanceEpoch(&p.decEpoch, sec/uint32(s.windowSec))
	if !ok {
		return
	}
	slide(&p.decCur, &p.decPrev, step)
	slide(&p.denCur, &p.denPrev, step)
	if p.decCur == math.MaxUint16 {
		return // saturated: both stop, the ratio stands
	}
	p.decCur++
	if denied(d) {
		p.denCur++
	}
}

// denied reports whether a decision counts as the principal's own excess: a
// penalty's denials are the detector's own doing, and a shed request was
// refused for the platform's lack of capacity.
func denied(d *events.Decision) bool {
	return (!d.Allowed || d.Shadow) && d.Tier != events.TierPenalty && !d.Shed
}

// Automation's recent denials live in the record's all-routes window, which
// only people use (a principal's kind never changes): counts[0:recentBuckets]
// hold decisions and counts[recentBuckets:] denials of the newest
// recentBuckets rapid-fire buckets, head the newest bucket's index. No new
// bytes per principal.
const (
	recentBuckets  = NumBuckets / 2
	recentMinCount = 20 // decisions in the newest two buckets before their ratio counts
)

func (s *Scorer) countRecentDenial(st *rfState, d *events.Decision, ms int64) {
	b := uint32((ms - baseMs) / s.widthMs)
	switch {
	case st.head == 0 && st.counts == [NumBuckets]uint16{}:
		st.head = b
	case b > st.head:
		for i := st.head + 1; i <= b && i <= st.head+recentBuckets; i++ {
			st.counts[i%recentBuckets], st.counts[recentBuckets+i%recentBuckets] = 0, 0
		}
		st.head = b
	case b+recentBuckets <= st.head:
		return // older than the buckets kept
	}
	if c := &st.counts[b%recentBuckets]; *c < math.MaxUint16 {
		*c++
		if denied(d) {
			st.counts[recentBuckets+b%recentBuckets]++
		}
	}
}

// recentDenialRatio is the share denied in the current bucket, or over the
// newest two (the current one partial) if higher, each counted only with at
// least recentMinCount decisions; 0 without.
func (s *Scorer) recentDenialRatio(st *rfState, ms int64) float64 {
	b := uint32((ms - baseMs) / s.widthMs)
	if b > st.head+1 {
		return 0 // nothing recent
	}
	ratio := 0.0
	var dec, den int
	for i := st.head; i+2 > b && i+recentBuckets > st.head; i-- {
		dec += int(st.counts[i%recentBuckets])
		den += int(st.counts[recentBuckets+i%recentBuckets])
		if dec >= recentMinCount {
			ratio = max(ratio, float64(den)/float64(dec))
		}
		if i == 0 {
			break
		}
	}
	return ratio
}

// denialRatio is the share of the principal's decisions denied over about
// one rapid-fire window.
func (s *Scorer) denialRatio(p *pState, sec uint32) float64 {
	w := uint32(s.windowSec)
	if sec/w != p.decEpoch {
		return 0
	}
	prev := 1 - float64(sec%w)/float64(w)
	dec := float64(p.decCur) + float64(p.decPrev)*prev
	if dec < 1 {
		return 0
	}
	return (float64(p.denCur) + float64(p.denPrev)*prev) / dec
}

// countNewNetwork records a network new to the principal. Consecutive new
// addresses in one IPv4 /24 (a carrier's pool) count once.
func (s *Scorer) countNewNetwork(p *pState, key uint64, v6 bool, sec uint32) {
	net := fold32(key)
	if !v6 {
		net = uint32(key >> 8)
	}
	gap := uint32(maxFanGap)
	if p.lastNewSec != 0 {
		if sec < p.lastNewSec {
			return // an older event: the run is counted in order of arrival
		}
		if net == p.lastNewNet && sec-p.lastNewSec < s.fanSec {
			return
		}
		gap = min(sec-p.lastNewSec, maxFanGap)
	}
	p.lastNewNet = net
	copy(p.fanGaps[1:], p.fanGaps[:maxFanGaps-1])
	p.fanGaps[0] = uint8(gap)
	p.lastNewSec = max(sec, 1)
}

// newNetworks is how many new networks arrived within FanoutInterval up to
// the newest one, counting it, if the newest arrived at sec (else 0): at
// most FanoutMinNetworks, which is all the velocity rule asks.
func (s *Scorer) newNetworks(p *pState, sec uint32) int {
	if p.lastNewSec == 0 || p.lastNewSec != max(sec, 1) {
		return 0
	}
	n, span := 1, uint32(0)
	for _, g := range p.fanGaps[:s.cfg.FanoutMinNetworks-1] {
		if span += uint32(g); g == maxFanGap || span > s.fanSec {
			break
		}
		n++
	}
	return n
}

func ipKeyOnly(ip netip.Addr) uint64 { k, _ := ipKey(ip); return k }

func bucketTime(b uint32, widthMs int64) time.Time {
	return time.UnixMilli(baseMs + int64(b)*widthMs).UTC()
}

func minTime(a, b time.Time) time.Time {
	if a.After(b) {
		return b
	}
	return a
}

// advance moves a window to bucket b: the newest closed bucket feeds the EWMA
// baseline and the window's rate the route's population sketch; the buckets
// that fall out of the window are cleared.
func (s *Scorer) advance(st *rfState, ph uint64, b uint32, rt *routeStats, sec uint32) {
	gap := b - st.head
	sum := 0
	for _, c := range st.counts {
		sum += int(c)
	}
	observed := float64(sum) / s.windowSec
	// Robust EWMA: a closed bucket teaches at most the current expected rate,
	// so a burst (or an attack) moves the baseline by a bounded step, and
	// the baseline can grow by at most a factor k per half-life or so.
	rate := min(float64(st.counts[st.head%NumBuckets])*1000/float64(s.widthMs), max(float64(st.ewma)*s.cfg.BaselineK, s.cfg.Floor))
	st.ewma = float32(float64(st.ewma)*s.pow(gap) + rate*(1-s.decay[1])*s.pow(gap-1))
	// Only windows that are not anomalous feed the route's population: a
	// crowd of bots, active in every bucket while people are active in a few,
	// would otherwise become the route's p99 and raise everyone's bar.
	if rt != nil && sum > 0 && observed <= max(float64(st.ewma)*s.cfg.BaselineK, rt.q, s.cfg.Floor)*s.cfg.Threshold {
		rt.sample(ph, observed, sec, &s.cfg)
	}
	if gap >= NumBuckets {
		st.counts = [NumBuckets]uint16{}
	} else {
		for i := st.head + 1; i <= b; i++ {
			st.counts[i%NumBuckets] = 0
		}
	}
	st.head = b
}

func (s *Scorer) pow(g uint32) float64 {
	if int(g) < len(s.decay) {
		return s.decay[g]
	}
	return math.Pow(s.decay[1], float64(g))
}

// touchIPs records key in the principal's IP set and reports whether it is new
// in the window.
func (s *Scorer) touchIPs(ph uint64, p *pState, key uint64, v6 bool, sec uint32) bool {
	k32 := fold32(key)
	last := sec
	if v6 {
		last |= v6Flag
	}
	if p.big {
		return s.big[ph].add(key, v6, sec, s.ipWinSec)
	}
	free := -1
	for i := range p.ips {
		sl := p.ips[i]
		switch {
		case sl.last != 0 && sl.key == k32 && sl.v6() == v6:
			isNew := sl.sec()+s.ipWinSec < sec
			p.ips[i].last = last
			return isNew
		case free < 0 && (sl.last == 0 || sl.sec()+s.ipWinSec < sec):
			free = i
		}
	}
	if free >= 0 {
		p.ips[free] = slot{key: k32, last: last}
		return true
	}
	// Spill: inline IPv6 slots hold folded keys; add replaces them by the
	// full key when the same /64 is seen again.
	bs := &bigIPSet{exact: make(map[uint64]uint32, 2*inlineIPs)}
	for _, sl := range p.ips {
		k := uint64(sl.key) << 2
		if sl.v6() {
			k |= v6Folded
		}
		bs.exact[k] = sl.sec()
	}
	// From here on the principal is worth evidence: seed it with the IPv4
	// addresses seen so far (IPv6 slots hold only a fold of their /64).
	if s.ev[ph] == nil {
		e := &evidence{since: sec, routes: map[string]int64{}, ips: map[netip.Addr]int64{}}
		for _, sl := range p.ips {
			if !sl.v6() && sl.sec()+s.ipWinSec >= sec {
				var a [4]byte
				binary.BigEndian.PutUint32(a[:], sl.key)
				e.ips[netip.AddrFrom4(a)] = 1
			}
		}
		s.ev[ph] = e
	}
	p.ips = [inlineIPs]slot{}
	p.big = true
	s.big[ph] = bs
	return bs.add(key, v6, sec, s.ipWinSec)
}

func (b *bigIPSet) add(key uint64, v6 bool, sec, win uint32) bool {
	if b.hll[0] != nil {
		b.rotate(sec, win)
		b.hll[0].InsertHash(key * 0x9E3779B97F4A7C15)
		if !v6 {
			b.hll24[0].InsertHash((key >> 8) * 0xC2B2AE3D27D4EB4F)
		}
		return false // unknown: evaluated once a second instead
	}
	k := key << 2
	if v6 {
		k |= v6Full
		if folded := uint64(fold32(key))<<2 | v6Folded; b.exact[folded] != 0 {
			if b.exact[k] < b.exact[folded] {
				b.exact[k] = b.exact[folded]
			}
			delete(b.exact, folded)
		}
	}
	last, ok := b.exact[k]
	b.exact[k] = sec
	isNew := !ok || last+win < sec
	if isNew && len(b.exact) > maxExactIPs {
		b.prune(sec, win)
		if len(b.exact) > maxExactIPs {
			b.toHLL(sec, win)
		}
	}
	return isNew
}

func (b *bigIPSet) prune(sec, win uint32) {
	for k, last := range b.exact {
		if last+win < sec {
			delete(b.exact, k)
		}
	}
}

func (b *bigIPSet) toHLL(sec, win uint32) {
	for i := range b.hll {
		b.hll[i], b.hll24[i] = hyperloglog.New14(), hyperloglog.New14()
	}
	b.epoch = sec / win
	for k := range b.exact {
		key := k >> 2
		b.hll[0].InsertHash(key * 0x9E3779B97F4A7C15)
		if k&v6Full == 0 {
			b.hll24[0].InsertHash((key >> 8) * 0xC2B2AE3D27D4EB4F)
		}
	}
	b.exact = nil
}

func (b *bigIPSet) rotate(sec, win uint32) {
	e := sec / win
	switch {
	case e == b.epoch:
	case e == b.epoch+1:
		b.hll[0], b.hll[1] = b.hll[1], b.hll[0]
		b.hll24[0], b.hll24[1] = b.hll24[1], b.hll24[0]
		b.hll[0].Reset()
		b.hll24[0].Reset()
		b.epoch = e
	case e > b.epoch:
		for i := range b.hll {
			b.hll[i].Reset()
			b.hll24[i].Reset()
		}
		b.epoch = e
	}
}

// countRequest counts a request in the IP window's epochs (a sliding-window
// counter: the previous epoch is weighted by how much of it is still inside).
func (s *Scorer) countRequest(p *pState, sec uint32) {
	step, ok := advanceEpoch(&p.epoch, sec/s.ipWinSec)
	if !ok {
		return // late event from an older epoch: not counted
	}
	slide(&p.reqCur, &p.reqPrev, step)
	if p.reqCur < math.MaxUint16 {
		p.reqCur++
	}
}

func (s *Scorer) requests(p *pState, sec uint32) float64 {
	into := float64(sec%s.ipWinSec) / float64(s.ipWinSec)
	return float64(p.reqCur) + float64(p.reqPrev)*(1-into)
}

// ipCounts are the distinct IPs of a principal in the window ending at sec.
type ipCounts struct {
	distinct, unshared, nets24, nets64 int64
	oldest                             uint32
}

func (s *Scorer) countIPs(ph uint64, p *pState, sec uint32, withShared bool) ipCounts {
	var c ipCounts
	c.oldest = sec
	shared := int64(s.cfg.SharedIPPrincipals)
	if !p.big {
		var nets [inlineIPs]uint32
		n24 := 0
		for _, sl := range p.ips {
			if sl.last == 0 || sl.sec()+s.ipWinSec < sec {
				continue
			}
			c.distinct++
			c.oldest = min(c.oldest, sl.sec())
			if sl.v6() {
				c.nets64++
			} else {
				n := sl.key >> 8
				dup := false
				for _, x := range nets[:n24] {
					dup = dup || x == n
				}
				if !dup {
					nets[n24] = n
					n24++
				}
			}
		}
		c.nets24 = int64(n24)
		c.unshared = c.distinct
		return c
	}
	b := s.big[ph]
	if b.hll[0] != nil {
		u := b.hll[0].Clone()
		u24 := b.hll24[0].Clone()
		if sec/s.ipWinSec == b.epoch {
			_ = u.Merge(b.hll[1])
			_ = u24.Merge(b.hll24[1])
		}
		c.distinct = int64(u.Estimate())
		c.nets24 = int64(u24.Estimate())
		c.unshared = c.distinct // beyond maxExactIPs in a window no account is one person
		c.oldest = (b.epoch - 1) * s.ipWinSec
		return c
	}
	nets24 := map[uint64]struct{}{}
	for k, last := range b.exact {
		if last+s.ipWinSec < sec {
			continue
		}
		c.distinct++
		c.oldest = min(c.oldest, last)
		if k&v6Full != 0 {
			c.nets64++
			// A folded key (an inline slot before the spill) cannot be looked
			// up: it counts as unshared until the /64 is seen again.
			if !withShared || k&v6Folded == v6Folded || s.ips.principals(k>>2, sec) < shared {
				c.unshared++
			}
			continue
		}
		key := k >> 2
		nets24[key>>8] = struct{}{}
		if !withShared || s.ips.principals(key, sec) < shared {
			c.unshared++
		}
	}
	c.nets24 = int64(len(nets24))
	return c
}

// distributed evaluates distributed_ip; it also reports whether the principal
// is near the thresholds (worth collecting evidence for).
func (s *Scorer) distributed(d *events.Decision, ph uint64, p *pState, sec uint32) (*Detection, bool) {
	if p.big {
		s.big[ph].lastEval = sec
	}
	if sec < p.cool[pDistributed] {
		return nil, false
	}
	c := s.countIPs(ph, p, sec, false)
	minIPs := int64(s.cfg.MinDistinctIPs)
	near := c.distinct > minIPs/2
	// Fan-out: an account (with or without history) that starts using many
	// networks it never used is caught by the velocity of new networks,
	// before diversity over the whole window — still full of its normal
	// history — would notice.
	// Automation is exempt: a bot or API key on new networks is a deploy or
	// an autoscaled fleet; it is judged by its limits (rapid_fire) and by
	// diversity over the window.
	if fresh := s.newNetworks(p, sec); fresh >= s.cfg.FanoutMinNetworks && !automated(d.Principal.Kind) {
		near = true
		if cs := s.countIPs(ph, p, sec, true); cs.unshared >= int64(s.cfg.FanoutMinNetworks) {
			return s.distributedDetection(d, p, sec, cs, int64(fresh)), true
		}
	}
	if c.distinct <= minIPs {
		return nil, near
	}
	reqs := max(s.requests(p, sec), 1)
	diversity := math.Min(float64(c.distinct)/reqs, 1)
	if diversity <= s.cfg.MinDiversity {
		return nil, near
	}
	c = s.countIPs(ph, p, sec, true)
	if c.unshared <= minIPs {
		return nil, near
	}
	return s.distributedDetection(d, p, sec, c, 0), true
}

func (s *Scorer) distributedDetection(d *events.Decision, p *pState, sec uint32, c ipCounts, fresh int64) *Detection {
	p.cool[pDistributed] = sec + s.coolSec
	win := s.cfg.IPWindow
	start := d.TS.Add(-win)
	reqs := max(s.requests(p, sec), 1)
	score := float64(c.unshared) / float64(s.cfg.MinDistinctIPs)
	first := minTime(time.UnixMilli(baseMs+int64(c.oldest-1)*1000).UTC(), d.TS)
	netThreshold := int64(s.cfg.MinDistinctIPs)
	if fresh > 0 {
		netThreshold = int64(s.cfg.FanoutMinNetworks)
		score = max(score, float64(fresh)/float64(s.cfg.FanoutMinNetworks))
		// The fan-out began with the new networks, not with the history.
		first = maxTime(first, d.TS.Add(-s.cfg.FanoutInterval))
	}
	return &Detection{
		Pattern: DistributedIP, Principal: d.Principal, At: d.TS,
		FirstEventAt: first, WindowStart: start, Window: win,
		Score: score, Threshold: 1, ObservedRate: reqs / win.Seconds(),
		Count: int64(math.Round(reqs)), Route: d.Route, DistinctIPs: c.distinct, UnsharedIPs: c.unshared,
		DistinctIP24: c.nets24, DistinctIP64: c.nets64, Diversity: math.Min(float64(c.distinct)/reqs, 1),
		Severity: SeverityOf(score * 2), Penalize: true, NewNetworks: fresh,
		BaselineSource: SourceNetworks, NetworkThreshold: netThreshold, DenialRatio: s.denialRatio(p, sec),
	}
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// gap updates the exponentially weighted mean and variance of inter-arrival gaps.
func (s *Scorer) gap(p *pState, unixMs int64) {
	ms := uint32(unixMs - baseMs)
	if p.lastSec == 0 || int32(ms-p.lastMs) < 0 {
		if p.lastSec == 0 {
			p.lastMs = ms
		}
		return // first event, or a late one
	}
	g := float64(ms-p.lastMs) / 1000
	p.lastMs = ms
	if g > s.cfg.BotLikeMaxMeanGap.Seconds()*4 {
		p.gaps, p.gapMean, p.gapVar = 0, 0, 0 // a long pause starts a new session
		return
	}
	if p.gaps < math.MaxUint16 {
		p.gaps++
	}
	alpha := 1 / float64(min(p.gaps, 64))
	delta := g - float64(p.gapMean)
	mean := float64(p.gapMean) + alpha*delta
	p.gapMean = float32(mean)
	p.gapVar = float32((1 - alpha) * (float64(p.gapVar) + alpha*delta*delta))
}

// botLike fires for a user or anonymous principal whose request gaps are too
// regular for a person.
func (s *Scorer) botLike(d *events.Decision, ph uint64, p *pState, sec uint32) (*Detection, bool) {
	if d.Principal.Kind != events.PrincipalUser && d.Principal.Kind != events.PrincipalAnonymous {
		return nil, false
	}
	mean := float64(p.gapMean)
	if mean <= 0 || mean > s.cfg.BotLikeMaxMeanGap.Seconds() {
		return nil, false
	}
	cv := math.Sqrt(max(float64(p.gapVar), 0)) / mean
	near := int(p.gaps) >= s.cfg.BotLikeMinGaps/2 && cv < 2*s.cfg.BotLikeMaxCV
	if int(p.gaps) < s.cfg.BotLikeMinGaps || cv >= s.cfg.BotLikeMaxCV || sec < p.cool[pBotLike] {
		return nil, near
	}
	if d.Principal.Kind == events.PrincipalAnonymous && s.ips.principals(ipKeyOnly(d.IP), sec) >= int64(s.cfg.SharedIPPrincipals) {
		return nil, near
	}
	p.cool[pBotLike] = sec + s.coolSec
	span := time.Duration(mean * float64(p.gaps) * float64(time.Second))
	return &Detection{
		Pattern: BotLike, Principal: d.Principal, At: d.TS, FirstEventAt: d.TS.Add(-span),
		WindowStart: d.TS.Add(-span).Truncate(time.Second), Window: max(span.Truncate(time.Second), time.Second),
		Score: min(s.cfg.BotLikeMaxCV/max(cv, 1e-3), 100), Threshold: 1, ObservedRate: 1 / mean,
		Count: int64(p.gaps) + 1, Route: d.Route, GapMean: mean, GapCV: cv,
		// Regular timing is a signal, not harm: a script polling far inside
		// its limits hurts nobody. Reported for review, never penalized or paged.
		Severity: events.SeverityLow, Penalize: false,
	}, true
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
		if p.big {
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
