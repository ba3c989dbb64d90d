package ledger

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestRecentIDsWindow(t *testing.T) {
	t.Parallel()
	r := newRecentIDs(2)
	require.False(t, r.has("a"))
	r.add("a")
	require.True(t, r.has("a"), "a duplicate inside the window")
	r.add("a")
	r.add("b")
	require.True(t, r.has("a"), "adding an id twice takes one slot")
	r.add("c")
	require.False(t, r.has("a"), "c evicts a")
	require.True(t, r.has("b"))
	require.True(t, r.has("c"))
}
