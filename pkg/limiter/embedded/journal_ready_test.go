//go:build linux

package embedded

import (
	"context"
	"log/slog"
	"os/exec"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/floodgate-dev/floodgate/pkg/journal"
	"github.com/floodgate-dev/floodgate/pkg/limiter"
	"github.com/floodgate-dev/floodgate/pkg/redisx/redistest"
)

// TestReadyzSaysTheJournalIsMemoryOnly: a journal directory on a read-only
// filesystem starts the limiter (on main it refused) and /readyz says
// degraded, with why, while it stays ready.
func TestReadyzSaysTheJournalIsMemoryOnly(t *testing.T) {
	if testing.Short() {
		t.Skip("needs Redis")
	}
	dir := t.TempDir()
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=1m,ro", "tmpfs", dir).CombinedOutput(); err != nil {
		t.Skipf("mounting a read-only tmpfs needs root: %v: %s", err, out)
	}
	t.Cleanup(func() { _ = exec.Command("umount", "-l", dir).Run() })
	rs, err := limiter.ParseRules("test.yaml", []byte(failRules))
	require.NoError(t, err)
	e, err := New(context.Background(), Config{Redis: redistest.Client(t), Rules: rs, Gateway: "test",
		Brokers: []string{"127.0.0.1:1"}, Topic: "decisions", Journal: journal.Config{Dir: dir},
		Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err, "starts without its journal")
	ok, r := e.s.Readiness()
	require.True(t, ok, "ready: it answers checks")
	require.Equal(t, "degraded", r.Status)
	require.Contains(t, r.Journal, "memory only")
}
