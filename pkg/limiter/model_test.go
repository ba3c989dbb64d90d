package limiter

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"net/netip"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/floodgate-dev/floodgate/pkg/events"
	"github.com/floodgate-dev/floodgate/pkg/redisx"
	"github.com/floodgate-dev/floodgate/pkg/redisx/redistest"
)

// model is a pure-Go reference of check.lua's algorithms: the same arithmetic in
// the same order, state in maps. Property tests run random request sequences
// through the engine (against real Redis, with a fixed clock) and the model and
// require identical decisions.
type model struct {
	state map[string]map[string]float64
	logs  map[string][]float64 // sliding_window_log: one score per unit, ascending
}

type modelRule struct {
	key                         string
	alg                         string
	limit, period, burst, scale float64
	shadow                      bool
}

type modelOut struct {
	ok                             bool
	limit, remaining, reset, retry int64
}

func eff(x, scale, m float64) float64 { return math.Max(1, math.Floor(x*scale*m+1e-9)) }

func (md *model) check(now float64, rules []modelRule, cost float64, m float64) (bool, []modelOut) {
	outs := make([]modelOut, len(rules))
	commits := make([]func(), len(rules))
	denied := false
	for i, r := range rules {
		lim := eff(r.limit, r.scale, m)
		capacity := lim
		if r.burst > 0 {
			capacity = eff(r.burst, r.scale, m)
		}
		if r.alg == "swl" {
			lim = math.Min(lim, MaxSlidingLogLimit)
		}
		st := md.state[r.key]
		var o modelOut
		var commit func()
		switch r.alg {
		case "tb":
			rate := lim / r.period
			tokens, ts := capacity, now
			if st != nil {
				tokens, ts = st["t"], st["ts"]
			}
			if now > ts {
				tokens = tokens + (now-ts)*rate
			}
			if tokens > capacity {
				tokens = capacity
			}
			ok := tokens >= cost
			left := tokens
			if ok {
				left = tokens - cost
			}
			o = modelOut{ok: ok, remaining: int64(math.Floor(left)), reset: int64(math.Ceil((capacity - left) / rate))}
			if !ok {
				o.retry = -1
				if cost <= capacity {
					o.retry = int64(math.Ceil((cost - tokens) / rate))
				}
			}
			commit = func() { md.state[r.key] = map[string]float64{"t": left, "ts": now} }
		case "lb":
			rate := lim / r.period
			level, ts := 0.0, now
			if st != nil {
				level, ts = st["l"], st["ts"]
			}
			if now > ts {
				level = level - (now-ts)*rate
			}
			if level < 0 {
				level = 0
			}
			ok := level+cost <= capacity
			after := level
			if ok {
				after = level + cost
			}
			o = modelOut{ok: ok, remaining: int64(math.Floor(capacity - after)), reset: int64(math.Ceil(after / rate))}
			if !ok {
				o.retry = -1
				if cost <= capacity {
					o.retry = int64(math.Ceil((level + cost - capacity) / rate))
				}
			}
			commit = func() { md.state[r.key] = map[string]float64{"l": after, "ts": now} }
		case "gcra":
			T := r.period / lim
			tat := now
			if st != nil && st["tat"] >= now {
				tat = st["tat"]
			}
			newTat := tat + cost*T
			allowAt := newTat - capacity*T
			if allowAt-now <= 1e-6 {
				o = modelOut{ok: true, remaining: int64(math.Floor((now-allowAt)/T + 1e-9)), reset: int64(math.Ceil(newTat - now))}
				commit = func() { md.state[r.key] = map[string]float64{"tat": newTat} }
			} else {
				o = modelOut{remaining: int64(math.Max(0, math.Floor((now-(tat-capacity*T))/T+1e-9))), reset: int64(math.Ceil(tat - now)), retry: -1}
				if cost <= capacity {
					o.retry = int64(math.Ceil(allowAt - now))
				}
			}
		case "fw":
			win := now - math.Mod(now, r.period)
			c := 0.0
			if st != nil && st["w"] == win {
				c = st["c"]
			}
			reset := win + r.period - now
			if c+cost <= lim {
				o = modelOut{ok: true, remaining: int64(lim - c - cost), reset: int64(reset)}
				commit = func() { md.state[r.key] = map[string]float64{"w": win, "c": c + cost} }
			} else {
				o = modelOut{remaining: int64(math.Max(0, lim-c)), reset: int64(reset), retry: -1}
				if cost <= lim {
					o.retry = int64(reset)
				}
			}
		case "sw":
			period := r.period
			win := now - math.Mod(now, period)
			c, p := 0.0, 0.0
			if st != nil {
				c, p = st["c"], st["p"]
				if st["w"] != win {
					if st["w"] == win-period {
						p = c
					} else {
						p = 0
					}
					c = 0
				}
			}
			elapsed := now - win
			est := p*(period-elapsed)/period + c
			if est+cost <= lim {
				o = modelOut{ok: true, remaining: int64(math.Floor(lim - est - cost)), reset: int64(win + 2*period - now)}
				commit = func() { md.state[r.key] = map[string]float64{"w": win, "c": c + cost, "p": p} }
			} else {
				reset := win + period - now
				if c > 0 {
					reset += period
				}
				retry := -1.0
				if cost <= lim {
					need := est + cost - lim
					if p > 0 {
						if t1 := math.Ceil(need * period / p); t1 <= period-elapsed {
							retry = t1
						}
					}
					if retry == -1 {
						retry = period - elapsed
						if c+cost > lim {
							retry += math.Ceil((c + cost - lim) * period / c)
						}
					}
				}
				o = modelOut{remaining: int64(math.Max(0, math.Floor(lim-est))), reset: int64(reset), retry: int64(retry)}
			}
		case "swl":
			var live []float64 // units still in the window: score > now − period
			for _, sc := range md.logs[r.key] {
				if sc > now-r.period {
					live = append(live, sc)
				}
			}
			count := float64(len(live))
			newest := now
			if len(live) > 0 {
				newest = live[len(live)-1]
			}
			if count+cost <= lim {
				o = modelOut{ok: true, remaining: int64(lim - count - cost), reset: int64(math.Max(newest, now) + r.period - now)}
				commit = func() {
					for range int(cost) {
						live = append(live, now)
					}
					if md.logs == nil {
						md.logs = map[string][]float64{}
					}
					md.logs[r.key] = live
				}
			} else {
				o = modelOut{remaining: int64(math.Max(0, lim-count)), retry: -1}
				if count > 0 {
					o.reset = int64(newest + r.period - now)
				}
				if cost <= lim {
					o.retry = int64(live[int(count+cost-lim)-1] + r.period - now)
				}
			}
		}
		o.limit = int64(lim)
		if !o.ok && !r.shadow {
			denied = true
		}
		outs[i], commits[i] = o, commit
	}
	if !denied {
		for i, c := range commits {
			if outs[i].ok && c != nil {
				c()
			}
		}
	}
	return !denied, outs
}

// TestAlgorithmsMatchReferenceModel runs random sequences (costs, clock jumps,
// penalties, shadow rules) through check.lua in Redis and through the model.
func TestAlgorithmsMatchReferenceModel(t *testing.T) {
	rdb := redistest.Client(t)
	ctx := context.Background()
	algs := []Algorithm{TokenBucket, GCRA, FixedWindow, SlidingWindow, LeakyBucket, SlidingLog}
	for _, alg := range algs {
		for seed := range uint64(6) {
			t.Run(fmt.Sprintf("%s/seed%d", alg, seed), func(t *testing.T) {
				rng := rand.New(rand.NewPCG(seed, uint64(len(alg))))
				// Two rules of the same algorithm, different shapes: all-or-nothing
				// across them is part of what must match.
				type shape struct {
					limit, burst int
					period       time.Duration
					shadow       bool
				}
				shapes := make([]shape, 2)
				for i := range shapes {
					s := shape{limit: 1 + rng.IntN(20), period: time.Duration(50+rng.IntN(5000)) * time.Millisecond}
					if alg.HasBurst() && rng.IntN(2) == 0 {
						s.burst = s.limit + rng.IntN(10)
					}
					s.shadow = seed%3 == 2 && i == 1
					shapes[i] = s
				}
				yaml := "version: 1\nrules:\n"
				for i, s := range shapes {
					yaml += fmt.Sprintf("  - {id: r%d, tier: principal, algorithm: %s, limit: %d, period: %dms, burst: %d, shadow: %v}\n",
						i, alg, s.limit, s.period.Milliseconds(), s.burst, s.shadow)
				}
				now := int64(1_800_000_000_000 + rng.IntN(1_000_000))
				e := newTestEngine(t, rdb, yaml, func(c *EngineConfig) {})
				e.fixedNow = func() int64 { return now }
				p := principal(t)
				m := 1.0
				if seed%2 == 1 {
					m = []float64{0.1, 0.3, 0.5, 0.75}[rng.IntN(4)]
					require.NoError(t, rdb.HSet(ctx, redisx.PenaltyKey(string(p.Kind), p.ID), redisx.PenaltyFieldMultiplier, m).Err())
				}
				md := &model{state: map[string]map[string]float64{}}
				mrules := make([]modelRule, len(shapes))
				for i, s := range shapes {
					mrules[i] = modelRule{key: fmt.Sprint(i), alg: alg.code(), limit: float64(s.limit), period: float64(s.period.Milliseconds()),
						burst: float64(s.burst), scale: 1, shadow: s.shadow}
				}
				var lastRetry []int64 // the engine's last retry per rule: stepping exactly onto it tests the boundary
				for step := range 300 {
					switch rng.IntN(6) {
					case 0: // same millisecond
					case 1:
						now += int64(rng.IntN(20))
					case 2:
						now += int64(rng.IntN(int(shapes[0].period.Milliseconds())))
					case 3:
						now += int64(rng.IntN(3 * int(shapes[1].period.Milliseconds())))
					case 4: // one period ± 1 ms: a unit consumed at the last step is about to, just, or just did expire
						now += shapes[rng.IntN(2)].period.Milliseconds() + int64(rng.IntN(3)) - 1
					case 5:
						if len(lastRetry) > 0 {
							now += lastRetry[rng.IntN(len(lastRetry))]
						}
					}
					cost := 1
					if rng.IntN(5) == 0 {
						cost = 1 + rng.IntN(25)
					}
					res, err := e.Check(ctx, Request{Principal: p, Method: "GET", Route: "/x", Cost: cost})
					require.NoError(t, err)
					allowed, outs := md.check(float64(now), mrules, float64(cost), m)
					require.Equal(t, allowed, res.Allowed, "step %d now %d cost %d", step, now, cost)
					require.Len(t, res.Tiers, len(outs))
					lastRetry = lastRetry[:0]
					for _, tr := range res.Tiers {
						lastRetry = append(lastRetry, tr.RetryAfter.Milliseconds())
					}
					for i, o := range outs {
						got := res.Tiers[i]
						if o.retry == -1 { // cannot fit at this limit: the engine says wait a full window
							o.retry = max(o.reset, int64(mrules[i].period))
						}
						require.Equal(t, o, modelOut{ok: got.Allowed, limit: got.Limit, remaining: got.Remaining,
							reset: got.ResetAfter.Milliseconds(), retry: got.RetryAfter.Milliseconds()}, "step %d rule %d now %d cost %d", step, i, now, cost)
					}
				}
			})
		}
	}
}

func TestModelEffectiveLimit(t *testing.T) {
	cases := []struct {
		name         string
		limit, scale float64
		m            float64
		want         float64
	}{
		{"no scale no penalty", 50, 1, 1, 50},
		{"penalty 0.1", 50, 1, 0.1, 5},
		{"scale and penalty", 100, 0.5, 0.3, 15},
		{"rounding noise does not lose a unit", 100, 0.29, 1, 29},
		{"never below 1", 3, 0.1, 0.1, 1},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			require.Equal(t, tc.want, eff(tc.limit, tc.scale, tc.m))
		})
	}
	_ = events.TierPrincipal
}

// TestSlidingLogState checks what the model test cannot see: the sorted set
// itself (size bound, unique members, TTL), the cap on overridden limits, and
// the refund after a split decision.
func TestSlidingLogState(t *testing.T) {
	rdb := redistest.Client(t)
	ctx := context.Background()
	rules := `
version: 1
rules:
  - {id: log, tier: principal, kinds: [bot], limit: 10000, period: 1m, algorithm: sliding_window_log}
  - {id: small, tier: principal, kinds: [user], limit: 3, period: 1h, algorithm: sliding_window_log}
  - {id: per-ip, tier: ip, kinds: [user], limit: 1, period: 1h, algorithm: sliding_window_log}
`
	e := newTestEngine(t, rdb, rules, nil)

	t.Run("same millisecond, large costs: unique members, bounded set, TTL", func(t *testing.T) {
		now := int64(1_800_000_000_000)
		e.fixedNow = func() int64 { return now }
		t.Cleanup(func() { e.fixedNow = nil })
		p := principal(t)
		key := redisx.BucketKey(string(p.Kind), p.ID, "log|swl")
		for i := range 4 { // 2,500 members per call: ZADD in chunks, indices continue within the millisecond
			r := check(t, e, Request{Principal: p, Cost: 2500})
			require.True(t, r.Allowed, "call %d", i)
			require.Equal(t, int64(10000-2500*(i+1)), r.Tiers[0].Remaining)
		}
		n, err := rdb.ZCard(ctx, key).Result()
		require.NoError(t, err)
		require.Equal(t, int64(10000), n, "every unit is its own member")
		r := check(t, e, Request{Principal: p, Cost: 1})
		require.False(t, r.Allowed)
		require.Equal(t, time.Minute, r.RetryAfter)
		n, err = rdb.ZCard(ctx, key).Result()
		require.NoError(t, err)
		require.Equal(t, int64(10000), n, "a denial adds nothing")
		ttl, err := rdb.PTTL(ctx, key).Result()
		require.NoError(t, err)
		require.InDelta(t, time.Minute.Seconds(), ttl.Seconds(), 1, "the key lives as long as its newest unit")

		now += time.Minute.Milliseconds() // every unit expires: the trim keeps the set at the limit
		require.True(t, check(t, e, Request{Principal: p, Cost: 7}).Allowed)
		n, err = rdb.ZCard(ctx, key).Result()
		require.NoError(t, err)
		require.Equal(t, int64(7), n)
	})

	t.Run("an override cannot grow the set past the cap", func(t *testing.T) {
		p := principal(t)
		require.NoError(t, rdb.HSet(ctx, e.rt.OverridesKey, "principal:"+p.Key(), `{"limits":{"log":50000}}`).Err())
		require.NoError(t, e.rt.Refresh(ctx))
		r := check(t, e, Request{Principal: p, Cost: 1})
		require.True(t, r.Allowed)
		require.Equal(t, int64(MaxSlidingLogLimit), r.Tiers[0].Limit)
	})

	t.Run("Redis time: the limit holds", func(t *testing.T) {
		p := events.Principal{Kind: events.PrincipalUser, ID: redistest.Unique(t, "swl")}
		for range 3 {
			require.True(t, check(t, e, Request{Principal: p, Cost: 1}).Allowed)
		}
		r := check(t, e, Request{Principal: p, Cost: 1})
		require.False(t, r.Allowed)
		require.Equal(t, "small", r.Rule)
		require.Greater(t, r.RetryAfter, 59*time.Minute)
	})

	t.Run("IP denies: the principal's log is refunded", func(t *testing.T) {
		id := redistest.Unique(t, "swl")
		ip := netip.MustParseAddr("198.51.100.91")
		t.Cleanup(func() { _ = rdb.Del(ctx, redisx.BucketKey("ip", ipBucketID(ip), "per-ip|swl")) })
		a := events.Principal{Kind: events.PrincipalUser, ID: id + "a"}
		b := events.Principal{Kind: events.PrincipalUser, ID: id + "b"}
		require.True(t, check(t, e, Request{Principal: a, IP: ip, Cost: 1}).Allowed)
		r := check(t, e, Request{Principal: b, IP: ip, Cost: 1})
		require.False(t, r.Allowed)
		require.Equal(t, events.TierIP, r.Tier)
		n, err := rdb.ZCard(ctx, redisx.BucketKey(string(b.Kind), b.ID, "small|swl")).Result()
		require.NoError(t, err)
		require.Zero(t, n, "the principal group committed and was refunded")
	})
}
