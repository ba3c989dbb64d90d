package main

import (
	"os"
	"testing"
	"time"
)

// procCPU must agree with the kernel's other account of this process's CPU
// time (getrusage): a parse of the wrong /proc fields would not.
func TestProcCPUAgreesWithRusage(t *testing.T) {
	t.Parallel()
	p0, r0 := procCPU(os.Getpid()), cpuTime()
	for x := 0; cpuTime()-r0 < 300*time.Millisecond; x++ {
		_ = x * x
	}
	p, r := procCPU(os.Getpid())-p0, cpuTime()-r0
	if p < r/2 || p > 2*r+100*time.Millisecond {
		t.Fatalf("procCPU moved %s while getrusage moved %s", p, r)
	}
	if got := procCPU(0); got != 0 {
		t.Fatalf("procCPU(0) = %s, want 0", got)
	}
	if got := procCPU(1 << 30); got != 0 {
		t.Fatalf("procCPU of a missing process = %s, want 0", got)
	}
}
