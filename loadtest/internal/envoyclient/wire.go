package envoyclient

// Wire: unary gRPC calls over one HTTP/2 connection without grpc-go's
// client, for an open-loop generator that must not stall at its own 99th
// percentile (docs/chaos.md, "a generator that does not stall").

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"sync"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc/codes"
)

// maxFrame is HTTP/2's smallest maximum frame size, which every server
// accepts: a call's message is written as one DATA frame.
const maxFrame = 16384

// ErrClosed is a call on a connection that is gone (closed, broken, or
// sent GOAWAY): the caller dials another.
var ErrClosed = errors.New("envoyclient: connection closed")

// ErrBusy is a call the connection cannot take now: the server's
// concurrent-stream limit is reached or its flow-control window is
// spent. The call is not sent; a gateway would queue it or open another
// connection.
var ErrBusy = errors.New("envoyclient: connection busy (stream limit or flow-control window)")

// Answer is how one call ended. Body is the response message (its gRPC
// length prefix removed) and is valid only during the callback.
type Answer struct {
	Sent, At time.Time // the call written; its end read
	// Arrived is when the kernel received the bytes of the read that held
	// the answer's end (SO_TIMESTAMPNS; zero where the system gives none):
	// At less the time this process took to get round to reading them.
	Arrived time.Time
	Code    codes.Code
	Message string // grpc-message, percent-decoded
	Body    []byte
	Err     error // the stream reset or the connection lost: no status
}

// Wire is one HTTP/2 (h2c) connection carrying unary gRPC calls as a
// gateway's rate-limit filter sends them: static 1 MiB windows, no pings
// of its own, the caller's deadline as grpc-timeout, RST_STREAM CANCEL
// when the caller stops waiting.
//
// grpc-go's client spends a goroutine per connection reading, another
// writing and one per waiting call, plus a context, a stream and its
// buffers per call; over a thousand connections the generator's one core
// then waits for itself for tens of milliseconds at a time. Here one
// goroutine per connection reads and delivers each answer to done as its
// last frame is read; calls are written by the caller's goroutine, one
// write each.
type Wire[T any] struct {
	nc   net.Conn
	path string
	auth string
	done func(T, Answer)

	mu      sync.Mutex // the writer side and the streams' table
	bw      *bufio.Writer
	wfr     *http2.Framer
	hbuf    []byte // a call's header block
	dbuf    []byte // a call's DATA payload
	henc    *hpack.Encoder
	next    uint32
	calls   map[uint32]*call[T]
	free    []*call[T]
	window  int64  // connection-level send window
	streamW int64  // the server's initial stream window
	maxStr  uint32 // the server's concurrent-stream limit
	closed  error
	// cancelled are the calls Cancel reset while they waited, by stream
	// id: an answer the server had written before the reset still comes,
	// and goes to afterCancel (OnAnswerAfterCancel). Only while
	// afterCancel is set.
	cancelled   map[uint32]*call[T]
	afterCancel func(Answer)

	arrived  func() time.Time // the kernel's receive time of the last read; the reading goroutine's
	readDone chan struct{}
	settled  chan struct{} // closed when the server's SETTINGS are read
	settle   sync.Once
}

type call[T any] struct {
	tag  T
	sent time.Time
	body []byte
	head bool // response headers read
}

// hbufWriter lets the hpack encoder append to Wire.hbuf.
type hbufWriter[T any] struct{ w *Wire[T] }

func (h hbufWriter[T]) Write(p []byte) (int, error) {
	h.w.hbuf = append(h.w.hbuf, p...)
	return len(p), nil
}

// DialWire connects to addr, exchanges the HTTP/2 preface and settings,
// and starts reading. path is the gRPC method every call names
// (/package.Service/Method); done receives each call's tag and answer,
// on the connection's reading goroutine — it must not block.
func DialWire[T any](addr, path string, done func(T, Answer)) (*Wire[T], error) {
	nc, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return nil, err
	}
	w := &Wire[T]{nc: nc, path: path, auth: addr, done: done, next: 1, calls: map[uint32]*call[T]{},
		window: 65535, streamW: 65535, maxStr: 1<<31 - 1, readDone: make(chan struct{}), settled: make(chan struct{})}
	w.bw = bufio.NewWriterSize(nc, 16<<10)
	w.wfr = http2.NewFramer(w.bw, nil)
	w.henc = hpack.NewEncoder(hbufWriter[T]{w})
	_, err = w.bw.WriteString(http2.ClientPreface)
	if err == nil {
		err = w.wfr.WriteSettings(http2.Setting{ID: http2.SettingEnablePush, Val: 0},
			http2.Setting{ID: http2.SettingInitialWindowSize, Val: Window})
	}
	if err == nil {
		err = w.wfr.WriteWindowUpdate(0, Window-65535)
	}
	if err == nil {
		err = w.bw.Flush()
	}
	if err != nil {
		_ = nc.Close()
		return nil, err
	}
	r, arrived := newStampReader(nc)
	w.arrived = arrived
	rfr := http2.NewFramer(nil, bufio.NewReaderSize(r, 16<<10))
	rfr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	rfr.SetReuseFrames()
	go w.read(rfr)
	return w, nil
}

// Call writes a unary call of msg (the serialized request) with md as
// extra metadata and timeout as its grpc-timeout (none when zero), and
// returns its stream id for Cancel. tag comes back with the answer.
func (w *Wire[T]) Call(tag T, timeout time.Duration, md []hpack.HeaderField, msg []byte) (uint32, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed != nil {
		return 0, ErrClosed
	}
	n := int64(len(msg) + 5)
	if n > maxFrame {
		return 0, fmt.Errorf("envoyclient: a %d-byte message needs more than one DATA frame", len(msg))
	}
	if uint32(len(w.calls)) >= w.maxStr || n > w.window || n > w.streamW || w.next > 1<<31-1 {
		return 0, ErrBusy
	}
	w.hbuf = w.hbuf[:0]
	fields := [...]hpack.HeaderField{
		{Name: ":method", Value: "POST"}, {Name: ":scheme", Value: "http"}, {Name: ":path", Value: w.path},
		{Name: ":authority", Value: w.auth}, {Name: "content-type", Value: "application/grpc"}, {Name: "te", Value: "trailers"},
	}
	for _, f := range fields {
		_ = w.henc.WriteField(f)
	}
	if timeout > 0 {
		_ = w.henc.WriteField(hpack.HeaderField{Name: "grpc-timeout", Value: grpcTimeout(timeout)})
	}
	for _, f := range md {
		_ = w.henc.WriteField(f)
	}
	id := w.next
	w.next += 2
	err := w.wfr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: w.hbuf, EndHeaders: true})
	if err == nil {
		var prefix [5]byte
		prefix[1], prefix[2], prefix[3], prefix[4] = byte(len(msg)>>24), byte(len(msg)>>16), byte(len(msg)>>8), byte(len(msg))
		w.dbuf = append(append(w.dbuf[:0], prefix[:]...), msg...)
		err = w.wfr.WriteData(id, true, w.dbuf)
	}
	c := w.acquire()
	c.tag, c.sent = tag, time.Now()
	if err == nil {
		err = w.bw.Flush()
	}
	if err != nil {
		w.free = append(w.free, c)
		w.fail(err)
		return 0, ErrClosed
	}
	w.window -= n
	w.calls[id] = c
	return id, nil
}

// Cancel resets stream id if its answer has not been read, as a gateway
// does when the caller's deadline passes; the answer is then never
// delivered. It reports whether the call was still waiting, with its
// tag.
func (w *Wire[T]) Cancel(id uint32) (T, time.Time, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	c, ok := w.calls[id]
	if !ok {
		var zero T
		return zero, time.Time{}, false
	}
	delete(w.calls, id)
	tag, sent := c.tag, c.sent
	w.rememberCancelled(id, c)
	if w.closed == nil {
		if err := w.wfr.WriteRSTStream(id, http2.ErrCodeCancel); err == nil {
			err = w.bw.Flush()
			if err != nil {
				w.fail(err)
			}
		}
	}
	return tag, sent, true
}

// OnAnswerAfterCancel has f hear of every answer that comes for a call
// Cancel reset while it waited (Sent, At and Arrived set as for done): an
// answer that reached this machine before the caller gave up waited in the
// socket while this process's reading goroutine waited for its CPU, and
// its Arrived says so. f runs on the reading goroutine and must not
// block; set it before the first Cancel.
func (w *Wire[T]) OnAnswerAfterCancel(f func(Answer)) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.afterCancel, w.cancelled = f, map[uint32]*call[T]{}
}

// maxCancelled bounds the calls a connection keeps after Cancel: beyond
// it, those sent more than cancelledFor ago are forgotten (a server that
// had not answered before the reset never will), and while it is still
// full a reset call is not kept.
const (
	maxCancelled = 4096
	cancelledFor = 10 * time.Second
)

// rememberCancelled keeps call c, stream id, reset while it waited, for
// afterCancel; without one it is released. Called with mu held.
func (w *Wire[T]) rememberCancelled(id uint32, c *call[T]) {
	if w.afterCancel == nil {
		w.release(c)
		return
	}
	if len(w.cancelled) >= maxCancelled {
		for old, oc := range w.cancelled {
			if time.Since(oc.sent) > cancelledFor {
				delete(w.cancelled, old)
				w.release(oc)
			}
		}
		if len(w.cancelled) >= maxCancelled {
			w.release(c)
			return
		}
	}
	var zero T
	c.tag = zero // the caller's, which it may use again
	w.cancelled[id] = c
}

// Settled is closed once the server's SETTINGS have been read: the server
// has taken the connection and finished its handshake.
func (w *Wire[T]) Settled() <-chan struct{} { return w.settled }

// Close closes the connection and waits for its reader; calls still
// waiting are answered with ErrClosed.
func (w *Wire[T]) Close() error {
	w.mu.Lock()
	w.fail(ErrClosed)
	w.mu.Unlock()
	<-w.readDone
	return nil
}

// Err is why the connection can take no more calls (nil while it can).
func (w *Wire[T]) Err() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.closed
}

// fail marks the connection closed and closes the socket; the reader then
// ends every waiting call. Called with mu held.
func (w *Wire[T]) fail(err error) {
	if w.closed == nil {
		w.closed = err
	}
	_ = w.nc.Close()
}

func (w *Wire[T]) acquire() *call[T] {
	if n := len(w.free); n > 0 {
		c := w.free[n-1]
		w.free = w.free[:n-1]
		return c
	}
	return &call[T]{}
}

func (w *Wire[T]) release(c *call[T]) {
	var zero T
	c.tag, c.body, c.head = zero, c.body[:0], false
	w.free = append(w.free, c)
}

// read is the connection's one reading goroutine.
func (w *Wire[T]) read(fr *http2.Framer) {
	defer close(w.readDone)
	var unacked uint32 // DATA bytes read since the last connection WINDOW_UPDATE
	err := func() error {
		for {
			f, err := fr.ReadFrame()
			if err != nil {
				return err
			}
			switch f := f.(type) {
			case *http2.SettingsFrame:
				if f.IsAck() {
					continue
				}
				w.mu.Lock()
				_ = f.ForeachSetting(func(s http2.Setting) error {
					switch s.ID {
					case http2.SettingMaxConcurrentStreams:
						w.maxStr = s.Val
					case http2.SettingInitialWindowSize:
						w.streamW = int64(s.Val)
					case http2.SettingHeaderTableSize:
						w.henc.SetMaxDynamicTableSizeLimit(s.Val)
					}
					return nil
				})
				err = w.write(func() error { return w.wfr.WriteSettingsAck() })
				w.mu.Unlock()
				w.settle.Do(func() { close(w.settled) })
			case *http2.PingFrame:
				if !f.IsAck() {
					w.mu.Lock()
					err = w.write(func() error { return w.wfr.WritePing(true, f.Data) })
					w.mu.Unlock()
				}
			case *http2.WindowUpdateFrame:
				if f.StreamID == 0 {
					w.mu.Lock()
					w.window += int64(f.Increment)
					w.mu.Unlock()
				}
			case *http2.DataFrame:
				if unacked += f.Length; unacked >= Window/2 {
					w.mu.Lock()
					err = w.write(func() error { return w.wfr.WriteWindowUpdate(0, unacked) })
					w.mu.Unlock()
					unacked = 0
				}
				w.mu.Lock()
				if c := w.waiting(f.StreamID); c != nil {
					c.body = append(c.body, f.Data()...)
				}
				w.mu.Unlock()
				if f.StreamEnded() { // no trailers: not gRPC
					w.end(f.StreamID, Answer{Code: codes.Internal, Message: "stream ended without trailers"})
				}
			case *http2.MetaHeadersFrame:
				w.headers(f)
			case *http2.RSTStreamFrame:
				w.end(f.StreamID, Answer{Err: fmt.Errorf("stream reset by the server: %v", f.ErrCode)})
			case *http2.GoAwayFrame:
				w.mu.Lock()
				if w.closed == nil {
					w.closed = ErrClosed // no new calls; those at or below LastStreamID may still finish
				}
				var gone []uint32
				for id := range w.calls {
					if id > f.LastStreamID {
						gone = append(gone, id)
					}
				}
				w.mu.Unlock()
				for _, id := range gone {
					w.end(id, Answer{Err: ErrClosed})
				}
			}
			if err != nil {
				return err
			}
		}
	}()
	w.mu.Lock()
	w.fail(err)
	left := make([]uint32, 0, len(w.calls))
	for id := range w.calls {
		left = append(left, id)
	}
	w.mu.Unlock()
	for _, id := range left {
		w.end(id, Answer{Err: ErrClosed})
	}
}

// write runs one frame write and flushes it. Called with mu held.
func (w *Wire[T]) write(frame func() error) error {
	err := frame()
	if err == nil {
		err = w.bw.Flush()
	}
	return err
}

// headers reads a response's headers or trailers; trailers (or headers
// that end the stream: trailers only) end the call.
func (w *Wire[T]) headers(f *http2.MetaHeadersFrame) {
	if !f.StreamEnded() {
		w.mu.Lock()
		if c := w.waiting(f.StreamID); c != nil {
			c.head = true
		}
		w.mu.Unlock()
		if s := f.PseudoValue("status"); s != "200" {
			w.end(f.StreamID, Answer{Code: codes.Unknown, Message: "HTTP status " + s})
		}
		return
	}
	a := Answer{Code: codes.Unknown, Message: "no grpc-status"}
	var status, message string
	for _, hf := range f.RegularFields() {
		switch hf.Name {
		case "grpc-status":
			status = hf.Value
		case "grpc-message":
			message = hf.Value
		}
	}
	if n, err := strconv.ParseUint(status, 10, 32); err == nil {
		a.Code, a.Message = codes.Code(n), decodeGRPCMessage(message)
	}
	w.end(f.StreamID, a)
}

// waiting is stream id's call, waiting or reset while it waited (nil:
// neither). Called with mu held.
func (w *Wire[T]) waiting(id uint32) *call[T] {
	if c, ok := w.calls[id]; ok {
		return c
	}
	return w.cancelled[id]
}

// end delivers stream id's answer if the call is still waiting, or to
// afterCancel if it was reset while it waited.
func (w *Wire[T]) end(id uint32, a Answer) {
	w.mu.Lock()
	c, waiting := w.calls[id]
	if waiting {
		delete(w.calls, id)
	} else if cc, was := w.cancelled[id]; was {
		delete(w.cancelled, id)
		c = cc
	}
	w.mu.Unlock()
	if c == nil {
		return
	}
	a.Sent, a.At, a.Arrived = c.sent, time.Now(), w.arrived()
	if a.Err == nil && a.Code == codes.OK {
		if len(c.body) < 5 || int(uint32(c.body[1])<<24|uint32(c.body[2])<<16|uint32(c.body[3])<<8|uint32(c.body[4])) != len(c.body)-5 {
			a.Code, a.Message = codes.Internal, "malformed gRPC message"
		} else {
			a.Body = c.body[5:]
		}
	}
	switch {
	case waiting:
		w.done(c.tag, a)
	case a.Err == nil: // reset after it had been answered: the answer came anyway
		w.afterCancel(a)
	}
	w.mu.Lock()
	w.release(c)
	w.mu.Unlock()
}

// grpcTimeout is d in the grpc-timeout header's form: at most eight
// digits, in the coarsest unit that keeps d exact to a microsecond.
func grpcTimeout(d time.Duration) string {
	if ms := d / time.Millisecond; d%time.Millisecond == 0 && ms < 1e8 {
		return strconv.FormatInt(int64(ms), 10) + "m"
	}
	if us := d / time.Microsecond; us < 1e8 {
		return strconv.FormatInt(int64(max(us, 1)), 10) + "u"
	}
	return strconv.FormatInt(int64(min(d/time.Second, 1e8-1)), 10) + "S"
}

// decodeGRPCMessage undoes grpc-message's percent-encoding; a message
// that is not valid percent-encoding is kept as it came.
func decodeGRPCMessage(s string) string {
	if m, err := url.PathUnescape(s); err == nil {
		return m
	}
	return s
}
