package cli

import (
	"context"
	"os/exec"
	"syscall"
	"testing"
	"time"
)

func TestMainRunsWithALiveContext(t *testing.T) {
	ran := false
	Main(nil, "test", func(ctx context.Context) error {
		ran = ctx.Err() == nil
		return nil
	})
	if !ran {
		t.Fatal("run was not called with a live context")
	}
}

// TestStopAll: a process that exits on SIGTERM stops at once; one that
// ignores it is killed after the grace period.
func TestStopAll(t *testing.T) {
	polite := exec.Command("sleep", "30")
	stubborn := exec.Command("sh", "-c", `trap "" TERM; while :; do sleep 0.1; done`)
	for _, c := range []*exec.Cmd{polite, stubborn} {
		if err := c.Start(); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(200 * time.Millisecond) // the shell has set its trap
	start := time.Now()
	StopAll([]*exec.Cmd{polite, stubborn}, 500*time.Millisecond)
	took := time.Since(start)
	if polite.ProcessState == nil || stubborn.ProcessState == nil {
		t.Fatal("a process was not waited for")
	}
	if ws := polite.ProcessState.Sys().(syscall.WaitStatus); !ws.Signaled() || ws.Signal() != syscall.SIGTERM {
		t.Fatalf("sleep ended by %v, want SIGTERM", polite.ProcessState)
	}
	if ws := stubborn.ProcessState.Sys().(syscall.WaitStatus); !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		t.Fatalf("the shell ignoring SIGTERM ended by %v, want SIGKILL", stubborn.ProcessState)
	}
	if took < 500*time.Millisecond {
		t.Fatalf("stopped in %v, before the grace period", took)
	}
}
