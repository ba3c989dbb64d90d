package openloop

import (
	"errors"
	"testing"
	"time"
)

// TestRunChargesTheWait: 200 calls at 1,000/s against a server that takes
// 20 ms with only 2 callers (at most 100 calls/s) fall behind their due
// times, and the latencies say so; every call is made and failures counted.
func TestRunChargesTheWait(t *testing.T) {
	t.Parallel()
	lat, errs := Run(1000, 200*time.Millisecond, 2, func(w int) error {
		time.Sleep(20 * time.Millisecond)
		if w == 0 {
			return errors.New("worker 0 fails")
		}
		return nil
	})
	calls := len(lat)
	if calls != 200 {
		t.Fatalf("%d calls made, want 200", calls)
	}
	if errs == 0 || errs == int64(calls) {
		t.Fatalf("%d of %d failed, want worker 0's only", errs, calls)
	}
	// The last call was due at 199 ms and waited behind 198 others at 100/s.
	if p99 := Quantile(lat, 0.99); p99 < 1500*time.Millisecond {
		t.Fatalf("p99 %s: the wait behind a slow server was not charged", p99)
	}
	if Quantile(nil, 0.5) != 0 {
		t.Fatal("Quantile of nothing is not 0")
	}
}
