package cpusplit

import (
	"bytes"
	"testing"

	"github.com/google/pprof/profile"
	"github.com/stretchr/testify/require"
)

// stackProfile is a CPU profile with one sample of ns per stack (each
// innermost first; a stack entry of several names is one location with
// inlined calls, innermost first).
func stackProfile(ns int64, stacks ...[][]string) *profile.Profile {
	p := &profile.Profile{
		SampleType: []*profile.ValueType{{Type: "samples", Unit: "count"}, {Type: "cpu", Unit: "nanoseconds"}},
		PeriodType: &profile.ValueType{Type: "cpu", Unit: "nanoseconds"},
		Period:     10_000_000,
	}
	fns := map[string]*profile.Function{}
	fn := func(name string) *profile.Function {
		if f, ok := fns[name]; ok {
			return f
		}
		f := &profile.Function{ID: uint64(len(fns) + 1), Name: name}
		fns[name] = f
		p.Function = append(p.Function, f)
		return f
	}
	for _, st := range stacks {
		var locs []*profile.Location
		for _, frame := range st {
			loc := &profile.Location{ID: uint64(len(p.Location) + 1)}
			for _, name := range frame {
				loc.Line = append(loc.Line, profile.Line{Function: fn(name)})
			}
			p.Location = append(p.Location, loc)
			locs = append(locs, loc)
		}
		p.Sample = append(p.Sample, &profile.Sample{Location: locs, Value: []int64{1, ns}})
	}
	return p
}

func frames(names ...string) [][]string {
	out := make([][]string, len(names))
	for i, n := range names {
		out[i] = []string{n}
	}
	return out
}

// TestSplit: each stack goes to the part of its innermost frame that names
// one — a write system call to the Redis client or to the transport by
// who made it, an allocation to who allocated — inlined frames innermost
// first, the runtime's own work to GC or the scheduler, the rest to other;
// the shares add up to 1 and survive the profile's encoding.
func TestSplit(t *testing.T) {
	p := stackProfile(1000,
		frames("syscall.write", "net.(*conn).Write", fg+"pkg/redisx.(*readyConn).Write", "github.com/redis/go-redis/v9.(*baseClient).withConn",
			fg+"pkg/envoyconf.(*Evaluator).Evaluate", fg+"pkg/limiter/envoyrls.(*EnvoyRLS).ShouldRateLimit", fg+"pkg/grpcfast.(*conn).call"),
		frames("syscall.write", "net.(*conn).Write", fg+"pkg/h2guard.(*conn).Write", fg+"pkg/grpcfast.(*conn).reply", fg+"pkg/grpcfast.(*conn).call"),
		frames("syscall.write", "net.(*conn).Write", fg+"pkg/h2guard.(*conn).Write", fg+"pkg/grpcfast.(*conn).reply", fg+"pkg/grpcfast.(*conn).call"),
		[][]string{{"github.com/segmentio/kafka-go/protocol.WriteRequest", fg + "pkg/limiter/envoyrls.(*EnvoyRLS).envoyAnswer"}, {fg + "pkg/grpcfast.(*conn).call"}},
		frames("runtime.mallocgc", fg+"pkg/envoyconf.(*Evaluator).Evaluate", fg+"pkg/grpcfast.(*conn).call"),
		frames("runtime.gcDrain", "runtime.gcBgMarkWorker"),
		frames("internal/runtime/syscall/linux.EpollWait", "runtime.netpoll", "runtime.findRunnable", "runtime.schedule", "runtime.park_m", "runtime.mcall"),
		frames("main.main"),
	)
	var buf bytes.Buffer
	require.NoError(t, p.Write(&buf))
	parsed, err := profile.Parse(&buf)
	require.NoError(t, err)
	parts, err := Split(parsed)
	require.NoError(t, err)

	got := map[string]float64{}
	sum := 0.0
	for _, pt := range parts {
		got[pt.Name] = pt.Share
		sum += pt.Share
	}
	require.InDelta(t, 1, sum, 1e-9)
	require.Equal(t, map[string]float64{Transport: 2.0 / 8, Engine: 1.0 / 8, Redis: 1.0 / 8, Event: 1.0 / 8, Scheduler: 1.0 / 8, GC: 1.0 / 8, Other: 1.0 / 8}, got)
	require.Equal(t, "transport 5.0 + engine 2.5 + Redis client 2.5 + decision event 2.5 + runtime: scheduling and polling 2.5 + garbage collection 2.5 + other 2.5 = 20.0 µs", PerCall(parts, 20))

	_, err = Split(&profile.Profile{SampleType: []*profile.ValueType{{Type: "alloc_space", Unit: "bytes"}}})
	require.ErrorContains(t, err, "not a CPU profile")
}
