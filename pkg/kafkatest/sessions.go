package kafkatest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// ExpectKilledJoinerExpired replays, against the broker at addr, the chaos
// scenario consumer-kill's hang, and fails t unless the broker expires the
// killed member: member B's JoinGroup waits in a rebalance and B's
// connection closes before the answer (B was SIGKILLed); the join completes
// with B, the leader A assigns it a share and syncs, and the group is
// stable. kfake never starts B's session timer, so without a session keeper
// (package sessionkeeper) B holds its share forever and A's heartbeats keep
// succeeding. With it, B is expired after its session timeout: A's
// heartbeat reports the rebalance, and A rejoins alone. It creates the
// topic killed-joiner and groups killed-joiner-<try>.
//
// kfake answers a JoinGroup whose connection has closed at random (a
// select between the reply and the closed connection), and when it does,
// it times B out itself. An expiry seen before twice the session timeout
// after B joined is kfake's (the keeper waits that long), so the scenario
// did not happen: it is played again with a fresh group, up to
// killedJoinerTries times.
func ExpectKilledJoinerExpired(t testing.TB, addr string) {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(addr))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	ct := kmsg.NewPtrCreateTopicsRequest()
	topic := kmsg.NewCreateTopicsRequestTopic()
	topic.Topic, topic.NumPartitions, topic.ReplicationFactor = "killed-joiner", 2, 1
	ct.Topics = append(ct.Topics, topic)
	if resp, err := ct.RequestWith(ctx, cl); err != nil || resp.Topics[0].ErrorCode != 0 {
		t.Fatalf("create topic: %v %+v", err, resp)
	}
	for try := 1; ; try++ {
		if killedJoinerExpired(t, ctx, cl, addr, fmt.Sprintf("killed-joiner-%d", try)) {
			return
		}
		if try == killedJoinerTries {
			t.Fatalf("kfake timed the killed member out itself in all %d tries: the scenario never happened", try)
		}
		t.Logf("try %d: kfake timed the killed member out itself (it answered the closed connection); again", try)
	}
}

// killedJoinerTries bounds the replays: each one misses the scenario with
// probability 1/2.
const killedJoinerTries = 12

// killedJoinerExpired plays the scenario once in group and reports whether
// the member killed in its join was expired no sooner than twice its
// session timeout after it joined (false: kfake expired it itself).
func killedJoinerExpired(t testing.TB, ctx context.Context, cl *kgo.Client, addr, group string) bool {
	t.Helper()
	const session = time.Second
	meta := (&kmsg.ConsumerMemberMetadata{Topics: []string{"killed-joiner"}}).AppendTo(nil)
	joinReq := func(member string) *kmsg.JoinGroupRequest {
		req := kmsg.NewPtrJoinGroupRequest()
		req.Group, req.MemberID, req.ProtocolType = group, member, "consumer"
		req.SessionTimeoutMillis, req.RebalanceTimeoutMillis = int32(session/time.Millisecond), 10_000
		req.Protocols = []kmsg.JoinGroupRequestProtocol{{Name: "range", Metadata: meta}}
		return req
	}
	join := func(member string) *kmsg.JoinGroupResponse {
		t.Helper()
		resp, err := joinReq(member).RequestWith(ctx, cl)
		if err != nil {
			t.Fatalf("join: %v", err)
		}
		return resp
	}
	sync := func(member string, gen int32, members []string) {
		t.Helper()
		req := kmsg.NewPtrSyncGroupRequest()
		req.Group, req.MemberID, req.Generation = group, member, gen
		for _, m := range members {
			req.GroupAssignment = append(req.GroupAssignment, kmsg.SyncGroupRequestGroupAssignment{MemberID: m, MemberAssignment: []byte{}})
		}
		resp, err := req.RequestWith(ctx, cl)
		if err != nil || resp.ErrorCode != 0 {
			t.Fatalf("sync: %v %+v", err, resp)
		}
	}
	heartbeat := func(member string, gen int32) error {
		t.Helper()
		req := kmsg.NewPtrHeartbeatRequest()
		req.Group, req.MemberID, req.Generation = group, member, gen
		resp, err := req.RequestWith(ctx, cl)
		if err != nil {
			t.Fatalf("heartbeat: %v", err)
		}
		return kerr.ErrorForCode(resp.ErrorCode)
	}
	memberIDs := func(resp *kmsg.JoinGroupResponse) []string {
		var ids []string
		for _, m := range resp.Members {
			ids = append(ids, m.MemberID)
		}
		slices.Sort(ids)
		return ids
	}

	// A joins alone (v4+: the first join only hands out the member id).
	first := join("")
	if first.ErrorCode != kerr.MemberIDRequired.Code {
		t.Fatalf("first join: %v, want MEMBER_ID_REQUIRED", kerr.ErrorForCode(first.ErrorCode))
	}
	a := first.MemberID
	resp := join(a)
	if resp.ErrorCode != 0 || resp.LeaderID != a {
		t.Fatalf("join: %v, leader %q, want A (%s)", kerr.ErrorForCode(resp.ErrorCode), resp.LeaderID, a)
	}
	sync(a, resp.Generation, []string{a})

	// B joins (v1, as kafka-go does) on a connection of its own, and the
	// connection is gone before the rebalance completes.
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	b := joinReq("")
	b.Version = 1
	joined := time.Now() // before the broker's first sight of B
	if _, err := conn.Write(kmsg.NewRequestFormatter(kmsg.FormatterClientID("killed")).AppendRequest(nil, b, 1)); err != nil {
		t.Fatal(err)
	}
	for heartbeat(a, resp.Generation) == nil { // until B's join started the rebalance
		time.Sleep(20 * time.Millisecond)
	}
	_ = conn.Close()
	time.Sleep(200 * time.Millisecond) // the broker notices the close

	// A rejoins; the join completes with A and the departed B, A assigns
	// both and syncs: the group is stable.
	resp = join(a)
	if resp.ErrorCode != 0 || resp.LeaderID != a || len(resp.Members) != 2 {
		t.Fatalf("rejoin: %v, leader %q, members %v; want A leading A and B", kerr.ErrorForCode(resp.ErrorCode), resp.LeaderID, memberIDs(resp))
	}
	sync(a, resp.Generation, memberIDs(resp))

	// A heartbeats as a live member does; B sends nothing. The keeper must
	// expire B, which A learns as a rebalance.
	gen := resp.Generation
	for {
		err := heartbeat(a, gen)
		if err == nil {
			select {
			case <-ctx.Done():
				t.Fatalf("B, silent since before the join completed, still holds its share (session timeout %v)", session)
			case <-time.After(session / 5):
			}
			continue
		}
		if !errors.Is(err, kerr.RebalanceInProgress) {
			t.Fatalf("heartbeat: %v, want REBALANCE_IN_PROGRESS", err)
		}
		break
	}
	expired := time.Since(joined)
	resp = join(a)
	if resp.ErrorCode != 0 || !slices.Equal(memberIDs(resp), []string{a}) {
		t.Fatalf("join after the expiry: %v, members %v, want A alone", kerr.ErrorForCode(resp.ErrorCode), memberIDs(resp))
	}
	return expired >= 2*session
}
