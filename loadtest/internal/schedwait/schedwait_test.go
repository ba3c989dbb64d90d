package schedwait

import (
	"bytes"
	"net"
	"runtime"
	"runtime/trace"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/floodgate-dev/floodgate/pkg/tlstest"
)

// TestReadSplitsWaitsByHowWoken traces goroutines woken by the network
// poller, a timer and a channel, and a yield, and finds each under its kind
// with where it had blocked.
func TestReadSplitsWaitsByHowWoken(t *testing.T) {
	done := make(chan struct{})
	var ended sync.WaitGroup // every goroutine of the test's
	ended.Add(4)
	client, err := net.Dial("tcp", tlstest.Peer(t, func(c net.Conn) { defer ended.Done(); readsTheNetwork(c, done) }))
	require.NoError(t, err)
	defer client.Close()

	var buf bytes.Buffer
	require.NoError(t, trace.Start(&buf))
	ch := make(chan int)
	for _, f := range []func(){func() { sleeps(done) }, func() { receives(ch) }, func() { yields(done) }} {
		go func() { defer ended.Done(); f() }()
	}
	time.Sleep(10 * time.Millisecond) // each blocks
	for i := range 3 {
		_, err := client.Write([]byte{byte(i)})
		require.NoError(t, err)
		ch <- i
		time.Sleep(5 * time.Millisecond)
	}
	close(done)
	_, _ = client.Write([]byte{9})
	close(ch)
	ended.Wait()
	time.Sleep(30 * time.Millisecond) // nothing runs
	trace.Stop()

	r, err := Read(&buf)
	require.NoError(t, err)
	require.Greater(t, r.Span, 20*time.Millisecond)
	found := map[string]Class{}
	for _, c := range r.Classes {
		if strings.Contains(c.Where, "schedwait.") {
			found[c.Kind+" "+c.Where[:strings.Index(c.Where+" ", " ")]] = c
		}
	}
	for _, want := range []string{
		KindNetwork + " schedwait.readsTheNetwork",
		KindTimer + " schedwait.sleeps",
		"chan receive schedwait.receives",
		KindYield + " schedwait.yields",
	} {
		c, ok := found[want]
		require.True(t, ok, "no %q among %v", want, keys(found))
		require.NotEmpty(t, c.Waits)
		require.LessOrEqual(t, c.Quantile(0), c.Quantile(0.99), "sorted")
	}
	kinds := map[string]bool{}
	for _, c := range r.ByKind() {
		kinds[c.Kind] = true
	}
	require.True(t, kinds[KindNetwork] && kinds[KindTimer] && kinds[KindYield], "by kind: %v", kinds)
	require.Contains(t, r.Line(), KindNetwork+" ")

	// The last 30 ms, every goroutine here ended, have no event but the
	// runtime's own: the longest stretch without one is most of them.
	require.NotEmpty(t, r.Gaps.Waits)
	require.GreaterOrEqual(t, r.Gaps.Quantile(1), 10*time.Millisecond)
	require.Less(t, r.Gaps.Sum(), r.Span)
	require.Contains(t, r.Line(), "no event for ")
}

func TestHistogram(t *testing.T) {
	ms := func(n float64) time.Duration { return time.Duration(n * float64(time.Millisecond)) }
	got := Histogram([]time.Duration{ms(0.5), ms(2.5), ms(3), ms(6.9)}, ms(2))
	require.Equal(t, []Bucket{{0, 1}, {ms(2), 2}, {ms(4), 0}, {ms(6), 1}}, got)
	require.Nil(t, Histogram(nil, ms(2)))
}

func keys(m map[string]Class) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

func readsTheNetwork(c net.Conn, done chan struct{}) {
	defer c.Close()
	b := make([]byte, 1)
	for {
		if _, err := c.Read(b); err != nil {
			return
		}
		select {
		case <-done:
			return
		default:
		}
	}
}

func sleeps(done chan struct{}) {
	for {
		time.Sleep(2 * time.Millisecond)
		select {
		case <-done:
			return
		default:
		}
	}
}

func receives(ch chan int) {
	for range ch {
	}
}

func yields(done chan struct{}) {
	for {
		select {
		case <-done:
			return
		default:
			runtime.Gosched()
		}
	}
}
