package grpcfast

// Writing: frames are appended to the connection's buffer under its lock,
// and whoever appends first while no write is under way writes — after
// letting the other goroutines that are ready run, so that the answers of a
// batch of calls leave in one write.

import (
	"encoding/binary"
	"runtime"
	"time"

	"golang.org/x/net/http2"
	"google.golang.org/grpc/codes"
)

// frameHeaderLen is an HTTP/2 frame header's length (RFC 9113 §4.1).
const frameHeaderLen = 9

func appendFrameHeader(b []byte, length int, typ http2.FrameType, flags http2.Flags, stream uint32) []byte {
	return append(b, byte(length>>16), byte(length>>8), byte(length), byte(typ), byte(flags),
		byte(stream>>24)&0x7f, byte(stream>>16), byte(stream>>8), byte(stream))
}

func appendSettings(b []byte, cfg *Config) []byte {
	set := []http2.Setting{
		{ID: http2.SettingMaxConcurrentStreams, Val: cfg.MaxConcurrentStreams},
		{ID: http2.SettingInitialWindowSize, Val: cfg.Window},
		{ID: http2.SettingMaxHeaderListSize, Val: cfg.MaxHeaderListSize},
	}
	b = appendFrameHeader(b, 6*len(set), http2.FrameSettings, 0, 0)
	for _, s := range set {
		b = binary.BigEndian.AppendUint16(b, uint16(s.ID))
		b = binary.BigEndian.AppendUint32(b, s.Val)
	}
	return b
}

func appendWindowUpdate(b []byte, stream, inc uint32) []byte {
	return binary.BigEndian.AppendUint32(appendFrameHeader(b, 4, http2.FrameWindowUpdate, 0, stream), inc&0x7fffffff)
}

func appendRST(b []byte, stream uint32, code http2.ErrCode) []byte {
	return binary.BigEndian.AppendUint32(appendFrameHeader(b, 4, http2.FrameRSTStream, 0, stream), uint32(code))
}

func appendGoAway(b []byte, last uint32, code http2.ErrCode, debug []byte) []byte {
	b = appendFrameHeader(b, 8+len(debug), http2.FrameGoAway, 0, 0)
	b = binary.BigEndian.AppendUint32(b, last&0x7fffffff)
	return append(binary.BigEndian.AppendUint32(b, uint32(code)), debug...)
}

// appendHeaders appends a header block as one HEADERS frame and as many
// CONTINUATION frames as the client's frame size needs.
func appendHeaders(b []byte, stream uint32, block []byte, endStream bool, maxFrame int) []byte {
	flags := http2.Flags(0)
	if endStream {
		flags |= http2.FlagHeadersEndStream
	}
	typ := http2.FrameHeaders
	for {
		n := min(len(block), maxFrame)
		f := flags
		if n == len(block) {
			f |= http2.FlagHeadersEndHeaders
		}
		b = append(appendFrameHeader(b, n, typ, f, stream), block[:n]...)
		block = block[n:]
		if len(block) == 0 {
			return b
		}
		typ, flags = http2.FrameContinuation, 0
	}
}

// kickLocked writes the buffer unless a write is under way (whose writer
// will take what was appended). Called with mu held; returns with it held.
func (c *conn) kickLocked() {
	if c.flushing || c.closed {
		return
	}
	c.flushing = true
	c.mu.Unlock()
	if !c.critical() {
		runtime.Gosched() // the calls ready now append their answers first
	}
	c.mu.Lock()
	for !c.closed && len(c.wbuf) > 0 {
		buf := c.wbuf
		c.wbuf = c.spare[:0]
		c.mu.Unlock()
		// The write deadline moves at most every WriteTimeout/2, not per
		// write: a write blocked on a client that does not read fails
		// within WriteTimeout/2 to WriteTimeout.
		if now := time.Now(); c.deadline.Sub(now) < c.s.cfg.WriteTimeout/2 {
			c.deadline = now.Add(c.s.cfg.WriteTimeout)
			_ = c.nc.SetWriteDeadline(c.deadline)
		}
		_, err := c.nc.Write(buf)
		c.mu.Lock()
		if cap(buf) <= 4*maxPending {
			c.spare = buf[:0]
		}
		if len(c.wbuf) <= maxPending {
			c.room.Broadcast()
		}
		if err != nil {
			c.flushing = false
			c.mu.Unlock()
			c.close()
			c.mu.Lock()
			return
		}
	}
	c.flushing = false
	if c.closeAfter && !c.closed {
		c.mu.Unlock()
		c.close()
		c.mu.Lock()
	}
}

// sendLocked writes as much of st's answer as the flow-control windows
// allow, and its trailers (if set) once the message is out; a stream whose
// answer does not fit waits for WINDOW_UPDATE (flow.go).
func (c *conn) sendLocked(st *stream) {
	for len(st.out) > 0 {
		n := int(min(int64(len(st.out)), c.sendAvail, st.sendAvail, int64(c.peerFrame)))
		if n <= 0 {
			c.waitLocked(st)
			return
		}
		c.wbuf = append(appendFrameHeader(c.wbuf, n, http2.FrameData, 0, st.id), st.out[:n]...)
		c.sentData = true
		st.out = st.out[n:]
		c.sendAvail -= int64(n)
		st.sendAvail -= int64(n)
	}
	c.unwaitLocked(st)
	if st.trailers == nil { // a server-streaming call's message, not its end
		return
	}
	c.wbuf = appendHeaders(c.wbuf, st.id, st.trailers, true, c.peerFrame)
	st.trailers = nil
	c.finishLocked(st)
}

// finishLocked ends a stream whose answer is written: a client still
// sending its request is told to stop (RST_STREAM NO_ERROR, as grpc-go).
func (c *conn) finishLocked(st *stream) {
	if !st.recvDone {
		c.wbuf = appendRST(c.wbuf, st.id, http2.ErrCodeNo)
	}
	c.sentData = true
	c.dropLocked(st)
}

// maxRefusals bounds the refusals' trailer blocks a server keeps.
const maxRefusals = 64

// refusalKey names a refusal's status.
type refusalKey struct {
	code codes.Code
	msg  string
}

// refusal is the trailers-only block of a call refused with code and msg
// before its message was read (refuse): made once per status and kept, as
// a door that refuses most calls under overload refuses them all alike —
// no status, no block and no copy of the status proto per refusal. The
// caller must not write into it.
func (s *Server) refusal(code codes.Code, msg string) []byte {
	k := refusalKey{code, msg}
	if b, ok := s.refusals.Load(k); ok {
		return b.([]byte)
	}
	b := appendStatus(append([]byte(nil), respHeaders...), uint32(code), msg, nil)
	b = b[:len(b):len(b)]
	if s.nRefusals.Load() < maxRefusals && s.nRefusals.Add(1) <= maxRefusals {
		s.refusals.Store(k, b)
	}
	return b
}
