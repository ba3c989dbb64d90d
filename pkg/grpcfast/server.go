// Package grpcfast is a small HTTP/2 (h2c, cleartext) server for unary gRPC
// calls: a second transport beside grpc-go for a service whose calls are
// small and many (Envoy's ShouldRateLimit), where grpc-go's transport — a
// goroutine and contexts per stream, its loopy writer, a write per call at
// low concurrency — costs more CPU than the call itself (docs/limiter.md,
// "The gRPC transport").
//
// Per connection it runs one goroutine that reads frames (golang.org/x/net's
// http2.Framer and hpack, with their CONTINUATION and header-list bounds) and
// one goroutine per call; answers are appended to one buffer and written
// together, one write for every batch of answers ready at once. It speaks
// what a gRPC client needs and no more: unary and server-streaming methods
// (a health Watch) registered from a grpc.ServiceDesc (client- and
// bidi-streaming methods are answered UNIMPLEMENTED),
// identity encoding only, grpc-timeout as the call's deadline, metadata in
// the call's context, flow control both ways, PING, RST_STREAM, GOAWAY with
// a graceful drain, and the connection age and idle bounds and keepalive
// pings of grpc-go's keepalive.ServerParameters.
package grpcfast

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/net/http2"
	"google.golang.org/grpc"
	"google.golang.org/grpc/stats"
	"google.golang.org/grpc/tap"
	"google.golang.org/protobuf/proto"
)

// Config bounds the server. The zero value takes the defaults.
type Config struct {
	// MaxConcurrentStreams is the most calls one connection may have open
	// (SETTINGS_MAX_CONCURRENT_STREAMS; default 1000). A client past it has
	// its new streams refused (RST_STREAM REFUSED_STREAM).
	MaxConcurrentStreams uint32
	// MaxRecvMsgSize bounds a request message (default 4 MiB, as grpc-go);
	// MaxSendMsgSize an answer (default 4 MiB).
	MaxRecvMsgSize int
	MaxSendMsgSize int
	// MaxHeaderListSize bounds a request's header list, hpack-decoded
	// (SETTINGS_MAX_HEADER_LIST_SIZE; default 16 KiB). A stream past it is
	// refused; a connection that goes on sending CONTINUATION frames past
	// it is closed (CVE-2023-45288).
	MaxHeaderListSize uint32
	// Window is the flow-control window the server grants each stream
	// (default 1 MiB); the connection's is the larger of it and twice
	// MaxRecvMsgSize.
	Window uint32
	// MaxConnBuffered bounds the bytes of a connection's requests not yet
	// complete (default the larger of 16 MiB and 4 MaxRecvMsgSize): a
	// request that would go past it is refused RESOURCE_EXHAUSTED.
	MaxConnBuffered int
	// MaxConnectionIdle closes (GOAWAY) a connection without a call for
	// this long; MaxConnectionAge one this old, after MaxConnectionAgeGrace
	// for its calls to end (0: no bound), as grpc-go's
	// keepalive.ServerParameters.
	MaxConnectionIdle     time.Duration
	MaxConnectionAge      time.Duration
	MaxConnectionAgeGrace time.Duration
	// KeepaliveTime is how long a connection may go without a frame from
	// the client before the server PINGs it, and KeepaliveTimeout how long
	// the server then waits for a frame (the ack or any other) before it
	// closes the connection (KeepaliveTime 0: no pings; KeepaliveTimeout
	// 0: 20 s), as grpc-go's keepalive.ServerParameters Time and Timeout.
	// Silence is noticed after KeepaliveTime to 5/4 of it: the reader
	// counts frames and one timer per connection looks at the count, with
	// nothing per frame but the count.
	KeepaliveTime    time.Duration
	KeepaliveTimeout time.Duration
	// PingMinTime is how often a client may PING while the server has sent
	// nothing since (default 5 s, grpc-go's keepalive.EnforcementPolicy with
	// PermitWithoutStream): after two pings closer than that the connection
	// is sent GOAWAY (ENHANCE_YOUR_CALM, "too_many_pings").
	PingMinTime time.Duration
	// HandshakeTimeout bounds the wait for a client's preface (default 10 s);
	// WriteTimeout a write to a client that does not read (default 20 s).
	HandshakeTimeout time.Duration
	WriteTimeout     time.Duration
	// Interceptor, when set, wraps every unary call (as grpc.UnaryInterceptor).
	Interceptor grpc.UnaryServerInterceptor
	// StatsHandler, when set, is told of every call that reaches dispatch
	// (its request complete, past the tap and the method lookup) as
	// grpc.StatsHandler's is: TagRPC (its context is the call's), then
	// InHeader, Begin and End — no payload, OutHeader or OutTrailer
	// events. otelgrpc.NewServerHandler makes the same server spans on it
	// as on grpc-go. Nil: none of it, at no cost.
	StatsHandler stats.Handler
	// Tap, when set, sees every call as its headers arrive, before its
	// message is read (as grpc.InTapHandle); an error answers the call with
	// its status at once.
	Tap tap.ServerInHandle
	// PastDeadline, when set, is told of a call whose grpc-timeout had
	// already passed when its request was complete: the call is answered
	// DEADLINE_EXCEEDED with the message it returns, at once, its message
	// not decoded and its handler not run (the caller has given up). Unset,
	// such a call goes to its handler with a context already done.
	PastDeadline func(fullMethod string) string
	// Abandoned, when set, is told of a call its client reset (RST_STREAM)
	// before it was dispatched: before its request was complete, or in the
	// read that completed it — as a call that waited in the socket past
	// its deadline under overload comes, with its client's reset behind
	// it. Such a call is neither run nor answered.
	Abandoned func(fullMethod string)
	// Workers is how many goroutines run calls for good (default 128):
	// their stacks have grown to what a call needs, where a goroutine per
	// call grows a new one every time (a quarter of the CPU of a
	// do-nothing call). Past them, while every worker is busy, a call
	// starts a spare worker, which takes further calls until none has come
	// for SpareIdle and then ends: a standing queue of more calls than
	// Workers does not grow a stack per call either.
	Workers int
	// SpareIdle is how long a spare worker waits for another call before
	// it ends (default 100 ms).
	SpareIdle time.Duration
	// ReadPacer, when set, paces the reads of every accepted TCP
	// connection (ReadPacer; pace.go): once its socket has had nothing to
	// read, a connection waits for the pacer's turn before it reads what
	// arrives, until a call's metadata takes it out of pacing.
	ReadPacer ReadPacer
	// WrapConn, when set, wraps every accepted connection on its own
	// goroutine (a rapid-reset guard: pkg/h2guard); returning nil drops it
	// (WrapConn closes it).
	WrapConn func(net.Conn) net.Conn
	// Codec decodes requests and encodes answers (default protobuf's
	// proto.Unmarshal and proto.MarshalOptions.MarshalAppend).
	Codec Codec
}

// Codec is the encoding of a call's messages (grpc-go's encoding.CodecV2
// on whole messages). It must be safe for concurrent use.
type Codec interface {
	// Unmarshal decodes a request's body into m, keeping nothing of body.
	Unmarshal(body []byte, m any) error
	// MarshalAppend appends m's encoding to dst and returns dst, grown.
	MarshalAppend(dst []byte, m any) ([]byte, error)
}

// protoCodec is the default Codec.
type protoCodec struct{}

func (protoCodec) Unmarshal(body []byte, m any) error {
	pm, ok := m.(proto.Message)
	if !ok {
		return fmt.Errorf("%T is not a proto message", m)
	}
	return proto.Unmarshal(body, pm)
}

func (protoCodec) MarshalAppend(dst []byte, m any) ([]byte, error) {
	pm, ok := m.(proto.Message)
	if !ok {
		return dst, fmt.Errorf("%T is not a proto message", m)
	}
	return proto.MarshalOptions{}.MarshalAppend(dst, pm)
}

func (c *Config) defaults() {
	def := func(v *uint32, d uint32) {
		if *v == 0 {
			*v = d
		}
	}
	def(&c.MaxConcurrentStreams, 1000)
	def(&c.MaxHeaderListSize, 16<<10)
	def(&c.Window, 1<<20)
	if c.Codec == nil {
		c.Codec = protoCodec{}
	}
	if c.MaxRecvMsgSize <= 0 {
		c.MaxRecvMsgSize = 4 << 20
	}
	if c.MaxConnBuffered <= 0 {
		c.MaxConnBuffered = max(16<<20, 4*c.MaxRecvMsgSize)
	}
	if c.MaxSendMsgSize <= 0 {
		c.MaxSendMsgSize = 4 << 20
	}
	if c.PingMinTime <= 0 {
		c.PingMinTime = 5 * time.Second
	}
	if c.KeepaliveTimeout <= 0 {
		c.KeepaliveTimeout = 20 * time.Second
	}
	if c.SpareIdle <= 0 {
		c.SpareIdle = 100 * time.Millisecond
	}
	if c.Workers <= 0 {
		c.Workers = 128
	}
	if c.HandshakeTimeout <= 0 {
		c.HandshakeTimeout = 10 * time.Second
	}
	if c.WriteTimeout <= 0 {
		c.WriteTimeout = 20 * time.Second
	}
}

// ErrServerClosed is what Serve returns when called after Shutdown or Close.
var ErrServerClosed = errors.New("grpcfast: server closed")

// Server serves unary gRPC methods over h2c; safe for concurrent use.
type Server struct {
	cfg     Config
	methods map[string]method // by full method name, "/pkg.Service/Method"
	streams map[string]bool   // client- and bidi-streaming methods: answered UNIMPLEMENTED

	mu        sync.Mutex
	listeners map[net.Listener]struct{}
	conns     map[*conn]struct{}
	closing   bool
	drained   chan struct{} // closed when closing and the last connection has gone

	refusals  sync.Map     // refusalKey → trailers-only block (refusal)
	nRefusals atomic.Int32 // refusal blocks made (at most maxRefusals kept)

	work    chan *stream  // calls for an idle worker
	workers int           // started, under mu
	nSpares atomic.Int64  // spare workers started
	quit    chan struct{} // closed by Close: the workers end
}

type method struct {
	srv     any
	handler grpc.MethodHandler // a unary method's
	stream  grpc.StreamHandler // a server-streaming method's
}

var _ grpc.ServiceRegistrar = (*Server)(nil)

// New returns a server with cfg's bounds and no services.
func New(cfg Config) *Server {
	cfg.defaults()
	return &Server{cfg: cfg, methods: map[string]method{}, streams: map[string]bool{},
		listeners: map[net.Listener]struct{}{}, conns: map[*conn]struct{}{}, drained: make(chan struct{}),
		work: make(chan *stream), quit: make(chan struct{})}
}

// run hands a call to an idle worker, or to a new one while there are
// fewer than Workers, or else to a new spare worker.
func (s *Server) run(st *stream) {
	select {
	case s.work <- st:
		return
	default:
	}
	s.mu.Lock()
	spawn := s.workers < s.cfg.Workers
	if spawn {
		s.workers++
	}
	s.mu.Unlock()
	if spawn {
		go s.worker(st)
		return
	}
	go s.spare(st)
}

func (s *Server) worker(st *stream) {
	for {
		st.c.call(st)
		select {
		case st = <-s.work:
		case <-s.quit:
			return
		}
	}
}

// spare is a worker past Config.Workers: it ends when no call has come for
// Config.SpareIdle.
func (s *Server) spare(st *stream) {
	s.nSpares.Add(1)
	idle := time.NewTimer(s.cfg.SpareIdle)
	defer idle.Stop()
	for {
		st.c.call(st)
		idle.Reset(s.cfg.SpareIdle)
		select {
		case st = <-s.work:
		case <-idle.C:
			return
		case <-s.quit:
			return
		}
	}
}

// RegisterService registers desc's unary and server-streaming methods on
// impl (as grpc.Server's, so that generated Register…Server functions take
// this server); its client- and bidi-streaming methods are answered
// UNIMPLEMENTED. Call it before Serve.
func (s *Server) RegisterService(desc *grpc.ServiceDesc, impl any) {
	for _, m := range desc.Methods {
		s.methods["/"+desc.ServiceName+"/"+m.MethodName] = method{srv: impl, handler: m.Handler}
	}
	for _, st := range desc.Streams {
		name := "/" + desc.ServiceName + "/" + st.StreamName
		if st.ServerStreams && !st.ClientStreams {
			s.methods[name] = method{srv: impl, stream: st.Handler}
		} else {
			s.streams[name] = true
		}
	}
}

// Serve accepts connections on ln until Shutdown or Close, then returns nil
// (as grpc.Server's), or the listener's error.
func (s *Server) Serve(ln net.Listener) error {
	s.mu.Lock()
	if s.closing {
		s.mu.Unlock()
		_ = ln.Close()
		return ErrServerClosed
	}
	s.listeners[ln] = struct{}{}
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.listeners, ln)
		s.mu.Unlock()
	}()
	var backoff time.Duration
	for {
		nc, err := ln.Accept()
		if err != nil {
			s.mu.Lock()
			closing := s.closing
			s.mu.Unlock()
			if closing {
				return nil
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() { // as net/http: EMFILE and the like pass
				backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
				time.Sleep(backoff)
				continue
			}
			return err
		}
		backoff = 0
		go s.serveConn(nc)
	}
}

// serveConn wraps an accepted connection (on its own goroutine: a guard may
// hold it a while) and serves it.
func (s *Server) serveConn(nc net.Conn) {
	var paced *pacedConn
	if s.cfg.ReadPacer != nil {
		if paced = pace(nc, s.cfg.ReadPacer); paced != nil {
			nc = paced
		}
	}
	if s.cfg.WrapConn != nil {
		if nc = s.cfg.WrapConn(nc); nc == nil {
			return
		}
	}
	c := newConn(s, nc)
	c.paced = paced
	s.mu.Lock()
	if s.closing {
		s.mu.Unlock()
		_ = nc.Close()
		return
	}
	s.conns[c] = struct{}{}
	s.mu.Unlock()
	c.serve()
}

// forget drops a closed connection.
func (s *Server) forget(c *conn) {
	s.mu.Lock()
	delete(s.conns, c)
	if s.closing && len(s.conns) == 0 {
		select {
		case <-s.drained:
		default:
			close(s.drained)
		}
	}
	s.mu.Unlock()
}

// Shutdown stops accepting, sends every connection GOAWAY and waits for
// their calls to end and the connections to close, or for ctx to be done
// (then it closes them: Close). It is grpc.Server.GracefulStop with a
// deadline, but for server-streaming calls (a health Watch), which would
// never end by themselves: they are ended at once, UNAVAILABLE.
func (s *Server) Shutdown(ctx context.Context) error {
	conns := s.stop()
	for _, c := range conns {
		c.goAway(http2.ErrCodeNo, nil, true)
		c.endStreaming()
	}
	select {
	case <-s.drained:
		return nil
	case <-ctx.Done():
		s.Close()
		return ctx.Err()
	}
}

// Close stops accepting and closes every connection at once, failing their
// calls' contexts.
func (s *Server) Close() {
	for _, c := range s.stop() {
		c.close()
	}
}

// stop marks the server closing, closes its listeners and returns its
// connections.
func (s *Server) stop() []*conn {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.closing {
		s.closing = true
		if len(s.conns) == 0 {
			close(s.drained)
		}
	}
	for ln := range s.listeners {
		_ = ln.Close()
	}
	select {
	case <-s.quit:
	default:
		close(s.quit)
	}
	out := make([]*conn, 0, len(s.conns))
	for c := range s.conns {
		out = append(out, c)
	}
	return out
}
