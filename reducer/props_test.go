package reducer

import (
	"math/rand/v2"
	"slices"
	"testing"
	"testing/quick"

	"github.com/ranktree/ranktree/comm"
)

// tensorsFrom turns fuzz bytes into tensors: pairs of (dtype, count).
func tensorsFrom(data []byte) []TensorInfo {
	dts := []comm.DType{comm.Float32, comm.Float64, comm.Float16, comm.BFloat16}
	var ts []TensorInfo
	for i := 0; i+1 < len(data) && len(ts) < 64; i += 2 {
		ts = append(ts, TensorInfo{DType: dts[int(data[i])%len(dts)], Count: int(data[i+1]), Device: -1})
	}
	return ts
}

// checkAssignment verifies the invariants of a bucket assignment: every
// tensor in exactly one bucket; one dtype per bucket; each (dtype) key's
// buckets close at their limit except its last; limits follow the list
// per key; with no order, buckets sorted by smallest index.
func checkAssignment(t *testing.T, ts []TensorInfo, limits []int, order []int, buckets [][]int, bl []int) {
	t.Helper()
	seen := make([]int, len(ts))
	lastOfKey := map[comm.DType]int{}
	for b, idx := range buckets {
		if len(idx) == 0 {
			t.Fatalf("bucket %d empty", b)
		}
		dt := ts[idx[0]].DType
		for _, p := range idx {
			seen[p]++
			if ts[p].DType != dt {
				t.Fatalf("bucket %d mixes dtypes: %v", b, idx)
			}
		}
		lastOfKey[dt] = b
	}
	for p, c := range seen {
		if c != 1 {
			t.Fatalf("tensor %d in %d buckets: %v", p, c, buckets)
		}
	}
	// Walk the buckets of each dtype in the order their members were taken.
	pos := make([]int, len(ts))
	seq := order
	if seq == nil {
		seq = make([]int, len(ts))
		for i := range seq {
			seq[i] = i
		}
	}
	for i, p := range seq {
		pos[p] = i
	}
	byKey := map[comm.DType][]int{}
	for b := range buckets {
		dt := ts[buckets[b][0]].DType
		byKey[dt] = append(byKey[dt], b)
	}
	for dt, bs := range byKey {
		slices.SortFunc(bs, func(a, b int) int { return pos[buckets[a][0]] - pos[buckets[b][0]] })
		for k, b := range bs {
			want := limits[min(k, len(limits)-1)]
			if bl[b] != want {
				t.Fatalf("%v bucket #%d (%v) has limit %d, want %d", dt, k, buckets[b], bl[b], want)
			}
			size := 0
			for _, p := range buckets[b] {
				size += ts[p].Bytes()
			}
			if k < len(bs)-1 && size < want {
				t.Fatalf("%v bucket %v closed at %d bytes < limit %d", dt, buckets[b], size, want)
			}
			// Closing happens at the first member that reaches the limit.
			prefix := 0
			for j, p := range buckets[b][:len(buckets[b])-1] {
				prefix += ts[p].Bytes()
				if prefix >= want {
					t.Fatalf("%v bucket %v should have closed after member %d", dt, buckets[b], j)
				}
			}
		}
	}
	if order == nil {
		for b := 1; b < len(buckets); b++ {
			if slices.Min(buckets[b-1]) > slices.Min(buckets[b]) {
				t.Fatalf("buckets not sorted by smallest index: %v", buckets)
			}
		}
	}
}

// FuzzComputeBucketAssignment checks the assignment's invariants on
// arbitrary models, limits and orders.
func FuzzComputeBucketAssignment(f *testing.F) {
	f.Add([]byte{0, 100, 0, 200, 0, 100, 0, 50}, uint16(400), uint16(0), false)
	f.Add([]byte{0, 50, 1, 25, 0, 50, 1, 25, 0, 50, 1, 25}, uint16(200), uint16(400), true)
	f.Fuzz(func(t *testing.T, data []byte, l1, l2 uint16, reversed bool) {
		ts := tensorsFrom(data)
		limits := []int{int(l1) + 1}
		if l2 > 0 {
			limits = append(limits, int(l2))
		}
		var order []int
		if reversed {
			for p := len(ts) - 1; p >= 0; p-- {
				order = append(order, p)
			}
		}
		buckets, bl, err := ComputeBucketAssignmentBySize(ts, limits, order)
		if err != nil {
			t.Fatal(err)
		}
		checkAssignment(t, ts, limits, order, buckets, bl)
	})
}

// TestCoreLaunchProperty: for random layouts and random ready orders, the
// core launches every bucket exactly once, in index order, and only when
// it and every earlier bucket are complete (testing/quick).
func TestCoreLaunchProperty(t *testing.T) {
	prop := func(seed uint64, nParams uint8, capBytes uint8) bool {
		rng := rand.New(rand.NewPCG(seed, 1))
		n := int(nParams%20) + 1
		infos := make([]TensorInfo, n)
		names := make([]string, n)
		for i := range infos {
			infos[i] = TensorInfo{DType: []comm.DType{comm.Float32, comm.Float64}[rng.IntN(2)], Count: rng.IntN(8) + 1, Device: -1}
			names[i] = "p"
		}
		rev := make([]int, n)
		for i := range rev {
			rev[i] = n - 1 - i
		}
		buckets, limits, err := ComputeBucketAssignmentBySize(infos, []int{int(capBytes%64) + 1, int(capBytes%64) + 33}, rev)
		if err != nil {
			return false
		}
		lay, err := newLayout(infos, buckets, limits)
		if err != nil {
			return false
		}
		c := newCore(0, names, lay, false, false)
		for it := range 3 {
			set, err := c.checkBegin(nil)
			if err != nil {
				return false
			}
			c.begin(set)
			marked := make([]bool, n)
			var launched []int
			for _, p := range rng.Perm(n) {
				marked[p] = true
				got, err := c.mark(p)
				if err != nil {
					return false
				}
				for _, b := range got {
					if b != len(launched) {
						return false // not in index order
					}
					for bb := 0; bb <= b; bb++ {
						for _, q := range lay.buckets[bb].params {
							if !marked[q] {
								return false // launched before complete
							}
						}
					}
					launched = append(launched, b)
				}
			}
			if len(launched) != len(lay.buckets) {
				return false
			}
			if _, _, _, err := c.end(); err != nil {
				return false
			}
			if order := c.finalize(); (it == 0) != (order != nil) {
				return false
			}
		}
		return true
	}
	if err := quick.Check(prop, &quick.Config{MaxCount: 300}); err != nil {
		t.Fatal(err)
	}
}
