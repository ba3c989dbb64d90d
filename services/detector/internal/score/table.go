package score

import "math/bits"

// table is an open-addressing hash table from uint64 keys to values of V,
// stored inline in one slice: linear probing with Robin Hood insertion and
// backward-shift deletion (no tombstones). It exists for memory: Go's map
// grows by doubling, so right after a growth a big map is about half empty
// (the detector's per-principal maps cost ~2× their payload at 1 M
// principals); table grows by a quarter at 90 % load, so it is always between
// 72 % and 90 % full. Keys need not be uniformly distributed: they are mixed
// before use. Not safe for concurrent use.
type table[V any] struct {
	slots []tslot[V]
	n     int
	// Key 0 is the empty-slot marker inside slots; its value lives here.
	zero    V
	hasZero bool
}

type tslot[V any] struct {
	key uint64 // 0: empty
	val V
}

const (
	tableMinCap  = 16
	tableMaxLoad = 0.9 // grow when an insert would pass this load
	tableGrowth  = 1.25
)

// home is key's preferred slot in a table of cap slots: Lemire's
// multiply-shift range reduction of the key mixed by MurmurHash3's finalizer,
// so keys that share bits (the IP store shards by the high bits of a product,
// the same keys this table sees) still spread over every slot.
func home(key uint64, cap int) int {
	h := key
	h ^= h >> 33
	h *= 0xff51afd7ed558ccd
	h ^= h >> 33
	h *= 0xc4ceb9fe1a85ec53
	h ^= h >> 33
	hi, _ := bits.Mul64(h, uint64(cap))
	return int(hi)
}

// Len returns the number of keys held.
func (t *table[V]) Len() int {
	if t.hasZero {
		return t.n + 1
	}
	return t.n
}

// Get returns key's value and whether key is present.
func (t *table[V]) Get(key uint64) (V, bool) {
	if key == 0 {
		return t.zero, t.hasZero
	}
	if i := t.find(key); i >= 0 {
		return t.slots[i].val, true
	}
	var zero V
	return zero, false
}

// find returns key's slot index, or -1. key != 0.
func (t *table[V]) find(key uint64) int {
	c := len(t.slots)
	if c == 0 {
		return -1
	}
	i := home(key, c)
	for d := 0; ; d++ {
		s := &t.slots[i]
		if s.key == key {
			return i
		}
		if s.key == 0 || t.dist(s.key, i) < d {
			return -1 // Robin Hood: key would have displaced this one
		}
		if i++; i == c {
			i = 0
		}
	}
}

// dist is how far slot i is from key's home.
func (t *table[V]) dist(key uint64, i int) int {
	h := home(key, len(t.slots))
	if i >= h {
		return i - h
	}
	return i + len(t.slots) - h
}

// Put sets key's value.
func (t *table[V]) Put(key uint64, val V) {
	if key == 0 {
		t.zero, t.hasZero = val, true
		return
	}
	if i := t.find(key); i >= 0 {
		t.slots[i].val = val
		return
	}
	if float64(t.n+1) > tableMaxLoad*float64(len(t.slots)) {
		t.grow()
	}
	t.insert(key, val)
	t.n++
}

// Ref returns a pointer to key's value, adding key with the zero value
// first when absent: one probe where Get then Put take two, and no copy of
// V either way. The pointer is valid until the next Put, Ref, Delete or
// DeleteFunc on t.
func (t *table[V]) Ref(key uint64) *V {
	if key == 0 {
		t.hasZero = true
		return &t.zero
	}
	if i := t.find(key); i >= 0 {
		return &t.slots[i].val
	}
	var zero V
	t.Put(key, zero)
	return &t.slots[t.find(key)].val
}

// insert places a key known to be absent; there is a free slot.
func (t *table[V]) insert(key uint64, val V) {
	c := len(t.slots)
	i := home(key, c)
	cur := tslot[V]{key: key, val: val}
	for d := 0; ; d++ {
		s := &t.slots[i]
		if s.key == 0 {
			*s = cur
			return
		}
		if sd := t.dist(s.key, i); sd < d {
			cur, *s = *s, cur // take from the rich: the resident moves on
			d = sd
		}
		if i++; i == c {
			i = 0
		}
	}
}

func (t *table[V]) grow() {
	old := t.slots
	c := max(tableMinCap, int(float64(len(old))*tableGrowth)+1)
	t.slots = make([]tslot[V], c)
	for i := range old {
		if old[i].key != 0 {
			t.insert(old[i].key, old[i].val)
		}
	}
}

// Delete removes key.
func (t *table[V]) Delete(key uint64) {
	if key == 0 {
		var zero V
		t.zero, t.hasZero = zero, false
		return
	}
	if i := t.find(key); i >= 0 {
		t.removeAt(i)
	}
}

// removeAt empties slot i and shifts the following displaced keys back one slot.
func (t *table[V]) removeAt(i int) {
	c := len(t.slots)
	for {
		j := i + 1
		if j == c {
			j = 0
		}
		next := &t.slots[j]
		if next.key == 0 || t.dist(next.key, j) == 0 {
			t.slots[i] = tslot[V]{}
			break
		}
		t.slots[i] = *next
		i = j
	}
	t.n--
}

// DeleteFunc calls f for every key exactly once with a pointer to its value
// (f may change the value) and removes the keys for which f returns true.
// f must not otherwise use the table.
func (t *table[V]) DeleteFunc(f func(key uint64, v *V) bool) {
	if t.hasZero && f(0, &t.zero) {
		var zero V
		t.zero, t.hasZero = zero, false
	}
	c := len(t.slots)
	if t.n == 0 {
		return
	}
	// Start just after an empty slot: no run of displaced keys crosses it, so
	// backward shifts never move a key from before the start to after it.
	e := 0
	for t.slots[e].key != 0 {
		e++
	}
	for i := (e + 1) % c; i != e; {
		s := &t.slots[i]
		if s.key != 0 && f(s.key, &s.val) {
			t.removeAt(i) // the next key may have moved into i: look at i again
			continue
		}
		if i++; i == c {
			i = 0
		}
	}
}
