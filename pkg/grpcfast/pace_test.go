package grpcfast

import (
	"context"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	testpb "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/tap"

	"github.com/floodgate-dev/floodgate/pkg/stacktest"
)

// testPacer gives turns at once until held; held, each turn waits for a
// value on give (or the connection's closing). Metadata "critical" unpaces.
type testPacer struct {
	held    atomic.Bool
	give    chan struct{}
	asked   atomic.Int64 // turns asked for
	waiting atomic.Int64
	closing atomic.Int64 // waits ended by the connection's closing
	counted atomic.Int64 // counted turns not yet ended
	transit atomic.Int64 // calls dispatched, not started
	started atomic.Int64
}

func (p *testPacer) Turn(done <-chan struct{}) bool {
	p.asked.Add(1)
	if p.held.Load() {
		p.waiting.Add(1)
		defer p.waiting.Add(-1)
		select {
		case <-p.give:
		case <-done:
			p.closing.Add(1)
			return false
		}
	}
	p.counted.Add(1)
	return true
}

func (p *testPacer) Done() { p.counted.Add(-1) }

func (p *testPacer) Dispatched() { p.transit.Add(1) }

func (p *testPacer) Started() { p.transit.Add(-1); p.started.Add(1) }

func (p *testPacer) Unpaced(md metadata.MD) bool { return len(md.Get("critical")) > 0 }

// A new connection is read unpaced until its first call; once a call has
// shown it is not for the CRITICAL cluster, a call that arrives while the
// connection waits for data is read only once the pacer gives it a turn; a
// call with the metadata that unpaces its connection makes the
// connection's later calls need none; closing the server ends a wait for a
// turn.
func TestPacedReads(t *testing.T) {
	p := &testPacer{give: make(chan struct{})}
	f := serve(t, Config{ReadPacer: p})
	c := testpb.NewTestServiceClient(f.conn)
	ctx := ctxT(t)
	f.conn.Connect()
	require.Eventually(t, func() bool { return f.conn.GetState() == connectivity.Ready }, 5*time.Second, time.Millisecond)
	time.Sleep(50 * time.Millisecond) // the reader waiting for data
	p.held.Store(true)                // a turn asked for would wait
	first, cancel := context.WithTimeout(ctx, 2*time.Second)
	_, err := c.UnaryCall(first, &testpb.SimpleRequest{})
	cancel()
	require.NoError(t, err, "the first call needs no turn")
	p.held.Store(false)
	require.Eventually(t, func() bool { // a read after the call (a PING, say) may wait: give it its turn
		select {
		case p.give <- struct{}{}:
		default:
		}
		return p.waiting.Load() == 0
	}, 5*time.Second, time.Millisecond)
	// Paced from its first call: a call asks for a turn once the reader
	// waits for data (a call sent before the reader is back is read
	// without one).
	calls := int64(1)
	require.Eventually(t, func() bool {
		_, err := c.UnaryCall(ctx, &testpb.SimpleRequest{})
		require.NoError(t, err)
		calls++
		return p.asked.Load() > 0
	}, 5*time.Second, 10*time.Millisecond, "paced from its first call")
	require.Equal(t, calls, p.started.Load(), "the calls of a connection paced from their dispatch are counted to their worker")
	require.Zero(t, p.transit.Load())

	t.Run("a call waits for its connection's turn", func(t *testing.T) {
		time.Sleep(50 * time.Millisecond) // the reader back waiting for data
		p.held.Store(true)
		defer p.held.Store(false)
		answered := callWaitingForATurn(t, p, func() error {
			_, err := c.UnaryCall(ctx, &testpb.SimpleRequest{ResponseSize: 3})
			return err
		})
		p.give <- struct{}{}
		select {
		case err := <-answered:
			require.NoError(t, err)
		case <-time.After(5 * time.Second):
			t.Fatal("not answered after its turn")
		}
		require.Eventually(t, func() bool { return p.counted.Load() == 0 }, 5*time.Second, time.Millisecond,
			"every counted turn ended once its reads were handled")
	})

	t.Run("a critical call unpaces its connection", func(t *testing.T) {
		// A server of its own: the other connection's reads (a client's
		// PING, say) would ask this pacer for turns too.
		p2 := &testPacer{give: make(chan struct{})}
		f2 := serve(t, Config{ReadPacer: p2})
		cc := testpb.NewTestServiceClient(f2.conn)
		_, err := cc.UnaryCall(ctx, &testpb.SimpleRequest{}) // paced by the first call
		require.NoError(t, err)
		// A call of its own asks for a turn once the reader waits for data
		// (a call sent before the reader is back is read without one).
		require.Eventually(t, func() bool {
			_, err := cc.UnaryCall(ctx, &testpb.SimpleRequest{})
			require.NoError(t, err)
			return p2.asked.Load() > 0
		}, 5*time.Second, 10*time.Millisecond, "paced")
		_, err = cc.UnaryCall(metadata.AppendToOutgoingContext(ctx, "critical", "1"), &testpb.SimpleRequest{})
		require.NoError(t, err)
		time.Sleep(50 * time.Millisecond)
		p2.held.Store(true)
		asked := p2.asked.Load()
		for range 20 {
			_, err := cc.UnaryCall(ctx, &testpb.SimpleRequest{})
			require.NoError(t, err)
		}
		require.Equal(t, asked, p2.asked.Load(), "no turn asked for on the unpaced connection")
		require.Zero(t, p2.waiting.Load())
	})

	t.Run("closing ends a wait", func(t *testing.T) {
		time.Sleep(50 * time.Millisecond)
		p.held.Store(true)
		cctx, cancel := context.WithCancel(ctx)
		defer cancel()
		go func() { _, _ = c.UnaryCall(cctx, &testpb.SimpleRequest{}) }()
		require.Eventually(t, func() bool { return p.waiting.Load() == 1 }, 5*time.Second, time.Millisecond)
		f.srv.Close()
		require.Eventually(t, func() bool { return p.waiting.Load() == 0 }, 5*time.Second, time.Millisecond)
		require.Equal(t, int64(1), p.closing.Load())
	})
}

// A connection is paced through the wrappers a listener puts around it
// (Unwrap); one with no socket under it is served unpaced.
func TestPaceFindsTheSocket(t *testing.T) {
	_, nc := stacktest.TCPPair(t)
	w := wrapped{nc}
	pc := pace(w, &testPacer{})
	require.NotNil(t, pc)
	require.Equal(t, net.Conn(w), pc.Conn, "Close and the rest stay the wrapper's")
	require.Nil(t, pace(opaque{nc}, &testPacer{}))
}

type wrapped struct{ net.Conn }

func (w wrapped) Unwrap() net.Conn { return w.Conn }

type opaque struct{ net.Conn }

// TestPacedCallDeadlineCountsFromItsArrival: a call that waited in the
// socket for its connection's turn has its deadline counted from when it
// arrived, not from when it was read; one whose deadline passed while it
// waited is answered by the transport, without a worker.
func TestPacedCallDeadlineCountsFromItsArrival(t *testing.T) {
	var told atomic.Int64
	p := &testPacer{give: make(chan struct{})}
	f := serve(t, Config{ReadPacer: p, PastDeadline: func(string) string { told.Add(1); return "too late" }})
	r := rawDial(t, f.addr)
	r.unaryCall(t, 1, "10S") // the first call: read unpaced, paced from then on
	require.Equal(t, "0", r.trailers(t)["grpc-status"])
	time.Sleep(50 * time.Millisecond) // the reader waiting for data
	p.held.Store(true)
	r.unaryCall(t, 3, "100m")
	require.Eventually(t, func() bool { return p.waiting.Load() == 1 }, 5*time.Second, time.Millisecond)
	time.Sleep(150 * time.Millisecond) // past its 100 ms, unread
	p.held.Store(false)
	p.give <- struct{}{}
	got := r.trailers(t)
	require.Equal(t, "4", got["grpc-status"], "DEADLINE_EXCEEDED: %v", got)
	require.Equal(t, "too late", got["grpc-message"])
	require.EqualValues(t, 1, told.Load())
}

// A paced read woken by a frame that is not a call (a WINDOW_UPDATE) does
// not date the call behind it: that call came later, and its deadline is
// not counted from the frame's arrival.
func TestPacedArrivalIsACallsOnly(t *testing.T) {
	p := &testPacer{give: make(chan struct{})}
	f := serve(t, Config{ReadPacer: p, PastDeadline: func(string) string { return "too late" }})
	r := rawDial(t, f.addr)
	r.unaryCall(t, 1, "10S") // read unpaced, paced from then on
	require.Equal(t, "0", r.trailers(t)["grpc-status"])
	time.Sleep(50 * time.Millisecond) // the reader waiting for data
	p.held.Store(true)
	require.NoError(t, r.fr.WriteWindowUpdate(0, 1000))
	require.Eventually(t, func() bool { return p.waiting.Load() == 1 }, 5*time.Second, time.Millisecond)
	time.Sleep(150 * time.Millisecond)
	r.unaryCall(t, 3, "100m") // 150 ms after the WINDOW_UPDATE, well within its own 100 ms
	time.Sleep(10 * time.Millisecond)
	p.held.Store(false)
	p.give <- struct{}{}
	got := r.trailers(t)
	require.Equal(t, "0", got["grpc-status"], "served, not dated by the WINDOW_UPDATE: %v", got)
}

// TestPacedFromACallRefusedAtTheDoor: a connection whose first call the
// tap refuses is paced from then on, as one whose first call was served:
// under overload the door may refuse a connection's every call.
func TestPacedFromACallRefusedAtTheDoor(t *testing.T) {
	var refuse atomic.Bool
	refuse.Store(true)
	p := &testPacer{give: make(chan struct{})}
	f := serve(t, Config{ReadPacer: p, Tap: refusingTap("the door", func(*tap.Info) bool { return refuse.Load() })})
	c := testpb.NewTestServiceClient(f.conn)
	ctx := ctxT(t)
	_, err := c.UnaryCall(ctx, &testpb.SimpleRequest{})
	require.Equal(t, codes.Unavailable, status.Code(err))
	refuse.Store(false)
	time.Sleep(50 * time.Millisecond) // the reader waiting for data
	p.held.Store(true)
	answered := callWaitingForATurn(t, p, func() error {
		_, err := c.UnaryCall(ctx, &testpb.SimpleRequest{})
		return err
	})
	p.held.Store(false)
	p.give <- struct{}{}
	require.NoError(t, <-answered)
}

// callWaitingForATurn starts call while p holds every turn, and returns
// where its answer will come, once the call's connection waits for a turn
// and the call is still unanswered 100 ms later.
func callWaitingForATurn(t *testing.T, p *testPacer, call func() error) <-chan error {
	t.Helper()
	answered := make(chan error, 1)
	go func() { answered <- call() }()
	require.Eventually(t, func() bool { return p.waiting.Load() == 1 }, 5*time.Second, time.Millisecond)
	select {
	case err := <-answered:
		t.Fatalf("answered before its turn: %v", err)
	case <-time.After(100 * time.Millisecond):
	}
	return answered
}

// TestPacedArrivalIsWhenTheBytesCame: a paced read can be woken with
// nothing to read (an edge left from bytes an earlier read took) and then
// wait for its turn while a call arrives; the call is dated when it came,
// not when the read was woken — which was before it was sent, and would
// have it answered DEADLINE_EXCEEDED while its caller still waited.
func TestPacedArrivalIsWhenTheBytesCame(t *testing.T) {
	client, nc := stacktest.TCPPair(t)
	p := &testPacer{give: make(chan struct{})}
	pc := pace(nc, p)
	require.NotNil(t, pc)
	require.NotNil(t, pc.oob, "this system stamps what a socket receives")
	var fd uintptr
	require.NoError(t, pc.rc.Control(func(f uintptr) { fd = f }))
	// wokenRead is a read the runtime woke: it waits for its turn, then
	// reads whatever the socket then holds.
	wokenRead := func() (bool, time.Time) {
		pc.buf, pc.woken = make([]byte, 64), true
		read := pc.readFrom(fd)
		pc.settle()
		return read, pc.arrival()
	}
	// The kernel starts stamping a moment after the first socket asks.
	require.Eventually(t, func() bool {
		_, err := client.Write([]byte("x"))
		require.NoError(t, err)
		time.Sleep(time.Millisecond)
		read, at := wokenRead()
		return read && !at.IsZero()
	}, 5*time.Second, 10*time.Millisecond)

	p.held.Store(true)
	type result struct {
		read bool
		at   time.Time
	}
	done := make(chan result)
	woken := time.Now()
	go func() { read, at := wokenRead(); done <- result{read, at} }() // nothing to read yet
	require.Eventually(t, func() bool { return p.waiting.Load() == 1 }, 5*time.Second, time.Millisecond)
	time.Sleep(100 * time.Millisecond)
	sent := time.Now()
	_, err := client.Write([]byte("call"))
	require.NoError(t, err)
	time.Sleep(10 * time.Millisecond)
	p.give <- struct{}{}
	r := <-done
	require.True(t, r.read)
	require.Equal(t, 4, pc.n)
	require.False(t, r.at.Before(sent), "dated %s before it was sent (%s after the wake)", sent.Sub(r.at), r.at.Sub(woken))
}
