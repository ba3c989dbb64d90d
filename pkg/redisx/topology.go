package redisx

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
)

// Topology makes a client's view of where its data lives the service's own
// event (issue 38): the master in use (standalone, or the one Sentinel names)
// and a Cluster's slot map. A change is one structured log line — old and new
// master, how it was learned — and floodgate_redis_master_changes_total; the
// masters in use are the floodgate_redis_master info series. Options.Topology
// hands it to NewClient, which feeds it: a Node from the address of every
// connection it dials (the first one to a new master is the switch), a
// Cluster from every CLUSTER SLOTS reply through the client (the limiter
// reloads them every second). Safe for concurrent use.
type Topology struct {
	log     *slog.Logger
	changes *prometheus.CounterVec
	info    *prometheus.GaugeVec

	mu        sync.Mutex
	name      string            // Sentinel's master name; "" otherwise
	master    string            // a Node's master in use
	masterSeq uint64            // the start order of the dial that found it
	slotMap   map[string]string // a Cluster's slot ranges ("0-5460") → master
}

// NewTopology returns a Topology logging to log, its metrics registered on reg.
func NewTopology(log *slog.Logger, reg prometheus.Registerer) *Topology {
	t := &Topology{log: log,
		changes: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "floodgate_redis_master_changes_total",
			Help: "Times the Redis master in use changed: a Sentinel failover or switchover, a demoted node (READONLY), or a Cluster slot range moved to another master; by how it was learned."}, []string{"via"}),
		info: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "floodgate_redis_master",
			Help: "1 for each Redis master in use: the standalone node, the master Sentinel names (name = the master's name in Sentinel), or each master of a Cluster's slot map."}, []string{"addr", "name"}),
	}
	if reg != nil {
		reg.MustRegister(t.changes, t.info)
	}
	return t
}

// Via values: how a change was learned.
const (
	ViaSentinel    = "sentinel"      // a connection dialed to the master Sentinel names (after +switch-master, or a lost connection)
	ViaReadOnly    = "readonly"      // the node answered READONLY: demoted; reconnected to the master Sentinel names
	ViaDial        = "dial"          // a standalone address resolving to another server
	ViaClusterSlot = "cluster slots" // a CLUSTER SLOTS reply with a slot range on another master
)

// Master is the master in use: a Node's address, or a Cluster's masters
// joined by ",". "" before the first connection.
func (t *Topology) Master() string {
	if t == nil {
		return ""
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.slotMap != nil {
		return strings.Join(t.clusterMasters(), ",")
	}
	return t.master
}

// dialed records a connection to addr, the master of a Node, dialed
// seq-th. It returns false for a stale connection: one to another address
// than a dial started after it found — during a switch, a dial that asked
// Sentinel before it reached the old master after the new one was in use.
func (t *Topology) dialed(ctx context.Context, addr, via string, seq uint64) bool {
	t.mu.Lock()
	old := t.master
	if old == addr {
		t.masterSeq = max(t.masterSeq, seq)
		t.mu.Unlock()
		return true
	}
	if seq < t.masterSeq {
		t.mu.Unlock()
		return false
	}
	t.master, t.masterSeq = addr, seq
	name := t.name
	t.mu.Unlock()
	if old != "" {
		t.info.DeleteLabelValues(old, name)
	}
	t.info.WithLabelValues(addr, name).Set(1)
	if old == "" {
		t.log.InfoContext(ctx, "redis master in use", "master", addr, "sentinel_master", name, "via", via)
		return true
	}
	t.changes.WithLabelValues(via).Inc()
	t.log.WarnContext(ctx, "redis master changed", "old_master", old, "new_master", addr, "sentinel_master", name, "via", via)
	return true
}

// slots records a CLUSTER SLOTS reply.
func (t *Topology) slots(ctx context.Context, slots []redis.ClusterSlot) {
	m := make(map[string]string, len(slots))
	for _, s := range slots {
		if len(s.Nodes) > 0 {
			m[fmt.Sprintf("%d-%d", s.Start, s.End)] = s.Nodes[0].Addr
		}
	}
	if len(m) == 0 {
		return
	}
	t.mu.Lock()
	old, oldMasters := t.slotMap, t.clusterMasters()
	if old != nil && mapsEqual(old, m) {
		t.mu.Unlock()
		return
	}
	t.slotMap = m
	masters := t.clusterMasters()
	t.mu.Unlock()
	for _, a := range oldMasters {
		if !slices.Contains(masters, a) {
			t.info.DeleteLabelValues(a, "")
		}
	}
	for _, a := range masters {
		t.info.WithLabelValues(a, "").Set(1)
	}
	if old == nil {
		t.log.InfoContext(ctx, "redis cluster masters in use", "masters", masters, "slot_ranges", len(m))
		return
	}
	var moved []string
	for r, a := range m {
		if old[r] != a {
			moved = append(moved, fmt.Sprintf("%s: %s → %s", r, cmpOr(old[r], "unmapped"), a))
		}
	}
	slices.Sort(moved)
	t.changes.WithLabelValues(ViaClusterSlot).Add(float64(max(len(moved), 1)))
	t.log.WarnContext(ctx, "redis cluster slot map changed", "old_masters", oldMasters, "new_masters", masters, "moved", moved, "via", ViaClusterSlot)
}

// clusterMasters is the sorted masters of the slot map; t.mu is held.
func (t *Topology) clusterMasters() []string {
	var out []string
	for _, a := range t.slotMap {
		if !slices.Contains(out, a) {
			out = append(out, a)
		}
	}
	slices.Sort(out)
	return out
}

func mapsEqual(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

func cmpOr(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// topologyHook feeds a Topology: a Node's dials and a Cluster's CLUSTER SLOTS
// replies. It also remembers the latest failed dial, the root cause a call
// that timed out behind it does not name (Node.RootCause).
type topologyHook struct {
	t          *Topology // nil: dial errors only
	via        string
	readOnlyAt *atomic.Int64 // unix ns of the last Reconnect after READONLY: a new master within readOnlyWindow was learned that way
	dialErr    *atomic.Pointer[dialFailure]
	node       bool           // a Node: the conn says which server it reached (go-redis dials a placeholder address for Sentinel)
	seq        *atomic.Uint64 // a Node's dials, numbered as they start
}

// readOnlyWindow is how long after a READONLY reply a new master counts as
// learned from it.
const readOnlyWindow = 30 * time.Second

type dialFailure struct {
	err error
	at  time.Time
}

// staleRedials bounds how often a dial that reached a master already
// replaced is tried again.
const staleRedials = 3

func (h topologyHook) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		for attempt := 0; ; attempt++ {
			var seq uint64
			if h.seq != nil {
				seq = h.seq.Add(1)
			}
			c, err := next(ctx, network, addr)
			if err != nil {
				if h.dialErr != nil {
					h.dialErr.Store(&dialFailure{err: err, at: time.Now()})
				}
				return nil, err
			}
			if h.dialErr != nil {
				h.dialErr.Store(nil)
			}
			if h.t == nil || !h.node {
				return c, nil
			}
			via := h.via
			if at := h.readOnlyAt.Load(); at != 0 && time.Since(time.Unix(0, at)) < readOnlyWindow {
				via = ViaReadOnly
			}
			if h.t.dialed(ctx, c.RemoteAddr().String(), via, seq) || attempt == staleRedials {
				return c, nil
			}
			// The old master, reached after the switch: go-redis's failover
			// dropped its connections once, at the switch, and would keep
			// this one — writable until Sentinel demotes the old master.
			_ = c.Close()
		}
	}
}

func (h topologyHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	if h.t == nil || h.node {
		return next
	}
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if c, ok := cmd.(*redis.ClusterSlotsCmd); ok && err == nil {
			h.t.slots(ctx, c.Val())
		}
		return err
	}
}

func (topologyHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
