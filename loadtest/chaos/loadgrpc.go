package chaos

import (
	"context"
	"strings"
	"sync"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/floodgate-dev/floodgate/loadtest/internal/envoyclient"
	"github.com/floodgate-dev/floodgate/pkg/events"
	"github.com/floodgate-dev/floodgate/pkg/limiter/envoyrls"
	"github.com/floodgate-dev/floodgate/pkg/limiter/server"
)

// grpcSenders sends checks as Envoy does: ShouldRateLimit in Floodgate's own
// descriptor shape (one descriptor naming the principal, address, method,
// route and priority), over l.Conns connections, each call with the caller's
// deadline as its gRPC deadline.
func (l *Load) grpcSenders() (func(w int) (sender, func()), func(), error) {
	n := l.Conns
	if n <= 0 {
		n = max(l.Workers, 1)
	}
	conns := make([]*grpc.ClientConn, 0, n)
	closeAll := func() {
		for _, c := range conns {
			_ = c.Close()
		}
	}
	for range n {
		c, err := envoyclient.Dial(l.GRPCAddr)
		if err != nil {
			closeAll()
			return nil, nil, err
		}
		c.Connect()
		conns = append(conns, c)
	}
	var reqs sync.Map // bodyKey → *rlsv3.RateLimitRequest: built once, only read after
	request := func(p events.Principal, route, priority string) *rlsv3.RateLimitRequest {
		k := bodyKey{p, priority}
		if r, ok := reqs.Load(k); ok {
			return r.(*rlsv3.RateLimitRequest)
		}
		ip := "198.51.100.23"
		if l.IP != nil {
			ip = l.IP(p)
		}
		entries := []*rlcommon.RateLimitDescriptor_Entry{
			{Key: envoyrls.KeyPrincipalKind, Value: string(p.Kind)}, {Key: envoyrls.KeyPrincipalID, Value: p.ID},
			{Key: envoyrls.KeyRemoteAddress, Value: ip}, {Key: envoyrls.KeyMethod, Value: "GET"}, {Key: envoyrls.KeyRoute, Value: route},
		}
		if priority != "" {
			entries = append(entries, &rlcommon.RateLimitDescriptor_Entry{Key: envoyrls.KeyPriority, Value: priority})
		}
		r := &rlsv3.RateLimitRequest{Domain: "floodgate", Descriptors: []*rlcommon.RateLimitDescriptor{{Entries: entries}}}
		reqs.Store(k, r)
		return r
	}
	timeout := 2 * time.Second
	if l.Deadline > 0 {
		timeout = l.Deadline
	}
	return func(w int) (sender, func()) {
		client := rlsv3.NewRateLimitServiceClient(conns[w%len(conns)])
		return func(p events.Principal, route, priority string) Check {
			c := Check{Start: time.Now(), Principal: p, Priority: priority}
			ctx, cancel := context.WithTimeout(context.Background(), timeout)
			if priority == string(events.PriorityCritical) {
				// As a gateway's rate-limit cluster for its CRITICAL routes
				// sends it (envoyrls.MetadataPriority).
				ctx = metadata.AppendToOutgoingContext(ctx, envoyrls.MetadataPriority, priority)
			}
			resp, err := client.ShouldRateLimit(ctx, request(p, route, priority))
			cancel()
			c.Latency = time.Since(c.Start)
			grpcOutcome(&c, resp, err)
			return c
		}, func() {}
	}, closeAll, nil
}

// grpcOutcome reads a ShouldRateLimit answer into c as the HTTP sender reads
// a /v1/check answer. The limiter's own "past its deadline" status, read
// before the caller's deadline, is an answer (the caller fails open on it):
// OK, degraded and dropped, as the HTTP answer's X-RateLimit-Error is.
func grpcOutcome(c *Check, resp *rlsv3.RateLimitResponse, err error) {
	if err != nil {
		st, _ := status.FromError(err)
		switch {
		case st.Code() == codes.DeadlineExceeded && st.Message() == server.DeadlineReason:
			c.OK, c.Degraded, c.Dropped = true, true, true
		case st.Code() == codes.Unavailable && st.Message() == envoyrls.Overloaded:
			c.Overloaded = true
		}
		return
	}
	c.OK = true
	c.Allowed = resp.GetOverallCode() == rlsv3.RateLimitResponse_OK
	for _, h := range resp.GetResponseHeadersToAdd() {
		switch h.GetKey() {
		case "X-Request-Id":
			c.ID = h.GetValue()
		case "X-RateLimit-Error":
			c.Degraded = true
			c.Dropped = strings.Contains(h.GetValue(), "deadline exceeded")
		case "X-RateLimit-Shed":
			c.Degraded, c.Shed = true, true
		case "X-Floodgate-Utilization":
			c.PriorityShed = true
		}
	}
}
