package labeled

import (
	"math"
	"net/netip"
	"os"
	"runtime"
	"sort"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/floodgate-dev/floodgate/pkg/events"
)

// peopleCall is what the shape checks keep of one event.
type peopleCall struct {
	at      time.Time
	ip      netip.Addr
	route   string
	res     string
	allowed bool
}

// TestPeople generates a run large enough for notification crowds of
// thousands and checks each people family: present, valid events, at most
// 0.1 % of its events denied by the limiter model, and its defining shape.
func TestPeople(t *testing.T) {
	h := HeldOut{Seed: 11, Start: time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC), Duration: 2 * time.Minute, Legit: 30000, Abusive: 60, Prefix: "t_"}
	s, err := NewHeldOut(h)
	require.NoError(t, err)
	end := h.Start.Add(h.Duration)
	persons := map[string]*person{}
	for _, a := range s.actors {
		if a.pp != nil {
			persons[a.p.Key()] = a.pp
		}
	}
	labels := s.Labels()
	calls := map[string][]peopleCall{}
	type tally struct{ principals, events, denied int }
	fam := map[string]*tally{}
	var d events.Decision
	for s.Next(&d) {
		k := d.Principal.Key()
		if persons[k] == nil {
			continue
		}
		_, err := events.EncodeDecision(&d)
		require.NoError(t, err)
		calls[k] = append(calls[k], peopleCall{at: d.TS, ip: d.IP, route: d.Method + " " + d.Route, res: d.Resource, allowed: d.Allowed})
		f := labels[k].Family
		if fam[f] == nil {
			fam[f] = &tally{}
		}
		fam[f].events++
		if !d.Allowed {
			fam[f].denied++
		}
	}
	byFam := map[string][]string{}
	for k := range persons {
		f := labels[k].Family
		byFam[f] = append(byFam[f], k)
	}
	for _, f := range []string{"app_cold_start", "reconnect_storm", "retry_storm", "page_fanout", "notification_fanout", "multi_device", "quiet_then_active"} {
		tl := fam[f]
		require.NotNil(t, tl, "family %s sent nothing", f)
		tl.principals = len(byFam[f])
		t.Logf("%-20s %6d principals %8d events %5d denied (%.4f %%)", f, tl.principals, tl.events, tl.denied, 100*float64(tl.denied)/float64(tl.events))
		require.LessOrEqual(t, float64(tl.denied), 0.001*float64(tl.events), "%s: denied %d of %d", f, tl.denied, tl.events)
	}

	t.Run("app_cold_start: >= 20 calls within 1 s at every open and resume", func(t *testing.T) {
		opens := 0
		for _, k := range byFam["app_cold_start"] {
			cs := calls[k]
			for i, c := range cs {
				if c.route != "GET /gateway" || c.at.After(end.Add(-time.Second)) {
					continue
				}
				opens++
				require.GreaterOrEqual(t, within(cs, c.at.Add(-60*time.Millisecond), time.Second+60*time.Millisecond), 20, "%s open %d at %s", k, i, c.at)
			}
		}
		require.Greater(t, opens, len(byFam["app_cold_start"]), "opens and resumes")
	})

	t.Run("reconnect_storm: >= 50 principals on one address within 5 s of every network change", func(t *testing.T) {
		groups := map[*natGroup]bool{}
		for _, k := range byFam["reconnect_storm"] {
			groups[persons[k].group] = true
		}
		per := map[netip.Addr]map[time.Time]map[string]bool{}
		for _, k := range byFam["reconnect_storm"] {
			p := persons[k]
			for _, inc := range p.group.incidents {
				if inc.outage > 0 || inc.at.Add(5*time.Second).After(end) {
					continue
				}
				for _, c := range calls[k] {
					if !c.at.Before(inc.at) && c.at.Before(inc.at.Add(5*time.Second)) && c.ip == p.addr {
						if per[c.ip] == nil {
							per[c.ip] = map[time.Time]map[string]bool{}
						}
						if per[c.ip][inc.at] == nil {
							per[c.ip][inc.at] = map[string]bool{}
						}
						per[c.ip][inc.at][k] = true
					}
				}
			}
		}
		changes := 0
		for g := range groups {
			for _, inc := range g.incidents {
				if inc.outage > 0 || inc.at.Add(5*time.Second).After(end) {
					continue
				}
				changes++
				busiest := 0
				for _, ip := range g.addrs {
					busiest = max(busiest, len(per[ip][inc.at]))
				}
				require.GreaterOrEqual(t, busiest, 50, "group %v at %s", g.addrs, inc.at)
			}
		}
		require.Greater(t, changes, 0)
	})

	t.Run("retry_storm: naive retries within 100 ms, the others backing off", func(t *testing.T) {
		naive, backoff := 0, 0
		for _, k := range byFam["retry_storm"] {
			p := persons[k]
			cs := calls[k]
			fast, slow := false, false
			for i := 1; i < len(cs); i++ {
				if _, ok := s.people.failing(cs[i-1].at); !ok || cs[i].route != cs[i-1].route || cs[i].res != cs[i-1].res {
					continue
				}
				gap := cs[i].at.Sub(cs[i-1].at)
				if p.naive { // a retry at once, or the next screen (>= 1.5 s later)
					require.True(t, gap <= 100*time.Millisecond || gap >= time.Second, "%s: a naive retry after %s", k, gap)
				}
				fast = fast || gap <= 100*time.Millisecond
				slow = slow || gap > 100*time.Millisecond
			}
			if p.naive && fast {
				naive++
			}
			if !p.naive && slow {
				backoff++
			}
		}
		t.Logf("%d naive and %d backing-off clients retried", naive, backoff)
		require.Greater(t, naive, len(byFam["retry_storm"])/10)
		require.Greater(t, backoff, len(byFam["retry_storm"])/10)
	})

	t.Run("page_fanout: a page load fans out into >= 5 calls on >= 4 routes within 3 s", func(t *testing.T) {
		loads := 0
		for _, k := range byFam["page_fanout"] {
			cs := calls[k]
			for _, c := range cs {
				if c.route != "GET /meta" || c.at.After(end.Add(-3*time.Second)) {
					continue
				}
				loads++
				routes := map[string]bool{}
				n := 0
				for _, o := range cs {
					if !o.at.Before(c.at) && o.at.Before(c.at.Add(3*time.Second)) {
						routes[o.route] = true
						n++
					}
				}
				require.GreaterOrEqual(t, n, 5, k)
				require.GreaterOrEqual(t, len(routes), 4, k)
			}
		}
		require.Greater(t, loads, len(byFam["page_fanout"]))
	})

	t.Run("notification_fanout: >= 1,000 principals on one resource within 10 s", func(t *testing.T) {
		size := map[*crowd]int{}
		seen := map[*crowd]map[string]bool{}
		for _, k := range byFam["notification_fanout"] {
			c := persons[k].crowd
			size[c]++
			if seen[c] == nil {
				seen[c] = map[string]bool{}
			}
			for _, e := range calls[k] {
				if e.res == c.res && e.route == c.r.method+" "+c.r.path && !e.at.Before(c.at) && e.at.Before(c.at.Add(10*time.Second)) {
					seen[c][k] = true
				}
			}
		}
		for c, n := range size {
			t.Logf("crowd of %d on %s %s: %d within 10 s", n, c.r.path, c.res, len(seen[c]))
			require.GreaterOrEqual(t, len(seen[c]), 1000)
		}
	})

	t.Run("multi_device: >= 2 addresses per principal, devices bursting together", func(t *testing.T) {
		three := 0
		for _, k := range byFam["multi_device"] {
			ips := map[netip.Addr]bool{}
			for _, c := range calls[k] {
				ips[c.ip] = true
			}
			require.GreaterOrEqual(t, len(ips), 2, k)
			if len(ips) >= 3 {
				three++
			}
		}
		require.Greater(t, three, 0, "some people on three networks")
	})

	t.Run("quiet_then_active: quiet, then a burst and an engaged session", func(t *testing.T) {
		for _, k := range byFam["quiet_then_active"] {
			p := persons[k]
			cs := calls[k]
			before := sort.Search(len(cs), func(i int) bool { return !cs[i].at.Before(p.activeAt) })
			require.LessOrEqual(t, before, 3, "%s: quiet before %s", k, p.activeAt)
			require.GreaterOrEqual(t, within(cs, p.activeAt, 3*time.Second), 5, "%s: a burst at activation", k)
			span := min(time.Minute, end.Sub(p.activeAt))
			after := within(cs, p.activeAt, span)
			require.GreaterOrEqual(t, float64(after)/span.Seconds(), 0.4, "%s: %d calls in %s after activation", k, after, span)
		}
	})
}

// within counts the calls in [from, from+d).
func within(cs []peopleCall, from time.Time, d time.Duration) int {
	n := 0
	for _, c := range cs {
		if !c.at.Before(from) && c.at.Before(from.Add(d)) {
			n++
		}
	}
	return n
}

// TestHeldOutScale generates the full held-out run the quality report uses
// and prints each family's principals, events and denied share, the time it
// took and the heap. It runs only with FLOODGATE_LABELED_SCALE=1 (a
// measurement, about a minute on a shared core):
//
//	FLOODGATE_LABELED_SCALE=1 go test ./loadtest/labeled -run TestHeldOutScale -v
func TestHeldOutScale(t *testing.T) {
	if os.Getenv("FLOODGATE_LABELED_SCALE") != "1" {
		t.Skip("a measurement: set FLOODGATE_LABELED_SCALE=1")
	}
	h := HeldOut{Seed: 101, Start: time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC), Duration: 4 * time.Minute, Legit: 100000, Abusive: 1000}
	began := time.Now()
	s, err := NewHeldOut(h)
	require.NoError(t, err)
	labels := s.Labels()
	type tally struct{ principals, events, denied int }
	fam := map[string]*tally{}
	for _, l := range labels {
		if fam[l.Family] == nil {
			fam[l.Family] = &tally{}
		}
		fam[l.Family].principals++
	}
	persons := map[string]*person{}
	for _, a := range s.actors {
		if a.pp != nil {
			persons[a.p.Key()] = a.pp
		}
	}
	crowds := map[*crowd]map[string]bool{}                   // principals on the crowd's resource within 10 s
	storms := map[netip.Addr]map[time.Time]map[string]bool{} // reconnect_storm principals per address within 5 s of a network change
	var peak uint64
	var ms runtime.MemStats
	total := 0
	var d events.Decision
	for s.Next(&d) {
		k := d.Principal.Key()
		if p := persons[k]; p != nil && p.crowd != nil && d.Resource == p.crowd.res && !d.TS.Before(p.crowd.at) && d.TS.Before(p.crowd.at.Add(10*time.Second)) {
			if crowds[p.crowd] == nil {
				crowds[p.crowd] = map[string]bool{}
			}
			crowds[p.crowd][k] = true
		}
		if p := persons[k]; p != nil && p.group != nil {
			for _, inc := range p.group.incidents {
				if inc.outage == 0 && !d.TS.Before(inc.at) && d.TS.Before(inc.at.Add(5*time.Second)) {
					if storms[d.IP] == nil {
						storms[d.IP] = map[time.Time]map[string]bool{}
					}
					if storms[d.IP][inc.at] == nil {
						storms[d.IP][inc.at] = map[string]bool{}
					}
					storms[d.IP][inc.at][k] = true
				}
			}
		}
		tl := fam[labels[k].Family]
		tl.events++
		if !d.Allowed {
			tl.denied++
		}
		total++
		if total%1_000_000 == 0 {
			runtime.ReadMemStats(&ms)
			peak = max(peak, ms.HeapInuse)
		}
	}
	took := time.Since(began)
	legit := 0
	for _, f := range Families() {
		tl := fam[f.Name]
		require.NotNil(t, tl, f.Name)
		if !f.Abusive {
			legit += tl.principals
		}
		t.Logf("%-20s abusive=%-5v %7d principals %9d events %7d denied (%.4f %%)", f.Name, f.Abusive, tl.principals, tl.events, tl.denied, 100*float64(tl.denied)/float64(max(1, tl.events)))
	}
	for c, ps := range crowds {
		t.Logf("notification crowd on %s %s: %d principals within 10 s", c.r.path, c.res, len(ps))
	}
	smallest, largest, n := math.MaxInt, 0, 0
	for _, at := range storms {
		for _, ps := range at {
			smallest, largest, n = min(smallest, len(ps)), max(largest, len(ps)), n+1
		}
	}
	t.Logf("reconnect storms after network changes: %d (address, instant) pairs, %d–%d principals on one address within 5 s", n, smallest, largest)
	t.Logf("%d legitimate principals, %d events in %s (%.0f events/s), peak heap in use %d MiB", legit, total, took.Round(time.Millisecond), float64(total)/took.Seconds(), peak>>20)
	require.GreaterOrEqual(t, legit, 100000)
}
