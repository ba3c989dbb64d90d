// Package detector scores the decision stream for abuse and turns detections into
// penalties, abuse events and metrics.
package detector

import (
	"crypto/sha256"
	"encoding/hex"
	"hash/maphash"
	"net/netip"
	"sort"
	"sync"
	"time"

	"github.com/floodgate-dev/floodgate/pkg/events"
)

// RapidFireConfig sets when a principal's request rate counts as rapid fire.
type RapidFireConfig struct {
	Window    time.Duration // sliding window, whole seconds
	Threshold float64       // events per second over the window that trigger a detection
	Cooldown  time.Duration // after a detection, the principal is not re-detected for this long
}

// Detection is what the scorer found; the caller turns it into a penalty and an abuse event.
type Detection struct {
	Principal    events.Principal
	At           time.Time // event time of the event that crossed the threshold
	FirstEventAt time.Time // first event counted in the window
	WindowStart  time.Time
	Window       time.Duration
	Count        int
	Rate         float64 // observed events per second over the span the counted events cover
	Threshold    float64
	TopRoutes    []events.RouteCount
	DistinctIPs  int64
	DistinctIP24 int64
	DistinctIP64 int64
	TopIPs       []events.IPCount
}

// RapidFire counts events per principal per second of event time and reports a
// principal whose count in the window exceeds threshold × window. Event time (not
// arrival time) keeps it deterministic: replaying a partition yields the same
// detections, which is what makes penalties and abuse events idempotent.
//
// RapidFire is safe for concurrent use; state is sharded by principal.
type RapidFire struct {
	cfg    RapidFireConfig
	slots  int
	seed   maphash.Seed
	shards [64]shard
}

type shard struct {
	mu sync.Mutex
	m  map[string]*principalState
}

// principalState is one principal's window: a ring of per-second counts plus a
// small sample of routes and IPs kept as evidence.
type principalState struct {
	counts    []uint32
	lastSec   int64 // event-time second of the newest slot
	firstSeen map[int64]int64
	cooldown  int64 // no detection before this second
	routes    map[string]int
	ips       map[netip.Addr]int
}

const maxEvidenceKeys = 32

// NewRapidFire returns a scorer for cfg.
func NewRapidFire(cfg RapidFireConfig) *RapidFire {
	slots := int(cfg.Window / time.Second)
	if slots < 1 {
		slots = 1
	}
	r := &RapidFire{cfg: cfg, slots: slots, seed: maphash.MakeSeed()}
	for i := range r.shards {
		r.shards[i].m = map[string]*principalState{}
	}
	return r
}

// Observe counts one decision and returns a detection when it pushes the principal over the threshold.
func (r *RapidFire) Observe(d *events.Decision) *Detection {
	key := d.Principal.Key()
	sh := &r.shards[maphash.String(r.seed, key)%uint64(len(r.shards))]
	sh.mu.Lock()
	defer sh.mu.Unlock()

	sec := d.TS.Unix()
	st := sh.m[key]
	if st == nil {
		st = &principalState{counts: make([]uint32, r.slots), lastSec: sec, firstSeen: map[int64]int64{},
			routes: map[string]int{}, ips: map[netip.Addr]int{}}
		sh.m[key] = st
	}
	switch {
	case sec > st.lastSec:
		r.advance(st, sec)
	case sec <= st.lastSec-int64(r.slots):
		return nil // older than the window: late event, does not count
	}
	slot := int(sec % int64(r.slots))
	if st.counts[slot] == 0 {
		st.firstSeen[sec] = d.TS.UnixMilli()
	}
	st.counts[slot]++
	if len(st.routes) < maxEvidenceKeys || st.routes[d.Route] > 0 {
		st.routes[d.Route]++
	}
	if len(st.ips) < maxEvidenceKeys || st.ips[d.IP] > 0 {
		st.ips[d.IP]++
	}

	total := 0
	for _, c := range st.counts {
		total += int(c)
	}
	if float64(total) <= r.cfg.Threshold*float64(r.slots) || sec < st.cooldown {
		return nil
	}
	st.cooldown = sec + int64(r.cfg.Cooldown/time.Second)
	return r.detection(d, st, total)
}

// advance moves the ring to second sec, clearing the seconds that left the window.
func (r *RapidFire) advance(st *principalState, sec int64) {
	gap := sec - st.lastSec
	if gap >= int64(r.slots) {
		clear(st.counts)
		clear(st.firstSeen)
		clear(st.routes)
		clear(st.ips)
	} else {
		for s := st.lastSec + 1; s <= sec; s++ {
			st.counts[int(s%int64(r.slots))] = 0
			delete(st.firstSeen, s-int64(r.slots))
		}
	}
	st.lastSec = sec
}

// detection describes the crossing. The observed rate is the count over the time the
// counted events actually span (at least one second): a bot that fills the whole
// window's allowance in one second is rated at its real pace, which is what its
// severity should reflect, not at the window average that just crossed the line.
func (r *RapidFire) detection(d *events.Decision, st *principalState, total int) *Detection {
	windowStart := time.Unix(st.lastSec-int64(r.slots)+1, 0).UTC()
	first := d.TS
	for _, ms := range st.firstSeen {
		if t := time.UnixMilli(ms).UTC(); t.Before(first) && !t.Before(windowStart) {
			first = t
		}
	}
	span := max(d.TS.Sub(first), time.Second)
	rate := float64(total) / span.Seconds()
	det := &Detection{
		Principal: d.Principal, At: d.TS, FirstEventAt: first, WindowStart: windowStart,
		Window: time.Duration(r.slots) * time.Second, Count: total, Rate: rate, Threshold: r.cfg.Threshold,
		DistinctIPs: int64(len(st.ips)),
	}
	for route, n := range st.routes {
		det.TopRoutes = append(det.TopRoutes, events.RouteCount{Route: route, Count: int64(n)})
	}
	sort.Slice(det.TopRoutes, func(i, j int) bool {
		a, b := det.TopRoutes[i], det.TopRoutes[j]
		return a.Count > b.Count || (a.Count == b.Count && a.Route < b.Route)
	})
	det.TopRoutes = det.TopRoutes[:min(len(det.TopRoutes), 10)]

	nets24, nets64 := map[netip.Prefix]bool{}, map[netip.Prefix]bool{}
	for ip, n := range st.ips {
		if ip.Is4() {
			p, _ := ip.Prefix(24)
			nets24[p] = true
		} else {
			p, _ := ip.Prefix(64)
			nets64[p] = true
		}
		det.TopIPs = append(det.TopIPs, events.IPCount{IP: ip, Count: int64(n)})
	}
	det.DistinctIP24, det.DistinctIP64 = int64(len(nets24)), int64(len(nets64))
	sort.Slice(det.TopIPs, func(i, j int) bool {
		a, b := det.TopIPs[i], det.TopIPs[j]
		return a.Count > b.Count || (a.Count == b.Count && a.IP.Less(b.IP))
	})
	det.TopIPs = det.TopIPs[:min(len(det.TopIPs), 10)]
	return det
}

// Sweep forgets principals whose newest event is older than the window before now
// (event time), bounding memory to the principals active in one window.
func (r *RapidFire) Sweep(now time.Time) int {
	cutoff := now.Unix() - int64(r.slots)
	removed := 0
	for i := range r.shards {
		sh := &r.shards[i]
		sh.mu.Lock()
		for k, st := range sh.m {
			if st.lastSec < cutoff && st.cooldown < now.Unix() {
				delete(sh.m, k)
				removed++
			}
		}
		sh.mu.Unlock()
	}
	return removed
}

// Len is the number of principals held.
func (r *RapidFire) Len() int {
	n := 0
	for i := range r.shards {
		r.shards[i].mu.Lock()
		n += len(r.shards[i].m)
		r.shards[i].mu.Unlock()
	}
	return n
}

// AbuseID is the deterministic id of a detection: the same principal, pattern and
// window always give the same id, so a replayed detection is recognisably the same.
func AbuseID(p events.Principal, pattern events.Pattern, windowStart time.Time) string {
	h := sha256.Sum256([]byte(p.Key() + "\x00" + string(pattern) + "\x00" + windowStart.UTC().Format(time.RFC3339)))
	return "ab_" + hex.EncodeToString(h[:12])
}
