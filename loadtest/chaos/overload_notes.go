package chaos

// The overload scenarios' readings and notes: the limiters' metrics
// scraped around a phase, this process's own, and how they are said.

import (
	"context"
	"fmt"
	"math"
	"os"
	"runtime/metrics"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/floodgate-dev/floodgate/loadtest/internal/cputime"
	"github.com/floodgate-dev/floodgate/loadtest/internal/promtext"
)

// spread is a sample's median and range, and its values in order of
// measurement ("median 88 (45–107): 86, 48, …").
func spread(v []float64) string {
	if len(v) == 0 {
		return "none"
	}
	sorted := slices.Sorted(slices.Values(v))
	med := sorted[len(sorted)/2]
	if len(sorted)%2 == 0 {
		med = (sorted[len(sorted)/2-1] + med) / 2
	}
	each := make([]string, len(v))
	for i, x := range v {
		each[i] = fmt.Sprintf("%.0f", x)
	}
	return fmt.Sprintf("median %.0f (%.0f–%.0f): %s", med, sorted[0], sorted[len(sorted)-1], strings.Join(each, ", "))
}

// answeredInTime reports whether c was answered, a decision, within the
// caller's deadline.
func answeredInTime(c Check) bool { return c.OK && c.Latency <= overloadDeadline }

// seriesByLabel reads metric's series whose label is each of values from
// the service (absent: 0).
func seriesByLabel(ctx context.Context, lim *Service, metric, label string, values ...string) map[string]float64 {
	out := map[string]float64{}
	e, err := lim.Metrics(ctx)
	if err != nil {
		return out
	}
	for _, v := range values {
		out[v], _ = e.Sum(fmt.Sprintf("%s{%s=%q}", metric, label, v))
	}
	return out
}

// canceledCalls is how many ShouldRateLimit calls the limiters have counted
// as reset by their callers before they were run: not through the entry
// gate, whose own cancellations its note gives, but before dispatch
// (grpcfast.Config.Abandoned).
func canceledCalls(ctx context.Context, limiters []*Service) float64 {
	var n float64
	for _, lim := range limiters {
		e, err := lim.Metrics(ctx) // one scrape: each costs the limiter CPU it is short of
		if err != nil {
			continue
		}
		all, _ := e.Sum(`floodgate_limiter_envoy_requests_total{result="canceled"}`)
		gate, _ := e.Sum(`floodgate_limiter_grpc_gate_left_total{outcome="canceled"}`)
		n += all - gate
	}
	return n
}

// schedNote says how long the limiter's goroutines waited for its CPU
// between two scrapes of go_sched_latencies_seconds (the runtime samples
// the waits; its buckets are coarse): the share over about 1 ms and over
// about 10 ms, and the bound every wait fell under.
func schedNote(from, to []promtext.Bucket) string {
	return tailNote("waits for the CPU (the runtime's sample)", from, to, 0.0009, 0.01)
}

// checkNote reads the limiter's floodgate_limiter_check_seconds between two
// scrapes: how long deciding a check took once its call reached the engine
// (the Redis round trip included, the wait to be read and to be written
// not), to tell a CRITICAL call's lateness inside the limiter's decision
// from its lateness before and after it.
func checkNote(from, to []promtext.Bucket) string {
	return tailNote("checks decided by the engine (floodgate_limiter_check_seconds, Redis round trip included)", from, to, 0.01, 0.025)
}

// tailNote says what a histogram observed between two scrapes: how many,
// the share over each of limits (ascending; each read as the first bucket
// bound at or over it) and the bound every observation fell under.
func tailNote(what string, from, to []promtext.Bucket, limits ...float64) string {
	if len(to) == 0 || len(from) != len(to) {
		return what + ": not read"
	}
	bound := func(s float64) string {
		if math.IsInf(s, 1) {
			return "+Inf"
		}
		return ms(seconds(s))
	}
	total := to[len(to)-1].Count - from[len(from)-1].Count
	note := fmt.Sprintf("%s: %.0f", what, total)
	all := ""
	for i, limit := range limits {
		n, b, most := promtext.Above(from, to, limit)
		note += fmt.Sprintf(", %.2f %% over %s", 100*n/max(total, 1), bound(b))
		if i == 0 {
			all = bound(b) // none over the first limit: all under its bound
			if n > 0 {
				all = bound(most)
			}
		}
	}
	return note + ", all under " + all
}

// checkSeconds is one scrape of the limiter's check-time histogram.
func checkSeconds(ctx context.Context, lim *Service) []promtext.Bucket {
	return lim.Buckets(ctx, "floodgate_limiter_check_seconds")
}

// ownSchedLatencies is this process's go_sched_latencies_seconds, from
// runtime/metrics: how long the load generator's own goroutines waited for
// a CPU — a caller's latency includes its wait to read the answer.
func ownSchedLatencies() []promtext.Bucket {
	sample := []metrics.Sample{{Name: "/sched/latencies:seconds"}}
	metrics.Read(sample)
	if sample[0].Value.Kind() != metrics.KindFloat64Histogram {
		return nil
	}
	h := sample[0].Value.Float64Histogram()
	out := make([]promtext.Bucket, len(h.Counts))
	var n float64
	for i, c := range h.Counts {
		n += float64(c)
		out[i] = promtext.Bucket{LE: h.Buckets[i+1], Count: n} // cumulative, by upper bound, as the exposition has them
	}
	return out
}

// startProfiles takes a CPU profile of the limiter (its pprof listener at
// debugAddr) and of this process for d, into prefix-limiter.pprof and
// prefix-generator.pprof; the returned func waits for both and says where
// they are (or why not).
func startProfiles(ctx context.Context, debugAddr, prefix string, d time.Duration) func() string {
	d = max(d, time.Second)
	var limErr error
	done := make(chan struct{})
	go func() {
		defer close(done)
		limErr = cputime.Profile(ctx, fmt.Sprintf("http://%s/debug/pprof/profile?seconds=%d", debugAddr, int(d.Seconds())), prefix+"-limiter.pprof")
	}()
	f, err := os.Create(prefix + "-generator.pprof")
	genErr := err
	if err == nil {
		if genErr = pprof.StartCPUProfile(f); genErr != nil {
			_ = f.Close()
		}
	}
	return func() string {
		if genErr == nil {
			pprof.StopCPUProfile()
			genErr = f.Close()
		}
		<-done
		if limErr != nil || genErr != nil {
			return fmt.Sprintf("profiles: limiter %v, generator %v", limErr, genErr)
		}
		return "profiles " + prefix + "-{limiter,generator}.pprof"
	}
}

func invalidNote(genSaturated bool) string {
	if genSaturated {
		return " — INVALID: the generator, Redis and the broker used over 90 % of their core"
	}
	return ""
}

func metOrNot(ok bool) string {
	if ok {
		return "met"
	}
	return "missed"
}

func pct(n, of int) float64 {
	if of == 0 {
		return 0
	}
	return 100 * float64(n) / float64(of)
}

// peakRSS is the process's peak resident set (VmHWM).
func peakRSS(pid int) (int64, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0, fmt.Errorf("read status: %w", err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			return kb << 10, err
		}
	}
	return 0, fmt.Errorf("no VmHWM in /proc/%d/status", pid)
}
