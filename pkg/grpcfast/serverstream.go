package grpcfast

// Server-streaming calls (one request, answers until the handler returns: a
// health Watch): each on a goroutine of its own, its messages written as
// the handler sends them, one at a time within the flow-control windows.

import (
	"context"
	"io"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// errShutdown is the status of a server-streaming call Shutdown ends.
var errShutdown = status.New(codes.Unavailable, "grpcfast: the server is shutting down")

// callStream runs a server-streaming method's handler and writes its end.
func (c *conn) callStream(st *stream) {
	ss := &serverStream{st: st, ctx: st.ctx, body: st.body}
	st.ctx, st.body = nil, nil
	c.mu.Lock()
	ending := c.ending
	c.mu.Unlock()
	s := errShutdown
	if !ending { // else dispatched after endStreaming looked
		s = statusOf(st.m.stream(st.m.srv, ss))
	}
	c.mu.Lock()
	if st.gone {
		s = status.New(codes.Canceled, "grpcfast: the stream ended before its handler returned")
	} else {
		c.endStreamLocked(st, s)
		c.kickLocked()
	}
	c.mu.Unlock()
	if sh := c.s.cfg.StatsHandler; sh != nil {
		statsEnd(sh, ss.ctx, st, s)
	}
}

// endStreamLocked ends a server-streaming call with s: trailers after what
// it has sent, or a trailers-only answer if it has sent nothing.
func (c *conn) endStreamLocked(st *stream, s *status.Status) {
	if !st.sentHdr {
		c.statusLocked(st, s)
		return
	}
	st.trailers = appendStatus(nil, uint32(s.Code()), s.Message(), detailsOf(s))
	if len(st.trl) > 0 {
		st.trailers = appendMD(st.trailers, st.trl)
	}
	c.sendLocked(st)
}

// endStreaming ends the connection's server-streaming calls, UNAVAILABLE
// (Shutdown: a Watch would hold the drain until its client went away).
func (c *conn) endStreaming() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.ending = true
	ended := false
	for _, st := range c.streams {
		if st.m.stream != nil && st.dispatched && st.trailers == nil {
			c.endStreamLocked(st, errShutdown)
			ended = true
		}
	}
	if ended {
		c.room.Broadcast() // a SendMsg waiting for the window: the stream has ended
		c.kickLocked()
	}
}

// serverStream is a server-streaming call's grpc.ServerStream.
type serverStream struct {
	st   *stream
	ctx  context.Context
	body []byte // the request message; nil once read
	read bool
}

var _ grpc.ServerStream = (*serverStream)(nil)

func (ss *serverStream) Context() context.Context { return ss.ctx }

// RecvMsg reads the one request message; after it, io.EOF.
func (ss *serverStream) RecvMsg(m any) error {
	if ss.read {
		return io.EOF
	}
	ss.read = true
	body := ss.body
	ss.body = nil
	return ss.st.c.decodeRequest(body, m)
}

// SendMsg writes a message (after the headers, the first time). It waits
// while the stream's previous message is held by flow control, and fails
// once the stream has ended.
func (ss *serverStream) SendMsg(m any) error {
	st, c := ss.st, ss.st.c
	out, err := c.frameMessage(nil, m)
	if err != nil {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for len(st.out) > 0 && !st.gone && !c.closed && st.trailers == nil {
		c.room.Wait()
	}
	if st.gone || c.closed || st.trailers != nil {
		return status.Error(codes.Canceled, "grpcfast: the stream has ended")
	}
	c.sendHeaderLocked(st)
	st.out = out
	c.sendLocked(st)
	c.kickLocked()
	return nil
}

// sendHeaderLocked writes the call's headers (with the handler's header
// metadata, if it set any), once.
func (c *conn) sendHeaderLocked(st *stream) {
	if st.sentHdr {
		return
	}
	st.sentHdr = true
	block := respHeaders
	if len(st.hdr) > 0 {
		block = appendMD(append([]byte(nil), respHeaders...), st.hdr)
	}
	c.wbuf = appendHeaders(c.wbuf, st.id, block, false, c.peerFrame)
	c.sentData = true
}

func (ss *serverStream) SetHeader(md metadata.MD) error {
	c := ss.st.c
	c.mu.Lock()
	defer c.mu.Unlock()
	if ss.st.sentHdr {
		return status.Error(codes.Internal, "grpcfast: SetHeader after the headers were sent")
	}
	ss.st.hdr = metadata.Join(ss.st.hdr, md)
	return nil
}

func (ss *serverStream) SendHeader(md metadata.MD) error {
	if err := ss.SetHeader(md); err != nil {
		return err
	}
	c := ss.st.c
	c.mu.Lock()
	defer c.mu.Unlock()
	if ss.st.gone {
		return status.Error(codes.Canceled, "grpcfast: the stream has ended")
	}
	c.sendHeaderLocked(ss.st)
	c.kickLocked()
	return nil
}

func (ss *serverStream) SetTrailer(md metadata.MD) { _ = ss.st.SetTrailer(md) }
