package main

import (
	"os/exec"
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
	line, remove := favour(false, []member{{"generator", 1}}, nil)
	require.Nil(t, remove)
	require.Contains(t, line, "-favour=false")

	sleep := exec.Command("sleep", "30")
	require.NoError(t, sleep.Start())
	t.Cleanup(func() { _ = sleep.Process.Kill(); _ = sleep.Wait() })
	pid := sleep.Process.Pid
	line, remove = favour(true, []member{{"floodgate", pid}, {"floodgate baseline", 0}}, []string{"redis 127.0.0.1:6379"})
	if remove == nil {
		require.True(t, strings.HasPrefix(line, "NOT favoured ("), line)
		t.Skip(line)
	}
	require.Contains(t, line, "floodgate "+strconv.Itoa(pid))
	require.NotContains(t, line, "baseline", "a process not started is not named")
	require.Contains(t, line, "not moved (shared, not this run's): redis 127.0.0.1:6379")
	require.Regexp(t, `^favoured: cgroup (cpu\.shares 262144|cpu\.weight 10000) holds`, line)
	remove()
}
