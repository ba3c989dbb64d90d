package bench

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
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
	tg := NewTarget(srv.URL, 3, 4)

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
	require.Contains(t, Markdown([]Result{r}), "| open 100/s | 100 |")
}

func TestClosedLoopCountsErrors(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.Contains(r.URL.Path, "check") {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
	}))
	defer srv.Close()
	r := NewTarget(srv.URL, 1, 2).ClosedLoop(context.Background(), 100*time.Millisecond, 2)
	require.Positive(t, r.Requests)
	require.Equal(t, r.Requests, r.Errors)
}
