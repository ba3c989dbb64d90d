package score

// The distributed_ip pattern: the IPs and networks a principal uses in the
// window (inline, exact, then HyperLogLog), new-network velocity (fan-out)
// and diversity against its requests.

import (
	"encoding/binary"
	"math"
	"net/netip"
	"time"

	"github.com/axiomhq/hyperloglog"

	"github.com/floodgate-dev/floodgate/pkg/events"
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
func (s *Scorer) newNetworks(p *pState, sec uint32, k *knobs) int {
	if p.lastNewSec == 0 || p.lastNewSec != max(sec, 1) {
		return 0
	}
	n, span := 1, uint32(0)
	for _, g := range p.fanGaps[:k.FanoutMinNetworks-1] {
		if span += uint32(g); g == maxFanGap || span > s.fanSec {
			break
		}
		n++
	}
	return n
}

func ipKeyOnly(ip netip.Addr) uint64 { k, _ := ipKey(ip); return k }

// touchIPs records key in the principal's IP set and reports whether it is new
// in the window.
func (s *Scorer) touchIPs(ph uint64, p *pState, key uint64, v6 bool, sec uint32) bool {
	k32 := fold32(key)
	last := sec
	if v6 {
		last |= v6Flag
	}
	if p.isBig() {
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
	p.setBig()
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
	rotateEpoch(&b.epoch, sec/win, &b.hll, &b.hll24)
}

// rotateEpoch moves *epoch on to e for sketches that each hold the current
// epoch's keys ([0]) and the previous one's ([1]): one epoch on, the current
// sketch becomes the previous one and starts again empty; further on, both
// start empty; e at or before *epoch changes nothing.
func rotateEpoch(epoch *uint32, e uint32, sketches ...*[2]*hyperloglog.Sketch) {
	switch {
	case e == *epoch+1:
		for _, s := range sketches {
			s[0], s[1] = s[1], s[0]
			s[0].Reset()
		}
	case e > *epoch:
		for _, s := range sketches {
			s[0].Reset()
			s[1].Reset()
		}
	default:
		return
	}
	*epoch = e
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
	if !p.isBig() {
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
	k := s.tuned.For(d.Principal.Kind, "")
	if p.isBig() {
		s.big[ph].lastEval = sec
	}
	if sec < p.cool[pDistributed] {
		return nil, false
	}
	c := s.countIPs(ph, p, sec, false)
	minIPs := int64(k.MinDistinctIPs)
	near := c.distinct > minIPs/2
	// Fan-out: an account (with or without history) that starts using many
	// networks it never used is caught by the velocity of new networks,
	// before diversity over the whole window — still full of its normal
	// history — would notice.
	// Automation is exempt: a bot or API key on new networks is a deploy or
	// an autoscaled fleet; it is judged by its limits (rapid_fire) and by
	// diversity over the window.
	if fresh := s.newNetworks(p, sec, k); fresh >= k.FanoutMinNetworks && !automated(d.Principal.Kind) {
		near = true
		if cs := s.countIPs(ph, p, sec, true); cs.unshared >= int64(k.FanoutMinNetworks) {
			return s.distributedDetection(d, p, sec, cs, int64(fresh), k), true
		}
	}
	if c.distinct <= minIPs {
		return nil, near
	}
	reqs := max(s.requests(p, sec), 1)
	diversity := math.Min(float64(c.distinct)/reqs, 1)
	if diversity <= k.MinDiversity {
		return nil, near
	}
	c = s.countIPs(ph, p, sec, true)
	if c.unshared <= minIPs {
		return nil, near
	}
	return s.distributedDetection(d, p, sec, c, 0, k), true
}

func (s *Scorer) distributedDetection(d *events.Decision, p *pState, sec uint32, c ipCounts, fresh int64, k *knobs) *Detection {
	p.cool[pDistributed] = sec + s.coolSec
	win := k.IPWindow
	start := d.TS.Add(-win)
	reqs := max(s.requests(p, sec), 1)
	score := float64(c.unshared) / float64(k.MinDistinctIPs)
	first := minTime(time.UnixMilli(baseMs+int64(c.oldest-1)*1000).UTC(), d.TS)
	netThreshold := int64(k.MinDistinctIPs)
	if fresh > 0 {
		netThreshold = int64(k.FanoutMinNetworks)
		score = max(score, float64(fresh)/float64(k.FanoutMinNetworks))
		// The fan-out began with the new networks, not with the history.
		first = maxTime(first, d.TS.Add(-k.FanoutInterval))
	}
	ratio, denials := s.denialRatio(p, sec)
	return &Detection{
		Pattern: DistributedIP, Principal: d.Principal, At: d.TS,
		FirstEventAt: first, WindowStart: start, Window: win,
		Score: score, Threshold: 1, ObservedRate: reqs / win.Seconds(),
		Count: int64(math.Round(reqs)), Route: d.Route, DistinctIPs: c.distinct, UnsharedIPs: c.unshared,
		DistinctIP24: c.nets24, DistinctIP64: c.nets64, Diversity: math.Min(float64(c.distinct)/reqs, 1),
		Severity: SeverityOf(score * 2), Penalize: true, NewNetworks: fresh,
		BaselineSource: SourceNetworks, NetworkThreshold: netThreshold, DenialRatio: ratio, Denials: int64(denials),
	}
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}
