package cputime

import (
	"os"
	"testing"
	"time"
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
