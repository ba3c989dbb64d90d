// Package sessionkeeper expires the consumer-group members a kfake cluster
// never times out. Both kfakes of this repository run it: the local broker
// program (deploy/local/broker) and the in-process test broker
// (pkg/kafkatest).
package sessionkeeper

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// Why the broker expires group members itself. kfake starts a classic group
// member's session timer only when an answer reaches the member. A member
// whose JoinGroup waits in a rebalance and whose connection closes before
// the answer (a consumer SIGKILLed while it joins) stays in the group with
// no timer at all: the join completes with it, the leader assigns it
// partitions, the leader's SyncGroup makes the group stable (which stops
// the timer that would have dropped a member that never syncs), and from
// then on nobody reads those partitions. The live members' heartbeats keep
// succeeding, so none of them rejoins. Apache Kafka schedules every
// member's session expiry when the join completes, answered or not.
//
// The chaos scenario consumer-kill hit it: the last quota instance owned
// half the partitions for four minutes, the other half assigned to an
// instance killed in its JoinGroup. kafkatest.ExpectKilledJoinerExpired
// replays it; deploy/local/broker and pkg/kafkatest run it against their
// clusters.
//
// sessionKeeper watches the group requests (JoinGroup, SyncGroup,
// Heartbeat, OffsetCommit, LeaveGroup) and, for a stable group, sends a
// LeaveGroup on behalf of a member that has sent nothing for twice the
// longest session timeout its group's members joined with: what the
// coordinator's session expiry should have done by then. Twice, so that a
// member kfake does time out is left to kfake. A live member heartbeats
// well within its session timeout (kafka-go, franz-go and the Java client
// all do), so it is never dropped by this; kfake would have dropped it
// first.
type sessionKeeper struct {
	log      *slog.Logger
	interval time.Duration

	// probe is a group name no client uses, described with the watched
	// groups; probed is set when this cluster sees that request. A
	// description answered without it came from another cluster now on the
	// same address (this one closed), whose members the keeper never hears.
	probe  string
	probed atomic.Bool

	mu     sync.Mutex
	groups map[string]*keptGroup
}

type keptGroup struct {
	session time.Duration         // the longest session timeout of its joins
	seen    map[string]memberSeen // by member id
}

type memberSeen struct {
	at    time.Time // its last request, or when a description first listed it
	heard bool      // a request of its own was seen (a member killed in its first join never sends one)
}

// groupKeys are the requests the keeper watches.
var groupKeys = []kmsg.Key{kmsg.JoinGroup, kmsg.SyncGroup, kmsg.Heartbeat, kmsg.OffsetCommit, kmsg.LeaveGroup}

// Start installs a keeper on cluster, sweeping every interval, and runs it
// until stop, asking the cluster through a client of its own (opts added to
// its seed brokers, the cluster's listen addresses). Install it before
// clients join groups: members it never hears of are met at its first
// sweep. Its client is plaintext and anonymous unless opts say otherwise: a
// cluster that needs TLS or SASL it cannot ask, and it then expires nobody.
// Closing the cluster does not stop the keeper; stop does. Until then it
// ignores what another cluster listening on the closed one's address
// answers (it never hears that cluster's members).
func Start(cluster *kfake.Cluster, log *slog.Logger, interval time.Duration, opts ...kgo.Opt) (stop func(), err error) {
	k := newSessionKeeper(cluster, log, interval)
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(cluster.ListenAddrs()...)}, opts...)...)
	if err != nil {
		return nil, fmt.Errorf("session keeper client: %w", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		k.run(ctx, cl)
		close(done)
	}()
	return func() {
		cancel()
		<-done
		cl.Close()
	}, nil
}

// newSessionKeeper installs the keeper's request observers on cluster; run
// starts its sweeps.
func newSessionKeeper(cluster *kfake.Cluster, log *slog.Logger, interval time.Duration) *sessionKeeper {
	k := &sessionKeeper{log: log, interval: interval, groups: map[string]*keptGroup{}, probe: "sessionkeeper-probe-" + rand.Text()}
	cluster.ControlKey(kmsg.DescribeGroups.Int16(), func(req kmsg.Request) (kmsg.Response, error, bool) {
		if r, ok := req.(*kmsg.DescribeGroupsRequest); ok && slices.Contains(r.Groups, k.probe) {
			k.probed.Store(true)
		}
		return nil, nil, false
	})
	for _, key := range groupKeys {
		cluster.ControlKey(key.Int16(), func(req kmsg.Request) (kmsg.Response, error, bool) {
			k.observe(req, time.Now())
			return nil, nil, false // kfake handles the request as usual
		})
	}
	return k
}

// observe notes who sent req, a group request, at now.
func (k *sessionKeeper) observe(req kmsg.Request, now time.Time) {
	k.mu.Lock()
	defer k.mu.Unlock()
	switch r := req.(type) {
	case *kmsg.JoinGroupRequest:
		g := k.group(r.Group)
		g.session = max(g.session, time.Duration(r.SessionTimeoutMillis)*time.Millisecond)
		if r.MemberID != "" {
			g.seen[r.MemberID] = memberSeen{at: now, heard: true}
		}
	case *kmsg.SyncGroupRequest:
		k.touch(r.Group, r.MemberID, now)
	case *kmsg.HeartbeatRequest:
		k.touch(r.Group, r.MemberID, now)
	case *kmsg.OffsetCommitRequest:
		k.touch(r.Group, r.MemberID, now)
	case *kmsg.LeaveGroupRequest:
		if g := k.groups[r.Group]; g != nil {
			delete(g.seen, r.MemberID)
			for _, m := range r.Members {
				delete(g.seen, m.MemberID)
			}
		}
	}
}

func (k *sessionKeeper) group(name string) *keptGroup {
	g := k.groups[name]
	if g == nil {
		g = &keptGroup{seen: map[string]memberSeen{}}
		k.groups[name] = g
	}
	return g
}

func (k *sessionKeeper) touch(group, member string, now time.Time) {
	if member != "" {
		k.group(group).seen[member] = memberSeen{at: now, heard: true}
	}
}

// run sweeps every interval until ctx is done, asking the cluster through
// cl.
func (k *sessionKeeper) run(ctx context.Context, cl *kgo.Client) {
	t := time.NewTicker(k.interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			k.sweep(ctx, cl, time.Now())
		}
	}
}

// sweep describes the watched groups and sends a LeaveGroup for each member
// of a stable group silent for longer than twice its group's session
// timeout. A member first met in a description counts as seen then. Requests go out
// without k.mu held: kfake runs the observers while it handles them.
func (k *sessionKeeper) sweep(ctx context.Context, cl *kgo.Client, now time.Time) {
	k.mu.Lock()
	names := make([]string, 0, len(k.groups))
	for name, g := range k.groups {
		if g.session > 0 {
			names = append(names, name)
		}
	}
	k.mu.Unlock()
	if len(names) == 0 {
		return
	}
	req := kmsg.NewPtrDescribeGroupsRequest()
	req.Groups = append(names, k.probe)
	k.probed.Store(false)
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		if ctx.Err() == nil {
			k.log.Warn("session keeper: describe groups", "err", err)
		}
		return
	}
	if !k.probed.Load() {
		k.log.Debug("session keeper: groups described by another cluster on this address; ignored")
		return
	}
	type expired struct {
		group, member   string
		silent, session time.Duration
		heard           bool
	}
	var drop []expired
	k.mu.Lock()
	for _, d := range resp.Groups {
		g := k.groups[d.Group]
		if g == nil || d.ErrorCode != 0 {
			continue
		}
		listed := make(map[string]bool, len(d.Members))
		for _, m := range d.Members {
			listed[m.MemberID] = true
			last, ok := g.seen[m.MemberID]
			switch {
			case !ok:
				g.seen[m.MemberID] = memberSeen{at: now}
			case d.State == "Stable" && now.Sub(last.at) > 2*g.session:
				drop = append(drop, expired{d.Group, m.MemberID, now.Sub(last.at), g.session, last.heard})
			}
		}
		for id := range g.seen {
			if !listed[id] {
				delete(g.seen, id)
			}
		}
		if len(d.Members) == 0 && (d.State == "Empty" || d.State == "Dead") {
			delete(k.groups, d.Group)
		}
	}
	k.mu.Unlock()
	for _, e := range drop {
		leave := kmsg.NewPtrLeaveGroupRequest()
		leave.Group, leave.MemberID = e.group, e.member
		lm := kmsg.NewLeaveGroupRequestMember()
		lm.MemberID = e.member
		leave.Members = append(leave.Members, lm)
		resp, err := leave.RequestWith(ctx, cl)
		if err == nil {
			err = kerr.ErrorForCode(resp.ErrorCode)
			for _, m := range resp.Members {
				err = errors.Join(err, kerr.ErrorForCode(m.ErrorCode))
			}
		}
		if err != nil { // UNKNOWN_MEMBER_ID: gone meanwhile
			k.log.Debug("session keeper: leave group", "group", e.group, "member", e.member, "err", err)
			continue
		}
		k.log.Warn("session keeper: expired a group member silent for twice its session timeout (kfake had not)",
			"group", e.group, "member", e.member, "silent", e.silent.Round(time.Millisecond).String(),
			"session_timeout", e.session.String(), "heard_from", e.heard)
	}
}
