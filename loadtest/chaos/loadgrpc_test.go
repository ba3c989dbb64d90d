package chaos

import (
	"context"
	"fmt"
	"maps"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/floodgate-dev/floodgate/pkg/events"
	"github.com/floodgate-dev/floodgate/pkg/limiter/envoyrls"
	"github.com/floodgate-dev/floodgate/pkg/limiter/server"
)

// rlsByID answers ShouldRateLimit by the principal id the call names, and
// records each call's deadline and descriptor entries.
type rlsByID struct {
	rlsv3.UnimplementedRateLimitServiceServer
	mu        sync.Mutex
	deadlines []time.Duration
	entries   map[string]string
	priority  []string                  // the last call's envoyrls.MetadataPriority
	byConn    map[string]map[string]int // each connection's calls (client address) by their MetadataPriority
}

func (s *rlsByID) ShouldRateLimit(ctx context.Context, in *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	entries := map[string]string{}
	for _, e := range in.GetDescriptors()[0].GetEntries() {
		entries[e.GetKey()] = e.GetValue()
	}
	d, ok := ctx.Deadline()
	if !ok {
		d = time.Now().Add(time.Hour) // none: the test's check fails
	}
	md, _ := metadata.FromIncomingContext(ctx)
	s.mu.Lock()
	s.deadlines = append(s.deadlines, time.Until(d))
	s.entries = entries
	s.priority = md.Get(envoyrls.MetadataPriority)
	if p, ok := peer.FromContext(ctx); ok {
		if s.byConn == nil {
			s.byConn = map[string]map[string]int{}
		}
		if s.byConn[p.Addr.String()] == nil {
			s.byConn[p.Addr.String()] = map[string]int{}
		}
		s.byConn[p.Addr.String()][strings.Join(s.priority, ",")]++
	}
	s.mu.Unlock()
	h := func(kv ...string) []*corev3.HeaderValue {
		out := []*corev3.HeaderValue{{Key: "X-Request-Id", Value: "id-" + entries[envoyrls.KeyPrincipalID]}}
		for i := 0; i < len(kv); i += 2 {
			out = append(out, &corev3.HeaderValue{Key: kv[i], Value: kv[i+1]})
		}
		return out
	}
	switch entries[envoyrls.KeyPrincipalID] {
	case "allowed":
		return &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK, ResponseHeadersToAdd: h()}, nil
	case "denied":
		return &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OVER_LIMIT, ResponseHeadersToAdd: h("Retry-After", "1")}, nil
	case "failed-open":
		return &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK, ResponseHeadersToAdd: h("X-RateLimit-Error", "redis unavailable; answered by fail policy")}, nil
	case "local":
		return &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK, ResponseHeadersToAdd: h("X-RateLimit-Shed", "answered from local state")}, nil
	case "priority-shed":
		return &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OVER_LIMIT, ResponseHeadersToAdd: h("X-Floodgate-Utilization", "0.95")}, nil
	case "past-deadline":
		return nil, status.Error(codes.DeadlineExceeded, server.DeadlineReason)
	case "overloaded":
		return nil, status.Error(codes.Unavailable, envoyrls.Overloaded)
	default: // slow: answers after the caller gave up
		time.Sleep(200 * time.Millisecond)
		return &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK}, nil
	}
}

// TestGRPCLoad: the generator's gRPC mode sends Floodgate's descriptor with
// the caller's deadline and reads each kind of answer as the HTTP mode does.
func TestGRPCLoad(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := grpc.NewServer()
	rls := &rlsByID{}
	rlsv3.RegisterRateLimitServiceServer(srv, rls)
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(srv.Stop)

	ids := []string{"allowed", "denied", "failed-open", "local", "priority-shed", "past-deadline", "overloaded", "slow"}
	l := &Load{GRPCAddr: ln.Addr().String(), Conns: 2, Workers: 1, Rate: 100, Deadline: 50 * time.Millisecond, Route: "/v1/things",
		Next: func(_, i int) events.Principal {
			return events.Principal{Kind: events.PrincipalUser, ID: ids[i%len(ids)]}
		},
		Priority: func(int, int) string { return "critical" }}
	send, closeAll, err := l.senders()
	require.NoError(t, err)
	defer closeAll()
	rls.mu.Lock()
	require.Len(t, rls.deadlines, l.Conns, "each connection warmed by a call")
	rls.deadlines = nil
	rls.mu.Unlock()
	one, done := send(0)
	defer done()
	got := map[string]Check{}
	for i, id := range ids {
		got[id] = one(l.Next(0, i), l.Route, l.Priority(0, i))
	}

	rls.mu.Lock()
	entries, deadlines, priority := rls.entries, rls.deadlines, rls.priority
	rls.mu.Unlock()
	require.Equal(t, []string{"critical"}, priority, "a CRITICAL call says so in its metadata, for the door")
	require.Equal(t, map[string]string{envoyrls.KeyPrincipalKind: "user", envoyrls.KeyPrincipalID: "slow", envoyrls.KeyRemoteAddress: "198.51.100.23",
		envoyrls.KeyMethod: "GET", envoyrls.KeyRoute: "/v1/things", envoyrls.KeyPriority: "critical"}, entries)
	require.Len(t, deadlines, len(ids))
	for _, d := range deadlines {
		// What is left of it when the handler runs: at most the caller's
		// 50 ms (less by however long the server took to get to it).
		require.LessOrEqual(t, d, 50*time.Millisecond, "the caller's deadline is the call's")
	}
	require.Equal(t, Check{OK: true, Allowed: true, ID: "id-allowed"}, strip(got["allowed"]))
	require.Equal(t, Check{OK: true, ID: "id-denied"}, strip(got["denied"]))
	require.Equal(t, Check{OK: true, Allowed: true, Degraded: true, ID: "id-failed-open"}, strip(got["failed-open"]))
	require.Equal(t, Check{OK: true, Allowed: true, Degraded: true, Shed: true, ID: "id-local"}, strip(got["local"]))
	require.Equal(t, Check{OK: true, PriorityShed: true, ID: "id-priority-shed"}, strip(got["priority-shed"]))
	require.Equal(t, Check{OK: true, Degraded: true, Dropped: true}, strip(got["past-deadline"]), "the limiter's own past-deadline status is an answer")
	require.Equal(t, Check{Overloaded: true}, strip(got["overloaded"]), "the entry gate's refusal is no decision")
	require.Equal(t, Check{}, strip(got["slow"]), "an answer after the caller's deadline is none")
	require.GreaterOrEqual(t, got["slow"].Latency, 50*time.Millisecond)
	require.Less(t, got["slow"].Latency, 150*time.Millisecond, "the caller stops waiting at its deadline")
}

// strip keeps what the answer set.
func strip(c Check) Check {
	return Check{OK: c.OK, ID: c.ID, Allowed: c.Allowed, Degraded: c.Degraded, Shed: c.Shed, PriorityShed: c.PriorityShed, Dropped: c.Dropped, Overloaded: c.Overloaded}
}

// countingListener counts the connections it accepts.
type countingListener struct {
	net.Listener
	n atomic.Int64
}

func (l *countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.n.Add(1)
	}
	return c, err
}

// TestGRPCLoadRedials: a server that sends its connections away (GOAWAY at
// its maximum connection age, as the limiter does every 5 minutes) costs
// the generator the call that met the closed connection, not the rest of
// the run.
func TestGRPCLoadRedials(t *testing.T) {
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	ln := &countingListener{Listener: inner}
	srv := grpc.NewServer(grpc.KeepaliveParams(keepalive.ServerParameters{MaxConnectionAge: 150 * time.Millisecond, MaxConnectionAgeGrace: time.Second}))
	rlsv3.RegisterRateLimitServiceServer(srv, &rlsByID{})
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(srv.Stop)

	l := &Load{GRPCAddr: inner.Addr().String(), Conns: 1, Workers: 1, Rate: 100, Deadline: 50 * time.Millisecond,
		Next: func(int, int) events.Principal { return events.Principal{Kind: events.PrincipalUser, ID: "allowed"} }}
	send, closeAll, err := l.senders()
	require.NoError(t, err)
	defer closeAll()
	one, done := send(0)
	defer done()
	const calls = 60
	answered := 0
	for range calls {
		if one(l.Next(0, 0), "/v1/things", "").OK {
			answered++
		}
		time.Sleep(20 * time.Millisecond)
	}
	goaways := int(ln.n.Load()) - 1
	require.GreaterOrEqual(t, goaways, 3, "the server sent the connection away during the run")
	require.GreaterOrEqual(t, answered, calls-goaways, "at most the call meeting each closed connection is lost")
}

// TestGRPCLoadCriticalCluster: with CriticalCluster the critical calls go
// over connections of their own, as many as the others, every one of them
// marked critical, and no other call shares them; with CriticalAddr those
// connections go to a server of their own. Each connection has carried one
// call (its warm-up) before the load's first.
func TestGRPCLoadCriticalCluster(t *testing.T) {
	serve := func() (*countingListener, *rlsByID) {
		inner, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		ln := &countingListener{Listener: inner}
		srv := grpc.NewServer()
		rls := &rlsByID{}
		rlsv3.RegisterRateLimitServiceServer(srv, rls)
		go func() { _ = srv.Serve(ln) }()
		t.Cleanup(srv.Stop)
		return ln, rls
	}
	calls := func(rls *rlsByID) map[string]map[string]int {
		rls.mu.Lock()
		defer rls.mu.Unlock()
		out := map[string]map[string]int{}
		for addr, c := range rls.byConn {
			out[addr] = maps.Clone(c)
		}
		return out
	}
	for _, own := range []bool{false, true} {
		t.Run(fmt.Sprintf("server of its own %v", own), func(t *testing.T) {
			ln, rls := serve()
			critLn, critRLS := ln, rls
			l := &Load{GRPCAddr: ln.Addr().String(), Conns: 2, Workers: 2, Rate: 100, Deadline: time.Second, CriticalCluster: true,
				Next: func(int, int) events.Principal { return events.Principal{Kind: events.PrincipalUser, ID: "allowed"} },
				Priority: func(_, i int) string {
					if i%2 == 0 {
						return "critical"
					}
					return ""
				}}
			if own {
				critLn, critRLS = serve()
				l.CriticalAddr = critLn.Addr().String()
			}
			require.NoError(t, l.Open())
			defer l.closeAll()
			warmed := map[string]int{}
			for _, byConn := range []map[string]map[string]int{calls(rls), calls(critRLS)} {
				for addr, c := range byConn {
					warmed[addr] = c["critical"] + c[""]
				}
			}
			require.Len(t, warmed, 4, "every connection warmed: %v", warmed)
			for addr, n := range warmed {
				require.Equal(t, 1, n, "connection %s carried one warm-up call", addr)
			}
			for w := range 2 {
				one, done := l.send(w)
				for i := range 10 {
					require.True(t, one(l.Next(w, i), "/v1/things", l.Priority(w, i)).OK)
				}
				done()
			}
			if own {
				require.Equal(t, int64(2), ln.n.Load(), "two connections to the limiter")
				require.Equal(t, int64(2), critLn.n.Load(), "two to the critical cluster's")
			} else {
				require.Equal(t, int64(4), ln.n.Load(), "two connections for each cluster")
			}
			for _, byConn := range []map[string]map[string]int{calls(rls), calls(critRLS)} {
				for addr, c := range byConn {
					require.Len(t, c, 1, "connection %s carried one kind of call: %v", addr, c)
					require.Equal(t, 6, c["critical"]+c[""], "connection %s: its warm-up and 5 calls: %v", addr, c)
				}
			}
			if own {
				for addr, c := range calls(critRLS) {
					require.Equal(t, 6, c["critical"], "the critical server's connection %s carried critical calls only", addr)
				}
			}
		})
	}
}
