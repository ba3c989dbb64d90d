// Package whatif answers "what would these rules have done?": it reads the
// decisions the limiter recorded in a time range from the decisions topic,
// runs each recorded request through a pkg/limiter engine built from a
// candidate rules file — the same Lua script, with each decision's own
// timestamp as the script's clock — in a Redis keyspace of its own (a unique
// key prefix no limiter uses, deleted afterwards), and compares what the
// candidate blocks with what was blocked: per rule, per priority, per plan
// and per principal kind, with the principals and paying plans most affected
// and a verdict (safe, review, reject).
//
// What is replayed, and what is not (docs/whatif.md):
//   - the request (principal, IP, method, route, resource, plan, priority)
//     and its own cost: the recorded units divided by the route's cost in
//     the baseline rules (the rules the traffic was recorded under; without
//     them, the candidate's route costs);
//   - penalties as recorded: each decision's penalty_multiplier is written
//     to the principal's penalty in the isolated keyspace before its check;
//   - no adjuster scales and no runtime overrides (the candidate's file
//     limits as they are), no priority shedding: a request recorded as shed
//     is counted apart and not replayed, and so is a decision of an Envoy
//     call for an envoy-configured domain (its limits are that
//     configuration's, not a rules file's);
//   - the traffic is taken as it came: a request the candidate would deny is
//     assumed to be sent anyway, and no retry it would cause is invented.
package whatif

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"strconv"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/floodgate-dev/floodgate/pkg/events"
	"github.com/floodgate-dev/floodgate/pkg/limiter"
	"github.com/floodgate-dev/floodgate/pkg/limiter/admission"
	"github.com/floodgate-dev/floodgate/pkg/redisx"
	"github.com/floodgate-dev/floodgate/pkg/rollout"
)

// PrefixBase starts every isolated keyspace's prefix: "fgwhatif:<run>:".
// Limiter keys start with "fg:", so no limiter reads or writes a key under it.
const PrefixBase = "fgwhatif:"

// Config wires a replay.
type Config struct {
	Redis     redis.UniversalClient
	Candidate *limiter.Ruleset // the rules to try
	// Baseline is the rules the traffic was recorded under (optional): it
	// recovers each request's own cost from the recorded units.
	Baseline *limiter.Ruleset
	// Prefix is the isolated keyspace; "" = PrefixBase + a new UUID + ":".
	// It must start with PrefixBase.
	Prefix     string
	Thresholds Thresholds
	Top        int // principals and plans listed as most affected (default 10)
	Logger     *slog.Logger
	// Keep leaves the isolated keys in Redis after the replay (tests
	// inspect them); they expire on their own.
	Keep bool
	// Workers bounds the checks in flight (default 64). Checks of one
	// principal, and of one IP counting unit, still run one after the
	// other in replay order, so the answers are those of a sequential
	// replay; independent ones share pipelined round trips.
	Workers int
	// From, To, Topic, Read, CandidateName and BaselineName describe the
	// input in the report (Read's undecodable messages lower its confidence).
	From, To                    time.Time
	Topic                       string
	Read                        ReadStats
	CandidateName, BaselineName string
}

// Validate checks the configuration.
func (c *Config) Validate() error {
	var errs []error
	if c.Redis == nil {
		errs = append(errs, errors.New("redis: required"))
	}
	if c.Candidate == nil {
		errs = append(errs, errors.New("candidate rules: required"))
	}
	if c.Prefix != "" {
		if len(c.Prefix) <= len(PrefixBase) || c.Prefix[:len(PrefixBase)] != PrefixBase {
			errs = append(errs, fmt.Errorf("prefix %q: must start with %q and name the run", c.Prefix, PrefixBase))
		} else if err := limiter.ValidKeyPrefix(c.Prefix); err != nil {
			errs = append(errs, fmt.Errorf("prefix: %w", err))
		}
	}
	if err := c.Thresholds.Validate(); err != nil {
		errs = append(errs, fmt.Errorf("thresholds: %w", err))
	}
	return errors.Join(errs...)
}

// Replay runs recs (in replay order: see Sort) through the candidate and
// reports. Every key it touches is under the isolated prefix.
func Replay(ctx context.Context, c Config, recs []Recorded) (*Report, error) {
	if err := c.Validate(); err != nil {
		return nil, fmt.Errorf("what-if: %w", err)
	}
	if c.Prefix == "" {
		c.Prefix = PrefixBase + uuid.Must(uuid.NewV7()).String() + ":"
	}
	if c.Top <= 0 {
		c.Top = 10
	}
	if c.Workers <= 0 {
		c.Workers = 64
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	eng, err := limiter.NewEngine(limiter.EngineConfig{
		Redis: c.Redis, Rules: limiter.NewRuleStore(c.Candidate), KeyPrefix: c.Prefix,
		Budget: 5 * time.Second, RedisBatch: 64, QueueWait: time.Minute, BreakerFailures: 1 << 30,
		Logger: c.Logger, Registry: prometheus.NewRegistry(),
	})
	if err != nil {
		return nil, fmt.Errorf("what-if: %w", err)
	}
	if err := eng.Load(ctx); err != nil {
		return nil, fmt.Errorf("what-if: load the check script: %w", err)
	}
	if !c.Keep {
		defer func() {
			dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
			defer cancel()
			if n, err := DeleteKeys(dctx, c.Redis, c.Prefix); err != nil {
				c.Logger.Warn("delete the what-if keys", "prefix", c.Prefix, "deleted", n, "err", err)
			}
		}()
	}
	start := time.Now()
	rep := &Report{From: c.From, To: c.To, Topic: c.Topic, Read: c.Read, Rules: c.CandidateName, Baseline: c.BaselineName}
	switch {
	case c.Baseline == nil:
		rep.Baseline = ""
	case rep.Baseline == "":
		rep.Baseline = "(unnamed)"
	}
	if len(recs) > 0 && rep.From.IsZero() {
		rep.From, rep.To = recs[0].TS, recs[len(recs)-1].TS.Add(time.Millisecond)
	}
	if err := replay(ctx, c, eng, recs, rep); err != nil {
		return nil, err
	}
	elapsed := time.Since(start)
	rep.Elapsed = elapsed.Round(time.Millisecond).String()
	ids := make([]string, 0, len(c.Candidate.Rules)+len(c.Candidate.Quotas))
	for _, r := range c.Candidate.Rules {
		ids = append(ids, r.ID)
	}
	for i := range c.Candidate.Quotas {
		ids = append(ids, c.Candidate.Quotas[i].ID())
	}
	// The replay's keys live limiter.ReplayKeyTTL at least (Redis TTLs run
	// on the wall clock, not the decisions' time): a replay longer than that
	// may have lost an idle bucket.
	if elapsed > limiter.ReplayKeyTTL {
		rep.slow = fmt.Sprintf("the replay took %s, longer than its keys are sure to live (%s): a bucket idle for longer may have expired early",
			rep.Elapsed, limiter.ReplayKeyTTL)
	}
	rep.tally.finish(rep, ids, c.Top, c.Thresholds)
	return rep, nil
}

// Run reads the decisions of [from, to) from src and replays them (see Replay).
func Run(ctx context.Context, src *Source, from, to time.Time, c Config) (*Report, error) {
	if err := c.Validate(); err != nil {
		return nil, fmt.Errorf("what-if: %w", err)
	}
	recs, st, err := src.Read(ctx, from, to)
	if err != nil {
		return nil, fmt.Errorf("what-if: %w", err)
	}
	c.From, c.To, c.Topic, c.Read = from, to, src.Topic, st
	return Replay(ctx, c, recs)
}

// replay runs recs through eng, up to c.Workers at a time. A decision waits
// for the previous decision of its principal and of its IP counting unit (the
// keys it shares with them) to finish; all its other keys are its
// principal's, so every key sees its checks in replay order.
func replay(ctx context.Context, c Config, eng *limiter.Engine, recs []Recorded, rep *Report) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var (
		mu   sync.Mutex // rep, rep.tally, pens
		pens = map[string]float64{}
		last = map[string]chan struct{}{} // principal / IP unit → its latest decision's done
		sem  = make(chan struct{}, c.Workers)
		wg   sync.WaitGroup
	)
	rep.tally = newTally()
	one := func(d *events.Decision) error {
		mu.Lock()
		m, known := pens[d.Principal.Key()]
		mu.Unlock()
		if !known || m != d.PenaltyMultiplier {
			if err := setPenalty(ctx, c.Redis, c.Prefix, d.Principal, d.PenaltyMultiplier); err != nil {
				return err
			}
			mu.Lock()
			pens[d.Principal.Key()] = d.PenaltyMultiplier
			mu.Unlock()
		}
		req, inexact := request(d, c.Candidate, c.Baseline)
		res, err := eng.Check(ctx, req)
		if err != nil {
			return fmt.Errorf("check decision %s: %w", d.ID, err)
		}
		if res.Degraded {
			return fmt.Errorf("check decision %s: Redis did not answer (%s)", d.ID, res.Error)
		}
		o := outcome{principal: d.Principal.Key(), kind: string(d.Principal.Kind), plan: res.Plan, prio: res.Priority.String(),
			recordedBlocked: !d.Allowed, candidateBlocked: !res.Allowed}
		if !d.Allowed {
			o.recordedRule = d.Rule
		}
		if !res.Allowed {
			o.candidateRule = res.Rule
		}
		for _, tr := range res.Tiers {
			o.matched = append(o.matched, tr.Rule)
			if tr.Shadow && !tr.Allowed {
				o.shadowBlocked = append(o.shadowBlocked, tr.Rule)
			}
		}
		mu.Lock()
		defer mu.Unlock()
		rep.tally.add(o)
		rep.Replayed++
		if d.Degraded {
			rep.Degraded++
		}
		if d.Plan == "" {
			rep.NoPlan++
		}
		if inexact {
			rep.CostFixed++
		}
		return nil
	}
	for i := range recs {
		d := &recs[i].Decision
		if d.Shed {
			rep.Shed++
			continue
		}
		if d.Envoy != nil { // decided by an envoy ratelimit configuration, not a rules file
			rep.Envoy++
			continue
		}
		keys := [2]string{"p" + d.Principal.Key(), ""}
		if d.IP.IsValid() {
			keys[1] = "i" + ipUnit(d.IP)
		}
		var waits [2]chan struct{}
		done := make(chan struct{})
		for j, k := range keys {
			if k != "" {
				waits[j] = last[k]
				last[k] = done
			}
		}
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
		}
		if ctx.Err() != nil {
			break
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			defer close(done)
			for _, w := range waits {
				if w != nil {
					select {
					case <-w:
					case <-ctx.Done():
						return
					}
				}
			}
			if err := one(d); err != nil {
				cancel(err)
			}
		}()
	}
	wg.Wait()
	if err := context.Cause(ctx); err != nil {
		return fmt.Errorf("what-if: %w", err)
	}
	return nil
}

// ipUnit is the IP tier's counting unit: the IPv4 address, or the IPv6 /64.
func ipUnit(a netip.Addr) string {
	a = a.Unmap()
	if a.Is4() {
		return a.String()
	}
	return netip.PrefixFrom(a, 64).Masked().String()
}

// request rebuilds the check a decision answered. Its cost is the recorded
// units divided by the route's cost (the baseline's, else the candidate's);
// inexact reports a remainder (the cost is then rounded).
func request(d *events.Decision, candidate, baseline *limiter.Ruleset) (req limiter.Request, inexact bool) {
	rs := baseline
	if rs == nil {
		rs = candidate
	}
	per := int64(max(rs.Cost(d.Method, d.Route), 1))
	cost := d.Cost / per
	if d.Cost%per != 0 {
		inexact = true
		cost = (d.Cost + per/2) / per
	}
	prio, err := admission.ParsePriority(string(d.Priority))
	if err != nil {
		prio = admission.PriorityUnset
	}
	return limiter.Request{Principal: d.Principal, IP: d.IP, Method: d.Method, Route: d.Route, Resource: d.Resource,
		Plan: d.Plan, Cost: int(max(cost, 1)), Priority: prio, At: d.TS}, inexact
}

// setPenalty makes the principal's penalty in the isolated keyspace what a
// decision recorded (0: none).
func setPenalty(ctx context.Context, rdb redis.UniversalClient, prefix string, p events.Principal, m float64) error {
	key := prefix + redisx.PenaltyKey(string(p.Kind), p.ID)
	var err error
	if m <= 0 || m >= 1 {
		err = rdb.Del(ctx, key).Err()
	} else {
		err = rdb.HSet(ctx, key, redisx.PenaltyFieldMultiplier, strconv.FormatFloat(m, 'g', -1, 64)).Err()
		if err == nil {
			err = rdb.PExpire(ctx, key, 24*time.Hour).Err()
		}
	}
	if err != nil {
		return fmt.Errorf("set the replayed penalty of %s: %w", p.Key(), err)
	}
	return nil
}

// DeleteKeys removes every key under prefix (each master of a cluster) and
// returns how many it removed. prefix must start with PrefixBase.
func DeleteKeys(ctx context.Context, rdb redis.UniversalClient, prefix string) (int, error) {
	if len(prefix) <= len(PrefixBase) || prefix[:len(PrefixBase)] != PrefixBase {
		return 0, fmt.Errorf("delete keys: prefix %q is not a what-if prefix", prefix)
	}
	n := 0
	one := func(ctx context.Context, c redis.Cmdable) error {
		it := c.Scan(ctx, 0, prefix+"*", 1000).Iterator()
		var batch []string
		flush := func() error {
			if len(batch) == 0 {
				return nil
			}
			// One key per call: in a cluster the keys of a batch need not share a slot.
			for _, k := range batch {
				if err := c.Unlink(ctx, k).Err(); err != nil {
					return err
				}
				n++
			}
			batch = batch[:0]
			return nil
		}
		for it.Next(ctx) {
			if batch = append(batch, it.Val()); len(batch) == 1000 {
				if err := flush(); err != nil {
					return err
				}
			}
		}
		if err := it.Err(); err != nil {
			return err
		}
		return flush()
	}
	var err error
	if cc, ok := rdb.(*redis.ClusterClient); ok {
		err = cc.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error { return one(ctx, c) })
	} else {
		err = one(ctx, rdb)
	}
	if err != nil {
		return n, fmt.Errorf("delete keys under %s: %w", prefix, err)
	}
	return n, nil
}

// EnforcedBaseline is the baseline of a rollout's what-if gate: the version
// the rules topic enforces, parsed, and its name in a report ("enforced
// version N"). It is rollout.ErrNoEnforced when the topic enforces none.
func EnforcedBaseline(ctx context.Context, topic *rollout.Topic) (*limiter.Ruleset, string, error) {
	st, err := topic.Read(ctx)
	if err != nil {
		return nil, "", err
	}
	enf, ok := st.Enforced()
	if !ok {
		return nil, "", rollout.ErrNoEnforced
	}
	baseline, err := limiter.ParseRules(fmt.Sprintf("version %d", enf.Version), []byte(enf.Rules))
	if err != nil {
		return nil, "", fmt.Errorf("the enforced version %d: %w", enf.Version, err)
	}
	return baseline, fmt.Sprintf("enforced version %d", enf.Version), nil
}
