package grpcfast

// One connection: its reader (serve, the only goroutine that reads frames)
// and the state the reader and the calls share under mu.

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc/peer"
)

// initialWindow is HTTP/2's flow-control window before SETTINGS change it.
const initialWindow = 65535

// maxPending bounds the answers and control frames waiting to be written:
// past it the reader stops reading until the client has read (a client
// that sends but never reads cannot grow the server's memory).
const maxPending = 1 << 20

// maxEmptyFrames bounds the DATA frames without data or END_STREAM, and the
// SETTINGS frames, a connection may send (CVE-2019-9518, -9515): beyond it
// is a flood, not a client.
const maxEmptyFrames = 1000

type conn struct {
	s       *Server
	nc      net.Conn
	br      *bufio.Reader
	fr      *http2.Framer
	ctx     context.Context // the calls' parent: the peer (not cancelable: close cancels each call's own)
	connWin int64           // the connection's receive window the server grants
	frames  atomic.Uint64   // frames read, for the keepalive timer
	paced   *pacedConn      // the socket under nc, when its reads are paced (Config.ReadPacer)

	// The reader's own.
	ready       []*stream // calls read whole, dispatched once the next frame needs the socket
	recvAvail   int64     // connection credit the client still has
	recvPending int64     // connection credit to return
	buffered    int64     // bytes of requests not yet complete
	lastPing    time.Time
	pingStrikes int
	empty       int // empty DATA and SETTINGS frames seen

	mu         sync.Mutex
	room       *sync.Cond // the reader waits here while len(wbuf) > maxPending
	streams    map[uint32]*stream
	lastID     uint32 // the highest stream the client opened (GOAWAY's last stream)
	wbuf       []byte // frames to write
	spare      []byte
	flushing   bool
	sendAvail  int64    // connection credit the server has
	peerWin    int64    // the client's SETTINGS_INITIAL_WINDOW_SIZE
	peerFrame  int      // the client's SETTINGS_MAX_FRAME_SIZE
	connWait   waitList // answers waiting for the connection window (flow.go)
	streamWait waitList // answers waiting for their stream's window
	retried    uint64   // waiting answers tried after a window grew (the tests count them)
	sentData   bool     // the server sent headers or data since the last PING (ping strikes)
	greeted    bool     // the server's SETTINGS are in wbuf: frames may follow
	goingAway  bool
	ending     bool // Shutdown: server-streaming calls end at once (endStreaming)
	closeAfter bool // close once wbuf is written (GOAWAY sent, no stream left)
	closed     bool
	busy       bool      // a stream was open since the idle timer last looked
	deadline   time.Time // the write deadline set on nc
	timers     []*time.Timer
}

func newConn(s *Server, nc net.Conn) *conn {
	c := &conn{s: s, nc: nc, br: bufio.NewReaderSize(nc, 32<<10), streams: map[uint32]*stream{},
		sendAvail: initialWindow, peerWin: initialWindow, peerFrame: 16384}
	c.room = sync.NewCond(&c.mu)
	c.connWin = max(int64(s.cfg.Window), 2*int64(s.cfg.MaxRecvMsgSize+5))
	c.recvAvail = initialWindow
	c.fr = http2.NewFramer(nil, c.br)
	c.fr.SetReuseFrames()
	c.fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	c.fr.MaxHeaderListSize = s.cfg.MaxHeaderListSize
	c.ctx = peer.NewContext(context.Background(), &peer.Peer{Addr: nc.RemoteAddr(), LocalAddr: nc.LocalAddr()})
	return c
}

// serve reads the client's frames until the connection ends.
func (c *conn) serve() {
	defer c.s.forget(c)
	err := c.handshake()
	for err == nil {
		// The calls read whole are dispatched, and what the reader appended
		// (acks, window updates, refusals) is written, once the next frame
		// is not all in the read buffer: when the reader has handled all
		// it has read and would wait for the socket (or has too much to
		// write), in one write, not one per frame. A call whose client
		// reset it in the same read is neither run nor answered: under
		// overload, a connection read after a wait brings its calls that
		// passed their deadline meanwhile together with their RST_STREAM.
		// Calls' answers are written by their workers.
		if !c.frameBuffered() {
			c.dispatchReady()
			c.flushReader()
		}
		c.waitRoom()
		var f http2.Frame
		f, err = c.fr.ReadFrame()
		c.frames.Add(1)
		if err != nil {
			var se http2.StreamError
			if errors.As(err, &se) {
				c.mu.Lock()
				if se.StreamID%2 == 1 && se.StreamID > c.lastID { // a malformed new stream: its late frames are not an idle stream's
					c.lastID = se.StreamID
				}
				c.mu.Unlock()
				c.resetStream(se.StreamID, se.Code)
				err = nil
				continue
			}
			break
		}
		err = c.frame(f)
	}
	var ce http2.ConnectionError
	switch {
	case errors.As(err, &ce):
		c.goAway(http2.ErrCode(ce), nil, false)
	case errors.Is(err, http2.ErrFrameTooLarge):
		c.goAway(http2.ErrCodeFrameSize, nil, false)
	default:
		c.close()
	}
}

// handshake reads the client's preface, sends the server's SETTINGS and
// the connection's window, and starts the connection's age and idle timers.
func (c *conn) handshake() error {
	cfg := &c.s.cfg
	_ = c.nc.SetReadDeadline(time.Now().Add(cfg.HandshakeTimeout))
	var pre [len(http2.ClientPreface)]byte
	if _, err := io.ReadFull(c.br, pre[:]); err != nil {
		return err
	}
	if !bytes.Equal(pre[:], []byte(http2.ClientPreface)) {
		return errors.New("grpcfast: not an HTTP/2 preface")
	}
	// The client's first frame must be its SETTINGS (RFC 9113 §3.4).
	f, err := c.fr.ReadFrame()
	if err != nil {
		return err
	}
	if sf, ok := f.(*http2.SettingsFrame); !ok || sf.IsAck() {
		return http2.ConnectionError(http2.ErrCodeProtocol)
	}
	_ = c.nc.SetReadDeadline(time.Time{})
	c.mu.Lock()
	if c.goingAway { // shut down during the handshake
		c.mu.Unlock()
		return errors.New("grpcfast: shutting down")
	}
	c.greeted = true
	c.wbuf = appendSettings(c.wbuf, cfg)
	c.wbuf = appendWindowUpdate(c.wbuf, 0, uint32(c.connWin-initialWindow))
	c.recvAvail = c.connWin
	c.mu.Unlock()
	if err := c.frame(f); err != nil {
		return err
	}
	c.startTimers()
	return nil
}

// frameBuffered reports whether the next frame is all in the read buffer,
// so that reading it will not wait for the socket. A HEADERS frame without
// END_HEADERS is not: its CONTINUATION frames are read with it.
func (c *conn) frameBuffered() bool {
	if c.br.Buffered() < frameHeaderLen {
		return false
	}
	h, _ := c.br.Peek(frameHeaderLen) // buffered: no read
	n := int(h[0])<<16 | int(h[1])<<8 | int(h[2])
	if http2.FrameType(h[3]) == http2.FrameHeaders && http2.Flags(h[4])&http2.FlagHeadersEndHeaders == 0 {
		return false
	}
	return c.br.Buffered() >= frameHeaderLen+n
}

// dispatchReady dispatches the calls read whole since the last time.
func (c *conn) dispatchReady() {
	for i, st := range c.ready {
		c.ready[i] = nil
		c.dispatch(st)
	}
	c.ready = c.ready[:0]
}

// flushReader writes what the reader appended, unless a write is under
// way that will take it.
func (c *conn) flushReader() {
	c.mu.Lock()
	if len(c.wbuf) > 0 || c.closeAfter {
		c.kickLocked()
	}
	c.mu.Unlock()
}

// waitRoom holds the reader while too much waits to be written.
func (c *conn) waitRoom() {
	c.mu.Lock()
	for len(c.wbuf) > maxPending && !c.closed {
		if !c.flushing {
			c.kickLocked()
			continue
		}
		c.room.Wait()
	}
	c.mu.Unlock()
}

// frame handles one frame from the client; an error ends the connection.
func (c *conn) frame(f http2.Frame) error {
	if _, call := f.(*http2.MetaHeadersFrame); !call && c.paced != nil {
		// A read that a WINDOW_UPDATE, PING or reset woke: when it came
		// says nothing of a call behind it, which may have come later.
		c.paced.arrival()
	}
	switch f := f.(type) {
	case *http2.MetaHeadersFrame:
		return c.headers(f)
	case *http2.DataFrame:
		return c.data(f)
	case *http2.WindowUpdateFrame:
		return c.windowUpdate(f)
	case *http2.SettingsFrame:
		return c.settings(f)
	case *http2.PingFrame:
		return c.ping(f)
	case *http2.RSTStreamFrame:
		return c.rstStream(f)
	case *http2.GoAwayFrame:
		c.goAway(http2.ErrCodeNo, nil, true)
		return nil
	case *http2.PushPromiseFrame:
		return http2.ConnectionError(http2.ErrCodeProtocol)
	default: // PRIORITY, unknown types: ignored (RFC 9113 §5.5)
		return nil
	}
}

func (c *conn) settings(f *http2.SettingsFrame) error {
	if f.IsAck() {
		return nil
	}
	if c.empty++; c.empty > maxEmptyFrames {
		return http2.ConnectionError(http2.ErrCodeEnhanceYourCalm)
	}
	if err := f.ForeachSetting(func(s http2.Setting) error { return s.Valid() }); err != nil {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	moved := false
	if v, ok := f.Value(http2.SettingInitialWindowSize); ok && int64(v) != c.peerWin {
		delta := int64(v) - c.peerWin
		c.peerWin = int64(v)
		for _, st := range c.streams {
			st.sendAvail += delta
		}
		moved = true
	}
	if v, ok := f.Value(http2.SettingMaxFrameSize); ok {
		c.peerFrame = int(v)
	}
	c.wbuf = appendFrameHeader(c.wbuf, 0, http2.FrameSettings, http2.FlagSettingsAck, 0)
	if moved {
		c.peerWindowLocked()
	}
	return nil
}

func (c *conn) ping(f *http2.PingFrame) error {
	if f.IsAck() { // the server's keepalive ping answered: the frame count has moved
		return nil
	}
	// grpc-go's rule: a ping after the server sent headers or data is
	// free; others closer than PingMinTime are strikes, and the third ends
	// the connection.
	now := time.Now()
	c.mu.Lock()
	free := c.sentData
	c.sentData = false
	c.mu.Unlock()
	if free {
		c.pingStrikes = 0
	} else if !c.lastPing.IsZero() && now.Sub(c.lastPing) < c.s.cfg.PingMinTime {
		if c.pingStrikes++; c.pingStrikes > 2 {
			c.goAway(http2.ErrCodeEnhanceYourCalm, []byte("too_many_pings"), false)
			return errors.New("grpcfast: too many pings")
		}
	}
	c.lastPing = now
	c.mu.Lock()
	c.wbuf = appendFrameHeader(c.wbuf, 8, http2.FramePing, http2.FlagPingAck, 0)
	c.wbuf = append(c.wbuf, f.Data[:]...)
	c.mu.Unlock()
	return nil
}

func (c *conn) windowUpdate(f *http2.WindowUpdateFrame) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	inc := int64(f.Increment)
	if f.StreamID == 0 {
		if c.sendAvail+inc > 1<<31-1 {
			return http2.ConnectionError(http2.ErrCodeFlowControl)
		}
		c.sendAvail += inc
		c.connRoomLocked()
	} else if st := c.streams[f.StreamID]; st != nil {
		if st.sendAvail+inc > 1<<31-1 {
			c.resetLocked(st, http2.ErrCodeFlowControl)
			return nil
		}
		st.sendAvail += inc
		c.streamRoomLocked(st)
	} else if f.StreamID > c.lastID {
		return http2.ConnectionError(http2.ErrCodeProtocol) // an idle stream
	}
	return nil
}

func (c *conn) rstStream(f *http2.RSTStreamFrame) error {
	c.mu.Lock()
	if f.StreamID > c.lastID {
		c.mu.Unlock()
		return http2.ConnectionError(http2.ErrCodeProtocol) // an idle stream
	}
	st := c.streams[f.StreamID]
	if st != nil {
		c.dropLocked(st)
	}
	c.mu.Unlock()
	if st != nil && !st.dispatched {
		c.discard(st)
		if ab := c.s.cfg.Abandoned; ab != nil && st.method != "" {
			ab(st.method)
		}
	}
	return nil
}

// resetStream answers a stream error: RST_STREAM, and the stream dropped.
func (c *conn) resetStream(id uint32, code http2.ErrCode) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if st := c.streams[id]; st != nil {
		c.resetLocked(st, code)
		return
	}
	c.wbuf = appendRST(c.wbuf, id, code)
}

// resetLocked sends RST_STREAM for st and drops it.
func (c *conn) resetLocked(st *stream, code http2.ErrCode) {
	c.wbuf = appendRST(c.wbuf, st.id, code)
	c.dropLocked(st)
}

// dropLocked forgets st: its call's context is cancelled, an answer not
// yet written is not written, and its request bytes are released.
func (c *conn) dropLocked(st *stream) {
	if st.gone {
		return
	}
	st.gone = true
	delete(c.streams, st.id)
	c.unwaitLocked(st)
	st.out = nil // not to be written
	if st.cancel != nil {
		st.cancel()
	}
	if st.m.stream != nil {
		c.room.Broadcast() // its SendMsg may wait for the window
	}
	c.endedLocked()
}

// endedLocked notes a stream's end: the connection may have become idle, or
// drained after GOAWAY.
func (c *conn) endedLocked() {
	if len(c.streams) > 0 {
		return
	}
	if c.goingAway {
		c.closeAfter = true // the caller kicks
	}
}

// goAway sends GOAWAY with the last stream the server took. Graceful, the
// connection closes when its last stream ends; otherwise at once, once the
// frame is written.
func (c *conn) goAway(code http2.ErrCode, debug []byte, graceful bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return
	}
	if !c.greeted { // before the server's SETTINGS nothing may be sent
		c.goingAway = true
		c.mu.Unlock()
		c.close()
		c.mu.Lock()
		return
	}
	if !c.goingAway || !graceful {
		c.wbuf = appendGoAway(c.wbuf, c.lastID, code, debug)
	}
	c.goingAway = true
	if !graceful || len(c.streams) == 0 {
		c.closeAfter = true
	}
	c.kickLocked()
}

// close ends the connection at once: its calls' contexts are cancelled,
// nothing more is written.
func (c *conn) close() {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return
	}
	c.closed = true
	for _, t := range c.timers {
		t.Stop()
	}
	var cancels []context.CancelFunc
	for _, st := range c.streams {
		st.gone = true
		if st.cancel != nil {
			cancels = append(cancels, st.cancel)
		}
	}
	clear(c.streams)
	c.connWait.clear()
	c.streamWait.clear()
	c.room.Broadcast()
	c.mu.Unlock()
	for _, cancel := range cancels {
		cancel()
	}
	_ = c.nc.Close()
}

// startTimers closes the connection (GOAWAY, then its grace) past its age,
// when it has had no stream for MaxConnectionIdle, and when its client has
// not answered a keepalive PING.
func (c *conn) startTimers() {
	cfg := &c.s.cfg
	c.mu.Lock()
	defer c.mu.Unlock()
	if age := cfg.MaxConnectionAge; age > 0 {
		// ±10 %, as grpc-go, so that a fleet's connections do not all
		// reconnect at once.
		age += time.Duration((time.Now().UnixNano()%200 - 100)) * age / 1000
		c.timers = append(c.timers, time.AfterFunc(age, func() {
			c.goAway(http2.ErrCodeNo, nil, true)
			if g := cfg.MaxConnectionAgeGrace; g > 0 {
				c.mu.Lock()
				if !c.closed {
					c.timers = append(c.timers, time.AfterFunc(g, c.close))
				}
				c.mu.Unlock()
			}
		}))
	}
	if idle := cfg.MaxConnectionIdle; idle > 0 {
		// Every idle/2 the timer looks: a connection without a stream at
		// both of two looks in a row, and none in between, has been idle
		// for at least idle/2 and at most idle (no clock read per call).
		var t *time.Timer
		quiet := 0
		t = time.AfterFunc(idle/2, func() {
			c.mu.Lock()
			if c.busy || len(c.streams) > 0 {
				quiet = 0
			} else {
				quiet++
			}
			c.busy = false
			closed := c.closed
			c.mu.Unlock()
			switch {
			case closed:
			case quiet >= 2:
				c.goAway(http2.ErrCodeNo, nil, true)
			default:
				t.Reset(idle / 2)
			}
		})
		c.timers = append(c.timers, t)
	}
	if ka := cfg.KeepaliveTime; ka > 0 {
		c.timers = append(c.timers, c.keepalive(ka, cfg.KeepaliveTimeout))
	}
}

// keepalivePing is the data of the server's keepalive PING.
var keepalivePing = [8]byte{'f', 'g', 'k', 'e', 'e', 'p', 'a', 'l'}

// keepalive starts the connection's keepalive timer. Every every/4 it
// looks at the count of frames read: after four looks in a row that saw
// none (silence for every to 5/4 every), it PINGs the client; if no frame
// has come timeout later, it closes the connection (as grpc-go, without
// GOAWAY: the client is not there to read it). Called with mu held.
func (c *conn) keepalive(every, timeout time.Duration) *time.Timer {
	var t *time.Timer
	seen, quiet, pinged := c.frames.Load(), 0, false
	t = time.AfterFunc(every/4, func() {
		next := every / 4
		switch n := c.frames.Load(); {
		case n != seen:
			seen, quiet, pinged = n, 0, false
		case pinged:
			c.close()
			return
		default:
			quiet++
		}
		c.mu.Lock()
		defer c.mu.Unlock()
		if c.closed {
			return
		}
		if quiet >= 4 {
			c.wbuf = appendFrameHeader(c.wbuf, 8, http2.FramePing, 0, 0)
			c.wbuf = append(c.wbuf, keepalivePing[:]...)
			pinged, next = true, timeout
			c.kickLocked()
		}
		if !c.closed {
			t.Reset(next)
		}
	})
	return t
}
