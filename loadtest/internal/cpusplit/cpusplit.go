// Package cpusplit divides a CPU profile of the limiter into the parts of a
// call the per-core targets are argued from (docs/benchmarks.md): the
// transport a do-nothing server also pays (the gRPC or HTTP server and
// its codecs), the engine (pkg/limiter and its packages — the check API's
// request decoding and answer among them — and pkg/envoyconf), the Redis
// client, the decision event (building, encoding, the batcher, the
// journal, kafka-go), and the runtime's own scheduling, polling and
// garbage collection. Each sample goes to the part of the innermost frame
// of its stack that names one, so a write system call made by the Redis
// client is the Redis client's and one made answering the call is the
// transport's; a sample with no such frame is the runtime's or "other".
package cpusplit

import (
	"fmt"
	"os"
	"strings"

	"github.com/google/pprof/profile"
)

// Part is a share of the profile's CPU time.
type Part struct {
	Name  string
	Share float64 // of all the profile's CPU samples, 0..1
}

// A rule gives a part the functions whose names hold one of its prefixes
// (package path and function, as pprof names them).
type rule struct {
	part     string
	prefixes []string
}

// The parts of a limiter call, innermost first where a stack can hold
// several: the event's and the Redis client's frames sit below the
// engine's, the engine's below the transport's.
const (
	Event     = "decision event"
	Redis     = "Redis client"
	Engine    = "engine"
	Transport = "transport"
	GC        = "garbage collection"
	Scheduler = "runtime: scheduling and polling"
	Other     = "other"
)

const fg = "github.com/floodgate-dev/floodgate/"

// callRules give a part to the frames of a call's own code.
var callRules = []rule{
	{Event, []string{
		"github.com/segmentio/kafka-go",
		fg + "pkg/stream.", fg + "pkg/journal.", fg + "pkg/events.",
		fg + "pkg/limiter/server.(*Server).Emit", fg + "pkg/limiter/server.(*Server).emitAppend",
		fg + "pkg/limiter/server.(*Server).newScratch", fg + "pkg/limiter/server.DecisionEvent",
		fg + "pkg/limiter/server.NewDecisionID", fg + "pkg/limiter/server.MintDecisionID",
		fg + "pkg/limiter/envoyrls.envoyDecision", fg + "pkg/limiter/envoyrls.envoyUnavailable",
		fg + "pkg/limiter/envoyrls.envoyCall", fg + "pkg/limiter/envoyrls.eventText",
		fg + "pkg/limiter/envoyrls.(*EnvoyIdentity).identify", fg + "pkg/limiter/envoyrls.(*envoyWho).tiers",
		fg + "pkg/limiter/envoyrls.newEnvoyScratch", fg + "pkg/limiter/envoyrls.(*envoyScratch)",
	}},
	{Redis, []string{"github.com/redis/go-redis/", fg + "pkg/redisx."}},
	{Engine, []string{fg + "pkg/limiter", fg + "pkg/envoyconf."}},
	{Transport, []string{
		fg + "pkg/grpcfast.", fg + "pkg/h2guard.", fg + "pkg/httpapi.",
		"google.golang.org/grpc", "google.golang.org/protobuf", "golang.org/x/net/http2",
		"github.com/valyala/fasthttp", "net/http.",
	}},
}

// runtimeRules give the runtime's own work a part when no frame of a
// stack names a part of the call (a background mark worker's stack holds
// no frame of the program).
var runtimeRules = []rule{
	{GC, []string{"runtime.gcBgMarkWorker", "runtime.bgsweep", "runtime.bgscavenge", "runtime.gcStart", "runtime.forEachP"}},
	{Scheduler, []string{"runtime.mcall", "runtime.schedule", "runtime.findRunnable", "runtime.netpoll", "runtime.sysmon", "runtime.mstart", "runtime.goexit0", "runtime.park_m"}},
}

// Order is the parts in the order they are printed.
var Order = []string{Transport, Engine, Redis, Event, Scheduler, GC, Other}

// partOf is the part of a stack (innermost frame first): that of the
// first frame callRules name, else of the first runtimeRules name, else
// Other.
func partOf(stack []string) string {
	for _, rules := range [][]rule{callRules, runtimeRules} {
		for _, fn := range stack {
			for _, r := range rules {
				if hasPrefix(fn, r.prefixes) {
					return r.part
				}
			}
		}
	}
	return Other
}

func hasPrefix(s string, prefixes []string) bool {
	for _, p := range prefixes {
		if strings.HasPrefix(s, p) {
			return true
		}
	}
	return false
}

// File splits the CPU profile at path.
func File(path string) ([]Part, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	p, err := profile.Parse(f)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return Split(p)
}

// Split splits a CPU profile (its "cpu" sample type, in nanoseconds) into
// the parts, in Order.
func Split(p *profile.Profile) ([]Part, error) {
	idx := -1
	for i, st := range p.SampleType {
		if st.Type == "cpu" {
			idx = i
		}
	}
	if idx < 0 {
		return nil, fmt.Errorf("not a CPU profile: no \"cpu\" sample type")
	}
	var t Tally
	var stack []string
	for _, s := range p.Sample {
		stack = stack[:0]
		for _, loc := range s.Location {
			// A location's lines are innermost first too (inlined calls).
			for _, ln := range loc.Line {
				if ln.Function != nil {
					stack = append(stack, ln.Function.Name)
				}
			}
		}
		t.Add(stack, s.Value[idx])
	}
	return t.Parts()
}

// A Tally adds samples up by part: a CPU profile's, or perf's
// (loadtest/internal/perfsplit), whose frames are named as pprof names
// them.
type Tally struct {
	sums  map[string]int64
	total int64
}

// Add counts v of CPU (samples, or nanoseconds) for a stack, innermost
// frame first.
func (t *Tally) Add(stack []string, v int64) {
	if t.sums == nil {
		t.sums = map[string]int64{}
	}
	t.sums[partOf(stack)] += v
	t.total += v
}

// Parts is the shares of what was added, in Order.
func (t *Tally) Parts() ([]Part, error) {
	if t.total == 0 {
		return nil, fmt.Errorf("the profile holds no CPU samples")
	}
	parts := make([]Part, len(Order))
	for i, name := range Order {
		parts[i] = Part{Name: name, Share: float64(t.sums[name]) / float64(t.total)}
	}
	return parts, nil
}

// PerCall prints the parts of a call's perCall µs of CPU: "transport 5.1 +
// engine 2.0 + … = 14.4 µs".
func PerCall(parts []Part, perCall float64) string {
	s := make([]string, 0, len(parts))
	for _, p := range parts {
		s = append(s, fmt.Sprintf("%s %.1f", p.Name, p.Share*perCall))
	}
	return strings.Join(s, " + ") + fmt.Sprintf(" = %.1f µs", perCall)
}
