package detector

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"log/slog"
	"net/netip"
	"sync"
	"time"

	"github.com/floodgate-dev/floodgate/pkg/events"
)

// PatternPolicy is what a detection of one pattern costs the principal.
type PatternPolicy struct {
	Multiplier float64       // scales the principal's limits, in (0, 1]
	TTL        time.Duration // first offence
	Enforce    bool          // false: simulated (shadow) — reported, never written
}

// Escalation lengthens repeat offenders' penalties: level = 1 + the
// principal's incidents within Lookback that were over (penalty ended and
// Quiet passed) — re-detections of one ongoing incident keep its level;
// TTL = base × Factor^(level-1), capped at MaxTTL, then jittered by ±Jitter (a
// fraction) from the abuse id, so a replayed detection gets exactly the same
// penalty.
type Escalation struct {
	Lookback time.Duration
	Quiet    time.Duration
	Factor   float64
	MaxTTL   time.Duration
	Jitter   float64
}

// penaltyTTL is the jittered, escalated duration for level.
func (e Escalation) penaltyTTL(base time.Duration, level int64, abuseID string) time.Duration {
	ttl := float64(base)
	for i := int64(1); i < level && ttl < float64(e.MaxTTL); i++ {
		ttl *= e.Factor
	}
	ttl = min(ttl, float64(max(e.MaxTTL, base)))
	h := sha256.Sum256([]byte(abuseID))
	u := float64(binary.BigEndian.Uint64(h[:8])>>11) / (1 << 53) // [0, 1)
	ttl *= 1 + e.Jitter*(2*u-1)
	return time.Duration(ttl).Round(time.Second)
}

// Allowlist holds the principals and CIDRs that are never penalized; it is
// refreshed from the runtime-config table. Safe for concurrent use.
type Allowlist struct {
	mu         sync.RWMutex
	principals map[string]time.Time
	cidrs      []AllowEntry
}

// Set replaces the entries.
func (a *Allowlist) Set(entries []AllowEntry) {
	ps := map[string]time.Time{}
	var cidrs []AllowEntry
	for _, e := range entries {
		if e.Principal != "" {
			ps[e.Principal] = e.ExpiresAt
		} else {
			cidrs = append(cidrs, e)
		}
	}
	a.mu.Lock()
	a.principals, a.cidrs = ps, cidrs
	a.mu.Unlock()
}

// Allows reports whether a detection of p with evidence from ips must not be
// penalized at now: p is allowlisted, or every IP is in an allowlisted CIDR.
func (a *Allowlist) Allows(p events.Principal, ips []events.IPCount, now time.Time) (bool, string) {
	a.mu.RLock()
	defer a.mu.RUnlock()
	if exp, ok := a.principals[p.Key()]; ok && exp.After(now) {
		return true, "principal"
	}
	if len(ips) == 0 || len(a.cidrs) == 0 {
		return false, ""
	}
	for _, ip := range ips {
		if !a.coveredLocked(ip.IP, now) {
			return false, ""
		}
	}
	return true, "cidr"
}

func (a *Allowlist) coveredLocked(ip netip.Addr, now time.Time) bool {
	for _, c := range a.cidrs {
		if c.ExpiresAt.After(now) && c.CIDR.Contains(ip.Unmap()) {
			return true
		}
	}
	return false
}

// Refresh reloads the allowlist every interval until ctx is done.
func (a *Allowlist) Refresh(ctx context.Context, load func(context.Context, time.Time) ([]AllowEntry, error), every time.Duration, now func() time.Time, log *slog.Logger) error {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		entries, err := load(ctx, now())
		if err != nil {
			log.Warn("reload allowlist; keeping the previous one", "err", err)
		} else {
			a.Set(entries)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// BlastGuard holds enforcement of a pattern when it would penalize more than
// Limit principals within a minute: a detector gone wrong (a bad threshold, a
// broken upstream) must not throttle a whole customer base. While held,
// detections are simulated, and the hold pages once. Safe for concurrent use.
type BlastGuard struct {
	Limit int
	Now   func() time.Time

	mu      sync.Mutex
	recent  map[events.Pattern][]time.Time
	holding map[events.Pattern]bool
}

// Admit records an enforcement of pattern and reports whether it may go
// ahead, and whether this call started a hold (the caller pages).
func (g *BlastGuard) Admit(pattern events.Pattern) (ok, started bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.recent == nil {
		g.recent, g.holding = map[events.Pattern][]time.Time{}, map[events.Pattern]bool{}
	}
	now := g.Now()
	r := g.recent[pattern]
	i := 0
	for i < len(r) && now.Sub(r[i]) >= time.Minute {
		i++
	}
	r = r[i:]
	if len(r) >= g.Limit {
		started = !g.holding[pattern]
		g.holding[pattern] = true
		g.recent[pattern] = r
		return false, started
	}
	g.holding[pattern] = false
	g.recent[pattern] = append(r, now)
	return true, false
}
