package main

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestWriteDoc(t *testing.T) {
	for _, tc := range []struct {
		name, doc, want string
		wantErr         bool
	}{
		{"replaces the section", "a\n" + beginMark + "\nold\n" + endMark + "\nb\n", "a\n" + beginMark + "\nnew\n" + endMark + "\nb\n", false},
		{"empty section", beginMark + endMark, beginMark + "\nnew\n" + endMark, false},
		{"no markers", "a\n", "a\n", true},
		{"markers reversed", endMark + beginMark, endMark + beginMark, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "chaos.md")
			require.NoError(t, os.WriteFile(path, []byte(tc.doc), 0o644))
			err := writeDoc(path, "new\n")
			if tc.wantErr {
				require.Error(t, err)
			} else {
				require.NoError(t, err)
			}
			b, err := os.ReadFile(path)
			require.NoError(t, err)
			require.Equal(t, tc.want, string(b))
		})
	}
}

// A quota for the critical cluster's own limiter with no such limiter is
// refused before anything starts.
func TestCriticalQuotaNeedsTheCriticalLimiter(t *testing.T) {
	err := run(context.Background(), []string{"-only", "overload-grpc", "-overload-critical-quota", "0.5"}, func(string) string { return "" }, slog.New(slog.DiscardHandler))
	require.EqualError(t, err, "-overload-critical-quota needs -overload-critical-limiter")
}
