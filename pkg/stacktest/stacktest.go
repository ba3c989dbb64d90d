// Package stacktest holds what the tests of Floodgate's services and load
// tests repeat around the local stack: a context for a test that needs the
// stack (skipped under -short), a free loopback address, a loopback TCP
// connection (TCPPair), a service run in the test's process with its log
// captured, a service binary run as a child process until the test ends
// (Exec), waiting for a readiness URL, and a PagerDuty Events API v2
// receiver. Redis, the broker and DynamoDB have their own helpers
// (redistest, kafkatest, quotatest); this package only joins what every app
// test does with them.
package stacktest

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"testing"
	"time"

	"github.com/floodgate-dev/floodgate/pkg/config"
)

// Context skips t under -short — needs says what the test needs, e.g.
// "starts redis-server" — and returns a context that ends after timeout or
// when the test ends.
func Context(t testing.TB, timeout time.Duration, needs string) context.Context {
	t.Helper()
	Needs(t, needs)
	ctx, cancel := context.WithTimeout(t.Context(), timeout)
	t.Cleanup(cancel)
	return ctx
}

// FreeAddr returns a loopback host:port nothing listened on a moment ago.
func FreeAddr(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("free address: %v", err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// TCPPair returns the two ends of a loopback TCP connection: the client's,
// dialled, and the server's, accepted (a *net.TCPConn); both are closed when
// the test ends.
func TCPPair(t testing.TB) (client, server net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("listen: %v", err)
	}
	defer ln.Close()
	client, err = net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatalf("dial %s: %v", ln.Addr(), err)
	}
	t.Cleanup(func() { client.Close() })
	server, err = ln.Accept()
	if err != nil {
		t.Fatalf("accept: %v", err)
	}
	t.Cleanup(func() { server.Close() })
	return client, server
}

// Getenv reads a service's environment from m (service.Stdio.Getenv,
// config.Getenv).
func Getenv(m map[string]string) func(string) string {
	return func(k string) string { return m[k] }
}

// WaitOK polls url until it answers 200, failing t after timeout; msgAndArgs
// say what was awaited (a captured log helps).
func WaitOK(t testing.TB, url string, timeout time.Duration, msgAndArgs ...any) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		if r, err := http.Get(url); err == nil {
			r.Body.Close()
			if r.StatusCode == http.StatusOK {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s did not answer 200 within %s %s", url, timeout, describe(msgAndArgs))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Returned waits up to timeout for what a goroutine sends on done (what its
// Run or Serve returned) and fails t when that is an error or when nothing
// comes in time; msgAndArgs say what was awaited.
func Returned(t testing.TB, done <-chan error, timeout time.Duration, msgAndArgs ...any) {
	t.Helper()
	what := describe(msgAndArgs)
	if what == "" {
		what = "the goroutine returns"
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("%s: returned %v", what, err)
		}
	case <-time.After(timeout):
		t.Fatalf("%s: nothing returned within %s", what, timeout)
	}
}

// DefaultDynamoEndpoint is DynamoDB Local's address in the local stack.
const DefaultDynamoEndpoint = "http://127.0.0.1:8000"

// Stack is where the shared local stack listens: the FLOODGATE_* variables
// deploy/local/with-stack.sh exports, or the local stack's defaults.
type Stack struct {
	RedisAddrs     []string // FLOODGATE_REDIS_ADDRS
	InfluxURL      string   // FLOODGATE_INFLUX_URL
	DynamoEndpoint string   // FLOODGATE_DYNAMODB_ENDPOINT
}

// Local reads the stack's addresses from the process's environment.
func Local() Stack {
	e := config.NewEnv(os.Getenv)
	return Stack{
		RedisAddrs:     e.List("FLOODGATE_REDIS_ADDRS", config.DefaultRedisAddrs),
		InfluxURL:      e.String("FLOODGATE_INFLUX_URL", config.DefaultInfluxURL),
		DynamoEndpoint: e.String("FLOODGATE_DYNAMODB_ENDPOINT", DefaultDynamoEndpoint),
	}
}

// Needs skips t under -short: what says what the test needs that a short
// run does not have ("starts redis-server", "the local stack; run `make
// test`"). Without -short a missing service fails the test loudly.
func Needs(t testing.TB, what string) {
	t.Helper()
	if testing.Short() {
		t.Skip(what)
	}
}

// PostAs posts n empty requests to url one after another as the principal
// kind:id — in the X-Principal-Kind and X-Principal-Id headers, which a
// gateway trusting the test's address reads — and returns their status
// codes and the last response (its body closed, its headers there to check).
func PostAs(t testing.TB, url, kind, id string, n int) (codes []int, last *http.Response) {
	t.Helper()
	for range n {
		req, err := http.NewRequest(http.MethodPost, url, nil)
		if err != nil {
			t.Fatalf("request %s: %v", url, err)
		}
		req.Header.Set("X-Principal-Kind", kind)
		req.Header.Set("X-Principal-Id", id)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatalf("POST %s: %v", url, err)
		}
		_ = resp.Body.Close()
		codes, last = append(codes, resp.StatusCode), resp
	}
	return codes, last
}

// Get GETs url with c and returns the status and the body, failing t when
// the request or the read fails.
func Get(t testing.TB, c *http.Client, url string) (int, string) {
	t.Helper()
	res, err := c.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	return res.StatusCode, readBody(t, res)
}

// PostForm posts form to url with c and returns the response (its body
// read and closed) and the body.
func PostForm(t testing.TB, c *http.Client, url string, form url.Values) (*http.Response, string) {
	t.Helper()
	res, err := c.PostForm(url, form)
	if err != nil {
		t.Fatalf("POST %s: %v", url, err)
	}
	return res, readBody(t, res)
}

func readBody(t testing.TB, res *http.Response) string {
	t.Helper()
	defer res.Body.Close()
	body, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatalf("read %s: %v", res.Request.URL, err)
	}
	return string(body)
}
