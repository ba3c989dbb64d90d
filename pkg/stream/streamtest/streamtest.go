// Package streamtest holds the test fixtures that the tests of pkg/stream and
// pkg/journal share and that are not about the broker (pkg/kafkatest): a
// logger writing through t.Log, and metric values read from a registry.
package streamtest

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/require"
)

// Logger logs at level and above through t.Log until the test ends
// (goroutines that outlive the test, like a writer still flushing, must not
// call t.Log). slog.LevelError+1 keeps a test's output quiet.
func Logger(t testing.TB, level slog.Level) *slog.Logger {
	w := &testWriter{t: t}
	t.Cleanup(w.stop)
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: level}))
}

type testWriter struct {
	mu      sync.Mutex
	t       testing.TB
	stopped bool
}

func (w *testWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.stopped {
		w.t.Log(string(bytes.TrimRight(p, "\n")))
	}
	return len(p), nil
}

func (w *testWriter) stop() {
	w.mu.Lock()
	w.stopped = true
	w.mu.Unlock()
}

// MetricValue sums the samples of the counters or gauges called name whose
// labels include the given ones (nil: all); for a histogram it sums the
// sample counts.
func MetricValue(t testing.TB, reg *prometheus.Registry, name string, labels map[string]string) float64 {
	t.Helper()
	families, err := reg.Gather()
	require.NoError(t, err)
	var sum float64
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			if !hasLabels(m, labels) {
				continue
			}
			switch {
			case m.Counter != nil:
				sum += m.Counter.GetValue()
			case m.Gauge != nil:
				sum += m.Gauge.GetValue()
			case m.Histogram != nil:
				sum += float64(m.Histogram.GetSampleCount())
			}
		}
	}
	return sum
}

func hasLabels(m *dto.Metric, want map[string]string) bool {
	have := map[string]string{}
	for _, l := range m.GetLabel() {
		have[l.GetName()] = l.GetValue()
	}
	for k, v := range want {
		if have[k] != v {
			return false
		}
	}
	return true
}

// Start runs run in the background with a context that stop cancels; stop
// then waits up to within for run to return and gives its error (an error
// saying it did not stop, past within). The test's cleanup calls stop.
func Start(t testing.TB, within time.Duration, run func(context.Context) error) (stop func() error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx) }()
	var once sync.Once
	var err error
	stop = func() error {
		once.Do(func() {
			cancel()
			select {
			case err = <-done:
			case <-time.After(within):
				err = fmt.Errorf("did not stop within %v", within)
			}
		})
		return err
	}
	t.Cleanup(func() { _ = stop() })
	return stop
}
