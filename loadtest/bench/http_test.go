package bench

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/floodgate-dev/floodgate/pkg/limiter/checkapi"
)

func TestOpenLoopSendsTheOfferedCountAndChargesQueueing(t *testing.T) {
	var n atomic.Int64
	slow := atomic.Bool{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n.Add(1)
		if slow.Load() {
			time.Sleep(50 * time.Millisecond)
		}
		w.WriteHeader(http.StatusOK)
	}))
	defer srv.Close()
	tg := NewTarget(srv.URL, 3, 4, 1)

	r := tg.OpenLoop(context.Background(), 200, time.Second, 4)
	require.Equal(t, int64(200), r.Requests)
	require.Equal(t, int64(200), n.Load())
	require.Zero(t, r.Errors)

	// One worker and a server taking 50ms: requests queue, and the queueing is in the
	// latency — the last request waited for the ones before it.
	slow.Store(true)
	r = tg.OpenLoop(context.Background(), 100, 200*time.Millisecond, 1)
	require.Equal(t, int64(20), r.Requests)
	require.Greater(t, r.Quantile(100), 500*time.Millisecond, "queueing behind a slow server must show in the tail")
	require.Contains(t, Markdown([]Result{r}), "| open 100/s | 1 | 100 |")
	run := r.Run()
	require.Equal(t, Run{Name: "open 100/s", Batch: 1, Offered: 100, Achieved: r.Achieved, Requests: 20, Seconds: r.Elapsed.Seconds(),
		P50: run.P50, P90: run.P90, P99: run.P99, P999: run.P999, Max: run.Max}, run)
	require.Greater(t, run.Max, 500.0, "milliseconds")
	require.LessOrEqual(t, run.P50, run.P99)
	require.LessOrEqual(t, run.P99, run.Max)
}

func TestClosedLoopCountsErrors(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.Contains(r.URL.Path, "check") {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
	}))
	defer srv.Close()
	r := NewTarget(srv.URL, 1, 2, 1).ClosedLoop(context.Background(), 100*time.Millisecond, 2)
	require.Positive(t, r.Requests)
	require.Equal(t, r.Requests, r.Errors)
	require.True(t, r.Run().Closed)
}

// A batch target posts the limiter's batch body: every check valid, principals
// cycling through all n, and checks/s counted as requests × batch.
func TestBatchTargetSendsValidBatches(t *testing.T) {
	var checks atomic.Int64
	seen := map[string]bool{}
	var mu sync.Mutex
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/check/batch" {
			w.WriteHeader(http.StatusNotFound)
			return
		}
		var br checkapi.BatchRequest
		if err := json.NewDecoder(r.Body).Decode(&br); err != nil || len(br.Checks) != 10 {
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		for _, raw := range br.Checks {
			var c checkapi.CheckRequest
			if err := json.Unmarshal(raw, &c); err != nil || c.Principal.Validate() != nil || c.Route == "" || c.IP == "" {
				w.WriteHeader(http.StatusBadRequest)
				return
			}
			mu.Lock()
			seen[c.Principal.ID] = true
			mu.Unlock()
			checks.Add(1)
		}
		w.WriteHeader(http.StatusOK)
	}))
	defer srv.Close()
	r := NewTarget(srv.URL, 50, 4, 10).OpenLoop(context.Background(), 100, 100*time.Millisecond, 4)
	require.Zero(t, r.Errors)
	require.Equal(t, int64(10), r.Requests)
	require.Equal(t, int64(100), checks.Load())
	require.Len(t, seen, 50, "every principal in rotation")
	require.Contains(t, Markdown([]Result{r}), "| open 100/s | 10 | 100 |")
	require.Equal(t, 10, r.Run().Batch)
}

func TestWaitReady(t *testing.T) {
	t.Parallel()
	var calls atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		if calls.Add(1) < 3 {
			http.Error(w, "starting", http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusOK)
	}))
	defer srv.Close()
	require.NoError(t, WaitReady(context.Background(), srv.URL, 10*time.Second))
	require.EqualValues(t, 3, calls.Load())

	never := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, "starting", http.StatusServiceUnavailable)
	}))
	defer never.Close()
	err := WaitReady(context.Background(), never.URL, 300*time.Millisecond)
	require.ErrorContains(t, err, never.URL+" not ready after 300ms")
}
