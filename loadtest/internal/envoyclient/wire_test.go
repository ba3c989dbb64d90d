package envoyclient

import (
	"context"
	"errors"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/stretchr/testify/require"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

const rlsPath = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"

// rls is a rate-limit service whose answer each test chooses.
type rls struct {
	rlsv3.UnimplementedRateLimitServiceServer
	answer func(ctx context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error)
}

func (s *rls) ShouldRateLimit(ctx context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	return s.answer(ctx, req)
}

// serveRLS starts a grpc-go server on loopback with answer as the service.
func serveRLS(t *testing.T, answer func(context.Context, *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error)) (string, *grpc.Server) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	g := grpc.NewServer()
	rlsv3.RegisterRateLimitServiceServer(g, &rls{answer: answer})
	go func() { _ = g.Serve(ln) }()
	t.Cleanup(g.Stop)
	return ln.Addr().String(), g
}

// answers collects what a Wire delivers.
type answers struct {
	mu  sync.Mutex
	got map[int]Answer
	ch  chan int
}

func newAnswers() *answers { return &answers{got: map[int]Answer{}, ch: make(chan int, 100000)} }

func (a *answers) done(tag int, ans Answer) {
	ans.Body = append([]byte(nil), ans.Body...) // valid only during the callback
	a.mu.Lock()
	a.got[tag] = ans
	a.mu.Unlock()
	a.ch <- tag
}

func (a *answers) wait(t *testing.T, n int) {
	t.Helper()
	for range n {
		select {
		case <-a.ch:
		case <-time.After(10 * time.Second):
			t.Fatalf("an answer did not come within 10 s")
		}
	}
}

func request(t *testing.T, user string) []byte {
	b, err := proto.Marshal(&rlsv3.RateLimitRequest{Domain: "bench", Descriptors: []*rlcommon.RateLimitDescriptor{
		{Entries: []*rlcommon.RateLimitDescriptor_Entry{{Key: "user", Value: user}}}}})
	require.NoError(t, err)
	return b
}

func TestWireCallsAsGRPCGoAnswersThem(t *testing.T) {
	type seen struct {
		user     string
		deadline time.Duration
		prio     []string
	}
	var mu sync.Mutex
	var saw []seen
	addr, _ := serveRLS(t, func(ctx context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
		dl, has := ctx.Deadline()
		if !has {
			dl = time.Now().Add(24 * time.Hour)
		}
		md, _ := metadata.FromIncomingContext(ctx)
		user := req.GetDescriptors()[0].GetEntries()[0].GetValue()
		mu.Lock()
		saw = append(saw, seen{user, time.Until(dl), md.Get("x-floodgate-priority")})
		mu.Unlock()
		if user == "refused" {
			return nil, status.Error(codes.Unavailable, "overloaded: not decided (the gate dropped it) 100%")
		}
		return &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OVER_LIMIT,
			ResponseHeadersToAdd: []*corev3.HeaderValue{{Key: "X-Request-Id", Value: "id-" + user}}}, nil
	})
	a := newAnswers()
	w, err := DialWire(addr, rlsPath, a.done)
	require.NoError(t, err)
	defer w.Close()

	_, err = w.Call(1, 50*time.Millisecond, []hpack.HeaderField{{Name: "x-floodgate-priority", Value: "critical"}}, request(t, "alice"))
	require.NoError(t, err)
	_, err = w.Call(2, 0, nil, request(t, "refused"))
	require.NoError(t, err)
	a.wait(t, 2)

	ok := a.got[1]
	require.NoError(t, ok.Err)
	require.Equal(t, codes.OK, ok.Code)
	var resp rlsv3.RateLimitResponse
	require.NoError(t, proto.Unmarshal(ok.Body, &resp))
	require.Equal(t, rlsv3.RateLimitResponse_OVER_LIMIT, resp.GetOverallCode())
	require.Equal(t, "id-alice", resp.GetResponseHeadersToAdd()[0].GetValue())
	require.False(t, ok.At.Before(ok.Sent))

	refused := a.got[2]
	require.NoError(t, refused.Err)
	require.Equal(t, codes.Unavailable, refused.Code)
	require.Equal(t, "overloaded: not decided (the gate dropped it) 100%", refused.Message)
	require.Empty(t, refused.Body)

	mu.Lock()
	defer mu.Unlock()
	require.Len(t, saw, 2)
	for _, s := range saw {
		if s.user == "alice" { // the timeout arrived as the call's deadline, the metadata as metadata
			require.Greater(t, s.deadline, 30*time.Millisecond)
			require.LessOrEqual(t, s.deadline, 50*time.Millisecond)
			require.Equal(t, []string{"critical"}, s.prio)
		} else {
			require.Greater(t, s.deadline, time.Hour, "no timeout sent: no deadline")
		}
	}
}

// More answer bytes than the 1 MiB window: the connection's window is
// given back as answers are read, or the server stops writing.
func TestWireGivesTheWindowBack(t *testing.T) {
	big := strings.Repeat("x", 4096)
	addr, _ := serveRLS(t, func(ctx context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
		return &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK,
			ResponseHeadersToAdd: []*corev3.HeaderValue{{Key: "X-Big", Value: big}}}, nil
	})
	a := newAnswers()
	w, err := DialWire(addr, rlsPath, a.done)
	require.NoError(t, err)
	defer w.Close()
	const calls = 1500 // ≈ 6 MiB of answers
	msg := request(t, "bob")
	for i := range calls {
		for {
			_, err := w.Call(i, 0, nil, msg)
			if errors.Is(err, ErrBusy) { // the server's stream limit or window: wait as a gateway would
				time.Sleep(time.Millisecond)
				continue
			}
			require.NoError(t, err)
			break
		}
		if i%100 == 99 {
			a.wait(t, 100)
		}
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	require.Len(t, a.got, calls)
	for _, ans := range a.got {
		require.Equal(t, codes.OK, ans.Code)
		require.Greater(t, len(ans.Body), 4096)
	}
}

func TestWireCancelResetsTheStream(t *testing.T) {
	ended := make(chan error, 1)
	addr, _ := serveRLS(t, func(ctx context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
		<-ctx.Done()
		ended <- ctx.Err()
		return nil, ctx.Err()
	})
	a := newAnswers()
	w, err := DialWire(addr, rlsPath, a.done)
	require.NoError(t, err)
	defer w.Close()
	id, err := w.Call(7, time.Hour, nil, request(t, "carol"))
	require.NoError(t, err)
	time.Sleep(50 * time.Millisecond)
	tag, sent, waiting := w.Cancel(id)
	require.True(t, waiting)
	require.Equal(t, 7, tag)
	require.False(t, sent.IsZero())
	select {
	case err := <-ended:
		require.ErrorIs(t, err, context.Canceled, "the server saw the caller leave")
	case <-time.After(5 * time.Second):
		t.Fatal("the server's call was not cancelled")
	}
	_, _, waiting = w.Cancel(id)
	require.False(t, waiting, "cancelled once")
	time.Sleep(50 * time.Millisecond)
	a.mu.Lock()
	require.Empty(t, a.got, "a cancelled call is not answered")
	a.mu.Unlock()
}

// A server going away: calls it took finish, new ones are refused with
// ErrClosed, and Close ends the ones still waiting.
func TestWireGoAwayAndClose(t *testing.T) {
	release := make(chan struct{})
	addr, g := serveRLS(t, func(ctx context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
		if req.GetDescriptors()[0].GetEntries()[0].GetValue() == "slow" {
			<-release
		}
		return &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK}, nil
	})
	a := newAnswers()
	w, err := DialWire(addr, rlsPath, a.done)
	require.NoError(t, err)
	_, err = w.Call(1, 0, nil, request(t, "slow"))
	require.NoError(t, err)
	time.Sleep(50 * time.Millisecond)
	stopped := make(chan struct{})
	go func() { g.GracefulStop(); close(stopped) }()
	require.Eventually(t, func() bool { return w.Err() != nil }, 5*time.Second, 5*time.Millisecond)
	_, err = w.Call(2, 0, nil, request(t, "late"))
	require.ErrorIs(t, err, ErrClosed)
	close(release)
	a.wait(t, 1)
	require.Equal(t, codes.OK, a.got[1].Code, "the call the server took before GOAWAY finished")
	<-stopped

	// Close with a call waiting on a server that never answers.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	held := make(chan net.Conn, 1) // accepted and never answered
	go func() {
		if c, err := ln.Accept(); err == nil {
			held <- c
		}
	}()
	defer func() {
		if c := <-held; c != nil {
			_ = c.Close()
		}
	}()
	w2, err := DialWire(ln.Addr().String(), rlsPath, a.done)
	require.NoError(t, err)
	_, err = w2.Call(3, 0, nil, request(t, "never"))
	require.NoError(t, err)
	require.NoError(t, w2.Close())
	a.wait(t, 1)
	require.ErrorIs(t, a.got[3].Err, ErrClosed)
}

func TestGRPCTimeout(t *testing.T) {
	for d, want := range map[time.Duration]string{
		50 * time.Millisecond:       "50m",
		1500 * time.Microsecond:     "1500u",
		time.Nanosecond:             "1u",
		30 * time.Hour:              "108000S",
		99999999 * time.Millisecond: "99999999m",
	} {
		require.Equal(t, want, grpcTimeout(d), d)
	}
}

// TestWireSettled: Settled closes once the server's SETTINGS are read, and
// stays open while a server has accepted the connection but said nothing.
func TestWireSettled(t *testing.T) {
	addr, _ := serveRLS(t, func(context.Context, *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
		return &rlsv3.RateLimitResponse{}, nil
	})
	w, err := DialWire(addr, rlsPath, func(int, Answer) {})
	require.NoError(t, err)
	t.Cleanup(func() { _ = w.Close() })
	select {
	case <-w.Settled():
	case <-time.After(5 * time.Second):
		t.Fatal("the server's SETTINGS were not read")
	}

	ln, err := net.Listen("tcp", "127.0.0.1:0") // accepts, never speaks
	require.NoError(t, err)
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		if c, err := ln.Accept(); err == nil {
			t.Cleanup(func() { _ = c.Close() })
		}
	}()
	mute, err := DialWire(ln.Addr().String(), rlsPath, func(int, Answer) {})
	require.NoError(t, err)
	t.Cleanup(func() { _ = mute.Close() })
	select {
	case <-mute.Settled():
		t.Fatal("settled without the server's SETTINGS")
	case <-time.After(100 * time.Millisecond):
	}
}

// TestWireArrivedIsTheKernelsReceiveTime: an answer that waits in the
// socket while this process is busy elsewhere (here, the reading goroutine
// held by the answer before it) is read late, but Arrived is when it came.
func TestWireArrivedIsTheKernelsReceiveTime(t *testing.T) {
	addr, _ := serveRLS(t, func(context.Context, *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
		return &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK}, nil
	})
	const busy = 300 * time.Millisecond
	got := make(chan Answer, 2)
	w, hold := dialHeld(t, addr, func(_ int, a Answer) { got <- a }, func() { time.Sleep(busy) })
	<-w.Settled()
	// The kernel starts stamping a moment after the first socket asks
	// (netstamp): until an answer carries a receive time, call again.
	require.Eventually(t, func() bool {
		_, err := w.Call(-1, 0, nil, request(t, "bob"))
		require.NoError(t, err)
		return !(<-got).Arrived.IsZero()
	}, 5*time.Second, 10*time.Millisecond)
	hold.Store(true)
	for i := range 2 {
		_, err := w.Call(i, 0, nil, request(t, "bob"))
		require.NoError(t, err)
	}
	var as []Answer
	for range 2 {
		select {
		case a := <-got:
			require.Equal(t, codes.OK, a.Code)
			require.False(t, a.Arrived.IsZero(), "no receive time")
			require.False(t, a.Arrived.Before(a.Sent), "received %s before it was sent", a.Sent.Sub(a.Arrived))
			require.False(t, a.Arrived.After(a.At), "received %s after it was read", a.Arrived.Sub(a.At))
			as = append(as, a)
		case <-time.After(10 * time.Second):
			t.Fatal("no answer within 10 s")
		}
	}
	// The second answer was read after the first one's busy time, though
	// it had come long before.
	second := as[1]
	require.GreaterOrEqual(t, second.At.Sub(second.Sent), busy-10*time.Millisecond)
	require.Less(t, second.Arrived.Sub(second.Sent), busy/3, "read %s after it was sent", second.At.Sub(second.Sent))
}

// dialHeld dials addr with done hearing each answer and, once hold is
// set, the reading goroutine held in wait after the next one: the answer
// after that waits unread in the socket, as it does while this process's
// core is busy elsewhere.
func dialHeld(t *testing.T, addr string, done func(int, Answer), wait func()) (*Wire[int], *atomic.Bool) {
	t.Helper()
	hold := new(atomic.Bool)
	w, err := DialWire(addr, rlsPath, func(tag int, a Answer) {
		done(tag, a)
		if hold.CompareAndSwap(true, false) {
			wait()
		}
	})
	require.NoError(t, err)
	t.Cleanup(func() { _ = w.Close() })
	return w, hold
}

// A call given up on while its answer waited in the socket (the reading
// goroutine busy) is not delivered to done; its answer goes to
// OnAnswerAfterCancel's function, with when it reached this machine, and
// a call reset before the server answered brings nothing.
func TestWireAnswerAfterCancel(t *testing.T) {
	release := make(chan struct{})
	addr, _ := serveRLS(t, func(ctx context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
		if req.GetDescriptors()[0].GetEntries()[0].GetValue() == "never" {
			<-ctx.Done() // answers only after the reset: nothing comes
			return nil, ctx.Err()
		}
		return &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK}, nil
	})
	const busy = 300 * time.Millisecond
	got := make(chan int, 4)
	w, hold := dialHeld(t, addr, func(tag int, _ Answer) { got <- tag }, func() { <-release })
	var freed sync.Once
	free := func() { freed.Do(func() { close(release) }) }
	t.Cleanup(free) // before Close, which waits for the reading goroutine
	after := make(chan Answer, 4)
	w.OnAnswerAfterCancel(func(a Answer) { after <- a })
	<-w.Settled()
	never, err := w.Call(9, 0, nil, request(t, "never"))
	require.NoError(t, err)
	hold.Store(true)
	_, err = w.Call(1, 0, nil, request(t, "bob"))
	require.NoError(t, err)
	require.Equal(t, 1, <-got)
	id, err := w.Call(2, 0, nil, request(t, "bob"))
	require.NoError(t, err)
	time.Sleep(busy) // call 2's answer reaches the socket; its reader is held
	_, _, waiting := w.Cancel(id)
	require.True(t, waiting, "call 2's answer was not read yet")
	_, _, waiting = w.Cancel(never)
	require.True(t, waiting)
	free()
	select {
	case a := <-after:
		require.Equal(t, codes.OK, a.Code)
		require.NotEmpty(t, a.Body, "the answer's message")
		require.False(t, a.Sent.IsZero())
		require.GreaterOrEqual(t, a.At.Sub(a.Sent), busy, "read once the reader was free")
		if !a.Arrived.IsZero() { // the kernel's receive time, where the system gives one
			require.Less(t, a.Arrived.Sub(a.Sent), busy/3, "it had come long before it was read")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the answer to the call given up on did not come")
	}
	// The connection goes on: a new call is answered as usual, and
	// neither cancelled call reached done or came after.
	_, err = w.Call(3, 0, nil, request(t, "bob"))
	require.NoError(t, err)
	require.Equal(t, 3, <-got)
	select {
	case tag := <-got:
		t.Fatalf("call %d delivered after it was cancelled", tag)
	case a := <-after:
		t.Fatalf("a second answer after cancel: %+v", a)
	case <-time.After(100 * time.Millisecond):
	}
}
