package quality

import (
	"sort"
	"time"

	"github.com/floodgate-dev/floodgate/loadtest/labeled"
	"github.com/floodgate-dev/floodgate/pkg/events"
)

// Harm is what the detectors' penalties cost, per family: the held-out
// stream replayed through the model limiter that made its decisions (a token
// bucket per principal × route) twice — as generated, and with every
// enforced penalty the detectors published applied from its detection's
// event time plus Delay (the limiter reads a penalty on its next call once
// the detector wrote it) until it expires: capacity and refill × the
// strongest multiplier in force, as the limiter's script scales a rule.
type Harm struct {
	Delay    time.Duration
	Families []FamilyHarm
}

// FamilyHarm is one family's share of Harm.
type FamilyHarm struct {
	Name    string
	Abusive bool
	// Penalized principals, and their requests while a penalty was in force.
	Principals int
	Requests   int64
	// Legitimate: requests the limiter admits without the penalty and
	// refuses with it.
	Refused int64
	// Abusive: requests admitted after the first detection (penalties
	// applied), and the allowance of the penalized limits over the same
	// time (each route's penalized capacity once, plus its penalized refill
	// from its first request after the detection to its last).
	AdmittedAfter int64
	Allowance     float64
}

// Ratio is AdmittedAfter / Allowance (0 without an allowance).
func (f FamilyHarm) Ratio() float64 {
	if f.Allowance <= 0 {
		return 0
	}
	return float64(f.AdmittedAfter) / f.Allowance
}

type penaltySpan struct {
	from, until time.Time
	m           float64
}

type harmBucket struct {
	tokens, penTokens float64
	at                time.Time
	allowFrom, last   time.Time
	allowance         float64
}

// MeasureHarm replays src (the same held-out stream the pass produced)
// against the penalties of all (every abuse.v1 event per principal key).
func MeasureHarm(src *labeled.Stream, labels map[string]*labeled.Label, all map[string][]events.Abuse, delay time.Duration) Harm {
	spans := map[string][]penaltySpan{}
	firstAt := map[string]time.Time{}
	for k, as := range all {
		for _, a := range as {
			if f, ok := firstAt[k]; !ok || a.DetectedAt.Before(f) {
				firstAt[k] = a.DetectedAt
			}
			if a.Penalty.Mode == events.PenaltyEnforced {
				spans[k] = append(spans[k], penaltySpan{from: a.DetectedAt.Add(delay), until: a.Penalty.ExpiresAt, m: a.Penalty.Multiplier})
			}
		}
	}
	fams := map[string]*FamilyHarm{}
	for k, l := range labels {
		f := fams[l.Family]
		if f == nil {
			f = &FamilyHarm{Name: l.Family, Abusive: l.Abusive}
			fams[l.Family] = f
		}
		if spans[k] != nil {
			f.Principals++
		}
	}
	buckets := map[string]map[string]*harmBucket{}
	var d events.Decision
	for src.Next(&d) {
		k := d.Principal.Key()
		sp := spans[k]
		l := labels[k]
		if sp == nil || l == nil {
			continue
		}
		f := fams[l.Family]
		m := 1.0
		for _, s := range sp {
			if !d.TS.Before(s.from) && d.TS.Before(s.until) {
				m = min(m, s.m)
			}
		}
		rb := buckets[k]
		if rb == nil {
			rb = map[string]*harmBucket{}
			buckets[k] = rb
		}
		route := d.Method + " " + d.Route
		b := rb[route]
		limit, rate := float64(d.Limit), labeled.RefillPerSecond(&d)
		if b == nil {
			b = &harmBucket{tokens: limit, penTokens: limit, at: d.TS}
			rb[route] = b
		}
		dt := d.TS.Sub(b.at).Seconds()
		b.penTokens = min(limit*m, b.penTokens+dt*rate*m)
		b.at = d.TS
		admitted := b.penTokens >= 1
		if admitted {
			b.penTokens--
		}
		if m < 1 {
			f.Requests++
			if !l.Abusive && d.Allowed && !admitted {
				f.Refused++
			}
		}
		if l.Abusive && !d.TS.Before(firstAt[k]) {
			if admitted {
				f.AdmittedAfter++
			}
			if b.allowFrom.IsZero() {
				b.allowFrom = d.TS
				b.allowance = limit * m
			} else {
				b.allowance += d.TS.Sub(b.last).Seconds() * rate * m
			}
			b.last = d.TS
		}
	}
	for k, rb := range buckets {
		l := labels[k]
		if !l.Abusive {
			continue
		}
		for _, b := range rb {
			fams[l.Family].Allowance += b.allowance
		}
	}
	h := Harm{Delay: delay}
	for _, f := range fams {
		h.Families = append(h.Families, *f)
	}
	sort.Slice(h.Families, func(i, j int) bool {
		a, b := h.Families[i], h.Families[j]
		return familyLess(a.Abusive, a.Name, b.Abusive, b.Name)
	})
	return h
}
