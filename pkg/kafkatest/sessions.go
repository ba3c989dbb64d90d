package kafkatest

import (
	"context"
	"errors"
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
// topic and the group it uses (both named killed-joiner).
func ExpectKilledJoinerExpired(t testing.TB, addr string) {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(addr))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	ct := kmsg.NewPtrCreateTopicsRequest()
	topic := kmsg.NewCreateTopicsRequestTopic()
	topic.Topic, topic.NumPartitions, topic.ReplicationFactor = "killed-joiner", 2, 1
	ct.Topics = append(ct.Topics, topic)
	if resp, err := ct.RequestWith(ctx, cl); err != nil || resp.Topics[0].ErrorCode != 0 {
		t.Fatalf("create topic: %v %+v", err, resp)
	}

	const group = "killed-joiner"
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
	resp = join(a)
	if resp.ErrorCode != 0 || !slices.Equal(memberIDs(resp), []string{a}) {
		t.Fatalf("join after the expiry: %v, members %v, want A alone", kerr.ErrorForCode(resp.ErrorCode), memberIDs(resp))
	}
}
