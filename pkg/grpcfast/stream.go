package grpcfast

// One call: its headers and message as the reader gathers them, its
// dispatch to the method's handler on a goroutine of its own, and its answer.

import (
	"context"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/stats"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/tap"
	"google.golang.org/protobuf/proto"
)

type stream struct {
	c        *conn
	id       uint32
	method   string
	m        method
	md       metadata.MD
	base     context.Context // the tap's context, or the connection's
	deadline time.Time       // zero: none
	ctx      context.Context // the call's, from dispatch to its worker
	body     []byte          // the request message, from dispatch to its worker
	begin    time.Time       // the stats handler's Begin (StatsHandler set)
	paced    bool            // read on a paced connection: the pacer hears when it starts

	// The reader's own until dispatch.
	msg         []byte
	recvAvail   int64 // stream credit the client still has
	recvPending int64 // stream credit to return

	// Under the connection's mu.
	recvDone   bool // the request's END_STREAM came
	dispatched bool
	cancel     context.CancelFunc
	sendAvail  int64
	out        []byte      // answer bytes the windows have not let out yet
	trailers   []byte      // the answer's trailer block, sent after out
	waiting    *waitList   // the list st waits in for a window (flow.go), or nil
	prev, next *stream     // st's neighbours there
	sentHdr    bool        // a server-streaming call's headers are written
	gone       bool        // ended: answered, reset or the connection closed
	hdr, trl   metadata.MD // set by the handler (grpc.SetHeader, grpc.SetTrailer)
}

var _ grpc.ServerTransportStream = (*stream)(nil)

func (c *conn) headers(f *http2.MetaHeadersFrame) error {
	id := f.StreamID
	if id%2 == 0 {
		return http2.ConnectionError(http2.ErrCodeProtocol)
	}
	c.mu.Lock()
	last, open := c.lastID, c.streams[id] != nil
	c.mu.Unlock()
	if id <= last {
		if open { // trailers from the client: a unary request has none
			c.resetStream(id, http2.ErrCodeProtocol)
			return nil
		}
		return http2.ConnectionError(http2.ErrCodeStreamClosed)
	}
	st := &stream{c: c, id: id, base: c.ctx, recvAvail: int64(c.s.cfg.Window)}
	var arrived time.Time // the first call of a paced read: when it arrived
	if c.paced != nil {
		arrived = c.paced.arrival()
	}
	var path, meth, ctype, timeout, enc string
	var vals []string // the metadata's values, one backing array for the call
	if n := metadataFields(f.Fields); n > 0 {
		st.md, vals = make(metadata.MD, n), make([]string, 0, n)
	}
	for _, hf := range f.Fields {
		switch hf.Name {
		case ":path":
			path = hf.Value
		case ":method":
			meth = hf.Value
		case "content-type":
			ctype = hf.Value
		case "grpc-timeout":
			timeout = hf.Value
		case "grpc-encoding":
			enc = hf.Value
		}
		if isMetadata(hf.Name) {
			v := hf.Value
			if strings.HasSuffix(hf.Name, "-bin") {
				b, err := decodeBin(v)
				if err != nil {
					return c.refuse(st, f.StreamEnded(), codes.Internal, fmt.Sprintf("grpc: malformed binary metadata %q: %v", hf.Name, err))
				}
				v = string(b)
			}
			if prev := st.md[hf.Name]; prev != nil {
				st.md[hf.Name] = append(prev, v)
			} else {
				vals = append(vals, v)
				st.md[hf.Name] = vals[len(vals)-1 : len(vals) : len(vals)]
			}
		}
	}
	c.mu.Lock()
	c.lastID = id
	if c.goingAway || len(c.streams) >= int(c.s.cfg.MaxConcurrentStreams) {
		c.wbuf = appendRST(c.wbuf, id, http2.ErrCodeRefusedStream)
		c.mu.Unlock()
		return nil
	}
	st.sendAvail = c.peerWin
	c.streams[id] = st
	c.busy = true
	c.mu.Unlock()
	st.method = path
	switch {
	case f.Truncated:
		return c.refuse(st, f.StreamEnded(), codes.ResourceExhausted, fmt.Sprintf("grpc: header list larger than %d bytes", c.s.cfg.MaxHeaderListSize))
	case f.PseudoValue("scheme") == "" || path == "" || meth == "":
		c.resetStream(id, http2.ErrCodeProtocol) // malformed (RFC 9113 §8.3.1)
		return nil
	case meth != "POST":
		return c.refuseHTTP(st, f.StreamEnded(), "405")
	case ctype != "application/grpc" && !strings.HasPrefix(ctype, "application/grpc+") && !strings.HasPrefix(ctype, "application/grpc;"):
		return c.refuseHTTP(st, f.StreamEnded(), "415")
	case enc != "" && enc != "identity":
		return c.refuse(st, f.StreamEnded(), codes.Unimplemented, fmt.Sprintf("grpc: Decompressor is not installed for grpc-encoding %q", enc))
	}
	if timeout != "" {
		d, err := parseTimeout(timeout)
		if err != nil {
			return c.refuse(st, f.StreamEnded(), codes.Internal, fmt.Sprintf("grpc: malformed grpc-timeout %q: %v", timeout, err))
		}
		st.deadline = time.Now().Add(d)
		if !arrived.IsZero() { // it waited in the socket for its turn: from then
			st.deadline = arrived.Add(d)
		}
	}
	m, ok := c.s.methods[path]
	if !ok {
		msg := fmt.Sprintf("unknown method %s", path)
		if c.s.streams[path] {
			msg = fmt.Sprintf("method %s is client- or bidi-streaming: this server serves unary and server-streaming methods only", path)
		}
		return c.refuse(st, f.StreamEnded(), codes.Unimplemented, msg)
	}
	st.m = m
	if c.s.cfg.Tap != nil {
		ctx, err := c.s.cfg.Tap(c.ctx, &tap.Info{FullMethodName: path, Header: st.md})
		if err != nil {
			if c.paced != nil { // refused whole: what its connection is, is known
				c.paced.sawCall(st.md)
			}
			s, _ := status.FromError(err)
			return c.refuse(st, f.StreamEnded(), s.Code(), s.Message())
		}
		if ctx != nil {
			st.base = ctx
		}
	}
	if f.StreamEnded() {
		c.ready = append(c.ready, st)
	}
	return nil
}

// isMetadata reports whether a request header is the call's metadata:
// what gRPC does not reserve, and :authority and user-agent (as grpc-go).
func isMetadata(name string) bool {
	return name == ":authority" || name == "user-agent" || !reserved(name)
}

// metadataFields counts the fields isMetadata keeps.
func metadataFields(fs []hpack.HeaderField) int {
	n := 0
	for _, hf := range fs {
		if isMetadata(hf.Name) {
			n++
		}
	}
	return n
}

// refuse answers a call with a status before reading its message.
// Called by the reader.
func (c *conn) refuse(st *stream, ended bool, code codes.Code, msg string) error {
	c.mu.Lock()
	if c.streams[st.id] == nil && !st.gone { // not taken (the decoding of metadata failed first)
		c.streams[st.id] = st
		c.lastID = max(c.lastID, st.id)
	}
	st.recvDone = ended
	c.wbuf = appendHeaders(c.wbuf, st.id, c.s.refusal(code, msg), true, c.peerFrame)
	c.finishLocked(st)
	c.mu.Unlock()
	c.discard(st)
	return nil
}

// discard releases what the reader holds of a stream that ended before its
// request was complete.
func (c *conn) discard(st *stream) {
	if st == nil || len(st.msg) == 0 {
		return
	}
	c.buffered -= int64(len(st.msg))
	st.msg = nil
}

// refuseHTTP answers a request that is not gRPC with an HTTP status alone.
func (c *conn) refuseHTTP(st *stream, ended bool, code string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	st.recvDone = ended
	block := appendString(appendInt(nil, 0, 4, 8), code) // :status, literal value
	c.wbuf = appendHeaders(c.wbuf, st.id, block, true, c.peerFrame)
	c.finishLocked(st)
	return nil
}

func (c *conn) data(f *http2.DataFrame) error {
	id, n := f.StreamID, int64(f.Length)
	c.mu.Lock()
	st, last := c.streams[id], c.lastID
	c.mu.Unlock()
	if id > last {
		return http2.ConnectionError(http2.ErrCodeProtocol) // an idle stream
	}
	if n > c.recvAvail {
		return http2.ConnectionError(http2.ErrCodeFlowControl)
	}
	c.recvAvail -= n
	if n == 0 && !f.StreamEnded() {
		if c.empty++; c.empty > maxEmptyFrames {
			return http2.ConnectionError(http2.ErrCodeEnhanceYourCalm)
		}
	}
	if st == nil || st.dispatched {
		c.release(n) // a stream that ended: its late data is dropped
		return nil
	}
	if n > st.recvAvail {
		c.release(n)
		c.resetStream(id, http2.ErrCodeFlowControl)
		c.discard(st)
		return nil
	}
	st.recvAvail -= n
	data := f.Data()
	if limit := c.s.cfg.MaxRecvMsgSize + 5; len(st.msg)+len(data) > limit {
		c.release(n)
		return c.refuse(st, f.StreamEnded(), codes.ResourceExhausted,
			fmt.Sprintf("grpc: received message larger than max (%d vs. %d)", len(st.msg)+len(data)-5, c.s.cfg.MaxRecvMsgSize))
	}
	if c.buffered+int64(len(data)) > int64(c.s.cfg.MaxConnBuffered) {
		c.release(n)
		return c.refuse(st, f.StreamEnded(), codes.ResourceExhausted,
			fmt.Sprintf("grpcfast: the connection's requests under way are past %d bytes", c.s.cfg.MaxConnBuffered))
	}
	if st.msg == nil && f.StreamEnded() {
		st.msg = make([]byte, 0, len(data))
	}
	st.msg = append(st.msg, data...)
	c.buffered += int64(len(data))
	c.release(n)
	if f.StreamEnded() {
		c.ready = append(c.ready, st)
		return nil
	}
	if st.recvPending += n; st.recvPending >= int64(c.s.cfg.Window)/4 {
		c.mu.Lock()
		c.wbuf = appendWindowUpdate(c.wbuf, id, uint32(st.recvPending))
		c.mu.Unlock()
		st.recvAvail += st.recvPending
		st.recvPending = 0
	}
	return nil
}

// release returns connection credit, for every byte as it is read (the
// requests under way are bounded by MaxConnBuffered instead).
func (c *conn) release(n int64) {
	if c.recvPending += n; c.recvPending < c.connWin/4 {
		return
	}
	c.mu.Lock()
	c.wbuf = appendWindowUpdate(c.wbuf, 0, uint32(c.recvPending))
	c.mu.Unlock()
	c.recvAvail += c.recvPending
	c.recvPending = 0
}

// dispatch starts the call of a complete request on a goroutine of its own,
// unless its client has reset it since.
func (c *conn) dispatch(st *stream) {
	if c.paced != nil {
		c.paced.sawCall(st.md) // once the whole call is read: no turn between its frames
	}
	c.mu.Lock()
	gone := st.gone
	c.mu.Unlock()
	if gone {
		return
	}
	msg := st.msg
	st.msg = nil
	c.buffered -= int64(len(msg))
	var bad string
	switch {
	case len(msg) < 5:
		bad = "grpc: no request message"
	case msg[0] != 0:
		bad = "grpc: compressed flag set with identity or empty encoding"
	case int(binary.BigEndian.Uint32(msg[1:5])) != len(msg)-5:
		bad = "grpc: the request is not one whole message"
	}
	code := codes.Internal
	if past := c.s.cfg.PastDeadline; bad == "" && past != nil && !st.deadline.IsZero() && !time.Now().Before(st.deadline) {
		code, bad = codes.DeadlineExceeded, past(st.method)
	}
	ctx := st.base
	if st.md != nil {
		ctx = metadata.NewIncomingContext(ctx, st.md)
	}
	sh := c.s.cfg.StatsHandler
	if sh != nil {
		ctx = c.statsBegin(sh, st, ctx)
	}
	if bad != "" {
		c.mu.Lock()
		st.recvDone = true
		if !st.gone {
			c.wbuf = appendHeaders(c.wbuf, st.id, c.s.refusal(code, bad), true, c.peerFrame)
			c.finishLocked(st)
		}
		c.mu.Unlock()
		if sh != nil {
			statsEnd(sh, ctx, st, status.New(code, bad))
		}
		return
	}
	var cancel context.CancelFunc
	if st.deadline.IsZero() {
		ctx, cancel = context.WithCancel(ctx)
	} else {
		ctx, cancel = context.WithDeadline(ctx, st.deadline)
	}
	c.mu.Lock()
	st.recvDone = true
	if st.gone {
		c.mu.Unlock()
		cancel()
		if sh != nil {
			statsEnd(sh, ctx, st, status.New(codes.Canceled, "grpc: the client cancelled the call"))
		}
		return
	}
	st.dispatched, st.cancel = true, cancel
	c.mu.Unlock()
	st.ctx, st.body = grpc.NewContextWithServerTransportStream(ctx, st), msg[5:]
	if st.m.stream != nil {
		go c.callStream(st) // a stream may last: not on a worker
		return
	}
	if c.paced != nil && c.paced.state.Load() == paceOn {
		st.paced = true
		c.s.cfg.ReadPacer.Dispatched()
	}
	c.s.run(st)
}

// statsBegin tells the stats handler of a call, as grpc-go does: TagRPC,
// whose context becomes the call's, then InHeader and Begin.
func (c *conn) statsBegin(sh stats.Handler, st *stream, ctx context.Context) context.Context {
	ctx = sh.TagRPC(ctx, &stats.RPCTagInfo{FullMethodName: st.method})
	in := &stats.InHeader{FullMethod: st.method, Header: st.md}
	if p, ok := peer.FromContext(c.ctx); ok {
		in.RemoteAddr, in.LocalAddr = p.Addr, p.LocalAddr
	}
	sh.HandleRPC(ctx, in)
	st.begin = time.Now()
	sh.HandleRPC(ctx, &stats.Begin{BeginTime: st.begin})
	return ctx
}

// statsEnd tells the stats handler a call has ended with s.
func statsEnd(sh stats.Handler, ctx context.Context, st *stream, s *status.Status) {
	end := &stats.End{BeginTime: st.begin, EndTime: time.Now()}
	if s.Code() != codes.OK {
		end.Error = s.Err()
	}
	sh.HandleRPC(ctx, end)
}

// bufs holds answer buffers between calls.
var bufs = sync.Pool{New: func() any { b := make([]byte, 0, 256); return &b }}

// call runs the method's handler and writes its answer.
func (c *conn) call(st *stream) {
	if st.paced {
		c.s.cfg.ReadPacer.Started()
	}
	ctx, body := st.ctx, st.body
	st.ctx, st.body = nil, nil
	resp, err := st.m.handler(st.m.srv, ctx, func(v any) error { return c.decodeRequest(body, v) }, c.s.cfg.Interceptor)
	if err == nil {
		err = c.reply(st, resp)
	}
	if err != nil {
		err = c.answerErr(st, err)
	}
	if sh := c.s.cfg.StatsHandler; sh != nil {
		statsEnd(sh, ctx, st, status.Convert(err))
	}
}

// decodeRequest decodes a request message's body into m.
func (c *conn) decodeRequest(body []byte, m any) error {
	if err := c.s.cfg.Codec.Unmarshal(body, m); err != nil {
		return status.Errorf(codes.Internal, "grpc: error unmarshalling request: %v", err)
	}
	return nil
}

// frameMessage appends m to dst as a gRPC message (its 5-byte prefix, then
// the encoding), or says why it cannot be sent (MaxSendMsgSize bounds its
// size); dst, grown, is returned either way.
func (c *conn) frameMessage(dst []byte, m any) ([]byte, error) {
	at := len(dst)
	out, err := c.s.cfg.Codec.MarshalAppend(append(dst, 0, 0, 0, 0, 0), m)
	switch n, max := len(out)-at-5, c.s.cfg.MaxSendMsgSize; {
	case err != nil:
		return out, status.Errorf(codes.Internal, "grpc: error marshalling response: %v", err)
	case n > max:
		return out, status.Errorf(codes.ResourceExhausted, "grpc: trying to send message larger than max (%d vs. %d)", n, max)
	}
	binary.BigEndian.PutUint32(out[at+1:at+5], uint32(len(out)-at-5))
	return out, nil
}

// reply writes the handler's answer, or returns why it cannot be sent.
func (c *conn) reply(st *stream, resp any) error {
	bp := bufs.Get().(*[]byte)
	out, err := c.frameMessage((*bp)[:0], resp)
	if err == nil {
		c.answer(st, out)
	}
	if cap(out) <= 64<<10 {
		*bp = out[:0]
		bufs.Put(bp)
	}
	return err
}

// answer writes a message and OK trailers (with the handler's header and
// trailer metadata, if it set any).
func (c *conn) answer(st *stream, out []byte) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if st.gone {
		return
	}
	c.sendHeaderLocked(st)
	st.trailers = okTrailers
	if len(st.trl) > 0 {
		st.trailers = appendMD(append([]byte(nil), okTrailers...), st.trl)
	}
	st.out = out
	c.sendLocked(st)
	if st.waiting != nil {
		st.out = append([]byte(nil), st.out...) // out goes back to the pool
	}
	c.kickLocked()
}

// statusOf is a handler's error as the call's status (nil: OK; a context's
// error: CANCELLED or DEADLINE_EXCEEDED; any other: UNKNOWN).
func statusOf(err error) *status.Status {
	s, ok := status.FromError(err)
	if !ok && (errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)) {
		s = status.FromContextError(err)
	}
	return s
}

// answerErr writes the status of a failed call and returns it as an error.
func (c *conn) answerErr(st *stream, err error) error {
	s := statusOf(err)
	c.mu.Lock()
	defer c.mu.Unlock()
	if !st.gone {
		c.statusLocked(st, s)
		c.kickLocked()
	}
	return s.Err()
}

// statusLocked writes a trailers-only answer and ends the stream.
func (c *conn) statusLocked(st *stream, s *status.Status) {
	block := appendStatus(append([]byte(nil), respHeaders...), uint32(s.Code()), s.Message(), detailsOf(s))
	if len(st.trl) > 0 {
		block = appendMD(block, st.trl)
	}
	c.wbuf = appendHeaders(c.wbuf, st.id, block, true, c.peerFrame)
	c.finishLocked(st)
}

func detailsOf(s *status.Status) []byte {
	p := s.Proto()
	if len(p.GetDetails()) == 0 {
		return nil
	}
	b, err := proto.Marshal(p)
	if err != nil {
		return nil
	}
	return b
}

// Method, SetHeader, SendHeader and SetTrailer make the stream the call's
// grpc.ServerTransportStream: headers and trailers set by the handler leave
// with its answer (SendHeader does not send them earlier).
func (st *stream) Method() string { return st.method }

func (st *stream) SetHeader(md metadata.MD) error {
	st.c.mu.Lock()
	defer st.c.mu.Unlock()
	st.hdr = metadata.Join(st.hdr, md)
	return nil
}

func (st *stream) SendHeader(md metadata.MD) error { return st.SetHeader(md) }

func (st *stream) SetTrailer(md metadata.MD) error {
	st.c.mu.Lock()
	defer st.c.mu.Unlock()
	st.trl = metadata.Join(st.trl, md)
	return nil
}

// maxTimeout bounds a grpc-timeout (99999999H would overflow a deadline).
const maxTimeout = 100 * 365 * 24 * time.Hour

// timeoutUnits are grpc-timeout's units by their letter; 0: not a unit.
var timeoutUnits = [256]time.Duration{
	'H': time.Hour, 'M': time.Minute, 'S': time.Second,
	'm': time.Millisecond, 'u': time.Microsecond, 'n': time.Nanosecond,
}

// parseTimeout reads grpc-timeout: at most 8 digits and a unit.
func parseTimeout(s string) (time.Duration, error) {
	if len(s) < 2 || len(s) > 9 {
		return 0, errors.New("not 1 to 8 digits and a unit")
	}
	v, err := strconv.ParseUint(s[:len(s)-1], 10, 64)
	if err != nil {
		return 0, err
	}
	unit := timeoutUnits[s[len(s)-1]]
	if unit == 0 {
		return 0, errors.New("unknown unit")
	}
	if v > uint64(maxTimeout/unit) {
		return maxTimeout, nil
	}
	return time.Duration(v) * unit, nil
}

// decodeBin decodes a binary header, padded or not.
func decodeBin(v string) ([]byte, error) {
	if len(v)%4 == 0 {
		return base64.StdEncoding.DecodeString(v)
	}
	return base64.RawStdEncoding.DecodeString(v)
}
