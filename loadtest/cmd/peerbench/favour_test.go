package main

import (
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestFavour: off, nothing is moved and the line says so; on, the run's
// processes are in the favoured group, the line names them and the shared
// ones left alone, and remove ends the group. A machine without a writable
// cpu controller gets a line saying why, not an error.
func TestFavour(t *testing.T) {
	line, g, remove := favour(false, []member{{"generator", 1}}, nil)
	require.Nil(t, remove)
	require.Nil(t, g)
	require.Contains(t, line, "-favour=false")

	sleep := exec.Command("sleep", "30")
	require.NoError(t, sleep.Start())
	t.Cleanup(func() { _ = sleep.Process.Kill(); _ = sleep.Wait() })
	pid := sleep.Process.Pid
	line, g, remove = favour(true, []member{{"floodgate", pid}, {"floodgate baseline", 0}}, []string{"redis 127.0.0.1:6379"})
	if remove == nil {
		require.True(t, strings.HasPrefix(line, "NOT favoured ("), line)
		t.Skip(line)
	}
	require.Contains(t, line, "floodgate "+strconv.Itoa(pid))
	require.NotContains(t, line, "baseline", "a process not started is not named")
	require.Contains(t, line, "not moved (shared, not this run's): redis 127.0.0.1:6379")
	require.Regexp(t, `^favoured: cgroup (cpu\.shares 262144|cpu\.weight 10000) holds`, line)
	favoured := cgroupOf(t, pid)
	require.Contains(t, favoured, "floodgate-peerbench-")

	// -quota: a round's service runs in a limited cgroup of its own, and
	// after the round it is back in the favoured one.
	place := placement{favoured: true, group: g}
	undo, err := place.limit(pid, 0.3)
	require.NoError(t, err)
	require.Contains(t, cgroupOf(t, pid), "floodgate-peerbench-quota-"+strconv.Itoa(pid))
	_, err = undo()
	require.NoError(t, err)
	require.Equal(t, favoured, cgroupOf(t, pid), "after the round the service is back in the favoured cgroup")
	remove()
}

// cgroupOf is the cpu controller's cgroup of pid (/proc/PID/cgroup: the
// v1 "cpu" line, or the v2 "0::" one).
func cgroupOf(t *testing.T, pid int) string {
	t.Helper()
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cgroup")
	require.NoError(t, err)
	for _, line := range strings.Split(string(b), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) == 3 && (parts[0] == "0" || slices.Contains(strings.Split(parts[1], ","), "cpu")) {
			return parts[2]
		}
	}
	t.Fatalf("no cpu cgroup in %s", b)
	return ""
}
