package service

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/floodgate-dev/floodgate/pkg/httpapi"
)

func testRunner(t *testing.T, timeout time.Duration) *Runner {
	t.Helper()
	cfg := RunnerConfig{ShutdownTimeout: timeout, HTTP: httpapi.DefaultServerConfig()}
	return NewRunnerWith(Env{Name: "test", Log: slog.New(slog.DiscardHandler), Registry: prometheus.NewRegistry()}, cfg)
}

// events records what happened, in order.
type events struct {
	mu  sync.Mutex
	got []string
}

func (e *events) add(s string) {
	e.mu.Lock()
	e.got = append(e.got, s)
	e.mu.Unlock()
}

func (e *events) list() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]string(nil), e.got...)
}

func TestRunnerDrainsInOrder(t *testing.T) {
	r := testRunner(t, 5*time.Second)
	var ev events
	addr, err := r.Serve(API{Name: "api", Addr: "127.0.0.1:0", Health: true})
	require.NoError(t, err)
	readyz := func() int {
		res, err := http.Get("http://" + addr.String() + "/readyz")
		if err != nil {
			return 0
		}
		res.Body.Close()
		return res.StatusCode
	}
	r.OnReady(func(v bool) {
		if v {
			ev.add("ready")
		} else {
			ev.add("not ready")
		}
	})
	var tailSawFront bool
	frontDone := make(chan struct{})
	r.Worker("consumer", func(ctx context.Context) error {
		<-ctx.Done()
		// Readiness flipped before the fetching stopped.
		if !r.Ready() {
			ev.add("consumer stops (not ready)")
		}
		time.Sleep(50 * time.Millisecond) // drain what it holds, commit
		ev.add("consumer committed")
		close(frontDone)
		return nil
	})
	r.Tail("producer", func(ctx context.Context) error {
		<-ctx.Done()
		select {
		case <-frontDone:
			tailSawFront = true
		default:
		}
		ev.add("producer flushed")
		return nil
	})
	r.Closer("redis", func() error { ev.add("close redis"); return nil })
	r.Closer("kafka", func() error { ev.add("close kafka"); return nil })

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	require.Eventually(t, func() bool { return readyz() == http.StatusOK }, 5*time.Second, 10*time.Millisecond)
	cancel()
	require.NoError(t, <-done)
	require.True(t, tailSawFront, "the tail stopped before the front had drained")
	require.Equal(t, []string{"ready", "not ready", "consumer stops (not ready)", "consumer committed", "producer flushed",
		"close kafka", "close redis"}, ev.list())
	require.Equal(t, 0, readyz(), "the listener is closed after Run")
}

func TestRunnerReadinessFlipsBeforeDraining(t *testing.T) {
	r := testRunner(t, 5*time.Second)
	addr, err := r.Serve(API{Name: "api", Addr: "127.0.0.1:0", Health: true})
	require.NoError(t, err)
	seen := make(chan int, 1)
	r.Worker("consumer", func(ctx context.Context) error {
		<-ctx.Done()
		// The listener is being shut down now; ask on a connection opened
		// before the drain would be racy, so ask the handler directly.
		rec := &statusRecorder{header: http.Header{}}
		r.Handler(nil).ServeHTTP(rec, must(http.NewRequest(http.MethodGet, "http://"+addr.String()+"/readyz", nil)))
		seen <- rec.code
		return nil
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	require.Eventually(t, r.Ready, 5*time.Second, 10*time.Millisecond)
	cancel()
	require.NoError(t, <-done)
	require.Equal(t, http.StatusServiceUnavailable, <-seen)
}

func TestRunnerReportsPartPastDeadline(t *testing.T) {
	r := testRunner(t, 200*time.Millisecond)
	release := make(chan struct{})
	stuckDone := make(chan struct{})
	r.Worker("good", func(ctx context.Context) error { <-ctx.Done(); return nil })
	r.Worker("stuck-consumer", func(ctx context.Context) error {
		defer close(stuckDone)
		<-ctx.Done()
		<-release // ignores the deadline
		return nil
	})
	closed := false
	r.Closer("client", func() error { closed = true; return nil })
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	require.Eventually(t, r.Ready, 5*time.Second, 10*time.Millisecond)
	start := time.Now()
	cancel()
	var err error
	select {
	case err = <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after the shutdown deadline")
	}
	close(release)
	<-stuckDone
	require.ErrorIs(t, err, ErrShutdownTimeout)
	require.Contains(t, err.Error(), "stuck-consumer")
	require.NotContains(t, err.Error(), "good")
	require.True(t, closed, "closers run even when a part is late")
	require.GreaterOrEqual(t, time.Since(start), 200*time.Millisecond)
}

func TestRunnerFailingPartStopsTheRest(t *testing.T) {
	r := testRunner(t, 5*time.Second)
	otherStopped := make(chan struct{})
	r.Worker("other", func(ctx context.Context) error { <-ctx.Done(); close(otherStopped); return nil })
	r.Worker("broken", func(ctx context.Context) error { return errors.New("lost the broker") })
	err := r.Run(context.Background())
	require.ErrorContains(t, err, "broken stopped: lost the broker")
	select {
	case <-otherStopped:
	default:
		t.Fatal("the other worker was not stopped")
	}
}

func TestRunnerFinishesInFlightRequests(t *testing.T) {
	r := testRunner(t, 5*time.Second)
	started := make(chan struct{})
	mux := http.NewServeMux()
	mux.HandleFunc("GET /slow", func(w http.ResponseWriter, req *http.Request) {
		close(started)
		time.Sleep(300 * time.Millisecond)
		_, _ = io.WriteString(w, "done")
	})
	addr, err := r.Serve(API{Name: "api", Addr: "127.0.0.1:0", Handler: mux, Health: true, Metrics: "floodgate_test_api"})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	require.Eventually(t, r.Ready, 5*time.Second, 10*time.Millisecond)
	got := make(chan string, 1)
	go func() {
		res, err := http.Get("http://" + addr.String() + "/slow")
		if err != nil {
			got <- err.Error()
			return
		}
		b, _ := io.ReadAll(res.Body)
		res.Body.Close()
		got <- string(b) + " " + res.Header.Get(httpapi.HeaderRequestID)
	}()
	<-started
	cancel()
	require.NoError(t, <-done)
	ans := <-got
	require.True(t, strings.HasPrefix(ans, "done "), "in-flight request cut: %q", ans)
	require.True(t, httpapi.ValidRequestID(strings.TrimPrefix(ans, "done ")), "no minted request id: %q", ans)
}

func TestLogLevel(t *testing.T) {
	for _, tc := range []struct {
		value   string
		want    slog.Level
		wantErr bool
	}{{"", slog.LevelInfo, false}, {"debug", slog.LevelDebug, false}, {"warn", slog.LevelWarn, false},
		{"error", slog.LevelError, false}, {"verbose", 0, true}, {"INFO", 0, true}} {
		t.Run(tc.value, func(t *testing.T) {
			l, err := ParseLogLevel(func(k string) string { return map[string]string{"FLOODGATE_LOG_LEVEL": tc.value}[k] })
			if tc.wantErr {
				require.ErrorContains(t, err, "FLOODGATE_LOG_LEVEL")
				return
			}
			require.NoError(t, err)
			require.Equal(t, tc.want, l)
		})
	}
	var buf bytes.Buffer
	log, err := NewLogger(func(k string) string { return map[string]string{"FLOODGATE_LOG_LEVEL": "warn"}[k] }, &buf)
	require.NoError(t, err)
	log.Info("hidden")
	log.WarnContext(httpapi.WithRequestID(context.Background(), "req-1"), "shown")
	require.NotContains(t, buf.String(), "hidden")
	require.Contains(t, buf.String(), `"correlation_id":"req-1"`)
}

func TestExecStopsOnSIGTERM(t *testing.T) {
	var out bytes.Buffer
	started := make(chan struct{})
	code := make(chan int, 1)
	go func() {
		code <- Exec(context.Background(), "svc", func(ctx context.Context, env Env) error {
			require.Equal(t, []string{"serve"}, env.Args)
			require.NotNil(t, env.Registry)
			close(started)
			<-ctx.Done()
			return nil
		}, Stdio{Args: []string{"serve"}, Getenv: func(string) string { return "" }, Stderr: &out})
	}()
	<-started
	require.NoError(t, syscall.Kill(syscall.Getpid(), syscall.SIGTERM))
	select {
	case c := <-code:
		require.Equal(t, 0, c)
	case <-time.After(5 * time.Second):
		t.Fatal("SIGTERM did not stop the service")
	}
	c := Exec(context.Background(), "svc", func(context.Context, Env) error { return nil },
		Stdio{Getenv: func(k string) string { return map[string]string{"FLOODGATE_LOG_LEVEL": "loud"}[k] }, Stderr: &out})
	require.Equal(t, 2, c)
	require.Contains(t, out.String(), "FLOODGATE_LOG_LEVEL")
}

type statusRecorder struct {
	header http.Header
	code   int
}

func (s *statusRecorder) Header() http.Header         { return s.header }
func (s *statusRecorder) Write(b []byte) (int, error) { return len(b), nil }
func (s *statusRecorder) WriteHeader(code int)        { s.code = code }

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}
