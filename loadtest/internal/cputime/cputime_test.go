package cputime

import (
	"context"
	"os"
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// Of must agree with the kernel's other account of this process's CPU time
// (getrusage): a parse of the wrong /proc fields would not.
func TestOfAgreesWithSelf(t *testing.T) {
	t.Parallel()
	p0, r0, start := Of(os.Getpid()), Self(), time.Now()
	for x := 0; Self()-r0 < 300*time.Millisecond && time.Since(start) < 10*time.Second; x++ {
		_ = x * x
	}
	p, r := Of(os.Getpid())-p0, Self()-r0
	if p < r/2 || p > 2*r+100*time.Millisecond {
		t.Fatalf("Of moved %s while Self moved %s", p, r)
	}
	if got := Of(0); got != 0 {
		t.Fatalf("Of(0) = %s, want 0", got)
	}
	if got := Of(1 << 30); got != 0 {
		t.Fatalf("Of a missing process = %s, want 0", got)
	}
}

// Machine counts this process's busy time among the machine's: a spin of
// 300 ms of CPU must move it by at least most of that.
func TestMachineCountsThisProcess(t *testing.T) {
	m0, r0, start := Machine(), Self(), time.Now()
	if m0 == 0 {
		t.Fatal("Machine() = 0: /proc/stat not read")
	}
	for x := 0; Self()-r0 < 300*time.Millisecond && time.Since(start) < 10*time.Second; x++ {
		_ = x * x
	}
	if m, r := Machine()-m0, Self()-r0; m < r*8/10-20*time.Millisecond {
		t.Fatalf("Machine moved %s while this process spent %s", m, r)
	}
}

// CoreTimes reads one line per core, and CoreBusy of a spin pinned to one
// core shows that core busy: a parse of the wrong fields, or of the
// machine's total line as a core, would not.
func TestCoreBusyShowsAPinnedSpin(t *testing.T) {
	b0, t0 := CoreTimes()
	if len(b0) != runtime.NumCPU() || len(t0) != len(b0) {
		t.Fatalf("CoreTimes: %d cores, %d totals; runtime.NumCPU() = %d", len(b0), len(t0), runtime.NumCPU())
	}
	r0, start := Self(), time.Now()
	spun := make(chan error)
	go func() {
		// Locked and never unlocked: the pinned thread ends with the
		// goroutine instead of returning to the pool.
		runtime.LockOSThread()
		var set unix.CPUSet
		set.Set(0)
		if err := unix.SchedSetaffinity(0, &set); err != nil {
			spun <- err
			return
		}
		for x := 0; Self()-r0 < 300*time.Millisecond && time.Since(start) < 10*time.Second; x++ {
			_ = x * x
		}
		spun <- nil
	}()
	if err := <-spun; err != nil {
		t.Fatalf("pin to cpu 0: %v", err)
	}
	b1, t1 := CoreTimes()
	busy := CoreBusy(b0, t0, b1, t1)
	if len(busy) != len(b0) {
		t.Fatalf("CoreBusy: %d shares for %d cores", len(busy), len(b0))
	}
	// The spin had cpu 0 for most of its wall time unless others took it.
	if spun := Self() - r0; busy[0] < 0.8*spun.Seconds()/time.Since(start).Seconds()-0.1 {
		t.Fatalf("cpu 0 %.2f busy while this thread spun %s of %s on it", busy[0], spun, time.Since(start))
	}
	for i, v := range busy {
		if v < 0 || v > 1 {
			t.Fatalf("cpu %d busy share %.2f, want 0..1", i, v)
		}
	}
}

// Probe's work takes CPU time on the core it names, and a core list
// taskset refuses is an error, not a zero.
func TestProbe(t *testing.T) {
	wall, cpu, err := Probe(context.Background(), "0")
	require.NoError(t, err)
	require.Greater(t, cpu, 10*time.Millisecond, "hashing 64 MiB takes CPU")
	require.GreaterOrEqual(t, wall, cpu/2)
	_, _, err = Probe(context.Background(), "4096")
	require.Error(t, err)
}
