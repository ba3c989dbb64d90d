package admission

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestSheddingOrder(t *testing.T) {
	want := map[int][]Priority{ // shed at each level
		0: nil,
		1: {PriorityBulk},
		2: {PriorityBestEffort, PriorityBulk},
		3: {PriorityDegraded, PriorityBestEffort, PriorityBulk},
	}
	for level, shed := range want {
		s := Shedding{Level: level}
		for p := PriorityCritical; p <= PriorityBulk; p++ {
			require.Equal(t, contains(shed, p), s.Sheds(p), "level %d, %s", level, p)
		}
	}
	require.Equal(t, StatusNormal, Shedding{}.Status())
	require.Equal(t, StatusDegraded, Shedding{Level: 2}.Status())
	require.Equal(t, StatusCritical, Shedding{Level: 3}.Status())
}

func contains(ps []Priority, p Priority) bool {
	for _, q := range ps {
		if q == p {
			return true
		}
	}
	return false
}

func TestParsePriorityAndShedding(t *testing.T) {
	for i, n := range []string{"critical", "degraded", "best_effort", "bulk"} {
		p, err := ParsePriority(n)
		require.NoError(t, err)
		require.Equal(t, Priority(i+1), p)
		require.Equal(t, n, p.String())
	}
	_, err := ParsePriority("CRITICAL")
	require.ErrorContains(t, err, "critical|degraded|best_effort|bulk")

	s, err := ParseShedding(map[string]string{})
	require.NoError(t, err)
	require.Equal(t, Shedding{RetryAfter: defaultShedRetry}, s, "no hash: nothing shed")
	s, err = ParseShedding(map[string]string{"level": "2", "retry_after_ms": "1500", "reason": "cpu 0.91"})
	require.NoError(t, err)
	require.Equal(t, Shedding{Level: 2, RetryAfter: 1500 * time.Millisecond, Reason: "cpu 0.91"}, s)
	for _, bad := range []map[string]string{{"level": "4"}, {"level": "-1"}, {"level": "x"}, {"retry_after_ms": "0"}} {
		_, err := ParseShedding(bad)
		require.Error(t, err, "%v", bad)
	}
}
