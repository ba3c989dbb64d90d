package stacktest_test

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/floodgate-dev/floodgate/pkg/stacktest"
)

func TestContextEndsAfterItsTimeout(t *testing.T) {
	ctx := stacktest.Context(t, 50*time.Millisecond, "nothing")
	deadline, ok := ctx.Deadline()
	require.True(t, ok)
	require.WithinDuration(t, time.Now().Add(50*time.Millisecond), deadline, 40*time.Millisecond)
	<-ctx.Done()
	require.ErrorIs(t, ctx.Err(), context.DeadlineExceeded)
}

// Not parallel: FreeAddr's port is free when it returns, and another of this
// package's tests binding port 0 meanwhile may be handed the same one.
func TestFreeAddrCanBeListenedOn(t *testing.T) {
	addr := stacktest.FreeAddr(t)
	require.True(t, strings.HasPrefix(addr, "127.0.0.1:"), addr)
	ln, err := net.Listen("tcp", addr)
	require.NoError(t, err)
	require.NoError(t, ln.Close())
}

func TestGetenvReadsTheMap(t *testing.T) {
	t.Parallel()
	getenv := stacktest.Getenv(map[string]string{"A": "1"})
	require.Equal(t, "1", getenv("A"))
	require.Empty(t, getenv("B"))
}

func TestLogKeepsEveryConcurrentWrite(t *testing.T) {
	t.Parallel()
	var l stacktest.Log
	log := l.Logger(slog.LevelInfo)
	var wg sync.WaitGroup
	for i := range 20 {
		wg.Add(1)
		go func() { defer wg.Done(); log.Info("line", "n", i) }()
	}
	wg.Wait()
	log.Debug("below the level")
	require.Equal(t, 20, strings.Count(l.String(), "msg=line"))
	require.NotContains(t, l.String(), "below the level")
}

func TestServiceRunsUntilStopAndReturnsRunsError(t *testing.T) {
	t.Parallel()
	var stopped atomic.Bool
	s := stacktest.Start(t, "svc", func(ctx context.Context, log *slog.Logger) error {
		log.Debug("started", "k", "v")
		<-ctx.Done()
		stopped.Store(true)
		return errors.New("drained badly")
	})
	require.Eventually(t, func() bool { return strings.Contains(s.Log.String(), "msg=started k=v") }, 5*time.Second, 10*time.Millisecond)
	require.False(t, stopped.Load(), "runs until Stop")
	exited, _ := s.Exited()
	require.False(t, exited)
	require.EqualError(t, s.Stop(), "drained badly")
	require.True(t, stopped.Load())
	require.EqualError(t, s.Stop(), "drained badly", "a second Stop answers the same")
}

func TestServiceWaitReturnsWhatRunReturnedByItself(t *testing.T) {
	t.Parallel()
	s := stacktest.Start(t, "svc", func(ctx context.Context, _ *slog.Logger) error {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return errors.New("FLOODGATE_X: not a number")
	})
	require.EqualError(t, s.Wait(5*time.Second), "FLOODGATE_X: not a number", "not the cancelled context")
	exited, err := s.Exited()
	require.True(t, exited)
	require.EqualError(t, err, "FLOODGATE_X: not a number")
	require.EqualError(t, s.Stop(), "FLOODGATE_X: not a number")
}

func TestWaitOKReturnsOnceTheURLAnswers200(t *testing.T) {
	t.Parallel()
	var calls atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if calls.Add(1) < 3 {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
	}))
	defer srv.Close()
	stacktest.WaitOK(t, srv.URL, 5*time.Second)
	require.EqualValues(t, 3, calls.Load())
}

func TestPagerDutyRecordsEventsAndCanBeDown(t *testing.T) {
	t.Parallel()
	p := stacktest.PagerDutyFor(t)
	post := func(path, body string) int {
		res, err := http.Post(p.URL+path, "application/json", strings.NewReader(body))
		require.NoError(t, err)
		res.Body.Close()
		return res.StatusCode
	}
	require.Equal(t, http.StatusAccepted, post("/v2/enqueue", `{"dedup_key":"k","event_action":"trigger"}`))
	require.Equal(t, http.StatusNotFound, post("/other", `{"dedup_key":"k","event_action":"resolve"}`))
	require.Equal(t, http.StatusBadRequest, post("/v2/enqueue", `{`))
	p.SetDown(true)
	require.Equal(t, http.StatusInternalServerError, post("/v2/enqueue", `{"dedup_key":"k","event_action":"resolve"}`))
	require.EqualValues(t, 1, p.Failed())
	p.SetDown(false)
	require.Equal(t, http.StatusAccepted, post("/v2/enqueue", `{"dedup_key":"k","event_action":"resolve"}`))

	p.FailNext(2)
	require.Equal(t, http.StatusInternalServerError, post("/v2/enqueue", `{"dedup_key":"j","event_action":"trigger"}`))
	require.Equal(t, http.StatusInternalServerError, post("/v2/enqueue", `{"dedup_key":"j","event_action":"trigger"}`))
	require.Equal(t, http.StatusAccepted, post("/v2/enqueue", `{"dedup_key":"j","event_action":"trigger"}`))
	require.EqualValues(t, 3, p.Failed())
	require.Len(t, p.All(), 3)

	require.Equal(t, []string{"trigger", "resolve"}, p.Actions("k"))
	require.True(t, p.Triggered("k"))
	require.False(t, p.Triggered("other"))
	require.Equal(t, "trigger", p.WaitFor(t, "k", time.Second)["event_action"])
}

func TestLocalReadsTheStackFromTheEnvironment(t *testing.T) {
	t.Setenv("FLOODGATE_REDIS_ADDRS", "10.0.0.1:6379,10.0.0.2:6379")
	t.Setenv("FLOODGATE_INFLUX_URL", "http://influx:8086")
	t.Setenv("FLOODGATE_DYNAMODB_ENDPOINT", "")
	s := stacktest.Local()
	require.Equal(t, []string{"10.0.0.1:6379", "10.0.0.2:6379"}, s.RedisAddrs)
	require.Equal(t, "http://influx:8086", s.InfluxURL)
	require.Equal(t, stacktest.DefaultDynamoEndpoint, s.DynamoEndpoint, "unset means the local stack's")
}
