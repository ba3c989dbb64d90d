package score

import (
	"encoding/binary"
	"hash/maphash"
	"net/netip"
	"sync"

	"github.com/axiomhq/hyperloglog"
	"github.com/cespare/xxhash/v2"

	"github.com/floodgate-dev/floodgate/pkg/events"
)

// baseMs is the origin of the scorers' compact clocks (2024-01-01T00:00:00Z):
// seconds and buckets are counted from it in 32 bits. Events before it are
// ignored.
const baseMs = 1704067200000

// seconds returns the compact second of an event time in ms since the Unix
// epoch; 0 is never a valid second, so a zero slot reads as empty.
func seconds(ms int64) uint32 { return uint32((ms-baseMs)/1000) + 1 }

// ipKey is how an address is counted: an IPv4 address as itself, an IPv6
// address by its /64 (a host gets a whole /64; counting addresses inside it
// would turn one phone into a botnet).
func ipKey(ip netip.Addr) (key uint64, v6 bool) {
	ip = ip.Unmap()
	if ip.Is4() {
		b := ip.As4()
		return uint64(binary.BigEndian.Uint32(b[:])), false
	}
	b := ip.As16()
	return binary.BigEndian.Uint64(b[:8]), true
}

// fold32 reduces a 64-bit key to the 32 bits kept per slot; IPv4 keys stay exact.
func fold32(k uint64) uint32 { return uint32(k) ^ uint32((k>>32)*0x9E3779B1) }

// slot is one member of a compact windowed set: a 32-bit key and the second
// it was last seen; bit 31 of last flags an IPv6 /64.
type slot struct {
	key  uint32
	last uint32
}

const v6Flag = 1 << 31

func (s slot) sec() uint32 { return s.last &^ v6Flag }
func (s slot) v6() bool    { return s.last&v6Flag != 0 }

// IPStore counts distinct principals per IP (IPv6 per /64) over a window, so a
// carrier NAT or a corporate proxy is recognised as shared. One store serves
// every partition's scorer of a detector instance; it is safe for concurrent use.
type IPStore struct {
	seed   maphash.Seed
	winSec uint32
	shards [64]ipShard
	remote RemoteIPs
}

// RemoteIPs shares the principals seen per address with the other detector
// instances of the group (services/detector/internal/sharedip keeps them in
// Redis HyperLogLogs), so an address shared by principals whose partitions
// live on different instances is recognised as shared by all of them, and
// the answers do not depend on how many instances run. Add must not block
// (it is called for every event); Count may call out — it is used only on the
// rare paths that decide whether a detection fires. principal is a hash that
// is the same on every instance (StableHash).
type RemoteIPs interface {
	Add(key, principal uint64, sec uint32)
	Count(key uint64, sec uint32) int64
}

// ShareWith makes the store publish what it sees to r and count with what
// every instance saw. Call it before scoring starts.
func (s *IPStore) ShareWith(r RemoteIPs) { s.remote = r }

// StableHash is a principal's hash for RemoteIPs: the same on every instance
// (the scorers' own hashes are seeded per process).
func StableHash(p events.Principal) uint64 {
	var d xxhash.Digest
	d.Reset()
	_, _ = d.WriteString(string(p.Kind))
	_, _ = d.WriteString("\x00")
	_, _ = d.WriteString(p.ID)
	return d.Sum64()
}

type ipShard struct {
	mu   sync.Mutex
	m    table[ipInfo]
	many map[uint64]*manyPrincipals // IPs with more than three principals
}

// ipInfo holds up to three principals inline (24 bytes, no pointers); busier
// IPs are marked with manyMark and counted in the shard's many map.
type ipInfo struct {
	ps [3]slot
}

const manyMark = ^uint32(0)

func (i ipInfo) isMany() bool { return i.ps[0].last == manyMark }

// manyPrincipals counts the principals of a busy IP exactly up to
// maxExactPrincipals, then with two HyperLogLog epochs of one window each.
type manyPrincipals struct {
	exact map[uint32]uint32
	hll   [2]*hyperloglog.Sketch // current, previous epoch
	epoch uint32
}

const maxExactPrincipals = 512

// NewIPStore returns a store counting over window.
func NewIPStore(cfg Config) *IPStore {
	s := &IPStore{seed: maphash.MakeSeed(), winSec: uint32(cfg.IPWindow.Seconds())}
	for i := range s.shards {
		s.shards[i].many = map[uint64]*manyPrincipals{}
	}
	return s
}

func (s *IPStore) shard(key uint64) *ipShard {
	return &s.shards[(key*0x9E3779B97F4A7C15)>>58]
}

// touch records that principal ph used key at second sec. The address's
// record is updated in place (table.Ref): one probe, where Get then Put took
// two.
func (s *IPStore) touch(key uint64, ph uint64, sec uint32) {
	sh := s.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	info := sh.m.Ref(key) // valid to the end: nothing below adds to or removes from sh.m
	p32 := uint32(ph)
	if info.isMany() {
		sh.many[key].add(ph, p32, sec, s.winSec)
		return
	}
	free := -1
	for i := range info.ps {
		switch {
		case info.ps[i].key == p32 && info.ps[i].last != 0:
			info.ps[i].last = max(info.ps[i].last, sec)
			return
		case free < 0 && (info.ps[i].last == 0 || info.ps[i].last+s.winSec < sec):
			free = i
		}
	}
	if free >= 0 {
		info.ps[free] = slot{key: p32, last: sec}
		return
	}
	m := &manyPrincipals{exact: make(map[uint32]uint32, 8)}
	for _, p := range info.ps {
		m.exact[p.key] = p.last
	}
	m.add(ph, p32, sec, s.winSec)
	sh.many[key] = m
	info.ps = [3]slot{{last: manyMark}}
}

func (m *manyPrincipals) add(ph uint64, p32, sec, win uint32) {
	if m.hll[0] == nil {
		if last, ok := m.exact[p32]; !ok || last < sec {
			m.exact[p32] = sec
		}
		if len(m.exact) <= maxExactPrincipals {
			return
		}
		m.hll[0], m.hll[1] = hyperloglog.New14(), hyperloglog.New14()
		m.epoch = sec / win
		for k, last := range m.exact {
			if last+win >= sec {
				m.hll[0].InsertHash(uint64(k) * 0x9E3779B97F4A7C15)
			}
		}
		m.exact = nil
		return
	}
	m.rotate(sec, win)
	m.hll[0].InsertHash(ph)
}

func (m *manyPrincipals) rotate(sec, win uint32) {
	rotateEpoch(&m.epoch, sec/win, &m.hll)
}

func (m *manyPrincipals) count(sec, win uint32) int64 {
	if m.hll[0] == nil {
		n := int64(0)
		for _, last := range m.exact {
			if last+win >= sec {
				n++
			}
		}
		return n
	}
	e := sec / win
	switch {
	case e == m.epoch:
		u := m.hll[0].Clone()
		_ = u.Merge(m.hll[1])
		return int64(u.Estimate())
	case e == m.epoch+1:
		return int64(m.hll[0].Estimate())
	}
	return 0
}

// principals returns how many distinct principals used key in the window
// ending at sec: what this instance saw, or what every instance saw when the
// store is shared and that is more.
func (s *IPStore) principals(key uint64, sec uint32) int64 {
	n := s.localPrincipals(key, sec)
	if s.remote != nil {
		n = max(n, s.remote.Count(key, sec))
	}
	return n
}

func (s *IPStore) localPrincipals(key uint64, sec uint32) int64 {
	sh := s.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	info, ok := sh.m.Get(key)
	if !ok {
		return 0
	}
	if info.isMany() {
		return sh.many[key].count(sec, s.winSec)
	}
	n := int64(0)
	for _, p := range info.ps {
		if p.last != 0 && p.last+s.winSec >= sec {
			n++
		}
	}
	return n
}

// Principals returns how many distinct principals used ip in the window ending at ms.
func (s *IPStore) Principals(ip netip.Addr, ms int64) int64 {
	k, _ := ipKey(ip)
	return s.principals(k, seconds(ms))
}

// Sweep forgets IPs unused for a window before the event time nowMs and
// returns how many remain.
func (s *IPStore) Sweep(nowMs int64) int {
	sec := seconds(nowMs)
	left := 0
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		sh.m.DeleteFunc(func(k uint64, info *ipInfo) bool {
			newest := uint32(0)
			if info.isMany() {
				m := sh.many[k]
				if m.hll[0] != nil {
					newest = (m.epoch + 1) * s.winSec
				}
				for _, last := range m.exact {
					newest = max(newest, last)
				}
			} else {
				for _, p := range info.ps {
					newest = max(newest, p.last)
				}
			}
			if newest+s.winSec < sec {
				delete(sh.many, k)
				return true
			}
			return false
		})
		left += sh.m.Len()
		sh.mu.Unlock()
	}
	return left
}

// Len is the number of IPs held.
func (s *IPStore) Len() int {
	n := 0
	for i := range s.shards {
		s.shards[i].mu.Lock()
		n += s.shards[i].m.Len()
		s.shards[i].mu.Unlock()
	}
	return n
}
