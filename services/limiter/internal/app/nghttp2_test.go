package app

import (
	"context"
	"encoding/binary"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"

	"github.com/floodgate-dev/floodgate/pkg/limiter/envoyrls"
	"github.com/floodgate-dev/floodgate/pkg/redisx/redistest"
	"github.com/floodgate-dev/floodgate/pkg/stacktest"
)

// Envoy's HTTP/2 codec is nghttp2. Until the floodgate transport has run
// against a real Envoy, nghttp2's own client (nghttp) and load generator
// (h2load) call the limiter's rate-limit service on both transports over
// h2c, sending ShouldRateLimit as Envoy's rate-limit filter does: POST,
// application/grpc, te: trailers, a grpc-timeout and a length-prefixed
// RateLimitRequest. nghttp's calls are read frame by frame, with its
// default windows and with windows of 63 bytes a stream and 1023 the
// connection, where an answer must be split into DATA frames sent as
// nghttp's WINDOW_UPDATEs come. Then h2load, 4 connections of 100
// concurrent streams, with those small windows and with its default ones:
// every call must succeed, and the limiter must have decided every one.
func TestRLSServesNghttp2Clients(t *testing.T) {
	redistest.Client(t)
	nghttp, h2load := nghttp2Tool(t, "nghttp"), nghttp2Tool(t, "h2load")
	smallWindows := []string{"-w", "6", "-W", "10"} // 2^6-1 and 2^10-1 bytes
	for _, transport := range envoyrls.Transports {
		t.Run(transport, func(t *testing.T) {
			httpAddr, grpcAddr := stacktest.FreeAddr(t), stacktest.FreeAddr(t)
			startLimiter(t, map[string]string{
				"FLOODGATE_LIMITER_ADDR": httpAddr, "FLOODGATE_LIMITER_GRPC_ADDR": grpcAddr, "FLOODGATE_LIMITER_GRPC_TRANSPORT": transport,
				"FLOODGATE_GATEWAY": "nghttp2-test", "FLOODGATE_LIMITER_PRINCIPAL_LIMIT": "2", "FLOODGATE_LIMITER_PRINCIPAL_PERIOD": "1m",
				"FLOODGATE_LIMITER_INFLUX_INTERVAL": "0", "FLOODGATE_JOURNAL_DIR": t.TempDir(),
				// h2load's 400 streams at once are a closed loop that wants
				// every call decided: no entry gate to refuse those beyond
				// its round (gate_test.go tests the gate).
				"FLOODGATE_LIMITER_GRPC_GATE_MAX": "0",
			})
			rlsClient(t, t.Context(), grpcAddr, rlsv3.RateLimitService_ServiceDesc.ServiceName)
			url := "http://" + grpcAddr + rlsv3.RateLimitService_ShouldRateLimit_FullMethodName
			dir := t.TempDir()

			// One principal, limit 2: two calls allowed, the third denied
			// (a longer answer: the denial's body rides in it).
			call := callFile(t, dir, redistest.Unique(t, "nghttp_bot"))
			for i, tc := range []struct {
				windows   []string
				code      rlsv3.RateLimitResponse_Code
				remaining uint32
			}{
				{nil, rlsv3.RateLimitResponse_OK, 1},
				{smallWindows, rlsv3.RateLimitResponse_OK, 0},
				{smallWindows, rlsv3.RateLimitResponse_OVER_LIMIT, 0},
			} {
				args := append(append([]string{"-v", "-d", call}, tc.windows...), append(envoyHeaders("-H"), url)...)
				out, err := toolRun(t, nghttp, args...).Output()
				require.NoError(t, err, "nghttp %v:\n%s", args, out)
				require.NotContains(t, string(out), "recv RST_STREAM", "the server reset no stream")
				require.NotContains(t, string(out), "recv GOAWAY", "the server kept the connection")
				a := readNghttp(t, out)
				require.Equal(t, "HEADERS", a.frames[0], "headers, then the message, then trailers: %v", a.frames)
				require.Equal(t, "HEADERS+END_STREAM", a.frames[len(a.frames)-1], "headers, then the message, then trailers: %v", a.frames)
				require.Len(t, a.data, len(a.frames)-2, "only DATA between headers and trailers: %v", a.frames)
				require.Equal(t, "200", a.headers[":status"], "%s", out)
				require.Equal(t, "application/grpc", a.headers["content-type"], "%s", out)
				require.Equal(t, "0", a.trailers["grpc-status"], "%s", out)
				if tc.windows != nil {
					require.Greater(t, len(a.data), 1, "the answer is split to fit the window: %v\n%s", a.frames, out)
					require.LessOrEqual(t, slices.Max(a.data), 63, "no DATA frame exceeds the stream's window: %v\n%s", a.frames, out)
				}
				t.Logf("nghttp call %d %v: %s", i+1, tc.windows, strings.Join(a.frames, " "))
				var resp rlsv3.RateLimitResponse
				require.NoError(t, proto.Unmarshal(grpcMessage(t, a.body), &resp))
				require.Equal(t, tc.code, resp.GetOverallCode(), "call %d", i+1)
				require.Len(t, resp.GetStatuses(), 1)
				require.Equal(t, uint32(2), resp.GetStatuses()[0].GetCurrentLimit().GetRequestsPerUnit())
				require.Equal(t, tc.remaining, resp.GetStatuses()[0].GetLimitRemaining(), "call %d", i+1)
			}

			metrics := "http://" + httpAddr + "/metrics"
			decided := func() float64 {
				return metricValue(t, metrics, `floodgate_limiter_envoy_requests_total{result="ok"}`) +
					metricValue(t, metrics, `floodgate_limiter_envoy_requests_total{result="over_limit"}`)
			}
			require.Equal(t, 3.0, decided(), "nghttp's three calls")
			// h2load's summary counts a stream closed without error as
			// succeeded, whatever its grpc-status: the limiter's counters
			// say each call was decided (answered OK or OVER_LIMIT).
			const n = 20000
			for _, load := range []struct {
				name    string
				windows []string
			}{{"windows of 63 and 1023 bytes", smallWindows}, {"h2load's default windows", nil}} {
				before := decided()
				call := callFile(t, dir, redistest.Unique(t, "h2load_bot"))
				args := append(append([]string{"-c", "4", "-m", "100", "-n", strconv.Itoa(n), "-d", call}, load.windows...), append(envoyHeaders("-H"), url)...)
				out, err := toolRun(t, h2load, args...).CombinedOutput()
				require.NoError(t, err, "h2load %v:\n%s", args, out)
				require.Contains(t, string(out), fmt.Sprintf("requests: %d total, %d started, %d done, %d succeeded, 0 failed, 0 errored, 0 timeout", n, n, n, n), "h2load %v:\n%s", args, out)
				require.Contains(t, string(out), fmt.Sprintf("status codes: %d 2xx, 0 3xx, 0 4xx, 0 5xx", n), "h2load %v:\n%s", args, out)
				require.Equal(t, float64(n), decided()-before, "the limiter decided every call of h2load with %s", load.name)
				t.Logf("h2load with %s: %s", load.name, regexp.MustCompile(`finished in [^\n]*`).Find(out))
			}
		})
	}
}

// nghttp2Tool is the path of one of nghttp2's command-line tools; a test
// without it fails, naming what installs it.
func nghttp2Tool(t *testing.T, name string) string {
	t.Helper()
	path, err := exec.LookPath(name)
	require.NoError(t, err, "%s (Debian's nghttp2-client) is missing: run `make install-stack`", name)
	return path
}

// toolRun is the command running one of nghttp2's tools, killed if it
// takes more than 20 s (a server that stops answering, a window never
// updated).
func toolRun(t *testing.T, path string, args ...string) *exec.Cmd {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	t.Cleanup(cancel)
	return exec.CommandContext(ctx, path, args...)
}

// envoyHeaders are the headers Envoy's rate-limit filter sends beside the
// pseudo-headers, each after flag (nghttp's and h2load's -H); grpc-timeout
// is in the form Envoy writes (milliseconds).
func envoyHeaders(flag string) []string {
	var args []string
	for _, h := range []string{"content-type: application/grpc", "te: trailers", "grpc-timeout: 5000m"} {
		args = append(args, flag, h)
	}
	return args
}

// callFile writes a ShouldRateLimit request for the bot id as a gRPC
// message (its 5-byte prefix, then the RateLimitRequest) into dir and
// returns its path.
func callFile(t *testing.T, dir, id string) string {
	t.Helper()
	req, err := proto.Marshal(&rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*rlcommon.RateLimitDescriptor{
		envoyDescriptor("principal_kind", "bot", "principal_id", id, "remote_address", "203.0.113.9", "method", "POST", "route", "/x"),
	}})
	require.NoError(t, err)
	msg := binary.BigEndian.AppendUint32([]byte{0}, uint32(len(req)))
	path := filepath.Join(dir, id)
	require.NoError(t, os.WriteFile(path, append(msg, req...), 0o600))
	return path
}

// grpcMessage is the message of a unary answer's body: one message, not
// compressed, its length what its prefix says.
func grpcMessage(t *testing.T, body []byte) []byte {
	t.Helper()
	require.GreaterOrEqual(t, len(body), 5, "a gRPC message prefix: %q", body)
	require.Zero(t, body[0], "not compressed")
	require.Equal(t, len(body)-5, int(binary.BigEndian.Uint32(body[1:5])), "one whole message")
	return body[5:]
}

// nghttpAnswer is the answer to nghttp's one request, read from its -v
// output.
type nghttpAnswer struct {
	frames            []string          // the stream's frames received, in order: "HEADERS", "DATA(n)", "HEADERS+END_STREAM"
	headers, trailers map[string]string // the first header block, the last (the gRPC status)
	data              []int             // the DATA frames' lengths
	body              []byte
}

// nghttpFrame is the line nghttp -v prints for a received frame, after its
// fields (HEADERS) or its data (DATA, written to stdout just before it).
var nghttpFrame = regexp.MustCompile(`\[ *[0-9.]+\] recv (HEADERS|DATA) frame <length=(\d+), flags=0x([0-9a-f]{2}), stream_id=\d+>`)

// nghttpField is the line nghttp -v prints for a received header field.
var nghttpField = regexp.MustCompile(`(?m)^\[ *[0-9.]+\] recv \(stream_id=\d+\) (:?[^:\s]+): (.*)$`)

// readNghttp reads the answer from nghttp -v's stdout: header fields are
// gathered into a block until its HEADERS frame line, and each DATA frame's
// payload is the length bytes before its line.
func readNghttp(t *testing.T, out []byte) nghttpAnswer {
	t.Helper()
	var a nghttpAnswer
	block, from := map[string]string{}, 0
	for _, m := range nghttpFrame.FindAllSubmatchIndex(out, -1) {
		kind := string(out[m[2]:m[3]])
		length, err := strconv.Atoi(string(out[m[4]:m[5]]))
		require.NoError(t, err)
		flags, err := strconv.ParseUint(string(out[m[6]:m[7]]), 16, 8)
		require.NoError(t, err)
		switch kind {
		case "DATA":
			require.GreaterOrEqual(t, m[0], length, "%s", out)
			a.body = append(a.body, out[m[0]-length:m[0]]...)
			a.data = append(a.data, length)
			a.frames = append(a.frames, fmt.Sprintf("DATA(%d)", length))
		case "HEADERS":
			for _, f := range nghttpField.FindAllSubmatch(out[from:m[0]], -1) {
				block[string(f[1])] = string(f[2])
			}
			if a.headers == nil {
				a.headers = block
			}
			a.trailers, block = block, map[string]string{}
			a.frames = append(a.frames, "HEADERS")
		}
		if flags&0x1 != 0 { // END_STREAM
			a.frames[len(a.frames)-1] += "+END_STREAM"
		}
		from = m[1]
	}
	require.NotEmpty(t, a.frames, "no frame received:\n%s", out)
	require.True(t, strings.HasSuffix(a.frames[len(a.frames)-1], "+END_STREAM"), "the stream ended: %v\n%s", a.frames, out)
	return a
}
