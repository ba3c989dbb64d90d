package main

import (
	"runtime"
	"testing"

	"github.com/stretchr/testify/require"
)

// parseCPUs reads taskset lists and refuses what is not one, or names a
// core the machine does not have; a placement refuses a core shared by the
// service and the rest.
func TestPlacementCPUs(t *testing.T) {
	got, err := parseCPUs("0")
	require.NoError(t, err)
	require.Equal(t, []int{0}, got)
	if runtime.NumCPU() >= 2 {
		got, err = parseCPUs("0-1")
		require.NoError(t, err)
		require.Equal(t, []int{0, 1}, got)
		_, err = newPlacement(true, "1", "0,1")
		require.ErrorContains(t, err, "share cpu 1")
		p, err := newPlacement(true, "1", "0")
		require.NoError(t, err)
		require.Equal(t, []string{"taskset", "-c", "1", "/bin/true"}, p.command(p.service, "/bin/true").Args)
	}
	for _, bad := range []string{"", "x", "2-1", "0,", "99999"} {
		_, err := parseCPUs(bad)
		require.Error(t, err, "%q", bad)
	}
	p, err := newPlacement(false, "bogus", "bogus")
	require.NoError(t, err, "unpinned: the lists are not read")
	require.Equal(t, []string{"/bin/true"}, p.command(p.service, "/bin/true").Args)
	require.NoError(t, p.pin(1, []int{0}), "unpinned: nothing is pinned")
}
