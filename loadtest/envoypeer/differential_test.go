package envoypeer

import (
	"bytes"
	"cmp"
	"context"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/redis/go-redis/v9"
	"github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/floodgate-dev/floodgate/pkg/events"
	"github.com/floodgate-dev/floodgate/pkg/kafkatest"
	"github.com/floodgate-dev/floodgate/pkg/limiter/limitertest"
	"github.com/floodgate-dev/floodgate/pkg/stacktest"
)

// call is one ShouldRateLimit request of a sequence.
type call struct {
	domain string
	descs  []*rlcommon.RateLimitDescriptor
	hits   uint32
}

var d = limitertest.Descriptor

func times(n int, c call) []call { return slices.Repeat([]call{c}, n) }

// TestDifferentialAgainstEnvoyRatelimit runs envoy ratelimit (built from the
// module proxy at a pinned version) and Floodgate's limiter with the same
// envoy ratelimit configuration directory and the same Redis, sends both the
// same call sequences — every case of envoy ratelimit's configuration
// documentation, plus hits_addend, descriptor limit overrides, shadow and
// quota mode, wildcards, share_threshold and replaces, on limits with and
// without floodgate comments that keep envoy ratelimit's algorithm, and a
// domain no file configures, plain and with a limit override — and requires
// identical answers: overall code, per-descriptor code, current limit (name,
// requests per unit, unit), limit remaining, time until reset, and the
// response headers of LIMIT_RESPONSE_HEADERS_ENABLED.
func TestDifferentialAgainstEnvoyRatelimit(t *testing.T) {
	ctx, root, bin := setup(t)

	run, cfgDir := newRun(t, root)
	peer := startPeer(ctx, t, bin, cfgDir, "envoypeer_"+run+"_", nil)
	// Floodgate publishes a decision event for every call that names a
	// principal (FLOODGATE_LIMITER_ENVOY_PRINCIPAL_KEYS on, the default),
	// reads its penalty with the counters and applies the scales: with none
	// in force the answers must still be envoy ratelimit's. Its events go to
	// a topic of this run's own.
	fg, _ := startLimiter(t, cfgDir, "envoypeer."+run)

	peerC, fgC := client(t, peer.GRPCAddr), client(t, fg)
	tally := answerAlike(ctx, t, run, peerC, func(int) answerer { return answerer{fgC, "Floodgate"} })
	require.Greater(t, tally.compared, 40)
	require.Greater(t, tally.withHeaders, 30, "answers with RateLimit-* headers compared")
	// The directory, floodgate comments included (misc.yaml: azure and
	// hour_key keep the fixed window with a fail policy, gcra_key is GCRA),
	// loaded in envoy ratelimit unchanged.
	require.Empty(t, peer.ConfigError(), "envoy ratelimit refused the configuration")

	// The 11 calls that name a principal (user: shadow mode 3, replaces 5;
	// remote_address: most specific match 3) are decision events on the broker.
	r := kafka.NewReader(kafka.ReaderConfig{Brokers: []string{"127.0.0.1:9092"}, Topic: "envoypeer." + run, Partition: 0, MaxWait: 100 * time.Millisecond})
	defer r.Close()
	rctx, rcancel := context.WithTimeout(ctx, 30*time.Second)
	defer rcancel()
	kinds := map[events.PrincipalKind]int{}
	for range 11 {
		m, err := r.ReadMessage(rctx)
		require.NoError(t, err, "events read: %v", kinds)
		ev, err := events.DecodeDecision(m.Value)
		require.NoError(t, err)
		require.NotNil(t, ev.Envoy)
		require.True(t, strings.HasSuffix(ev.Envoy.Domain, "_"+run), ev.Envoy.Domain)
		kinds[ev.Principal.Kind]++
	}
	require.Equal(t, map[events.PrincipalKind]int{events.PrincipalUser: 8, events.PrincipalAnonymous: 3}, kinds)
}

// TestFleetMovesFromEnvoyRatelimitWithoutWindowsStartingAgain moves a fleet
// the way an operator does, a few gateways at a time: envoy ratelimit and
// Floodgate (FLOODGATE_LIMITER_ENVOY_KEYS=envoy_ratelimit, envoy ratelimit's
// CACHE_KEY_PREFIX) on one Redis, every sequence's calls alternating
// between them, must answer exactly as one envoy ratelimit answers the
// whole sequence alone — each counts on from the other's hits. In
// Floodgate's own keys the two would count apart and every answer after
// the first would differ.
func TestFleetMovesFromEnvoyRatelimitWithoutWindowsStartingAgain(t *testing.T) {
	ctx, root, bin := setup(t)

	run, cfgDir := newRun(t, root)
	alone := startPeer(ctx, t, bin, cfgDir, "alone_"+run+"_", nil)
	shared := "moving_" + run + "_"
	old := startPeer(ctx, t, bin, cfgDir, shared, nil)
	fg, _ := startLimiter(t, cfgDir, "envoypeer.moving."+run,
		"FLOODGATE_LIMITER_ENVOY_KEYS=envoy_ratelimit", "FLOODGATE_LIMITER_ENVOY_CACHE_KEY_PREFIX="+shared)

	aloneC, fleet := client(t, alone.GRPCAddr), []rlsv3.RateLimitServiceClient{client(t, old.GRPCAddr), client(t, fg)}
	tally := answerAlike(ctx, t, run, aloneC, func(i int) answerer {
		return [2]answerer{{fleet[0], "envoy ratelimit"}, {fleet[1], "Floodgate"}}[i%2]
	})
	require.Greater(t, tally.compared, 40)
	require.Greater(t, tally.counted, 25, "answers after a sequence's first that depend on a counter")
	require.Empty(t, old.ConfigError(), "envoy ratelimit refused the configuration")
}

// TestDifferentialGlobalModes compares envoy ratelimit's global switches,
// SHADOW_MODE (the overall code always OK) and QUOTA_MODE (every limit in
// quota mode, descriptor limit overrides included), with Floodgate's
// FLOODGATE_LIMITER_ENVOY_SHADOW_MODE and _QUOTA_MODE: every sequence of the
// differential test must get the same answers.
func TestDifferentialGlobalModes(t *testing.T) {
	ctx, root, bin := setup(t)
	for _, mode := range []struct{ peer, floodgate string }{
		{"SHADOW_MODE", "FLOODGATE_LIMITER_ENVOY_SHADOW_MODE"},
		{"QUOTA_MODE", "FLOODGATE_LIMITER_ENVOY_QUOTA_MODE"},
	} {
		t.Run(mode.peer, func(t *testing.T) {
			run, cfgDir := newRun(t, root)
			peer := startPeer(ctx, t, bin, cfgDir, "global_"+run+"_", map[string]string{mode.peer: "true"})
			fgAddr, _ := startLimiter(t, cfgDir, "envoypeer.global."+run, mode.floodgate+"=true")
			fg := client(t, fgAddr)
			n := answerAlike(ctx, t, run, client(t, peer.GRPCAddr), func(int) answerer { return answerer{fg, "Floodgate"} })
			require.Greater(t, n.compared, 40)
			require.Zero(t, n.overLimit, "no call fails in either mode")
			if mode.peer == "SHADOW_MODE" {
				require.Greater(t, n.descOver, 10, "descriptors over their limit, the call OK")
			} else {
				require.Zero(t, n.descOver)
				require.Greater(t, n.descQuota, 10, "descriptors over their limit, answered OK by quota mode")
			}
			require.Empty(t, peer.ConfigError())
		})
	}
}

// TestDifferentialCounters compares the settings of envoy ratelimit that
// change what is counted, not what is answered, with Floodgate's:
// LOCAL_CACHE_SIZE_IN_BYTES (a counter over its limit is answered from the
// process, not counted, until its window ends;
// FLOODGATE_LIMITER_ENVOY_LOCAL_CACHE_ENTRIES) and
// STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT (a call one counter denies does
// not increment the others; FLOODGATE_LIMITER_ENVOY_STOP_INCREMENT_WHEN_OVER_LIMIT),
// each alone and together. Both services count in envoy ratelimit's key
// format, each under a prefix of its own, so that after every sequence each
// counter can be read from both: the same answers, and the same count in
// every counter.
func TestDifferentialCounters(t *testing.T) {
	ctx, root, bin := setup(t)
	for _, c := range []struct {
		name   string
		peer   map[string]string
		fg     []string
		metric string // a per-descriptor outcome Floodgate must have counted
	}{
		{"local cache", map[string]string{"LOCAL_CACHE_SIZE_IN_BYTES": "1048576"},
			[]string{"FLOODGATE_LIMITER_ENVOY_LOCAL_CACHE_ENTRIES=1000"}, "over_limit_with_local_cache"},
		{"stop increment when over limit", map[string]string{"STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT": "true"},
			[]string{"FLOODGATE_LIMITER_ENVOY_STOP_INCREMENT_WHEN_OVER_LIMIT=true"}, ""},
		{"both", map[string]string{"LOCAL_CACHE_SIZE_IN_BYTES": "1048576", "STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT": "true"},
			[]string{"FLOODGATE_LIMITER_ENVOY_LOCAL_CACHE_ENTRIES=1000", "FLOODGATE_LIMITER_ENVOY_STOP_INCREMENT_WHEN_OVER_LIMIT=true"}, "over_limit_with_local_cache"},
	} {
		t.Run(c.name, func(t *testing.T) {
			run, cfgDir := newRun(t, root)
			peerPrefix, fgPrefix := "peercount_"+run+"_", "fgcount_"+run+"_"
			// No jitter on envoy ratelimit's expiry (its default adds up
			// to 300 s): its per-second counters expire as Floodgate's do,
			// and requireSameCounts leaves them out.
			env := maps.Clone(c.peer)
			env["EXPIRATION_JITTER_MAX_SECONDS"] = "0"
			peer := startPeer(ctx, t, bin, cfgDir, peerPrefix, env)
			fgAddr, fgHTTP := startLimiter(t, cfgDir, "envoypeer.counters."+run, append([]string{"FLOODGATE_LIMITER_ENVOY_KEYS=envoy_ratelimit",
				"FLOODGATE_LIMITER_ENVOY_CACHE_KEY_PREFIX=" + fgPrefix}, c.fg...)...)

			n := answerAlike(ctx, t, run, client(t, peer.GRPCAddr), func(int) answerer { return answerer{client(t, fgAddr), "Floodgate"} })
			require.Greater(t, n.compared, 40)
			require.Greater(t, n.overLimit, 5)
			requireSameCounts(ctx, t, peerPrefix, fgPrefix)
			if c.metric != "" {
				res, err := http.Get("http://" + fgHTTP + "/metrics")
				require.NoError(t, err)
				defer res.Body.Close()
				metrics, err := io.ReadAll(res.Body)
				require.NoError(t, err)
				require.Regexp(t, `(?m)^floodgate_limiter_envoy_descriptor_hits_total\{[^}]*outcome="`+c.metric+`"[^}]*\} [1-9]`, string(metrics))
			}
			require.Empty(t, peer.ConfigError())
		})
	}
}

// TestDifferentialDescriptorStats compares envoy ratelimit's per-descriptor
// stats (its Prometheus sink: ratelimit_service_rate_limit_{total_hits,
// within_limit,near_limit,over_limit,shadow_mode}{domain,key1,key2}) with
// floodgate_limiter_envoy_descriptor_hits_total after every sequence of the
// differential test, at NEAR_LIMIT_RATIO's default and at 0.5
// (FLOODGATE_LIMITER_ENVOY_NEAR_LIMIT_RATIO): the same count for every
// descriptor and outcome.
func TestDifferentialDescriptorStats(t *testing.T) {
	ctx, root, bin := setup(t)
	for _, ratio := range []string{"", "0.5"} {
		t.Run("ratio "+cmp.Or(ratio, "default"), func(t *testing.T) {
			run, cfgDir := newRun(t, root)
			promAddr := stacktest.FreeAddr(t)
			peerEnv := map[string]string{"USE_PROMETHEUS": "true", "PROMETHEUS_ADDR": promAddr, "STATS_FLUSH_INTERVAL": "100ms"}
			var fgEnv []string
			if ratio != "" {
				peerEnv["NEAR_LIMIT_RATIO"] = ratio
				fgEnv = append(fgEnv, "FLOODGATE_LIMITER_ENVOY_NEAR_LIMIT_RATIO="+ratio)
			}
			peer := startPeer(ctx, t, bin, cfgDir, "stats_"+run+"_", peerEnv)
			waitListen(t, promAddr, peer.Logs)
			fgAddr, fgHTTP := startLimiter(t, cfgDir, "envoypeer.stats."+run, fgEnv...)
			answerAlike(ctx, t, run, client(t, peer.GRPCAddr), func(int) answerer { return answerer{client(t, fgAddr), "Floodgate"} })
			time.Sleep(500 * time.Millisecond) // envoy ratelimit's stats flush every 100 ms

			outcomes := map[string]string{"total_hits": "total", "within_limit": "within_limit", "near_limit": "near_limit",
				"over_limit": "over_limit", "shadow_mode": "shadow_mode"}
			// envoy ratelimit's names join a descriptor's levels with dots and
			// write a dot in a value as "_": both sides are compared with
			// every dot as "_".
			flat := func(domain, desc, outcome string) string {
				return domain + " " + strings.ReplaceAll(desc, ".", "_") + " " + outcome
			}
			want := map[string]float64{} // domain descriptor outcome → hits
			for _, sm := range scrape(t, "http://"+promAddr+"/metrics") {
				outcome, ok := outcomes[strings.TrimPrefix(sm.name, "ratelimit_service_rate_limit_")]
				if !ok || !strings.HasSuffix(sm.labels["domain"], "_"+run) {
					continue
				}
				desc := sm.labels["key1"]
				if k2 := sm.labels["key2"]; k2 != "" {
					desc += "." + k2
				}
				want[flat(sm.labels["domain"], desc, outcome)] = sm.value
			}
			got := map[string]float64{}
			for _, sm := range scrape(t, "http://"+fgHTTP+"/metrics") {
				if sm.name == "floodgate_limiter_envoy_descriptor_hits_total" {
					got[flat(sm.labels["domain"], sm.labels["descriptor"], sm.labels["outcome"])] = sm.value
				}
			}
			compared, near := 0, 0
			for k, v := range want {
				if v == 0 {
					continue
				}
				require.Equal(t, v, got[k], "%s", k)
				compared++
				if strings.HasSuffix(k, " near_limit") {
					near++
				}
			}
			t.Logf("%d series compared, %d of them near_limit", compared, near)
			require.Greater(t, compared, 20, "series compared")
			require.Greater(t, near, 2, "near_limit series compared")
			require.Empty(t, peer.ConfigError())
		})
	}
}

// sample is one series of a Prometheus text exposition.
type sample struct {
	name   string
	labels map[string]string
	value  float64
}

var (
	sampleRE = regexp.MustCompile(`^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$`)
	labelRE  = regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"`)
)

// scrape reads url's exposition.
func scrape(t *testing.T, url string) []sample {
	t.Helper()
	res, err := http.Get(url)
	require.NoError(t, err)
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	require.NoError(t, err)
	var out []sample
	for _, line := range strings.Split(string(b), "\n") {
		m := sampleRE.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		v, err := strconv.ParseFloat(m[3], 64)
		if err != nil {
			continue
		}
		sm := sample{name: m[1], labels: map[string]string{}, value: v}
		for _, l := range labelRE.FindAllStringSubmatch(m[2], -1) {
			sm.labels[l[1]] = l[2]
		}
		out = append(out, sm)
	}
	return out
}

// requireSameCounts requires every counter under peerPrefix to hold the
// count of the same counter under fgPrefix. Counters with under 10 s to
// live are left out (per-second ones, without envoy ratelimit's expiry
// jitter): they may expire while they are read.
func requireSameCounts(ctx context.Context, t *testing.T, peerPrefix, fgPrefix string) {
	t.Helper()
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"})
	defer rdb.Close()
	keys, err := rdb.Keys(ctx, peerPrefix+"*").Result()
	require.NoError(t, err)
	compared := 0
	for _, k := range keys {
		ttl, err := rdb.PTTL(ctx, k).Result()
		if err != nil || ttl < 10*time.Second {
			continue
		}
		want, err := rdb.Get(ctx, k).Result()
		require.NoError(t, err)
		got, err := rdb.Get(ctx, fgPrefix+strings.TrimPrefix(k, peerPrefix)).Result()
		require.NoError(t, err, "Floodgate's counter of %s (envoy ratelimit's: %s, %v to live)", k, want, ttl)
		require.Equal(t, want, got, "the count of %s", strings.TrimPrefix(k, peerPrefix))
		compared++
	}
	require.Greater(t, compared, 12, "counters compared (of %d)", len(keys))
}

// TestDifferentialOverJSON compares envoy ratelimit's POST /json, its
// endpoint for clients that cannot speak gRPC, with Floodgate's on the check
// API: every sequence of the differential test must get the same answers,
// with the same HTTP statuses (200 OK, 429 OVER_LIMIT, 500 UNKNOWN:
// limitertest.JSONClient checks them), and a refusal where envoy ratelimit
// refuses.
func TestDifferentialOverJSON(t *testing.T) {
	ctx, root, bin := setup(t)
	run, cfgDir := newRun(t, root)
	peer := startPeer(ctx, t, bin, cfgDir, "json_"+run+"_", nil)
	_, fgHTTP := startLimiter(t, cfgDir, "envoypeer.json."+run)

	fg := answerer{limitertest.JSONClient{URL: "http://" + fgHTTP}, "Floodgate over /json"}
	n := answerAlike(ctx, t, run, limitertest.JSONClient{URL: "http://" + peer.HTTPAddr}, func(int) answerer { return fg })
	require.Greater(t, n.compared, 40)
	require.Greater(t, n.overLimit, 5, "answers 429 OVER_LIMIT compared")
	require.Greater(t, n.withHeaders, 30, "answers with RateLimit-* headers compared")
	require.Empty(t, peer.ConfigError())
}

// answerer is a service under comparison, by name.
type answerer struct {
	rlsv3.RateLimitServiceClient
	name string
}

// tally counts the answers answerAlike compared: those with RateLimit-*
// headers, those after a sequence's first call that carry a limit (a
// counter's answer), and those OVER_LIMIT overall; and of their
// descriptors, those OVER_LIMIT and those quota mode let through (OK, a
// limit, nothing remaining, no reset).
type tally struct{ compared, withHeaders, counted, overLimit, descOver, descQuota int }

// answerAlike sends every call sequence to want and to the service by(i)
// names for call i, and requires the same answers (summary) and the same
// errors.
func answerAlike(ctx context.Context, t *testing.T, run string, want rlsv3.RateLimitServiceClient, by func(i int) answerer) tally {
	var n tally
	for name, seq := range sequences(run) {
		t.Run(name, func(t *testing.T) {
			alignWindow()
			for i, c := range seq {
				req := &rlsv3.RateLimitRequest{Domain: c.domain, Descriptors: c.descs, HitsAddend: c.hits}
				a := by(i)
				w, werr := want.ShouldRateLimit(ctx, req)
				got, gerr := a.ShouldRateLimit(ctx, req)
				if werr != nil || gerr != nil {
					require.Error(t, werr, "call %d: the reference answered, %s said %v", i, a.name, gerr)
					require.Error(t, gerr, "call %d: the reference failed (%v), %s answered %v", i, werr, a.name, got)
					continue
				}
				require.Equal(t, summary(w), summary(got), "call %d of %q, answered by %s", i, name, a.name)
				n.compared++
				if len(got.GetResponseHeadersToAdd()) > 0 {
					n.withHeaders++
				}
				if i > 0 && slices.ContainsFunc(got.GetStatuses(), func(s *rlsv3.RateLimitResponse_DescriptorStatus) bool { return s.GetCurrentLimit() != nil }) {
					n.counted++
				}
				if got.GetOverallCode() == rlsv3.RateLimitResponse_OVER_LIMIT {
					n.overLimit++
				}
				for _, st := range got.GetStatuses() {
					switch {
					case st.GetCode() == rlsv3.RateLimitResponse_OVER_LIMIT:
						n.descOver++
					case st.GetCurrentLimit() != nil && st.GetLimitRemaining() == 0 && st.GetDurationUntilReset() == nil:
						n.descQuota++
					}
				}
			}
		})
	}
	return n
}

// setup is what every test here starts from: its context, the
// repository's root and envoy ratelimit's binary (installed once).
func setup(t *testing.T) (context.Context, string, string) {
	ctx := stacktest.Context(t, 5*time.Minute, "runs envoy ratelimit and the limiter against the local stack")
	root := stacktest.Root(t)
	bin, err := Install(ctx, filepath.Join(root, ".local", "bin"))
	require.NoError(t, err)
	return ctx, root, bin
}

// newRun names a run of its own and copies the configuration for it
// (configDir).
func newRun(t *testing.T, root string) (run, cfgDir string) {
	run = fmt.Sprint(time.Now().UnixNano())
	return run, configDir(t, root, run)
}

// configDir is a copy of pkg/envoyconf/testdata with every domain suffixed
// by "_"+run, so that runs never share counters.
func configDir(t *testing.T, root, run string) string {
	dir := t.TempDir()
	domainRE := regexp.MustCompile(`(?m)^domain: (\S+)$`)
	files, err := filepath.Glob(filepath.Join(root, "pkg", "envoyconf", "testdata", "*.yaml"))
	require.NoError(t, err)
	for _, f := range files {
		b, err := os.ReadFile(f)
		require.NoError(t, err)
		b = domainRE.ReplaceAll(b, []byte("domain: ${1}_"+run))
		require.NoError(t, os.WriteFile(filepath.Join(dir, filepath.Base(f)), b, 0o644))
	}
	return dir
}

// sequences are the call sequences the differential tests send, by name,
// for configDir(…, run)'s domains.
func sequences(run string) map[string][]call {
	dom := func(s string) string { return s + "_" + run }
	override := d("override_key", "v"+run)
	override.Limit = &rlcommon.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 2, Unit: typev3.RateLimitUnit_MINUTE}
	// A domain no file configures: envoy ratelimit answers OK without a
	// limit, a descriptor's own limit override included.
	unconfigured := "unconfigured_" + run
	unconfiguredOverride := d("user", "u"+run)
	unconfiguredOverride.Limit = &rlcommon.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 1, Unit: typev3.RateLimitUnit_MINUTE}
	withHits := d("azure", "hits")
	withHits.HitsAddend = wrapperspb.UInt64(3)
	return map[string][]call{
		"key and value; a value not configured": append(times(3, call{domain: dom("mongo_cps"), descs: []*rlcommon.RateLimitDescriptor{d("database", "users")}}),
			call{domain: dom("mongo_cps"), descs: []*rlcommon.RateLimitDescriptor{d("database", "other")}}),
		"nested key per value, and the top-level key, in one call": times(7, call{domain: dom("messaging"), descs: []*rlcommon.RateLimitDescriptor{
			d("message_type", "marketing", "to_number", "2061111111"), d("to_number", "2061111111")}}),
		"most specific match: a blocked address and another": {
			{domain: dom("edge_proxy_per_ip"), descs: []*rlcommon.RateLimitDescriptor{d("remote_address", "50.0.0.5")}},
			{domain: dom("edge_proxy_per_ip"), descs: []*rlcommon.RateLimitDescriptor{d("remote_address", "50.0.0.1")}},
			{domain: dom("edge_proxy_per_ip"), descs: []*rlcommon.RateLimitDescriptor{d("remote_address", "50.0.0.1")}},
		},
		"two levels; too long and too short descriptors": append(times(4, call{domain: dom("example"), descs: []*rlcommon.RateLimitDescriptor{d("key", "value", "subkey", "s")}}),
			call{domain: dom("example"), descs: []*rlcommon.RateLimitDescriptor{d("key", "value"), d("key", "value", "subkey", "s", "x", "y")}}),
		"unlimited and a per-minute limit":                          times(5, call{domain: dom("example"), descs: []*rlcommon.RateLimitDescriptor{d("ldap", "x"), d("azure", "y")}}),
		"shadow mode answers OK while counting":                     times(3, call{domain: dom("example"), descs: []*rlcommon.RateLimitDescriptor{d("service", "s", "user", "user-a"), d("service", "s", "user", "user-b")}}),
		"replaces lifts the named limit":                            times(5, call{domain: dom("example"), descs: []*rlcommon.RateLimitDescriptor{d("key_1", "value_1", "user", "bkthomps"), d("key_2", "value_2", "user", "bkthomps")}}),
		"trailing wildcard, one counter per value":                  times(4, call{domain: dom("example"), descs: []*rlcommon.RateLimitDescriptor{d("path", "/files/a.pdf"), d("path", "/files/b.pdf")}}),
		"share_threshold: one counter for all values":               {{domain: dom("example"), descs: []*rlcommon.RateLimitDescriptor{d("bucket", "shared-a")}}, {domain: dom("example"), descs: []*rlcommon.RateLimitDescriptor{d("bucket", "shared-b")}}, {domain: dom("example"), descs: []*rlcommon.RateLimitDescriptor{d("bucket", "shared-c")}}, {domain: dom("example"), descs: []*rlcommon.RateLimitDescriptor{d("bucket", "shared-d")}}},
		"quota mode reports the violation and never fails the call": times(3, call{domain: dom("example"), descs: []*rlcommon.RateLimitDescriptor{d("q", "hot"), d("azure", "quota")}}),
		"request hits_addend":                                       times(3, call{domain: dom("example"), hits: 2, descs: []*rlcommon.RateLimitDescriptor{d("hour_key", "h")}}),
		"descriptor hits_addend":                                    times(2, call{domain: dom("example"), descs: []*rlcommon.RateLimitDescriptor{withHits}}),
		"descriptor limit override":                                 times(3, call{domain: dom("example"), descs: []*rlcommon.RateLimitDescriptor{override}}),
		"a descriptor that matches nothing":                         {{domain: dom("example"), descs: []*rlcommon.RateLimitDescriptor{d("nothing", "here")}}},
		"per-second limit inside one second":                        times(3, call{domain: dom("mongo_cps"), descs: []*rlcommon.RateLimitDescriptor{d("database", "default")}}),
		"an empty descriptor list is an error":                      {{domain: dom("example")}},
		"a domain with no configuration":                            times(2, call{domain: unconfigured, descs: []*rlcommon.RateLimitDescriptor{d("database", "users"), d("remote_address", "50.0.0.1")}}),
		"a domain with no configuration, with a limit override":     times(3, call{domain: unconfigured, descs: []*rlcommon.RateLimitDescriptor{unconfiguredOverride}}),
	}
}

// summary is the comparable part of an answer; time until reset in whole
// seconds (both read the clock a moment apart); the response headers
// (LIMIT_RESPONSE_HEADERS_ENABLED on both) in order.
func summary(r *rlsv3.RateLimitResponse) string {
	var b strings.Builder
	fmt.Fprintf(&b, "overall=%s", r.GetOverallCode())
	for _, h := range r.GetResponseHeadersToAdd() {
		fmt.Fprintf(&b, " %s: %s", h.GetKey(), h.GetValue())
	}
	for i, s := range r.GetStatuses() {
		fmt.Fprintf(&b, " | %d: %s remaining=%d", i, s.GetCode(), s.GetLimitRemaining())
		if l := s.GetCurrentLimit(); l != nil {
			fmt.Fprintf(&b, " limit=%q %d/%s", l.GetName(), l.GetRequestsPerUnit(), l.GetUnit())
		}
		if rs := s.GetDurationUntilReset(); rs != nil {
			fmt.Fprintf(&b, " reset=%ds", (rs.AsDuration()+500*time.Millisecond).Truncate(time.Second)/time.Second)
		}
	}
	return b.String()
}

// alignWindow waits until a sequence cannot straddle a window's edge: early in
// a second (per-second limits) and not in a minute's last ten seconds.
func alignWindow() {
	for {
		now := time.Now()
		if now.Second() < 50 && now.Nanosecond() < 200e6 {
			return
		}
		time.Sleep(time.Duration(1e9-now.Nanosecond()) + 20*time.Millisecond)
	}
}

func client(t *testing.T, addr string) rlsv3.RateLimitServiceClient {
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	return rlsv3.NewRateLimitServiceClient(conn)
}

// startLimiter runs the limiter binary with envoyDir's configuration,
// publishing to topic, with env added to its environment, and returns its
// gRPC and HTTP addresses.
func startLimiter(t *testing.T, envoyDir, topic string, env ...string) (grpcAddr, httpAddr string) {
	t.Helper()
	kafkatest.CreateTopic(t, "127.0.0.1:9092", topic, 1)
	bin := filepath.Join(stacktest.Build(t, "limiter"), "limiter")
	grpcAddr, httpAddr = stacktest.FreeAddr(t), stacktest.FreeAddr(t)
	lim := exec.Command(bin)
	lim.Env = append(os.Environ(), "FLOODGATE_LIMITER_ADDR="+httpAddr, "FLOODGATE_LIMITER_GRPC_ADDR="+grpcAddr,
		"FLOODGATE_LIMITER_ENVOY_CONFIG="+envoyDir, "FLOODGATE_LIMITER_PRINCIPAL_LIMIT=100", "FLOODGATE_LIMITER_INFLUX_INTERVAL=0",
		"FLOODGATE_JOURNAL_DIR="+t.TempDir(), "FLOODGATE_GATEWAY=envoy-differential", "FLOODGATE_LIMITER_ENVOY_RESPONSE_HEADERS=true",
		"FLOODGATE_DECISIONS_TOPIC="+topic)
	lim.Env = append(lim.Env, env...)
	var logs bytes.Buffer
	lim.Stdout, lim.Stderr = &logs, &logs
	require.NoError(t, lim.Start())
	t.Cleanup(func() {
		_ = lim.Process.Kill()
		_ = lim.Wait()
		if t.Failed() {
			t.Logf("limiter log:\n%s", logs.String())
		}
	})
	waitListen(t, grpcAddr, logs.String)
	return grpcAddr, httpAddr
}

// startPeer runs envoy ratelimit with cfgDir's configuration on the local
// Redis, its keys under prefix, with LIMIT_RESPONSE_HEADERS_ENABLED and env's
// settings, until the test ends; it returns once both its ports listen.
func startPeer(ctx context.Context, t *testing.T, bin, cfgDir, prefix string, env map[string]string) *Peer {
	t.Helper()
	all := map[string]string{"LIMIT_RESPONSE_HEADERS_ENABLED": "true"}
	maps.Copy(all, env)
	p, err := Start(ctx, Options{Bin: bin, ConfigDir: cfgDir, RedisAddr: "127.0.0.1:6379", KeyPrefix: prefix, Env: all})
	require.NoError(t, err)
	t.Cleanup(p.Stop)
	waitListen(t, p.HTTPAddr, p.Logs)
	return p
}

// waitListen waits up to 30 s for addr to take connections.
func waitListen(t *testing.T, addr string, logs func() string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		if c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond); err == nil {
			_ = c.Close()
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("nothing listened on %s: %s", addr, logs())
}
