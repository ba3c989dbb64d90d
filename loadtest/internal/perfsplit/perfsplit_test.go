package perfsplit

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// script is `perf script --ns -F tid,time,ip,sym` output as perf 6.1 wrote
// it on this project's machine (a Go program hashing, one sample taken in
// a timer interrupt), with a recursive chain and an unnamed frame added.
const script = " 9531   397.611523817: \n" +
	"\t           911d6 crypto/internal/fips140/sha256.blockSHANI.abi0\n" +
	hashCallers +
	"\n" +
	" 9531   397.612905862: \n" +
	"\tffffffff82260674 irqentry_exit_to_user_mode\n" +
	"\tffffffff81000e06 asm_sysvec_apic_timer_interrupt\n" +
	"\t           91225 crypto/internal/fips140/sha256.blockSHANI.abi0\n" +
	hashCallers +
	"\n" +
	" 9532   398.000000001: \n" +
	"\t           10000 main.walk\n" +
	"\t           10010 main.walk\n" +
	"\t           10020 type:.eq.[2]interface {}\n" +
	"\t        7f00aa01 [unknown]\n" +
	"\n" +
	" 9531   399.500000000: \n" +
	"\t           8e73b main.main\n" +
	"\n"

// hashCallers are the callers of the hashing leaf (blockSHANI), the same in
// both of script's hashing samples, innermost first.
const hashCallers = "\t           8f608 crypto/internal/fips140/sha256.(*Digest).Write\n" +
	"\t           8e658 crypto/sha256.Sum256\n" +
	"\t           8e73b main.main\n" +
	"\t           492c7 runtime.main\n" +
	"\t           80d61 runtime.goexit.abi0\n"

func TestReadSortsSamplesIntoTheirWindows(t *testing.T) {
	const s = int64(1e9)
	got, err := Read(strings.NewReader(script), []Window{
		{From: 398 * s, To: 399 * s, Key: 2}, // given out of order
		{From: 397 * s, To: 397*s + 612_000_000, Key: 1},
		{From: 397*s + 612_000_000, To: 398 * s, Key: 3},
	})
	require.NoError(t, err)
	require.Len(t, got, 3)

	assert.Equal(t, Stacks{"runtime.goexit.abi0;runtime.main;main.main;crypto/sha256.Sum256;crypto/internal/fips140/sha256.(*Digest).Write;crypto/internal/fips140/sha256.blockSHANI.abi0": 1}, got[1])
	assert.Equal(t, 1, got[3].Samples(), "the interrupt's sample, 612.9 ms in")
	for chain := range got[3] {
		assert.Equal(t, "irqentry_exit_to_user_mode", Frames(chain)[0], "innermost first")
	}
	assert.Equal(t, Stacks{"[unknown];type:.eq.[2]interface {};main.walk;main.walk": 1}, got[2], "a symbol with a space kept whole")
	// 399.5 s is in no window: left out.
	assert.Equal(t, 3, got[1].Samples()+got[2].Samples()+got[3].Samples())
}

func TestInclusiveCountsAFunctionOncePerSample(t *testing.T) {
	s := Stacks{"main;walk;walk;leaf": 2, "main;other": 3}
	assert.Equal(t, map[string]int{"main": 5, "walk": 2, "leaf": 2, "other": 3}, s.Inclusive())
	assert.Equal(t, 5, s.Samples())
}

func TestReadRefusesWhatIsNotPerfScript(t *testing.T) {
	for name, in := range map[string]string{
		"a frame before any header": "\t  1234 main.main\n",
		"microseconds, not --ns":    " 9531   397.611523: \n\t 1 main.main\n",
		"not a header":              "perf: no samples\n",
	} {
		_, err := Read(strings.NewReader(in), []Window{{From: 0, To: 1 << 62, Key: 1}})
		assert.Error(t, err, name)
	}
	_, err := Read(strings.NewReader(script), []Window{{From: 0, To: 10, Key: 1}, {From: 5, To: 20, Key: 2}})
	assert.ErrorContains(t, err, "overlap")
}

func TestGrewOrdersByGrowthPerUnit(t *testing.T) {
	a := Stacks{"main;read": 10, "main;decide": 10}
	b := Stacks{"main;read": 30, "main;decide": 6, "main;refuse": 8}
	// One sample of a stands for 1 µs a unit, one of b for 0.5.
	g := Grew(a, b, 1, 0.5, 3)
	require.Len(t, g, 3)
	assert.Equal(t, Growth{Func: "read", A: 10, B: 15}, g[0])
	assert.Equal(t, Growth{Func: "refuse", A: 0, B: 4}, g[1], "new in b")
	assert.Equal(t, Growth{Func: "main", A: 20, B: 22}, g[2])
	assert.Equal(t, Growth{Func: "decide", A: 10, B: 3}, Grew(a, b, 1, 0.5, 10)[3], "shrunk: last")
}

// TestRecordSplitsARealProcessByTime records a child that hashes with one
// function, then with another, and finds each in its own window: perf's
// clock and MonoClock agree. The child switches after a span of its own CPU
// time, not of the clock's, so a loaded machine gives each window as many
// samples as an idle one.
func TestRecordSplitsARealProcessByTime(t *testing.T) {
	if testing.Short() {
		t.Skip("records with perf (linux-perf)")
	}
	_, err := exec.LookPath("perf")
	require.NoError(t, err, "perf not found: apt-get install linux-perf")
	dir := t.TempDir()
	bin := filepath.Join(dir, "hasher")
	src := filepath.Join(dir, "main.go")
	require.NoError(t, os.WriteFile(src, []byte(hasher), 0o644))
	build := exec.Command("go", "build", "-o", bin, src)
	build.Dir = dir
	out, err := build.CombinedOutput()
	require.NoError(t, err, "%s", out)

	mono, err := MonoClock()
	require.NoError(t, err)
	child := exec.Command(bin)
	child.Dir = dir
	stdin, err := child.StdinPipe()
	require.NoError(t, err)
	stdout, err := child.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, child.Start())
	t.Cleanup(func() { _ = child.Process.Kill(); _ = child.Wait() })
	ready := make([]byte, 6)
	_, err = io.ReadFull(stdout, ready) // "ready\n": waiting for "go"
	require.NoError(t, err)

	rec, err := Record(999, filepath.Join(dir, "perf.data"), child.Process.Pid)
	require.NoError(t, err)
	start := time.Now()
	_, err = io.WriteString(stdin, "go\n")
	require.NoError(t, err)
	exited := make(chan error, 1)
	go func() { _, _ = io.Copy(io.Discard, stdout); exited <- child.Wait() }()
	select {
	case err := <-exited:
		require.NoError(t, err, "the hasher")
	case <-time.After(60 * time.Second):
		t.Fatal("the hasher did not finish its 600 ms of CPU in 60 s")
	}
	require.NoError(t, rec.Stop())

	// The windows keep 20 ms clear of the switch: the child reads the
	// clock between its last call of one and its first of the other.
	switchAt := switchedAt(t, dir)
	got, err := rec.Split(context.Background(), []Window{
		{From: mono(start), To: switchAt - int64(20*time.Millisecond), Key: 1},
		{From: switchAt + int64(20*time.Millisecond), To: mono(time.Now()), Key: 2},
	})
	require.NoError(t, err)
	first, second := got[1].Inclusive(), got[2].Inclusive()
	require.Greater(t, got[1].Samples(), 100, "samples before the switch (300 ms of CPU at 999 Hz)")
	require.Greater(t, got[2].Samples(), 100, "samples after the switch (300 ms of CPU at 999 Hz)")
	// Most samples, not all: the process's other threads (the runtime's
	// sysmon, its collector) are sampled too, more of them on a loaded
	// machine (87 % in first once, under make test).
	assert.Greater(t, first["main.first"], got[1].Samples()*3/4, "before the switch: first")
	assert.Zero(t, first["main.second"], "before the switch")
	assert.Greater(t, second["main.second"], got[2].Samples()*3/4, "after the switch: second")
	assert.Zero(t, second["main.first"], "after the switch")

	require.NoError(t, WriteFolded(filepath.Join(dir, "first.folded"), got[1]))
	folded, err := os.ReadFile(filepath.Join(dir, "first.folded"))
	require.NoError(t, err)
	assert.Contains(t, string(folded), ";main.first")
}

// switchedAt is the CLOCK_MONOTONIC time the hasher wrote when it switched.
func switchedAt(t *testing.T, dir string) int64 {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "switched"))
	require.NoError(t, err)
	var at int64
	_, err = fmt.Sscan(string(b), &at)
	require.NoError(t, err)
	return at
}

// hasher waits for "go" on its stdin, hashes with first for 300 ms of its
// own CPU time, writes the CLOCK_MONOTONIC time it switched to the file
// "switched", then hashes with second for 300 ms of CPU.
const hasher = `package main

import (
	"bufio"
	"crypto/sha256"
	"fmt"
	"os"
	"syscall"
	"time"
	"unsafe"
)

var sink [32]byte

//go:noinline
func first(b []byte) { sink = sha256.Sum256(b) }

//go:noinline
func second(b []byte) { sink = sha256.Sum256(b) }

func clock(id uintptr) time.Duration {
	var ts syscall.Timespec
	syscall.Syscall(syscall.SYS_CLOCK_GETTIME, id, uintptr(unsafe.Pointer(&ts)), 0)
	return time.Duration(ts.Nano())
}

const monotonic, processCPU = 1, 2

func main() {
	b := make([]byte, 4096)
	fmt.Println("ready")
	bufio.NewReader(os.Stdin).ReadString('\n')
	// The CPU clock is a system call: read it every 64 hashes.
	start := clock(processCPU)
	for clock(processCPU)-start < 300*time.Millisecond {
		for range 64 {
			first(b)
		}
	}
	os.WriteFile("switched", []byte(fmt.Sprint(int64(clock(monotonic)))), 0o644)
	for clock(processCPU)-start < 600*time.Millisecond {
		for range 64 {
			second(b)
		}
	}
}
`
