package grpcfast

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	testpb "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/protobuf/proto"
)

// A stream's WINDOW_UPDATE tries that stream alone, however many others
// wait for theirs: the connection's work per frame does not grow with the
// streams a client keeps waiting.
func TestStreamWindowUpdateTriesItsStreamAlone(t *testing.T) {
	const n = 100
	f := serve(t, Config{})
	rc := newReceiver(t, rawDial(t, f.addr), 8)
	for i := range n {
		rc.ask(rc.r.fr, uint32(2*i+1), 100, []byte(fmt.Sprintf("answer %d;", i)))
	}
	rc.settle() // each answer's first 8 bytes
	c := serverConn(t, f.srv)
	require.Equal(t, waits{stream: n}, checkWaits(t, c))

	before := retried(c)
	rc.grantStream(rc.r.fr, 1, 1000)
	rc.settle()
	require.Equal(t, []uint32{1}, rc.order)
	require.EqualValues(t, 1, retried(c)-before, "one stream's WINDOW_UPDATE tried %d waiting answers", retried(c)-before)
	require.Equal(t, waits{stream: n - 1}, checkWaits(t, c))

	for i := 1; i < n; i++ {
		rc.grantStream(rc.r.fr, uint32(2*i+1), 1000)
	}
	rc.settle()
	require.Len(t, rc.order, n)
	require.Equal(t, waits{}, checkWaits(t, c))
}

// A connection WINDOW_UPDATE sends the answers waiting for the connection
// window in the order they began to wait, and tries no more of them than
// it has room for (and one it can send part of); while that window has no
// room, a stream's WINDOW_UPDATE tries nothing, and its answer waits behind
// those already waiting.
func TestConnectionWindowUpdateTriesWhatItHasRoomFor(t *testing.T) {
	const n, k = 50, 10
	f := serve(t, Config{})
	rc := newReceiver(t, rawDial(t, f.addr), initialWindow)
	rc.ask(rc.r.fr, 1, 70000, []byte("big"))
	rc.settle() // stream 1's answer takes the connection's whole window
	c := serverConn(t, f.srv)
	require.Equal(t, waits{stream: 1}, checkWaits(t, c))

	var ids []uint32
	for i := range n { // one at a time: they wait in this order
		id := uint32(3 + 2*i)
		ids = append(ids, id)
		rc.ask(rc.r.fr, id, 10, []byte{byte('a' + i%26)})
		require.Eventually(t, func() bool { return lists(c).conn == i+1 }, 5*time.Second, time.Millisecond)
	}
	size := len(rc.want[ids[0]])

	before := retried(c)
	rc.grantConn(rc.r.fr, k*size)
	rc.settle()
	require.Equal(t, ids[:k], rc.order, "the first to wait are sent first")
	require.LessOrEqual(t, retried(c)-before, uint64(k+1), "room for %d answers, %d tried", k, retried(c)-before)
	require.Equal(t, waits{conn: n - k, stream: 1}, checkWaits(t, c))

	before = retried(c)
	rc.grantStream(rc.r.fr, 1, 1<<20)
	require.Eventually(t, func() bool { return lists(c) == waits{conn: n - k + 1} }, 5*time.Second, time.Millisecond)
	require.Zero(t, retried(c)-before, "nothing can be sent: nothing tried")

	before = retried(c)
	rc.grantConn(rc.r.fr, k*size+size/2) // k answers and half of one
	rc.settle()
	require.Equal(t, ids[:2*k], rc.order)
	require.LessOrEqual(t, retried(c)-before, uint64(k+1), "room for %d answers and part of one, %d tried", k, retried(c)-before)

	rc.grantConn(rc.r.fr, 1<<20)
	rc.settle()
	require.Equal(t, append(ids, 1), rc.order, "stream 1 waits behind those that waited for the connection before it")
	require.Equal(t, waits{}, checkWaits(t, c))
}

// A waiting stream leaves the lists when it ends: reset by its client or by
// the server, or its connection closed.
func TestWaitingStreamsLeaveWhenTheyEnd(t *testing.T) {
	const n = 20
	f := serve(t, Config{})
	rc := newReceiver(t, rawDial(t, f.addr), 8)
	for i := range n {
		rc.ask(rc.r.fr, uint32(2*i+1), 100, []byte{byte('a' + i)})
	}
	rc.settle()
	c := serverConn(t, f.srv)
	require.Equal(t, waits{stream: n}, checkWaits(t, c))

	for i := 0; i < n; i += 4 { // the client cancels a quarter
		rc.reset(uint32(2*i + 1))
		require.NoError(t, rc.r.fr.WriteRSTStream(uint32(2*i+1), http2.ErrCodeCancel))
	}
	require.Eventually(t, func() bool { return lists(c).stream == n-n/4 }, 5*time.Second, time.Millisecond)
	require.Equal(t, waits{stream: n - n/4}, checkWaits(t, c))

	// HEADERS again on a stream whose request has ended: the server resets it.
	rc.reset(3)
	require.NoError(t, rc.r.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 3, BlockFragment: rc.r.block(callHeaders...), EndHeaders: true, EndStream: true}))
	require.Eventually(t, func() bool { return lists(c).stream == n-n/4-1 }, 5*time.Second, time.Millisecond)
	require.Equal(t, waits{stream: n - n/4 - 1}, checkWaits(t, c))

	held := waitingStreams(c)
	require.NoError(t, rc.r.nc.Close())
	require.Eventually(t, func() bool { c.mu.Lock(); defer c.mu.Unlock(); return c.closed }, 5*time.Second, time.Millisecond)
	require.Equal(t, waits{}, checkWaits(t, c))
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, st := range held {
		require.True(t, st.waiting == nil && st.prev == nil && st.next == nil, "stream %d still linked", st.id)
	}
}

// Many answers held by small windows, unary and server-streaming, with
// WINDOW_UPDATEs for streams and the connection, and now and then a new
// initial stream window (SETTINGS), coming in random orders and bursts:
// every answer arrives whole, in order, within the windows,
// its trailers after it; the connection's wait lists are sound after every
// burst and empty at the end.
func TestAnswersWhateverOrderTheWindowsCome(t *testing.T) {
	for seed := range 6 {
		t.Run(fmt.Sprint("seed ", seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(uint64(seed), 34))
			f := serve(t, Config{})
			rc := newReceiver(t, rawDial(t, f.addr), 1+rng.IntN(64))
			if seed%3 != 2 { // stream 1 takes the connection's window: all the others wait for it too
				rc.ask(rc.r.fr, 1, 70000, []byte("big"))
				rc.grantStream(rc.r.fr, 1, 70000)
				rc.settle()
			}
			var b bytes.Buffer
			fw := http2.NewFramer(&b, nil)
			for i := range 150 {
				id := uint32(2*i + 3)
				if i%10 == 0 {
					rc.askStream(fw, id, rng.IntN(300), rng.IntN(300), rng.IntN(300))
				} else {
					rc.ask(fw, id, rng.IntN(400), []byte(fmt.Sprintf("<%d>", id)))
				}
			}
			_, err := rc.r.nc.Write(b.Bytes())
			require.NoError(t, err)
			c := serverConn(t, f.srv)
			for round := 0; len(rc.order) < len(rc.want); round++ {
				require.Less(t, round, 100000)
				rc.settle()
				checkWaits(t, c)
				b.Reset()
				for range 1 + rng.IntN(6) {
					if rng.IntN(40) == 0 {
						rc.setInitial(fw, 1+rng.IntN(100))
						continue
					}
					if rng.IntN(4) == 0 {
						rc.grantConn(fw, 1+rng.IntN(200))
						continue
					}
					if open := rc.unsent(); len(open) > 0 {
						rc.grantStream(fw, open[rng.IntN(len(open))], 1+rng.IntN(60))
					}
				}
				_, err := rc.r.nc.Write(b.Bytes())
				require.NoError(t, err)
			}
			require.Equal(t, waits{}, checkWaits(t, c))
		})
	}
}

// receiver is a raw client's side of the server's answers: the windows it
// has granted and the bytes each stream must bring, checked frame by frame.
type receiver struct {
	t       *testing.T
	r       *rawConn
	initial int64             // the stream window of the last SETTINGS the server acked
	pending []int64           // the stream windows of the SETTINGS not acked yet (-1: none)
	conn    int64             // connection window left to the server
	win     map[uint32]int64  // stream windows left to the server
	want    map[uint32][]byte // each stream's answer: its messages, framed
	got     map[uint32][]byte
	hdr     map[uint32]bool // response headers came
	gone    map[uint32]bool // reset: frames may still come before the reset is read
	ids     []uint32
	order   []uint32 // the streams in the order their trailers came
}

// newReceiver sets the client's initial stream window (SETTINGS) on r,
// just dialled.
func newReceiver(t *testing.T, r *rawConn, initial int) *receiver {
	t.Helper()
	r.fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	rc := &receiver{t: t, r: r, initial: initialWindow, pending: []int64{-1}, conn: initialWindow, win: map[uint32]int64{},
		want: map[uint32][]byte{}, got: map[uint32][]byte{}, hdr: map[uint32]bool{}, gone: map[uint32]bool{}}
	rc.setInitial(r.fr, initial)
	return rc
}

// ask writes a UnaryCall on stream id with fw, asking for size bytes of
// pattern.
func (rc *receiver) ask(fw *http2.Framer, id uint32, size int, pattern []byte) {
	rc.t.Helper()
	rc.call(fw, id, testpb.TestService_UnaryCall_FullMethodName,
		&testpb.SimpleRequest{ResponseSize: int32(size), Payload: &testpb.Payload{Body: pattern}},
		framed(rc.t, &testpb.SimpleResponse{Payload: &testpb.Payload{Body: fill(size, pattern)}}))
}

// askStream writes a StreamingOutputCall on stream id with fw, asking for a
// message of each size.
func (rc *receiver) askStream(fw *http2.Framer, id uint32, sizes ...int) {
	rc.t.Helper()
	req, want := &testpb.StreamingOutputCallRequest{}, []byte(nil)
	for _, n := range sizes {
		req.ResponseParameters = append(req.ResponseParameters, &testpb.ResponseParameters{Size: int32(n)})
		want = append(want, framed(rc.t, &testpb.StreamingOutputCallResponse{Payload: &testpb.Payload{Body: make([]byte, n)}})...)
	}
	rc.call(fw, id, testpb.TestService_StreamingOutputCall_FullMethodName, req, want)
}

func (rc *receiver) call(fw *http2.Framer, id uint32, method string, req proto.Message, want []byte) {
	rc.t.Helper()
	hs := append([]string{}, callHeaders...)
	hs[5] = method
	require.NoError(rc.t, fw.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: rc.r.block(hs...), EndHeaders: true}))
	require.NoError(rc.t, fw.WriteData(id, true, framed(rc.t, req)))
	rc.want[id], rc.win[id] = want, rc.initial
	rc.ids = append(rc.ids, id)
}

// framed is m as a gRPC message: its 5-byte prefix, then its encoding.
func framed(t *testing.T, m proto.Message) []byte {
	b, err := proto.Marshal(m)
	require.NoError(t, err)
	return append(binary.BigEndian.AppendUint32([]byte{0}, uint32(len(b))), b...)
}

func (rc *receiver) grantConn(fw *http2.Framer, n int) {
	require.NoError(rc.t, fw.WriteWindowUpdate(0, uint32(n)))
	rc.conn += int64(n)
}

func (rc *receiver) grantStream(fw *http2.Framer, id uint32, n int) {
	require.NoError(rc.t, fw.WriteWindowUpdate(id, uint32(n)))
	rc.win[id] += int64(n)
}

// setInitial changes the initial stream window (SETTINGS), which moves
// every open stream's window by the change — from the server's ack on:
// what it sent before had the windows before.
func (rc *receiver) setInitial(fw *http2.Framer, n int) {
	require.NoError(rc.t, fw.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: uint32(n)}))
	rc.pending = append(rc.pending, int64(n))
}

// reset forgets stream id (the client resets it, or makes the server do so).
func (rc *receiver) reset(id uint32) {
	rc.gone[id] = true
	delete(rc.want, id)
}

// unsent lists the streams with answer bytes still to come, in the order
// they were asked.
func (rc *receiver) unsent() []uint32 {
	var ids []uint32
	for _, id := range rc.ids {
		if w, ok := rc.want[id]; ok && len(rc.got[id]) < len(w) {
			ids = append(ids, id)
		}
	}
	return ids
}

// settle reads until the server has acked the client's SETTINGS, sent all
// the windows let it send, and the trailers of every answer sent whole.
func (rc *receiver) settle() {
	rc.t.Helper()
	for {
		var sendable int64
		ended := true
		for id, w := range rc.want {
			sendable += min(max(rc.win[id], 0), int64(len(w)-len(rc.got[id])))
			ended = ended && (len(rc.got[id]) < len(w) || rc.ended(id))
		}
		if min(sendable, rc.conn) == 0 && ended && len(rc.pending) == 0 {
			return
		}
		rc.read()
	}
}

func (rc *receiver) ended(id uint32) bool {
	for _, e := range rc.order {
		if e == id {
			return true
		}
	}
	return false
}

// read reads one frame and checks it against the windows and the answers.
func (rc *receiver) read() {
	t := rc.t
	t.Helper()
	f, err := rc.r.fr.ReadFrame()
	require.NoError(t, err)
	id := f.Header().StreamID
	if rc.gone[id] {
		return
	}
	switch f := f.(type) {
	case *http2.DataFrame:
		n := int64(len(f.Data()))
		require.True(t, rc.hdr[id], "stream %d: DATA before HEADERS", id)
		require.LessOrEqual(t, n, rc.conn, "stream %d: DATA past the connection window", id)
		require.LessOrEqual(t, n, rc.win[id], "stream %d: DATA past the stream window", id)
		rc.conn -= n
		rc.win[id] -= n
		got, want := rc.got[id], rc.want[id]
		require.LessOrEqual(t, len(got)+int(n), len(want), "stream %d: more than its answer", id)
		require.Equal(t, want[len(got):len(got)+int(n)], f.Data(), "stream %d: its answer's bytes out of order", id)
		rc.got[id] = append(got, f.Data()...)
	case *http2.MetaHeadersFrame:
		if !f.StreamEnded() {
			require.False(t, rc.hdr[id], "stream %d: headers twice", id)
			require.Equal(t, "200", f.PseudoValue("status"))
			rc.hdr[id] = true
			return
		}
		require.True(t, rc.hdr[id], "stream %d: trailers only", id)
		require.Equal(t, len(rc.want[id]), len(rc.got[id]), "stream %d: trailers before the whole answer", id)
		for _, hf := range f.RegularFields() {
			if hf.Name == "grpc-status" {
				require.Equal(t, "0", hf.Value, "stream %d", id)
			}
		}
		require.False(t, rc.ended(id), "stream %d: trailers twice", id)
		rc.order = append(rc.order, id)
	case *http2.SettingsFrame:
		if !f.IsAck() {
			return
		}
		require.NotEmpty(t, rc.pending, "an ack of no SETTINGS")
		if n := rc.pending[0]; n >= 0 {
			for id := range rc.win {
				rc.win[id] += n - rc.initial
			}
			rc.initial = n
		}
		rc.pending = rc.pending[1:]
	case *http2.RSTStreamFrame:
		t.Fatalf("stream %d reset: %v", id, f.ErrCode)
	case *http2.GoAwayFrame:
		t.Fatalf("GOAWAY %v", f.ErrCode)
	}
}

// serverConn returns the server's one connection.
func serverConn(t *testing.T, s *Server) *conn {
	t.Helper()
	var c *conn
	require.Eventually(t, func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		for c = range s.conns {
		}
		return len(s.conns) == 1
	}, 5*time.Second, time.Millisecond)
	return c
}

// waits counts a connection's answers waiting for its window and for their
// streams' windows.
type waits struct{ conn, stream int }

func lists(c *conn) waits {
	c.mu.Lock()
	defer c.mu.Unlock()
	var w waits
	for st := c.connWait.head; st != nil; st = st.next {
		w.conn++
	}
	for st := c.streamWait.head; st != nil; st = st.next {
		w.stream++
	}
	return w
}

// checkWaits checks a connection's wait lists, and returns what waits.
// A stream waits in at most one list, linked both ways, while it is open
// and has answer bytes to send, in connWait only while its own window has
// room and the connection's has none, in streamWait only while its own
// window has none; an open stream with bytes to send waits.
func checkWaits(t *testing.T, c *conn) waits {
	t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	seen := map[*stream]bool{}
	count := func(l *waitList, forConn bool) int {
		n := 0
		var prev *stream
		for st := l.head; st != nil; st = st.next {
			require.False(t, seen[st], "stream %d waits twice", st.id)
			seen[st] = true
			require.True(t, st.waiting == l && st.prev == prev, "stream %d: links", st.id)
			require.False(t, st.gone, "stream %d waits but has ended", st.id)
			require.True(t, c.streams[st.id] == st, "stream %d waits but is not open", st.id)
			require.NotEmpty(t, st.out, "stream %d waits with nothing to send", st.id)
			if forConn {
				require.Positive(t, st.sendAvail, "stream %d waits for the connection with no window of its own", st.id)
				require.LessOrEqual(t, c.sendAvail, int64(0), "stream %d waits for the connection window, which has room", st.id)
			} else {
				require.LessOrEqual(t, st.sendAvail, int64(0), "stream %d waits for its window, which has room", st.id)
			}
			prev, n = st, n+1
		}
		require.True(t, l.tail == prev, "tail")
		return n
	}
	w := waits{conn: count(&c.connWait, true), stream: count(&c.streamWait, false)}
	for _, st := range c.streams {
		require.True(t, len(st.out) == 0 || seen[st], "stream %d has answer bytes and waits for nothing", st.id)
	}
	return w
}

// waitingStreams returns the streams waiting in either list.
func waitingStreams(c *conn) []*stream {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []*stream
	for _, l := range []*waitList{&c.connWait, &c.streamWait} {
		for st := l.head; st != nil; st = st.next {
			out = append(out, st)
		}
	}
	return out
}

// retried is how many waiting answers c has tried after a window grew.
func retried(c *conn) uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.retried
}
