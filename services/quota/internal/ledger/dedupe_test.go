package ledger

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestRecentIDsWindow(t *testing.T) {
	r := newRecentIDs(2)
	require.False(t, r.seen("a"))
	require.True(t, r.seen("a"), "a duplicate inside the window")
	require.False(t, r.seen("b"))
	require.False(t, r.seen("c"), "c evicts a")
	require.False(t, r.seen("a"), "a fell out of the window")
	require.True(t, r.seen("c"))
}
