package chaos

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestLimitCPURejectsBadQuotas: a quota must be positive and its period
// within what the kernel takes; the error names both.
func TestLimitCPURejectsBadQuotas(t *testing.T) {
	for _, tc := range []struct {
		name   string
		cores  float64
		period time.Duration
	}{{"no cores", 0, 10 * time.Millisecond}, {"period too short", 0.3, 500 * time.Microsecond}, {"period too long", 0.3, 2 * time.Second}} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := LimitCPU(os.Getpid(), tc.cores, tc.period)
			require.ErrorContains(t, err, "want cores > 0 and a period of 1ms..1s")
		})
	}
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
			n, d := (&CPUQuota{dir: dir}).Throttled()
			require.Equal(t, int64(7), n)
			require.Equal(t, tc.want, d)
		})
	}
}
