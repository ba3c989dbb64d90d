// Package quality measures detection quality through the real pipeline: the
// held-out labeled stream (loadtest/labeled.NewHeldOut) is produced to the
// Kafka-protocol broker, 1 or N detector processes (the binary built from
// ./services/detector, one consumer group) score it, and the penalties in
// Redis and the abuse.v1 events on the abuse topic are read back and compared
// with the labels: recall per family and pattern, legitimate principals
// penalized, detection latency from the abuse start (event time), fan-out
// latency apart, and whether 1 and N instances detected the same principals.
//
// The detector works in event time (docs/detector.md "State and memory"), so
// the stream is replayed faster than real time: event times start at the
// wall clock of the run's start (the same for every pass) and the producer
// sends as fast as the broker takes it. Each run uses its own topics, consumer group and principal-id prefix, so
// it never meets another run's or another engineer's traffic, and deletes its
// penalty keys and topics afterwards.
package quality

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/floodgate-dev/floodgate/loadtest/internal/cli"
	"github.com/floodgate-dev/floodgate/loadtest/labeled"
	"github.com/floodgate-dev/floodgate/migrations"
	"github.com/floodgate-dev/floodgate/pkg/config"
	"github.com/floodgate-dev/floodgate/pkg/events"
	"github.com/floodgate-dev/floodgate/pkg/kafkascan"
	"github.com/floodgate-dev/floodgate/pkg/redisx"
	"github.com/floodgate-dev/floodgate/pkg/stream"
)

// Config is one quality run.
type Config struct {
	Brokers    []string
	RedisAddrs []string
	// Kafka and Redis are the TLS and authentication of the tool's own
	// connections (nil / zero: plaintext); the detectors read the same
	// FLOODGATE_* variables from the inherited environment.
	Kafka       *stream.Security
	Redis       config.RedisSecurity
	DetectorBin string // a built ./services/detector
	Instances   []int  // detector processes per pass, e.g. 1 and 3
	Seed        uint64
	Legit       int
	Abusive     int
	Duration    time.Duration // event time covered by the stream
	Partitions  int           // of the run's decisions topic
	// RFC3986Routes adds routes such as /users/@me (needs the route grammar
	// of branch events in the detector and the codec).
	RFC3986Routes bool
	// DrainTimeout bounds the wait for the detectors to commit the stream.
	DrainTimeout time.Duration
	// HarmDelay is how long after a detection's event time its penalty is
	// taken to be in force in the harm replay (Harm).
	HarmDelay time.Duration
	// Env is extra detector environment (KEY=VALUE), applied last.
	Env    []string
	LogDir string // detector stderr goes here
	Log    *slog.Logger
}

// Validate checks the configuration.
func (c Config) Validate() error {
	var errs []error
	if len(c.Brokers) == 0 {
		errs = append(errs, errors.New("brokers: at least one"))
	}
	if len(c.RedisAddrs) == 0 {
		errs = append(errs, errors.New("redis addrs: at least one"))
	}
	if c.DetectorBin == "" {
		errs = append(errs, errors.New("detector bin: a built ./services/detector"))
	}
	if len(c.Instances) == 0 {
		errs = append(errs, errors.New("instances: at least one count"))
	}
	for _, n := range c.Instances {
		if n < 1 || n > c.Partitions {
			errs = append(errs, fmt.Errorf("instances %d: must be in 1..partitions (%d)", n, c.Partitions))
		}
	}
	if c.Legit < 1 || c.Abusive < 1 {
		errs = append(errs, errors.New("legit and abusive: at least 1 each"))
	}
	if c.DrainTimeout <= 0 {
		errs = append(errs, errors.New("drain timeout: must be > 0"))
	}
	if c.LogDir == "" || c.Log == nil {
		errs = append(errs, errors.New("log dir and log must be set"))
	}
	return errors.Join(errs...)
}

// Family is the outcome for one family.
type Family struct {
	Name       string
	Abusive    bool
	Pattern    events.Pattern // expected
	Principals int
	Detected   int // any abuse.v1 event (enforced or simulated)
	Penalized  int // an enforced penalty: key in Redis or an enforced abuse.v1
	AsExpected int // detected with the expected pattern
	LatP50     time.Duration
	LatP99     time.Duration
	Patterns   map[events.Pattern]int
}

// PatternResult is the abusive principals of one expected pattern.
type PatternResult struct {
	Pattern                           events.Pattern
	Principals, Penalized, AsExpected int
	LatP50, LatP99                    time.Duration
}

// Result is one pass through n detector instances.
type Result struct {
	Instances      int
	Events         int
	Produce        time.Duration // producing the stream (wall)
	Drain          time.Duration // from the first produce to the group's lag 0 (wall)
	Families       []Family
	Legit          int
	LegitPenalized int // an enforced penalty (as Family.Penalized)
	LegitDetected  int // any abuse.v1 event
	Abusive        int
	Caught         int // abusive principals with an enforced penalty
	// RateP* is the latency of the rate pattern (rapid_fire: one principal
	// past its line); FanOutP* of the breadth pattern (distributed_ip: one
	// account on many networks — takeover fan-out, botnets, proxy pools,
	// IPv6 rotation — at 1 req/s and more), whose evidence needs several
	// requests from several networks, so its target is 10 s, not 2 s.
	RateP50       time.Duration
	RateP99       time.Duration
	FanOutP50     time.Duration
	FanOutP99     time.Duration
	FalseExamples []string
	Patterns      []PatternResult // abusive principals by the pattern expected
	Harm          Harm            // what the penalties cost, per family
	// detected is the set of principal ids (without the run prefix) with any
	// abuse.v1 event, and the first pattern.
	detected map[string]events.Pattern
}

// Report is every pass.
type Report struct {
	Config  Config
	Results []Result
	// Agree is true when every pass detected the same principals with the
	// same first pattern; Diff lists up to 20 differences.
	Agree bool
	Diff  []string
}

// Run runs one pass per instance count.
func Run(ctx context.Context, cfg Config) (Report, error) {
	if err := cfg.Validate(); err != nil {
		return Report{}, fmt.Errorf("quality config: %w", err)
	}
	rep := Report{Config: cfg, Agree: true}
	// Every pass replays the same event times (windows aligned to the clock
	// then cut the stream at the same places)
	// and the same principal ids (one prefix per run: the same keys land on
	// the same partitions), so passes differ only by the number of
	// instances. Each pass deletes its penalty keys before the next starts.
	start := time.Now().UTC().Truncate(time.Second)
	prefix := fmt.Sprintf("q%x_", time.Now().UnixNano())
	for i, n := range cfg.Instances {
		res, err := pass(ctx, cfg, n, start, prefix, i)
		if err != nil {
			return rep, fmt.Errorf("pass with %d instances: %w", n, err)
		}
		rep.Results = append(rep.Results, res)
	}
	base := rep.Results[0].detected
	for _, r := range rep.Results[1:] {
		for id, p := range base {
			if q, ok := r.detected[id]; !ok || q != p {
				rep.Agree = false
				got := "none"
				if ok {
					got = string(q)
				}
				if len(rep.Diff) < 20 {
					rep.Diff = append(rep.Diff, fmt.Sprintf("%s: %d instances %s, %d instances %s", id, rep.Results[0].Instances, p, r.Instances, got))
				}
			}
		}
		for id, q := range r.detected {
			if _, ok := base[id]; !ok {
				rep.Agree = false
				if len(rep.Diff) < 20 {
					rep.Diff = append(rep.Diff, fmt.Sprintf("%s: %d instances none, %d instances %s", id, rep.Results[0].Instances, r.Instances, q))
				}
			}
		}
	}
	return rep, nil
}

func pass(ctx context.Context, cfg Config, n int, start time.Time, prefix string, i int) (Result, error) {
	log := cfg.Log.With("instances", n)
	run := fmt.Sprintf("%sp%d", prefix, i)
	decTopic, abuseTopic := "floodgate.quality."+run+".decisions", "floodgate.quality."+run+".abuse"
	km := migrations.NewKafka(cfg.Brokers, 1, cfg.Kafka)
	topics := []migrations.TopicSpec{{Name: decTopic, Partitions: cfg.Partitions}, {Name: decTopic + ".dlq", Partitions: 1},
		{Name: abuseTopic, Partitions: 3}, {Name: abuseTopic + ".dlq", Partitions: 1}}
	if err := km.Apply(ctx, topics, func(string) {}); err != nil {
		return Result{}, fmt.Errorf("create topics: %w", err)
	}
	defer func() {
		names := make([]string, len(topics))
		for i, t := range topics {
			names[i] = t.Name
		}
		if _, err := km.Client.DeleteTopics(context.Background(), &kafka.DeleteTopicsRequest{Topics: names}); err != nil {
			log.Warn("delete topics", "err", err)
		}
	}()

	src, err := labeled.NewHeldOut(labeled.HeldOut{Seed: cfg.Seed, Start: start, Duration: cfg.Duration,
		Legit: cfg.Legit, Abusive: cfg.Abusive, RFC3986Routes: cfg.RFC3986Routes, Prefix: prefix})
	if err != nil {
		return Result{}, err
	}
	labels := src.Labels()
	rdb := redisx.NewClient(redisx.Options{Addrs: cfg.RedisAddrs, DialTimeout: time.Second, Security: cfg.Redis})
	defer rdb.Close()
	keys := make([]string, 0, len(labels))
	ids := make([]string, 0, len(labels))
	for k, l := range labels {
		keys = append(keys, redisx.PenaltyKey(string(l.Principal.Kind), l.Principal.ID))
		ids = append(ids, k)
	}
	defer func() {
		for i := 0; i < len(keys); i += 1000 {
			pipe := rdb.Pipeline()
			for _, k := range keys[i:min(i+1000, len(keys))] {
				pipe.Del(context.Background(), k)
			}
			if _, err := pipe.Exec(context.Background()); err != nil {
				log.Warn("delete penalty keys", "err", err)
				return
			}
		}
	}()

	group := run + "-detector"
	stop, err := startDetectors(cfg, n, run, decTopic, abuseTopic, group)
	if err != nil {
		return Result{}, err
	}
	defer stop()

	prod := stream.NewProducer(stream.ProducerConfig{Brokers: cfg.Brokers, Security: cfg.Kafka, Topic: decTopic, BatchSize: 2000})
	defer prod.Close()
	res := Result{Instances: n}
	t0 := time.Now()
	var d events.Decision
	batch := make([]kafka.Message, 0, 10_000)
	flush := func() error {
		if len(batch) == 0 {
			return nil
		}
		if err := prod.Publish(ctx, batch...); err != nil {
			return fmt.Errorf("produce: %w", err)
		}
		batch = batch[:0]
		return nil
	}
	for src.Next(&d) {
		v, err := events.EncodeDecision(&d)
		if err != nil {
			return res, fmt.Errorf("encode %s: %w", d.ID, err)
		}
		batch = append(batch, kafka.Message{Key: []byte(d.Principal.Key()), Value: v})
		res.Events++
		if len(batch) == cap(batch) {
			if err := flush(); err != nil {
				return res, err
			}
		}
	}
	if err := flush(); err != nil {
		return res, err
	}
	res.Produce = time.Since(t0)
	log.Info("produced", "events", res.Events, "took", res.Produce.Round(time.Millisecond))

	admin := cfg.Kafka.Client(cfg.Brokers, 10*time.Second)
	deadline := time.Now().Add(cfg.DrainTimeout)
	for {
		lag, err := groupLag(ctx, admin, decTopic, group, cfg.Partitions)
		if err != nil {
			return res, err
		}
		if lag == 0 {
			break
		}
		if time.Now().After(deadline) {
			return res, fmt.Errorf("detectors still %d events behind after %s (logs in %s)", lag, cfg.DrainTimeout, cfg.LogDir)
		}
		select {
		case <-ctx.Done():
			return res, ctx.Err()
		case <-time.After(250 * time.Millisecond):
		}
	}
	res.Drain = time.Since(t0)
	log.Info("drained", "took", res.Drain.Round(time.Millisecond))
	// Abuse events and penalties are written before the offsets are
	// committed; the producer's batch timeout adds a little.
	time.Sleep(2 * time.Second)

	all, err := readAbuse(ctx, cfg.Brokers, cfg.Kafka, abuseTopic)
	if err != nil {
		return res, err
	}
	first := map[string]events.Abuse{}
	for k, as := range all {
		first[k] = as[0]
	}
	penalized := map[string]bool{}
	for i := 0; i < len(keys); i += 5000 {
		pipe := rdb.Pipeline()
		cmds := make([]interface{ Val() int64 }, 0, 5000)
		for _, k := range keys[i:min(i+5000, len(keys))] {
			cmds = append(cmds, pipe.Exists(ctx, k))
		}
		if _, err := pipe.Exec(ctx); err != nil {
			return res, fmt.Errorf("read penalties: %w", err)
		}
		for j, c := range cmds {
			if c.Val() == 1 {
				penalized[ids[i+j]] = true
			}
		}
	}
	// A penalty whose ladder step is short (docs/detector.md, 2 minutes
	// for step 1) can expire in event time before it is written or read:
	// this replay runs slower than real time here. The detector publishes
	// an enforced abuse.v1 only after its penalty write returned, so an
	// enforced event counts as penalized as well as a key still in Redis.
	for k, as := range all {
		for _, a := range as {
			if a.Penalty.Mode == events.PenaltyEnforced {
				penalized[k] = true
			}
		}
	}
	score(&res, labels, first, penalized, prefix)
	// The same stream again, through the model limiter with the penalties.
	again, err := labeled.NewHeldOut(labeled.HeldOut{Seed: cfg.Seed, Start: start, Duration: cfg.Duration,
		Legit: cfg.Legit, Abusive: cfg.Abusive, RFC3986Routes: cfg.RFC3986Routes, Prefix: prefix})
	if err != nil {
		return res, err
	}
	res.Harm = MeasureHarm(again, again.Labels(), all, cfg.HarmDelay)
	return res, nil
}

// score compares detections with the labels.
func score(res *Result, labels map[string]*labeled.Label, first map[string]events.Abuse, penalized map[string]bool, prefix string) {
	fams := map[string]*Family{}
	lat := map[string][]time.Duration{}
	byPat := map[events.Pattern]*PatternResult{}
	patLat := map[events.Pattern][]time.Duration{}
	var rate, fan []time.Duration
	res.detected = map[string]events.Pattern{}
	for k, l := range labels {
		f := fams[l.Family]
		if f == nil {
			f = &Family{Name: l.Family, Abusive: l.Abusive, Pattern: l.Pattern, Patterns: map[events.Pattern]int{}}
			fams[l.Family] = f
		}
		f.Principals++
		a, hit := first[k]
		if hit {
			f.Detected++
			f.Patterns[a.Pattern]++
			res.detected[strings.TrimPrefix(l.Principal.ID, prefix)] = a.Pattern
			if a.Pattern == l.Pattern {
				f.AsExpected++
			}
		}
		pen := penalized[k]
		if pen {
			f.Penalized++
		}
		if l.Abusive {
			res.Abusive++
			pr := byPat[l.Pattern]
			if pr == nil {
				pr = &PatternResult{Pattern: l.Pattern}
				byPat[l.Pattern] = pr
			}
			pr.Principals++
			if pen {
				res.Caught++
				pr.Penalized++
			}
			if hit && a.Pattern == l.Pattern {
				pr.AsExpected++
			}
			if hit && !l.AbuseStart.IsZero() {
				patLat[l.Pattern] = append(patLat[l.Pattern], a.DetectedAt.Sub(l.AbuseStart))
			}
			if hit && !l.AbuseStart.IsZero() {
				dl := a.DetectedAt.Sub(l.AbuseStart)
				lat[l.Family] = append(lat[l.Family], dl)
				if l.Pattern == events.PatternDistributedIP {
					fan = append(fan, dl)
				} else {
					rate = append(rate, dl)
				}
			}
		} else {
			res.Legit++
			if pen {
				res.LegitPenalized++
			}
			if hit {
				res.LegitDetected++
				if len(res.FalseExamples) < 10 {
					res.FalseExamples = append(res.FalseExamples, fmt.Sprintf("%s (%s, %s, score %.2f)", strings.TrimPrefix(k, string(l.Principal.Kind)+":"+prefix), l.Family, a.Pattern, a.Score))
				}
			}
		}
	}
	for name, f := range fams {
		f.LatP50, f.LatP99 = Quantile(lat[name], 0.5), Quantile(lat[name], 0.99)
		res.Families = append(res.Families, *f)
	}
	sort.Slice(res.Families, func(i, j int) bool {
		a, b := res.Families[i], res.Families[j]
		return familyLess(a.Abusive, a.Name, b.Abusive, b.Name)
	})
	for p, pr := range byPat {
		pr.LatP50, pr.LatP99 = Quantile(patLat[p], 0.5), Quantile(patLat[p], 0.99)
		res.Patterns = append(res.Patterns, *pr)
	}
	sort.Slice(res.Patterns, func(i, j int) bool { return res.Patterns[i].Pattern < res.Patterns[j].Pattern })
	res.RateP50, res.RateP99 = Quantile(rate, 0.5), Quantile(rate, 0.99)
	res.FanOutP50, res.FanOutP99 = Quantile(fan, 0.5), Quantile(fan, 0.99)
}

// familyLess orders families legitimate first, then by name.
func familyLess(abusiveA bool, nameA string, abusiveB bool, nameB string) bool {
	if abusiveA != abusiveB {
		return !abusiveA
	}
	return nameA < nameB
}

// Quantile is the q-quantile (nearest rank) of ds; 0 when empty.
func Quantile(ds []time.Duration, q float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[min(len(s)-1, int(q*float64(len(s))))]
}

// startDetectors starts n detector processes in one consumer group; the
// returned stop sends SIGTERM and waits (SIGKILL after 20 s).
func startDetectors(cfg Config, n int, run, decTopic, abuseTopic, group string) (func(), error) {
	env := append(os.Environ(),
		"FLOODGATE_KAFKA_BROKERS="+strings.Join(cfg.Brokers, ","),
		"FLOODGATE_REDIS_ADDRS="+strings.Join(cfg.RedisAddrs, ","),
		"FLOODGATE_DECISIONS_TOPIC="+decTopic,
		"FLOODGATE_ABUSE_TOPIC="+abuseTopic,
		"FLOODGATE_DETECTOR_GROUP="+group,
		"FLOODGATE_PAGER_GROUP="+run+"-pager",
		"FLOODGATE_DETECTOR_ADDR=127.0.0.1:0",
		"FLOODGATE_DETECTOR_START_OFFSET=first",
		"FLOODGATE_PAGERDUTY_ROUTING_KEY=",
		// Escalation history and allowlists live in DynamoDB; they change
		// TTLs, not which principals are detected.
		"FLOODGATE_DETECTOR_RECORDS=off",
		// The blast-radius guard (100 per pattern per minute per instance)
		// would turn most labeled abusers into simulations.
		"FLOODGATE_DETECTOR_BLAST_LIMIT=1000000000",
		// The stream's event times run up to Duration ahead of the wall
		// clock; the detector dead-letters events further ahead than its
		// skew limit (5m by default).
		"FLOODGATE_DETECTOR_MAX_EVENT_SKEW="+(cfg.Duration+time.Minute).String(),
	)
	env = append(env, cfg.Env...)
	var cmds []*exec.Cmd
	var files []*os.File
	stop := func() {
		cli.StopAll(cmds, 20*time.Second)
		for _, f := range files {
			_ = f.Close()
		}
	}
	for i := 0; i < n; i++ {
		f, err := os.Create(filepath.Join(cfg.LogDir, run+"-detector-"+strconv.Itoa(i)+".log"))
		if err != nil {
			stop()
			return nil, fmt.Errorf("detector log: %w", err)
		}
		files = append(files, f)
		c := exec.Command(cfg.DetectorBin)
		c.Env, c.Stdout, c.Stderr = env, f, f
		if err := c.Start(); err != nil {
			stop()
			return nil, fmt.Errorf("start detector: %w", err)
		}
		cmds = append(cmds, c)
	}
	return stop, nil
}

// groupLag is the decisions not yet committed by group, summed over partitions.
func groupLag(ctx context.Context, admin *kafka.Client, topic, group string, partitions int) (int64, error) {
	req := &kafka.ListOffsetsRequest{Topics: map[string][]kafka.OffsetRequest{}}
	parts := make([]int, partitions)
	for p := range parts {
		parts[p] = p
		req.Topics[topic] = append(req.Topics[topic], kafka.LastOffsetOf(p))
	}
	ends, err := admin.ListOffsets(ctx, req)
	if err != nil {
		return 0, fmt.Errorf("list offsets: %w", err)
	}
	got, err := admin.OffsetFetch(ctx, &kafka.OffsetFetchRequest{GroupID: group, Topics: map[string][]int{topic: parts}})
	if err != nil {
		return 0, fmt.Errorf("fetch offsets: %w", err)
	}
	commit := map[int]int64{}
	for _, po := range got.Topics[topic] {
		if po.CommittedOffset > 0 {
			commit[po.Partition] = po.CommittedOffset
		}
	}
	var lag int64
	for _, po := range ends.Topics[topic] {
		if po.Error != nil {
			return 0, fmt.Errorf("list offsets %s/%d: %w", topic, po.Partition, po.Error)
		}
		lag += po.LastOffset - commit[po.Partition]
	}
	return lag, nil
}

// readAbuse reads every abuse.v1 event on topic, per principal key, in
// detected_at order (the first detection first).
func readAbuse(ctx context.Context, brokers []string, sec *stream.Security, topic string) (map[string][]events.Abuse, error) {
	all := map[string][]events.Abuse{}
	var derr error
	err := kafkascan.All(ctx, sec.Client(brokers, 10*time.Second), topic, func(m kafka.Message) bool {
		a, err := events.DecodeAbuse(m.Value)
		if err != nil {
			derr = fmt.Errorf("decode abuse at %s/%d@%d: %w", topic, m.Partition, m.Offset, err)
			return false
		}
		k := a.Principal.Key()
		all[k] = append(all[k], a)
		return true
	})
	if err != nil {
		return nil, err
	}
	if derr != nil {
		return nil, derr
	}
	for _, as := range all {
		sort.SliceStable(as, func(i, j int) bool { return as[i].DetectedAt.Before(as[j].DetectedAt) })
	}
	return all, nil
}
