package score

// The rapid_fire pattern: per principal × route windows of counts against
// the route population's and the principal's own baselines, and automation's
// denial ratio.

import (
	"math"
	"time"

	"github.com/floodgate-dev/floodgate/pkg/events"
)

// rfState is one principal × route: NumBuckets counts over the window, the
// newest bucket's index and the EWMA baseline. 24 bytes, no pointers.
type rfState struct {
	counts [NumBuckets]uint16
	head   uint32  // bucket index of the newest bucket
	ewma   float32 // events/s
}

// rapid updates the principal × route window and reports its score and a
// detection when the score crosses the threshold outside the cool-down.
func (s *Scorer) rapid(d *events.Decision, ph uint64, rt *routeStats, p *pState, ms int64, sec uint32) (float64, *Detection) {
	var rid uint32
	if rt != nil {
		rid = rt.id
	}
	key := ph ^ (uint64(rid)+1)*0x9E3779B97F4A7C15
	return s.rapidOn(s.rf.Ref(key), d, ph, rt, rt, p, ms, sec, d.Route)
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
	k := s.tuned.For(d.Principal.Kind, route)
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
	denialRatio, denials := s.denialRatio(p, sec)
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
	expected := max(baseline*k.BaselineK, routeRate, k.Floor)
	line := expected * k.Threshold // a person's line, before automation's limit replaces expected
	score := observed / expected
	if sec < p.cool[pRapid] {
		return score, nil
	}
	var sev events.Severity
	var threshold float64 // each kind sets its own line below
	source := SourceFloor
	switch {
	case baseline*k.BaselineK >= max(routeRate, k.Floor):
		source = SourceHistory
	case routeRate > k.Floor:
		source = SourcePopulation
	}
	if auto {
		// Automation is judged against its own limit and history, never
		// against people's floors: fast and steady inside its limit is what
		// a bot is for. It is rapid fire when it keeps hammering past its
		// limit (most of its requests denied), or when one with a history
		// jumps far above it while already being denied.
		hammering := denialRatio >= k.AutomatedDenialRatio
		// Without a history the floor is the expectation, so a principal
		// whose first requests already run past its limit (a cold flood)
		// is a jump too; a new integration ramping inside its limits is
		// never denied and never fires.
		jump := denialRatio >= k.AutomatedDenialRatio/2 && score > k.Threshold
		if observed <= k.Floor*k.Threshold || !(hammering || jump) {
			return score, nil
		}
		source = SourceLimit
		// Measured against the limit: expected is what the limiter let
		// through, the score the rate against it, 1 / (1 - denial ratio),
		// and the line is where AutomatedDenialRatio puts it.
		expected = max(observed*(1-denialRatio), 1e-3)
		score = observed / expected
		threshold = 1 / max(1-k.AutomatedDenialRatio, 0.01)
		if !hammering {
			threshold = 1 / max(1-k.AutomatedDenialRatio/2, 0.01)
		}
		sev = denialSeverity(denialRatio)
	} else {
		all := st == &p.all
		if all {
			// Over all routes a person's devices add up: a phone's cold
			// start, a desktop restoring its tabs and a laptop together
			// hold 16/s for 7.5 s. There the window must keep holding the
			// line for PersonSustain more, so a storm has to outlast
			// PersonSustain + the sustainBuckets a window needs. The line
			// held is the person's own (history or floor), not the one of
			// the route of each event, which changes from call to call.
			own := max(baseline*k.BaselineK, k.Floor) * k.Threshold
			if float64(sum)*1000 > own*float64(int64(k.sustainBuckets)*s.widthMs) && s.heldRate(st, k) > own {
				if p.holdMark() == 0 {
					p.setHoldMark(uint8(b%holdMod) + 1)
				}
			} else {
				p.setHoldMark(0)
			}
		}
		// The common case, neither refused enough nor a window big enough
		// to hold the line in sustainBuckets buckets, ends here.
		if (denials < float64(k.PersonMinDenials) || denialRatio < k.PersonDenialRatio) &&
			float64(sum)*1000 <= line*float64(int64(k.sustainBuckets)*s.widthMs) {
			return score, nil
		}
		var ok bool
		var held float64
		if held, score, threshold, sev, ok = s.personPressure(st, sum, denialRatio, denials, expected, k); !ok {
			return observed / expected, nil
		}
		if sev == "" && all && !s.heldLongEnough(p, b, k) {
			return score, nil
		}
		if sev == "" { // the rate held, not the denials
			observed = held
			sev = SeverityOf(score)
		} else {
			source = SourceLimit
			expected = max(observed*(1-denialRatio), 1e-3)
			score = observed / expected
		}
	}
	// A shared IP alone never penalizes: an anonymous principal is usually
	// identified by its address, so on a shared one it is many people.
	if d.Principal.Kind == events.PrincipalAnonymous && s.ips.principals(ipKeyOnly(d.IP), sec) >= int64(k.SharedIPPrincipals) {
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
		FirstEventAt: minTime(bucketTime(first, s.widthMs), d.TS), WindowStart: bucketTime(oldest, s.widthMs), Window: k.Window,
		Score: score, Threshold: threshold, ObservedRate: observed, ExpectedRate: expected,
		Baseline: baseline, RouteRate: routeRate, Count: sum, Route: route,
		Severity: sev, Penalize: true, BaselineSource: source, DenialRatio: denialRatio,
		Denials: int64(denials), Sustained: time.Duration(s.overLine(st, line)) * time.Duration(s.widthMs) * time.Millisecond,
	}
}

// personPressure judges a person's window: rate alone never penalizes a
// person inside their limits. A person is rapid fire only under sustained
// pressure — refused by the limiter again and again (at least
// PersonMinDenials denials, PersonDenialRatio of their calls, in about one
// window), or holding a rate above the line (Threshold × expected, expected
// being the floor, the route's human p99 or the person's own history) for
// longer than a burst (PersonSustain). A burst of any size that ends within
// PersonSustain — an app's cold start, a page's fan-out, a reconnect or a
// retry storm — touches at most sustainBuckets-1 buckets, so it cannot hold
// the line in sustainBuckets of them.
//
// It reports the score and the threshold it is measured on, and false when
// there is no such pressure. Past the limit, the score is measured against
// the limit, as automation's is (1 / (1 - denial ratio)), and sev is set;
// otherwise held is the rate of the buckets above the line, the score
// held / expected, and sev is empty (the caller grades the score).
func (s *Scorer) personPressure(st *rfState, sum int64, ratio, denials, expected float64, k *knobs) (held, score, threshold float64, sev events.Severity, ok bool) {
	if denials >= float64(k.PersonMinDenials) && ratio >= k.PersonDenialRatio {
		return 0, 1 / max(1-ratio, 0.01), 1 / max(1-k.PersonDenialRatio, 0.01), denialSeverity(ratio), true
	}
	line := expected * k.Threshold
	// Holding the line in sustainBuckets buckets takes more than that many
	// buckets' worth of it in the window: most windows stop here.
	if float64(sum) <= line*float64(int64(k.sustainBuckets)*s.widthMs)/1000 || s.heldRate(st, k) <= line {
		return 0, 0, k.Threshold, "", false
	}
	// Held long enough: the score is the rate of the closed buckets above
	// the line (the newest is still filling), so a person holding 5× the
	// line scores 5× its threshold, not just over it.
	var n, over int
	for i, c := range st.counts {
		if uint32(i) != st.head%NumBuckets && float64(c)*1000/float64(s.widthMs) > line {
			n++
			over += int(c)
		}
	}
	held = float64(over) * 1000 / float64(int64(n)*s.widthMs)
	return held, held / expected, k.Threshold, "", true
}

// heldLongEnough reports whether a person's all-routes window, at bucket b,
// has held the line for PersonSustain since its hold mark.
func (s *Scorer) heldLongEnough(p *pState, b uint32, k *knobs) bool {
	m := p.holdMark()
	if m == 0 {
		return false
	}
	held := (b%holdMod + 1 + holdMod - uint32(m)) % holdMod // buckets
	return time.Duration(int64(held)*s.widthMs)*time.Millisecond >= k.PersonSustain
}

// heldRate is the rate (events/s) a window kept up in at least
// sustainBuckets of its buckets: its sustainBuckets-th largest count.
func (s *Scorer) heldRate(st *rfState, kn *knobs) float64 {
	c := st.counts
	k := kn.sustainBuckets
	// Partial selection: k passes of "largest not yet taken" over 8 values.
	var taken uint8
	var v uint16
	for range k {
		best := -1
		for i := range c {
			if taken&(1<<i) == 0 && (best < 0 || c[i] > c[best]) {
				best = i
			}
		}
		taken |= 1 << best
		v = c[best]
	}
	return float64(v) * 1000 / float64(s.widthMs)
}

// overLine counts a window's buckets whose rate is above line (events/s).
func (s *Scorer) overLine(st *rfState, line float64) int {
	n := 0
	for _, c := range st.counts {
		if float64(c)*1000/float64(s.widthMs) > line {
			n++
		}
	}
	return n
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

// denialSeverity grades a principal past its limit by the share of its
// calls the limiter refused.
func denialSeverity(ratio float64) events.Severity {
	switch {
	case ratio >= 0.9:
		return events.SeverityCritical
	case ratio >= 0.75:
		return events.SeverityHigh
	}
	return events.SeverityMedium
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
// one rapid-fire window, and how many were denied.
func (s *Scorer) denialRatio(p *pState, sec uint32) (ratio, denials float64) {
	w := uint32(s.windowSec)
	if sec/w != p.decEpoch {
		return 0, 0
	}
	prev := 1 - float64(sec%w)/float64(w)
	dec := float64(p.decCur) + float64(p.decPrev)*prev
	if dec < 1 {
		return 0, 0
	}
	den := float64(p.denCur) + float64(p.denPrev)*prev
	return den / dec, den
}

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
