package service

import (
	"runtime"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
)

// Every service serves how long its goroutines waited for a CPU and how
// much of its CPU the garbage collector took.
func TestRuntimeCollectorsServeSchedulerAndGCCPU(t *testing.T) {
	reg := prometheus.NewRegistry()
	reg.MustRegister(RuntimeCollectors()...)
	runtime.GC()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	got := map[string]bool{}
	for _, mf := range mfs {
		got[mf.GetName()] = true
	}
	for _, name := range []string{"go_sched_latencies_seconds", "go_cpu_classes_gc_total_cpu_seconds_total", "go_cpu_classes_total_cpu_seconds_total", "process_cpu_seconds_total"} {
		require.True(t, got[name], "%s not served", name)
	}
}
