package cgroup

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestLimitRejectsBadQuotas: a quota must be positive and its period
// within what the kernel takes; the error names both.
func TestLimitRejectsBadQuotas(t *testing.T) {
	for _, tc := range []struct {
		name   string
		cores  float64
		period time.Duration
	}{{"no cores", 0, 10 * time.Millisecond}, {"period too short", 0.3, 500 * time.Microsecond}, {"period too long", 0.3, 2 * time.Second}} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Limit("floodgate-test-bad-quota", os.Getpid(), tc.cores, tc.period)
			require.ErrorContains(t, err, "want cores > 0 and a period of 1ms..1s")
		})
	}
	// 0.3 of a core per 1 ms is a 300 µs quota, which the kernel refuses;
	// rounding it up to 1 ms would leave the process a whole core.
	_, err := Limit("floodgate-test-bad-quota", os.Getpid(), 0.3, time.Millisecond)
	require.ErrorContains(t, err, "300 µs, under the kernel's 1 ms floor: want a period of at least 3.333ms")
}

// TestThrottledReadsBothCgroupVersions: cgroup v1 counts the wait in ns
// (throttled_time), v2 in µs (throttled_usec).
func TestThrottledReadsBothCgroupVersions(t *testing.T) {
	for _, tc := range []struct {
		name, stat string
		want       time.Duration
	}{
		{"v1", "nr_periods 100\nnr_throttled 7\nthrottled_time 21000000\n", 21 * time.Millisecond},
		{"v2", "usage_usec 5\nnr_periods 100\nnr_throttled 7\nthrottled_usec 21000\n", 21 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			require.NoError(t, os.WriteFile(filepath.Join(dir, "cpu.stat"), []byte(tc.stat), 0o644))
			n, d := (&Group{dir: dir}).Throttled()
			require.Equal(t, int64(7), n)
			require.Equal(t, tc.want, d)
		})
	}
}

// TestFavourMovesAndRestores: a favoured group holds the processes at the
// highest CPU weight, and Remove hands them back to the root group.
func TestFavourMovesAndRestores(t *testing.T) {
	sleep := exec.Command("sleep", "30")
	require.NoError(t, sleep.Start())
	t.Cleanup(func() { _ = sleep.Process.Kill(); _ = sleep.Wait() })
	g, err := Favour(fmt.Sprintf("floodgate-test-favoured-%d", os.Getpid()), sleep.Process.Pid)
	if err != nil && strings.Contains(err.Error(), "no writable cpu controller") {
		t.Skip("this machine has no writable cpu controller: ", err)
	}
	require.NoError(t, err)
	t.Cleanup(func() { _ = g.Remove() }) // a failed assertion leaves no group behind
	procs, err := os.ReadFile(filepath.Join(g.dir, "cgroup.procs"))
	require.NoError(t, err)
	require.Contains(t, strings.Fields(string(procs)), strconv.Itoa(sleep.Process.Pid))
	weight := v1Favoured
	if g.v2 {
		weight = v2Favoured
	}
	w, err := os.ReadFile(filepath.Join(g.dir, weight[0]))
	require.NoError(t, err)
	require.Equal(t, weight[1], strings.TrimSpace(string(w)))
	require.Contains(t, g.String(), weight[0]+" "+weight[1])

	require.NoError(t, g.Remove())
	require.NoDirExists(t, g.dir)
	procs, err = os.ReadFile(filepath.Join(g.parent, "cgroup.procs"))
	require.NoError(t, err)
	require.Contains(t, strings.Fields(string(procs)), strconv.Itoa(sleep.Process.Pid), "back in the root group")
}
