package grpcfast

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/encoding/gzip"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	testpb "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/tap"
)

// testService answers UnaryCall with a payload of the asked size (the
// request's payload body repeated, or zeros), echoes metadata "echo" back as
// header and trailer, and holds a call whose payload body is "wait" until
// released (or its context ends).
type testService struct {
	testpb.UnimplementedTestServiceServer
	release  chan struct{}
	started  chan struct{}
	deadline atomic.Value // time.Time of the last call's context
}

func (s *testService) EmptyCall(ctx context.Context, _ *testpb.Empty) (*testpb.Empty, error) {
	return &testpb.Empty{}, nil
}

func (s *testService) UnaryCall(ctx context.Context, in *testpb.SimpleRequest) (*testpb.SimpleResponse, error) {
	if d, ok := ctx.Deadline(); ok {
		s.deadline.Store(d)
	}
	md, _ := metadata.FromIncomingContext(ctx)
	if v := md.Get("echo"); len(v) > 0 {
		_ = grpc.SetHeader(ctx, metadata.Pairs("echo", v[0]))
		_ = grpc.SetTrailer(ctx, metadata.Pairs("echo-trailer", v[0]))
	}
	if v := md.Get("blob-bin"); len(v) > 0 {
		_ = grpc.SetTrailer(ctx, metadata.Pairs("blob-bin", v[0]))
	}
	switch string(in.GetPayload().GetBody()) {
	case "wait":
		s.started <- struct{}{}
		select {
		case <-s.release:
		case <-ctx.Done():
			return nil, status.FromContextError(ctx.Err()).Err()
		}
	case "sleep":
		time.Sleep(10 * time.Millisecond)
	case "fail":
		return nil, status.Error(codes.FailedPrecondition, "nope: 100% wrong\nline")
	}
	return &testpb.SimpleResponse{Payload: &testpb.Payload{Body: fill(int(in.GetResponseSize()), in.GetPayload().GetBody())}}, nil
}

// fill returns n bytes of pattern repeated (zeros if pattern is empty).
func fill(n int, pattern []byte) []byte {
	b := make([]byte, n)
	for i := 0; len(pattern) > 0 && i < n; i += len(pattern) {
		copy(b[i:], pattern)
	}
	return b
}

// StreamingOutputCall sends a message of each asked size, with header
// "echo" set, then its status (ResponseStatus, or OK) with trailer
// "echo-trailer".
func (s *testService) StreamingOutputCall(in *testpb.StreamingOutputCallRequest, out testpb.TestService_StreamingOutputCallServer) error {
	_ = out.SetHeader(metadata.Pairs("echo", "h"))
	out.SetTrailer(metadata.Pairs("echo-trailer", "t"))
	for _, p := range in.GetResponseParameters() {
		if err := out.Send(&testpb.StreamingOutputCallResponse{Payload: &testpb.Payload{Body: make([]byte, p.GetSize())}}); err != nil {
			return err
		}
	}
	if rs := in.GetResponseStatus(); rs != nil {
		return status.Error(codes.Code(rs.GetCode()), rs.GetMessage())
	}
	return nil
}

type fixture struct {
	srv  *Server
	svc  *testService
	addr string
	conn *grpc.ClientConn
	hs   *health.Server
	done chan error // Serve's return
}

func serve(t testing.TB, cfg Config) *fixture {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	f := &fixture{srv: New(cfg), svc: &testService{release: make(chan struct{}), started: make(chan struct{}, 100)},
		addr: ln.Addr().String(), hs: health.NewServer(), done: make(chan error, 1)}
	testpb.RegisterTestServiceServer(f.srv, f.svc)
	healthpb.RegisterHealthServer(f.srv, f.hs)
	go func() { f.done <- f.srv.Serve(ln) }()
	t.Cleanup(f.srv.Close)
	f.conn = dial(t, f.addr)
	return f
}

func dial(t testing.TB, addr string) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func TestUnaryCalls(t *testing.T) {
	f := serve(t, Config{})
	c := testpb.NewTestServiceClient(f.conn)
	ctx := ctxT(t)
	t.Run("empty request and answer", func(t *testing.T) {
		_, err := c.EmptyCall(ctx, &testpb.Empty{})
		require.NoError(t, err)
	})
	t.Run("a message each way", func(t *testing.T) {
		r, err := c.UnaryCall(ctx, &testpb.SimpleRequest{ResponseSize: 100, Payload: &testpb.Payload{Body: []byte("hi")}})
		require.NoError(t, err)
		require.Len(t, r.GetPayload().GetBody(), 100)
	})
	t.Run("a status with a message to encode", func(t *testing.T) {
		_, err := c.UnaryCall(ctx, &testpb.SimpleRequest{Payload: &testpb.Payload{Body: []byte("fail")}})
		require.Equal(t, codes.FailedPrecondition, status.Code(err))
		require.Equal(t, "nope: 100% wrong\nline", status.Convert(err).Message())
	})
	t.Run("many calls one after another on one connection", func(t *testing.T) {
		for range 2000 {
			_, err := c.UnaryCall(ctx, &testpb.SimpleRequest{ResponseSize: 10})
			require.NoError(t, err)
		}
	})
}

// countingCodec is the default codec, counting its calls, refusing to
// decode a request whose payload body is "undecodable".
type countingCodec struct{ decoded, encoded atomic.Int64 }

func (c *countingCodec) Unmarshal(body []byte, m any) error {
	c.decoded.Add(1)
	if bytes.Contains(body, []byte("undecodable")) {
		return errors.New("undecodable")
	}
	return protoCodec{}.Unmarshal(body, m)
}

func (c *countingCodec) MarshalAppend(dst []byte, m any) ([]byte, error) {
	c.encoded.Add(1)
	return protoCodec{}.MarshalAppend(dst, m)
}

// TestCodec: Config.Codec decodes every request and encodes every answer,
// of unary and server-streaming calls; a request it cannot decode is
// answered INTERNAL.
func TestCodec(t *testing.T) {
	codec := &countingCodec{}
	f := serve(t, Config{Codec: codec})
	c := testpb.NewTestServiceClient(f.conn)
	ctx := ctxT(t)
	r, err := c.UnaryCall(ctx, &testpb.SimpleRequest{ResponseSize: 7})
	require.NoError(t, err)
	require.Len(t, r.GetPayload().GetBody(), 7)
	st, err := c.StreamingOutputCall(ctx, &testpb.StreamingOutputCallRequest{ResponseParameters: []*testpb.ResponseParameters{{Size: 1}, {Size: 2}}})
	require.NoError(t, err)
	for {
		if _, err := st.Recv(); err != nil {
			require.ErrorIs(t, err, io.EOF)
			break
		}
	}
	require.Equal(t, int64(2), codec.decoded.Load())
	require.Equal(t, int64(3), codec.encoded.Load())
	_, err = c.UnaryCall(ctx, &testpb.SimpleRequest{Payload: &testpb.Payload{Body: []byte("undecodable")}})
	require.Equal(t, codes.Internal, status.Code(err))
	require.Contains(t, status.Convert(err).Message(), "undecodable")
}

// Messages past the windows (64 KiB the client grants at first, 1 MiB per
// stream the server grants) flow both ways; a message past MaxRecvMsgSize
// is refused RESOURCE_EXHAUSTED.
func TestLargeMessagesAndFlowControl(t *testing.T) {
	f := serve(t, Config{Window: 256 << 10, MaxRecvMsgSize: 3 << 20, MaxSendMsgSize: 3 << 20})
	c := testpb.NewTestServiceClient(f.conn)
	ctx := ctxT(t)
	big := make([]byte, 2<<20)
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r, err := c.UnaryCall(ctx, &testpb.SimpleRequest{ResponseSize: 2 << 20, Payload: &testpb.Payload{Body: big}},
				grpc.MaxCallRecvMsgSize(4<<20))
			if !errors.Is(err, nil) {
				t.Error(err)
				return
			}
			if len(r.GetPayload().GetBody()) != 2<<20 {
				t.Errorf("answer of %d bytes", len(r.GetPayload().GetBody()))
			}
		}()
	}
	wg.Wait()
	_, err := c.UnaryCall(ctx, &testpb.SimpleRequest{Payload: &testpb.Payload{Body: make([]byte, 4<<20)}}, grpc.MaxCallSendMsgSize(8<<20))
	require.Equal(t, codes.ResourceExhausted, status.Code(err), "%v", err)
	_, err = c.UnaryCall(ctx, &testpb.SimpleRequest{ResponseSize: 4 << 20}, grpc.MaxCallRecvMsgSize(8<<20))
	require.Equal(t, codes.ResourceExhausted, status.Code(err), "%v", err)
	// The connection still serves.
	_, err = c.EmptyCall(ctx, &testpb.Empty{})
	require.NoError(t, err)
}

func TestDeadlines(t *testing.T) {
	f := serve(t, Config{})
	c := testpb.NewTestServiceClient(f.conn)
	t.Run("grpc-timeout is the call's deadline", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		want, _ := ctx.Deadline()
		_, err := c.UnaryCall(ctx, &testpb.SimpleRequest{})
		require.NoError(t, err)
		got := f.svc.deadline.Load().(time.Time)
		require.WithinDuration(t, want, got, 100*time.Millisecond)
	})
	t.Run("a call past its deadline ends with DEADLINE_EXCEEDED and its context", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		defer cancel()
		_, err := c.UnaryCall(ctx, &testpb.SimpleRequest{Payload: &testpb.Payload{Body: []byte("wait")}})
		require.Equal(t, codes.DeadlineExceeded, status.Code(err))
		<-f.svc.started
	})
	t.Run("the client's cancel (RST_STREAM) ends the call's context", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		errc := make(chan error, 1)
		go func() {
			_, err := c.UnaryCall(ctx, &testpb.SimpleRequest{Payload: &testpb.Payload{Body: []byte("wait")}})
			errc <- err
		}()
		<-f.svc.started
		cancel()
		require.Equal(t, codes.Canceled, status.Code(<-errc))
		// The connection still serves.
		_, err := c.EmptyCall(ctxT(t), &testpb.Empty{})
		require.NoError(t, err)
	})
}

func TestMetadataAndInterceptor(t *testing.T) {
	auth := func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		if info.FullMethod == "/grpc.health.v1.Health/Check" {
			return handler(ctx, req)
		}
		md, _ := metadata.FromIncomingContext(ctx)
		if v := md.Get("authorization"); len(v) != 1 || v[0] != "Bearer good" {
			return nil, status.Error(codes.Unauthenticated, "who are you")
		}
		if grpc.ServerTransportStreamFromContext(ctx).Method() != info.FullMethod {
			return nil, status.Error(codes.Internal, "method")
		}
		return handler(ctx, req)
	}
	f := serve(t, Config{Interceptor: auth})
	c := testpb.NewTestServiceClient(f.conn)
	ctx := ctxT(t)
	_, err := c.EmptyCall(ctx, &testpb.Empty{})
	require.Equal(t, codes.Unauthenticated, status.Code(err))
	_, err = c.EmptyCall(metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer bad"), &testpb.Empty{})
	require.Equal(t, codes.Unauthenticated, status.Code(err))

	blob := string([]byte{0, 1, 2, 255, 'x'})
	var hdr, trl metadata.MD
	_, err = c.UnaryCall(metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer good", "echo", "hello", "blob-bin", blob),
		&testpb.SimpleRequest{}, grpc.Header(&hdr), grpc.Trailer(&trl))
	require.NoError(t, err)
	require.Equal(t, []string{"hello"}, hdr.Get("echo"))
	require.Equal(t, []string{"hello"}, trl.Get("echo-trailer"))
	require.Equal(t, []string{blob}, trl.Get("blob-bin"), "binary metadata both ways")

	f.hs.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	r, err := healthpb.NewHealthClient(f.conn).Check(ctx, &healthpb.HealthCheckRequest{})
	require.NoError(t, err, "health passes the interceptor as AuthInterceptor lets it")
	require.Equal(t, healthpb.HealthCheckResponse_SERVING, r.GetStatus())
}

func TestWhatIsNotServed(t *testing.T) {
	f := serve(t, Config{})
	ctx := ctxT(t)
	for _, m := range []string{"/grpc.testing.TestService/Nope", "/nope.Service/Call", "/grpc.testing.TestService/UnimplementedCall"} {
		err := f.conn.Invoke(ctx, m, &testpb.Empty{}, &testpb.Empty{})
		require.Equal(t, codes.Unimplemented, status.Code(err), m)
	}
	t.Run("a streaming method", func(t *testing.T) {
		s, err := testpb.NewTestServiceClient(f.conn).FullDuplexCall(ctx)
		require.NoError(t, err)
		_, err = s.Recv()
		require.Equal(t, codes.Unimplemented, status.Code(err))
		require.Contains(t, status.Convert(err).Message(), "bidi-streaming")
	})
	t.Run("grpc-encoding other than identity", func(t *testing.T) {
		_, err := testpb.NewTestServiceClient(f.conn).UnaryCall(ctx, &testpb.SimpleRequest{}, grpc.UseCompressor(gzip.Name))
		require.Equal(t, codes.Unimplemented, status.Code(err))
	})
	t.Run("health is served", func(t *testing.T) {
		f.hs.SetServingStatus("x", healthpb.HealthCheckResponse_NOT_SERVING)
		r, err := healthpb.NewHealthClient(f.conn).Check(ctx, &healthpb.HealthCheckRequest{Service: "x"})
		require.NoError(t, err)
		require.Equal(t, healthpb.HealthCheckResponse_NOT_SERVING, r.GetStatus())
		_, err = healthpb.NewHealthClient(f.conn).Check(ctx, &healthpb.HealthCheckRequest{Service: "unknown"})
		require.Equal(t, codes.NotFound, status.Code(err))
	})
	// The connection still serves.
	_, err := testpb.NewTestServiceClient(f.conn).EmptyCall(ctx, &testpb.Empty{})
	require.NoError(t, err)
}

// Thousands of calls at once on one connection, past its
// MaxConcurrentStreams: the client waits for streams, every call answered.
func TestManyConcurrentStreams(t *testing.T) {
	f := serve(t, Config{MaxConcurrentStreams: 50, Workers: 8})
	c := testpb.NewTestServiceClient(f.conn)
	ctx := ctxT(t)
	var wg sync.WaitGroup
	var failed atomic.Int64
	for range 2000 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := c.UnaryCall(ctx, &testpb.SimpleRequest{ResponseSize: 64, Payload: &testpb.Payload{Body: []byte("sleep")}}); err != nil {
				failed.Add(1)
			}
		}()
	}
	wg.Wait()
	require.Zero(t, failed.Load())
}

// Shutdown sends GOAWAY: the call under way finishes, new calls go to a new
// connection (here: none, so they fail UNAVAILABLE), Serve returns nil.
func TestShutdownDrains(t *testing.T) {
	f := serve(t, Config{})
	c := testpb.NewTestServiceClient(f.conn)
	ctx := ctxT(t)
	_, err := c.EmptyCall(ctx, &testpb.Empty{})
	require.NoError(t, err)
	errc := make(chan error, 1)
	go func() {
		_, err := c.UnaryCall(ctx, &testpb.SimpleRequest{ResponseSize: 5, Payload: &testpb.Payload{Body: []byte("wait")}})
		errc <- err
	}()
	<-f.svc.started
	shut := make(chan error, 1)
	go func() { shut <- f.srv.Shutdown(ctx) }()
	require.Eventually(t, func() bool { // the listener is closed: no new connection
		c, err := net.Dial("tcp", f.addr)
		if err == nil {
			_ = c.Close()
		}
		return err != nil
	}, 5*time.Second, 10*time.Millisecond)
	select {
	case err := <-shut:
		t.Fatalf("Shutdown returned %v with a call under way", err)
	case <-time.After(100 * time.Millisecond):
	}
	close(f.svc.release)
	require.NoError(t, <-errc, "the call under way is answered")
	require.NoError(t, <-shut)
	require.NoError(t, <-f.done)
}

// Shutdown's ctx bounds the drain: then the connections are closed.
func TestShutdownDeadlineCloses(t *testing.T) {
	f := serve(t, Config{})
	c := testpb.NewTestServiceClient(f.conn)
	errc := make(chan error, 1)
	go func() {
		_, err := c.UnaryCall(context.Background(), &testpb.SimpleRequest{Payload: &testpb.Payload{Body: []byte("wait")}})
		errc <- err
	}()
	<-f.svc.started
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	require.ErrorIs(t, f.srv.Shutdown(ctx), context.DeadlineExceeded)
	require.Equal(t, codes.Unavailable, status.Code(<-errc))
}

// rawConn is a client speaking HTTP/2 by hand.
type rawConn struct {
	nc  net.Conn
	fr  *http2.Framer
	enc *hpack.Encoder
	hb  bytes.Buffer
}

func rawDial(t testing.TB, addr string) *rawConn {
	t.Helper()
	nc, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	t.Cleanup(func() { _ = nc.Close() })
	_ = nc.SetDeadline(time.Now().Add(10 * time.Second))
	r := &rawConn{nc: nc, fr: http2.NewFramer(nc, nc)}
	r.enc = hpack.NewEncoder(&r.hb)
	_, err = io.WriteString(nc, http2.ClientPreface)
	require.NoError(t, err)
	require.NoError(t, r.fr.WriteSettings())
	return r
}

func (r *rawConn) block(kv ...string) []byte {
	r.hb.Reset()
	for i := 0; i < len(kv); i += 2 {
		_ = r.enc.WriteField(hpack.HeaderField{Name: kv[i], Value: kv[i+1]})
	}
	return bytes.Clone(r.hb.Bytes())
}

var callHeaders = []string{":method", "POST", ":scheme", "http", ":path", "/grpc.testing.TestService/EmptyCall",
	":authority", "x", "content-type", "application/grpc", "te", "trailers"}

// unaryHeaders sends the HEADERS of a UnaryCall on stream id with
// grpc-timeout timeout.
func (r *rawConn) unaryHeaders(t *testing.T, id uint32, timeout string) {
	t.Helper()
	hs := append(append([]string{}, callHeaders...), "grpc-timeout", timeout)
	hs[5] = testpb.TestService_UnaryCall_FullMethodName
	require.NoError(t, r.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: r.block(hs...), EndHeaders: true}))
}

// unaryCall sends a whole UnaryCall (unaryHeaders, then an empty message).
func (r *rawConn) unaryCall(t *testing.T, id uint32, timeout string) {
	t.Helper()
	r.unaryHeaders(t, id, timeout)
	require.NoError(t, r.fr.WriteData(id, true, []byte{0, 0, 0, 0, 0}))
}

// trailers reads frames until a header block that ends its stream, and
// returns its fields by name.
func (r *rawConn) trailers(t *testing.T) map[string]string {
	t.Helper()
	got := map[string]string{}
	for _, hf := range r.ended(t).Fields {
		got[hf.Name] = hf.Value
	}
	return got
}

// ended reads frames until a header block that ends its stream, and
// returns it. The connection keeps one decoder: a later answer's block may
// name the table entries of an earlier one.
func (r *rawConn) ended(t *testing.T) *http2.MetaHeadersFrame {
	t.Helper()
	if r.fr.ReadMetaHeaders == nil {
		r.fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	}
	for {
		f, err := r.fr.ReadFrame()
		require.NoError(t, err)
		if mh, ok := f.(*http2.MetaHeadersFrame); ok && mh.StreamEnded() {
			return mh
		}
	}
}

// goAway reads frames until GOAWAY and the connection's end; it returns
// GOAWAY's code.
func (r *rawConn) goAway(t *testing.T) http2.ErrCode {
	t.Helper()
	code := http2.ErrCode(0xff)
	for {
		f, err := r.fr.ReadFrame()
		if err != nil {
			require.NotEqual(t, http2.ErrCode(0xff), code, "the connection ended without GOAWAY: %v", err)
			return code
		}
		if g, ok := f.(*http2.GoAwayFrame); ok {
			code = g.ErrCode
		}
	}
}

func TestMalformedClients(t *testing.T) {
	f := serve(t, Config{MaxHeaderListSize: 4 << 10})
	t.Run("not HTTP/2: closed", func(t *testing.T) {
		nc, err := net.Dial("tcp", f.addr)
		require.NoError(t, err)
		defer nc.Close()
		_, _ = io.WriteString(nc, "GET / HTTP/1.1\r\nHost: x\r\n\r\n")
		_ = nc.SetReadDeadline(time.Now().Add(5 * time.Second))
		_, err = io.Copy(io.Discard, nc)
		require.NoError(t, err, "closed by the server")
	})
	t.Run("CONTINUATION flood: GOAWAY and closed (CVE-2023-45288)", func(t *testing.T) {
		r := rawDial(t, f.addr)
		require.NoError(t, r.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: r.block(callHeaders...)}))
		junk := r.block("x-junk", string(bytes.Repeat([]byte("a"), 1000)))
		sent := 0
		for ; sent < 10000; sent++ { // 10 MB, if the server went on reading
			if err := r.fr.WriteContinuation(1, false, junk); err != nil {
				break
			}
		}
		require.Less(t, sent, 10000, "the server stopped reading")
		code := r.goAway(t)
		require.Contains(t, []http2.ErrCode{http2.ErrCodeProtocol, http2.ErrCodeCompression}, code)
	})
	t.Run("DATA on stream 0: GOAWAY PROTOCOL_ERROR", func(t *testing.T) {
		r := rawDial(t, f.addr)
		require.NoError(t, r.fr.WriteRawFrame(http2.FrameData, 0, 0, []byte("x")))
		require.Equal(t, http2.ErrCodeProtocol, r.goAway(t))
	})
	t.Run("a stream id going backwards: GOAWAY", func(t *testing.T) {
		r := rawDial(t, f.addr)
		require.NoError(t, r.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 5, BlockFragment: r.block(callHeaders...), EndHeaders: true}))
		require.NoError(t, r.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 3, BlockFragment: r.block(callHeaders...), EndHeaders: true}))
		require.Equal(t, http2.ErrCodeStreamClosed, r.goAway(t))
	})
	t.Run("a window past 2^31-1: GOAWAY FLOW_CONTROL_ERROR", func(t *testing.T) {
		r := rawDial(t, f.addr)
		require.NoError(t, r.fr.WriteWindowUpdate(0, 1<<31-1))
		require.Equal(t, http2.ErrCodeFlowControl, r.goAway(t))
	})
	t.Run("pings too often: GOAWAY ENHANCE_YOUR_CALM", func(t *testing.T) {
		r := rawDial(t, f.addr)
		for i := range 10 {
			if r.fr.WritePing(false, [8]byte{byte(i)}) != nil {
				break
			}
		}
		require.Equal(t, http2.ErrCodeEnhanceYourCalm, r.goAway(t))
	})
	t.Run("a header list past the bound: the call is refused, the connection serves", func(t *testing.T) {
		r := rawDial(t, f.addr)
		hs := append([]string{}, callHeaders...)
		for _, k := range []string{"x-a", "x-b", "x-c", "x-d"} {
			hs = append(hs, k, string(bytes.Repeat([]byte("b"), 2<<10)))
		}
		require.NoError(t, r.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: r.block(hs...), EndHeaders: true, EndStream: true}))
		require.NoError(t, r.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 3, BlockFragment: r.block(callHeaders...), EndHeaders: true}))
		require.NoError(t, r.fr.WriteData(3, true, []byte{0, 0, 0, 0, 0}))
		r.fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
		got := map[uint32]string{}
		for len(got) < 2 {
			f, err := r.fr.ReadFrame()
			require.NoError(t, err)
			if mh, ok := f.(*http2.MetaHeadersFrame); ok && mh.StreamEnded() {
				got[mh.StreamID] = mh.PseudoValue("status") + " " + mh.Fields[len(mh.Fields)-1].Value
				for _, hf := range mh.Fields {
					if hf.Name == "grpc-status" {
						got[mh.StreamID] = hf.Value
					}
				}
			}
		}
		require.Equal(t, map[uint32]string{1: "8", 3: "0"}, got) // RESOURCE_EXHAUSTED, OK
	})
}

// Idle and aged connections are sent GOAWAY; the client reconnects.
func TestConnectionIdleAndAge(t *testing.T) {
	f := serve(t, Config{MaxConnectionIdle: 100 * time.Millisecond})
	r := rawDial(t, f.addr)
	require.Equal(t, http2.ErrCodeNo, r.goAway(t))

	g := serve(t, Config{MaxConnectionAge: 100 * time.Millisecond, MaxConnectionAgeGrace: 100 * time.Millisecond})
	r = rawDial(t, g.addr)
	require.Equal(t, http2.ErrCodeNo, r.goAway(t))
	c := testpb.NewTestServiceClient(g.conn)
	for range 3 {
		_, err := c.EmptyCall(ctxT(t), &testpb.Empty{})
		require.NoError(t, err)
		time.Sleep(150 * time.Millisecond)
	}
}

func TestParseTimeout(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want time.Duration
		ok   bool
	}{
		{"1S", time.Second, true}, {"50m", 50 * time.Millisecond, true}, {"7u", 7 * time.Microsecond, true},
		{"3n", 3, true}, {"2M", 2 * time.Minute, true}, {"1H", time.Hour, true},
		{"99999999H", maxTimeout, true}, {"S", 0, false}, {"123456789S", 0, false}, {"1x", 0, false}, {"-1S", 0, false},
	} {
		t.Run(tc.in, func(t *testing.T) {
			d, err := parseTimeout(tc.in)
			if !tc.ok {
				require.Error(t, err)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tc.want, d)
		})
	}
}

// A stream the framer finds malformed (an unknown pseudo-header) is reset;
// its DATA after that does not end the connection, which serves on.
func TestMalformedStreamIsResetAlone(t *testing.T) {
	f := serve(t, Config{})
	r := rawDial(t, f.addr)
	bad := append(append([]string{}, callHeaders...), ":bogus", "x")
	require.NoError(t, r.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: r.block(bad...), EndHeaders: true}))
	require.NoError(t, r.fr.WriteData(1, true, []byte{0, 0, 0, 0, 0}))
	require.NoError(t, r.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 3, BlockFragment: r.block(callHeaders...), EndHeaders: true}))
	require.NoError(t, r.fr.WriteData(3, true, []byte{0, 0, 0, 0, 0}))
	r.fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	var reset bool
	for {
		fr, err := r.fr.ReadFrame()
		require.NoError(t, err)
		switch fr := fr.(type) {
		case *http2.RSTStreamFrame:
			require.Equal(t, uint32(1), fr.StreamID)
			reset = true
		case *http2.MetaHeadersFrame:
			if fr.StreamID == 3 && fr.StreamEnded() {
				require.True(t, reset)
				return
			}
		case *http2.GoAwayFrame:
			t.Fatalf("GOAWAY %v", fr.ErrCode)
		}
	}
}

// With PastDeadline set, a call whose grpc-timeout passed before its
// message came is answered DEADLINE_EXCEEDED by the transport; its handler
// does not run.
func TestPastDeadlineIsAnsweredByTheTransport(t *testing.T) {
	var told atomic.Int64
	f := serve(t, Config{PastDeadline: func(m string) string {
		if m == testpb.TestService_UnaryCall_FullMethodName {
			told.Add(1)
		}
		return "too late"
	}})
	r := rawDial(t, f.addr)
	r.unaryHeaders(t, 1, "1m")
	time.Sleep(20 * time.Millisecond)
	require.NoError(t, r.fr.WriteData(1, true, []byte{0, 0, 0, 0, 0}))
	got := r.trailers(t)
	require.Equal(t, "4", got["grpc-status"])
	require.Equal(t, "too late", got["grpc-message"])
	require.EqualValues(t, 1, told.Load())
	require.Nil(t, f.svc.deadline.Load(), "the handler did not run")
}

// Tap sees a call as its headers arrive, with its metadata; its error is
// the call's answer, and the handler does not run.
func TestTapRefusesBeforeTheMessage(t *testing.T) {
	f := serve(t, Config{Tap: refusingTap("overloaded", func(info *tap.Info) bool {
		return info.FullMethodName == testpb.TestService_UnaryCall_FullMethodName && len(info.Header.Get("critical")) == 0
	})})
	c := testpb.NewTestServiceClient(f.conn)
	ctx := ctxT(t)
	_, err := c.UnaryCall(ctx, &testpb.SimpleRequest{})
	require.Equal(t, codes.Unavailable, status.Code(err))
	require.Equal(t, "overloaded", status.Convert(err).Message())
	require.Nil(t, f.svc.deadline.Load())
	_, err = c.UnaryCall(metadata.AppendToOutgoingContext(ctx, "critical", "1"), &testpb.SimpleRequest{})
	require.NoError(t, err, "the tap read the metadata")
	_, err = c.EmptyCall(ctx, &testpb.Empty{})
	require.NoError(t, err, "other methods pass")
}

// refusingTap is a Tap that answers UNAVAILABLE with msg to every call
// refuse picks, and lets the others through.
func refusingTap(msg string, refuse func(*tap.Info) bool) tap.ServerInHandle {
	return func(ctx context.Context, info *tap.Info) (context.Context, error) {
		if refuse(info) {
			return nil, status.Error(codes.Unavailable, msg)
		}
		return ctx, nil
	}
}

// A refusal's trailer block is the status answer statusLocked writes, made
// once per status (a door under overload refuses calls by the thousand),
// capped so that a block cannot be appended into, and kept for at most
// maxRefusals statuses (a refusal's message may name what a client sent).
func TestRefusalBlocksAreMadeOnce(t *testing.T) {
	s := New(Config{})
	want := appendStatus(append([]byte(nil), respHeaders...), uint32(codes.Unavailable), "overloaded: 100% busy", nil)
	a := s.refusal(codes.Unavailable, "overloaded: 100% busy")
	require.Equal(t, want, a)
	require.Equal(t, len(a), cap(a), "full: an append copies it")
	b := s.refusal(codes.Unavailable, "overloaded: 100% busy")
	require.Same(t, &a[0], &b[0], "made once")
	require.Zero(t, testing.AllocsPerRun(100, func() { s.refusal(codes.Unavailable, "overloaded: 100% busy") }))

	for i := range 2 * maxRefusals {
		s.refusal(codes.Unimplemented, "unknown method /x/"+string(rune('a'+i%26))+string(rune('a'+i/26)))
	}
	kept := 0
	s.refusals.Range(func(any, any) bool { kept++; return true })
	require.Equal(t, maxRefusals, kept)
	require.Equal(t, appendStatus(append([]byte(nil), respHeaders...), uint32(codes.Unimplemented), "unknown method /x/zz", nil),
		s.refusal(codes.Unimplemented, "unknown method /x/zz"), "past the bound, made each time")
}

// A client silent for KeepaliveTime is PINGed and, if nothing comes back
// within KeepaliveTimeout, closed; one that acks, or keeps sending, stays.
func TestKeepalive(t *testing.T) {
	const every, timeout = 200 * time.Millisecond, 200 * time.Millisecond
	var accepted atomic.Int32
	f := serve(t, Config{KeepaliveTime: every, KeepaliveTimeout: timeout,
		WrapConn: func(c net.Conn) net.Conn { accepted.Add(1); return c }})

	t.Run("a client that does not ack is closed", func(t *testing.T) {
		start := time.Now()
		r := rawDial(t, f.addr)
		var pinged time.Time
		for {
			fr, err := r.fr.ReadFrame()
			if err != nil {
				require.ErrorIs(t, err, io.EOF)
				break
			}
			require.NotEqual(t, http2.FrameGoAway, fr.Header().Type)
			if p, ok := fr.(*http2.PingFrame); ok && !p.IsAck() {
				require.True(t, pinged.IsZero(), "one ping, then closed")
				require.Equal(t, keepalivePing, p.Data)
				pinged = time.Now()
			}
		}
		require.False(t, pinged.IsZero(), "pinged before it was closed")
		require.GreaterOrEqual(t, pinged.Sub(start), every)
		require.GreaterOrEqual(t, time.Since(pinged), timeout/2)
		require.Less(t, time.Since(start), 5*time.Second)
	})

	t.Run("no ping while frames flow; a client that acks stays", func(t *testing.T) {
		r := rawDial(t, f.addr)
		stop := make(chan struct{})
		wrote := make(chan error, 1)
		go func() { // a frame every every/5, for 6 periods
			tick := time.NewTicker(every / 5)
			defer tick.Stop()
			for {
				select {
				case <-stop:
					wrote <- nil
					return
				case <-tick.C:
					if err := r.fr.WriteWindowUpdate(0, 1); err != nil {
						wrote <- err
						return
					}
				}
			}
		}()
		pings := func(d time.Duration, ack bool) int {
			n := 0
			_ = r.nc.SetReadDeadline(time.Now().Add(d))
			defer func() { _ = r.nc.SetReadDeadline(time.Now().Add(10 * time.Second)) }()
			for {
				fr, err := r.fr.ReadFrame()
				var ne net.Error
				if errors.As(err, &ne) && ne.Timeout() {
					return n
				}
				require.NoError(t, err)
				if p, ok := fr.(*http2.PingFrame); ok && !p.IsAck() {
					n++
					if ack {
						require.NoError(t, r.fr.WritePing(true, p.Data))
					}
				}
			}
		}
		require.Zero(t, pings(6*every, false), "pinged while frames flowed")
		close(stop)
		require.NoError(t, <-wrote)
		require.GreaterOrEqual(t, pings(6*every, true), 3, "pinged each period once silent, the acks no ping strikes")

		// Still served.
		require.NoError(t, r.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: r.block(callHeaders...), EndHeaders: true}))
		require.NoError(t, r.fr.WriteData(1, true, []byte{0, 0, 0, 0, 0}))
		require.Equal(t, "0", r.trailers(t)["grpc-status"])
	})

	t.Run("a grpc-go client stays connected", func(t *testing.T) {
		before := accepted.Load()
		conn := dial(t, f.addr)
		c := testpb.NewTestServiceClient(conn)
		_, err := c.EmptyCall(ctxT(t), &testpb.Empty{})
		require.NoError(t, err)
		time.Sleep(5 * every)
		_, err = c.EmptyCall(ctxT(t), &testpb.Empty{})
		require.NoError(t, err)
		require.Equal(t, before+1, accepted.Load(), "one connection throughout")
	})
}

// openStreams counts the streams open on the server's connections.
func openStreams(s *Server) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for c := range s.conns {
		c.mu.Lock()
		n += len(c.streams)
		c.mu.Unlock()
	}
	return n
}

// A server-streaming call: its messages within the flow-control windows
// (more than they hold at once), headers and trailers, its status after
// messages or alone.
func TestServerStreaming(t *testing.T) {
	f := serve(t, Config{})
	c := testpb.NewTestServiceClient(f.conn)
	t.Run("messages past the windows, then OK", func(t *testing.T) {
		req := &testpb.StreamingOutputCallRequest{}
		for range 40 {
			req.ResponseParameters = append(req.ResponseParameters, &testpb.ResponseParameters{Size: 100 << 10})
		}
		var hdr, trl metadata.MD
		s, err := c.StreamingOutputCall(ctxT(t), req, grpc.Header(&hdr), grpc.Trailer(&trl))
		require.NoError(t, err)
		n := 0
		for {
			m, err := s.Recv()
			if errors.Is(err, io.EOF) {
				break
			}
			require.NoError(t, err)
			require.Len(t, m.GetPayload().GetBody(), 100<<10)
			n++
		}
		require.Equal(t, 40, n) // 4 MB: four times the stream's window
		require.Equal(t, []string{"h"}, hdr.Get("echo"))
		require.Equal(t, []string{"t"}, trl.Get("echo-trailer"))
	})
	t.Run("a status after messages, and alone", func(t *testing.T) {
		for _, sent := range []int{1, 0} {
			req := &testpb.StreamingOutputCallRequest{ResponseStatus: &testpb.EchoStatus{Code: int32(codes.Aborted), Message: "stop"}}
			for range sent {
				req.ResponseParameters = append(req.ResponseParameters, &testpb.ResponseParameters{Size: 10})
			}
			s, err := c.StreamingOutputCall(ctxT(t), req)
			require.NoError(t, err)
			for range sent {
				_, err = s.Recv()
				require.NoError(t, err)
			}
			_, err = s.Recv()
			require.Equal(t, codes.Aborted, status.Code(err))
			require.Equal(t, "stop", status.Convert(err).Message())
		}
	})
	require.Eventually(t, func() bool { return openStreams(f.srv) == 0 }, 5*time.Second, 10*time.Millisecond)
}

// Health Watch with grpc-go's health client: the status at once, then each
// change, until the client cancels; Shutdown ends a Watch UNAVAILABLE at
// once rather than wait for it.
func TestHealthWatch(t *testing.T) {
	f := serve(t, Config{})
	hc := healthpb.NewHealthClient(f.conn)
	next := func(w grpc.ServerStreamingClient[healthpb.HealthCheckResponse]) healthpb.HealthCheckResponse_ServingStatus {
		t.Helper()
		r, err := w.Recv()
		require.NoError(t, err)
		return r.GetStatus()
	}
	f.hs.SetServingStatus("svc", healthpb.HealthCheckResponse_SERVING)
	ctx, cancel := context.WithCancel(ctxT(t))
	w, err := hc.Watch(ctx, &healthpb.HealthCheckRequest{Service: "svc"})
	require.NoError(t, err)
	require.Equal(t, healthpb.HealthCheckResponse_SERVING, next(w))
	f.hs.SetServingStatus("svc", healthpb.HealthCheckResponse_NOT_SERVING)
	require.Equal(t, healthpb.HealthCheckResponse_NOT_SERVING, next(w))
	f.hs.SetServingStatus("svc", healthpb.HealthCheckResponse_SERVING)
	require.Equal(t, healthpb.HealthCheckResponse_SERVING, next(w))

	unknown, err := hc.Watch(ctxT(t), &healthpb.HealthCheckRequest{Service: "nope"})
	require.NoError(t, err)
	require.Equal(t, healthpb.HealthCheckResponse_SERVICE_UNKNOWN, next(unknown))

	cancel() // the client goes: its stream ends on the server
	_, err = w.Recv()
	require.Equal(t, codes.Canceled, status.Code(err))
	require.Eventually(t, func() bool { return openStreams(f.srv) == 1 }, 5*time.Second, 10*time.Millisecond)

	// Unary calls beside a Watch.
	_, err = testpb.NewTestServiceClient(f.conn).EmptyCall(ctxT(t), &testpb.Empty{})
	require.NoError(t, err)

	// The limiter's shutdown: health NOT_SERVING, then the server's drain.
	w, err = hc.Watch(ctxT(t), &healthpb.HealthCheckRequest{Service: "svc"})
	require.NoError(t, err)
	require.Equal(t, healthpb.HealthCheckResponse_SERVING, next(w))
	f.hs.Shutdown()
	require.Equal(t, healthpb.HealthCheckResponse_NOT_SERVING, next(w))
	sctx, scancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer scancel()
	start := time.Now()
	require.NoError(t, f.srv.Shutdown(sctx), "the drain does not wait for Watch streams")
	require.Less(t, time.Since(start), 4*time.Second)
	for _, s := range []grpc.ServerStreamingClient[healthpb.HealthCheckResponse]{w, unknown} {
		_, err = s.Recv()
		require.Equal(t, codes.Unavailable, status.Code(err))
	}
}

// Past Workers, calls start spare workers; a spare takes further calls
// (none is started while idle ones wait) and ends once none has come for
// SpareIdle.
func TestSpareWorkers(t *testing.T) {
	ctx := ctxT(t)
	held := func(f *fixture, n int) *sync.WaitGroup {
		var wg sync.WaitGroup
		c := testpb.NewTestServiceClient(f.conn)
		for range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, err := c.UnaryCall(ctx, &testpb.SimpleRequest{Payload: &testpb.Payload{Body: []byte("wait")}})
				assert.NoError(t, err)
			}()
		}
		for range n {
			<-f.svc.started
		}
		return &wg
	}

	t.Run("reused", func(t *testing.T) {
		f := serve(t, Config{Workers: 2, SpareIdle: time.Minute})
		wg := held(f, 10)
		require.EqualValues(t, 8, f.srv.nSpares.Load(), "10 calls held at once: 2 workers and 8 spares")
		close(f.svc.release)
		wg.Wait()
		require.Eventually(t, func() bool { return parked("worker")+parked("spare") == 10 }, 5*time.Second, 5*time.Millisecond)

		c := testpb.NewTestServiceClient(f.conn)
		var calls sync.WaitGroup
		for range 10 {
			calls.Add(1)
			go func() {
				defer calls.Done()
				_, err := c.UnaryCall(ctx, &testpb.SimpleRequest{Payload: &testpb.Payload{Body: []byte("sleep")}})
				assert.NoError(t, err)
			}()
		}
		calls.Wait()
		require.EqualValues(t, 8, f.srv.nSpares.Load(), "the idle spares took the calls: none started")
	})
	t.Run("ended when idle", func(t *testing.T) {
		f := serve(t, Config{Workers: 1, SpareIdle: 20 * time.Millisecond})
		wg := held(f, 5)
		require.EqualValues(t, 4, f.srv.nSpares.Load())
		close(f.svc.release)
		wg.Wait()
		require.Eventually(t, func() bool { return running("spare") == 0 }, 5*time.Second, 5*time.Millisecond, "spares end after SpareIdle")
		require.Equal(t, 1, running("worker"), "the worker stays")
	})
}

// running counts the goroutines in (*Server).fn; parked those of them
// waiting in a select (for a call).
func running(fn string) int { return goroutinesIn(fn, false) }
func parked(fn string) int  { return goroutinesIn(fn, true) }

func goroutinesIn(fn string, selecting bool) int {
	buf := make([]byte, 8<<20)
	buf = buf[:runtime.Stack(buf, true)]
	n := 0
	for _, g := range strings.Split(string(buf), "\n\n") {
		if strings.Contains(g, "grpcfast.(*Server)."+fn+"(") && (!selecting || strings.Contains(strings.SplitN(g, "\n", 2)[0], "[select")) {
			n++
		}
	}
	return n
}

// A call whose client reset it in the read that completed its request — as
// a call that waited in the socket past its deadline comes under overload,
// its client's RST_STREAM behind it — is neither run nor answered, and
// Abandoned is told; the call after it in the same read is served.
func TestCallResetInItsOwnReadIsNotRun(t *testing.T) {
	var ran, abandoned atomic.Int64
	f := serve(t, Config{
		Interceptor: func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
			ran.Add(1)
			return h(ctx, req)
		},
		Abandoned: func(m string) {
			if m == testpb.TestService_UnaryCall_FullMethodName {
				abandoned.Add(1)
			}
		},
	})
	r := rawDial(t, f.addr)
	var b bytes.Buffer
	fw := http2.NewFramer(&b, nil)
	writeCall(t, r, fw, 1)
	require.NoError(t, fw.WriteRSTStream(1, http2.ErrCodeCancel))
	writeCall(t, r, fw, 3)
	_, err := r.nc.Write(b.Bytes()) // one segment: one read
	require.NoError(t, err)
	require.Equal(t, uint32(3), r.ended(t).StreamID, "the reset call is not answered")
	require.EqualValues(t, 1, ran.Load())
	require.EqualValues(t, 1, abandoned.Load())
}

// A call read whole is dispatched when the rest of the read buffer does not
// hold a whole frame: it does not wait for the socket to bring the rest.
func TestCallBeforeAPartialFrameIsServed(t *testing.T) {
	for name, rest := range map[string]func(fw *http2.Framer, r *rawConn) []byte{
		"a frame header cut short": func(*http2.Framer, *rawConn) []byte { return []byte{0, 0, 5, 0} },
		"HEADERS without its CONTINUATION": func(fw *http2.Framer, r *rawConn) []byte {
			hs := append([]string{}, callHeaders...)
			require.NoError(t, fw.WriteHeaders(http2.HeadersFrameParam{StreamID: 3, BlockFragment: r.block(hs...)}))
			return nil
		},
	} {
		t.Run(name, func(t *testing.T) {
			f := serve(t, Config{})
			r := rawDial(t, f.addr)
			var b bytes.Buffer
			fw := http2.NewFramer(&b, nil)
			writeCall(t, r, fw, 1)
			b.Write(rest(fw, r))
			_, err := r.nc.Write(b.Bytes())
			require.NoError(t, err)
			require.Equal(t, uint32(1), r.ended(t).StreamID)
		})
	}
}

// writeCall writes a whole UnaryCall request on stream id with fw.
func writeCall(t *testing.T, r *rawConn, fw *http2.Framer, id uint32) {
	t.Helper()
	hs := append([]string{}, callHeaders...)
	hs[5] = testpb.TestService_UnaryCall_FullMethodName
	require.NoError(t, fw.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: r.block(hs...), EndHeaders: true}))
	require.NoError(t, fw.WriteData(id, true, []byte{0, 0, 0, 0, 0}))
}
