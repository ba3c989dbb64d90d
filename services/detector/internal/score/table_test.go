package score

import (
	"encoding/binary"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
)

// checkTable compares a table with the Go map it should equal.
func checkTable(t *testing.T, tb *table[uint32], want map[uint64]uint32) {
	t.Helper()
	require.Equal(t, len(want), tb.Len())
	for k, v := range want {
		got, ok := tb.Get(k)
		require.True(t, ok, "key %d missing", k)
		require.Equal(t, v, got, "key %d", k)
	}
	seen := map[uint64]int{}
	tb.DeleteFunc(func(k uint64, v *uint32) bool { seen[k]++; return false })
	require.Len(t, seen, len(want))
	for k, n := range seen {
		require.Equal(t, 1, n, "key %d visited %d times", k, n)
	}
}

func TestTableAgainstMap(t *testing.T) {
	cases := []struct {
		name string
		key  func(r *rand.Rand) uint64
	}{
		{"random keys", func(r *rand.Rand) uint64 { return r.Uint64() }},
		{"small keys, zero included", func(r *rand.Rand) uint64 { return r.Uint64N(3000) }},
		{"keys differing in high bits", func(r *rand.Rand) uint64 { return r.Uint64N(2000) << 52 }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := rand.New(rand.NewPCG(1, 2))
			var tb table[uint32]
			want := map[uint64]uint32{}
			for step := 0; step < 200_000; step++ {
				k := tc.key(r)
				switch op := r.IntN(10); {
				case op < 4:
					v := r.Uint32()
					tb.Put(k, v)
					want[k] = v
				case op < 6: // Ref adds a missing key as zero; a write through it stays
					p := tb.Ref(k)
					require.Equal(t, want[k], *p, "key %d", k)
					*p += 7
					want[k] += 7
				case op < 9:
					tb.Delete(k)
					delete(want, k)
				default:
					got, ok := tb.Get(k)
					w, wok := want[k]
					require.Equal(t, wok, ok)
					require.Equal(t, w, got)
				}
				if step%50_000 == 0 {
					checkTable(t, &tb, want)
				}
			}
			checkTable(t, &tb, want)
			// DeleteFunc removes exactly the chosen keys and may update the rest.
			tb.DeleteFunc(func(k uint64, v *uint32) bool {
				if k%3 == 0 {
					return true
				}
				*v = uint32(k)
				return false
			})
			for k := range want {
				if k%3 == 0 {
					delete(want, k)
				} else {
					want[k] = uint32(k)
				}
			}
			checkTable(t, &tb, want)
			require.LessOrEqual(t, float64(tb.n), tableMaxLoad*float64(len(tb.slots)))
		})
	}
}

// FuzzTable runs an operation sequence against a table and a Go map.
func FuzzTable(f *testing.F) {
	f.Add([]byte{0, 1, 0, 0, 0, 0, 0, 0, 0, 1, 1, 0, 0, 0, 0, 0, 0, 0})
	f.Fuzz(func(t *testing.T, ops []byte) {
		var tb table[uint32]
		want := map[uint64]uint32{}
		for len(ops) >= 3 {
			op, k := ops[0]%4, uint64(binary.LittleEndian.Uint16(ops[1:3]))<<(ops[0]>>2&63)
			ops = ops[3:]
			switch op {
			case 0, 1:
				tb.Put(k, uint32(len(ops)))
				want[k] = uint32(len(ops))
			case 2:
				tb.Delete(k)
				delete(want, k)
			case 3:
				tb.DeleteFunc(func(key uint64, _ *uint32) bool { return key&1 == k&1 })
				for key := range want {
					if key&1 == k&1 {
						delete(want, key)
					}
				}
			}
		}
		checkTable(t, &tb, want)
	})
}

// TestTableSpreadsOneShardsKeys: the IP store picks a shard by the top bits of
// key × 0x9E3779B97F4A7C15, so one shard's table sees keys that share those
// bits; they must still spread (short probe runs), not pile into 1/64 of it.
func TestTableSpreadsOneShardsKeys(t *testing.T) {
	var tb table[ipInfo]
	n := 0
	for k := uint64(1); n < 100_000; k++ {
		if (k*0x9E3779B97F4A7C15)>>58 == 7 {
			tb.Put(k, ipInfo{})
			n++
		}
	}
	longest := 0
	for i, s := range tb.slots {
		if s.key != 0 {
			longest = max(longest, tb.dist(s.key, i))
		}
	}
	require.Less(t, longest, 100, "longest displacement among %d keys in %d slots", n, len(tb.slots))
}
