package ddp

import (
	"errors"
	"slices"
	"testing"

	"github.com/ranktree/ranktree/comm"
)

func shards(t *testing.T, cfg SamplerConfig, epoch int) [][]int {
	t.Helper()
	out := make([][]int, cfg.Size)
	for r := range cfg.Size {
		c := cfg
		c.Rank = r
		s, err := NewDistributedSampler(c)
		if err != nil {
			t.Fatal(err)
		}
		s.SetEpoch(epoch)
		out[r] = s.Indices()
		if len(out[r]) != s.NumSamples() {
			t.Fatalf("rank %d: %d indices, NumSamples %d", r, len(out[r]), s.NumSamples())
		}
	}
	return out
}

// TestSamplerMatrix checks, for several dataset sizes and world sizes
// (including 1, 3 and sizes that do not divide), that shards have equal
// length ceil(n/size), cover every index, and repeat only the padding.
func TestSamplerMatrix(t *testing.T) {
	for _, n := range []int{1, 2, 7, 10, 60, 101} {
		for _, size := range []int{1, 2, 3, 4, 8} {
			for _, shuffle := range []bool{false, true} {
				cfg := SamplerConfig{Len: n, Size: size, Shuffle: shuffle, Seed: 42}
				sh := shards(t, cfg, 0)
				per := (n + size - 1) / size
				seen := make([]int, n)
				for r, s := range sh {
					if len(s) != per {
						t.Fatalf("n=%d size=%d: rank %d has %d samples, want %d", n, size, r, len(s), per)
					}
					for _, i := range s {
						if i < 0 || i >= n {
							t.Fatalf("n=%d size=%d: index %d out of range", n, size, i)
						}
						seen[i]++
					}
				}
				pad := per*size - n
				extra := 0
				for i, c := range seen {
					if c == 0 {
						t.Fatalf("n=%d size=%d shuffle=%v: index %d on no rank", n, size, shuffle, i)
					}
					extra += c - 1
				}
				if extra != pad {
					t.Fatalf("n=%d size=%d: %d repeated indices, want padding %d", n, size, extra, pad)
				}
				if pad == 0 { // no padding: shards are pairwise disjoint
					for a := range sh {
						for b := a + 1; b < size; b++ {
							for _, i := range sh[a] {
								if slices.Contains(sh[b], i) {
									t.Fatalf("n=%d size=%d: index %d on ranks %d and %d", n, size, i, a, b)
								}
							}
						}
					}
				}
			}
		}
	}
}

// TestSamplerStrided checks torch's layout without shuffle: rank r takes
// r, r+size, ..., and the padding repeats the head of the list.
func TestSamplerStrided(t *testing.T) {
	sh := shards(t, SamplerConfig{Len: 10, Size: 4}, 0)
	want := [][]int{{0, 4, 8}, {1, 5, 9}, {2, 6, 0}, {3, 7, 1}}
	for r := range want {
		if !slices.Equal(sh[r], want[r]) {
			t.Fatalf("rank %d: %v, want %v", r, sh[r], want[r])
		}
	}
	// Padding longer than the dataset wraps around more than once.
	sh = shards(t, SamplerConfig{Len: 2, Size: 5}, 0)
	got := []int{}
	for _, s := range sh {
		got = append(got, s...)
	}
	if !slices.Equal(got, []int{0, 1, 0, 1, 0}) {
		t.Fatalf("len 2 over 5 ranks: %v", got)
	}
}

func TestSamplerDropLast(t *testing.T) {
	sh := shards(t, SamplerConfig{Len: 10, Size: 4, DropLast: true}, 0)
	want := [][]int{{0, 4}, {1, 5}, {2, 6}, {3, 7}}
	for r := range want {
		if !slices.Equal(sh[r], want[r]) {
			t.Fatalf("rank %d: %v, want %v", r, sh[r], want[r])
		}
	}
}

// TestSamplerSeededEpochs: the same (seed, epoch) gives the same order on
// every call and every rank's view; another epoch or seed reshuffles.
func TestSamplerSeededEpochs(t *testing.T) {
	cfg := SamplerConfig{Len: 1000, Size: 3, Shuffle: true, Seed: 7}
	a, b := shards(t, cfg, 2), shards(t, cfg, 2)
	for r := range a {
		if !slices.Equal(a[r], b[r]) {
			t.Fatalf("rank %d: same seed and epoch gave different shards", r)
		}
	}
	if c := shards(t, cfg, 3); slices.Equal(a[0], c[0]) {
		t.Fatal("epoch 3 repeated epoch 2's order")
	}
	cfg.Seed = 8
	if c := shards(t, cfg, 2); slices.Equal(a[0], c[0]) {
		t.Fatal("seed 8 repeated seed 7's order")
	}
	// The shuffle is a real permutation of the strided order.
	if s := shards(t, SamplerConfig{Len: 1000, Size: 1, Shuffle: true, Seed: 7}, 0)[0]; slices.IsSorted(s) {
		t.Fatal("shuffled order is sorted")
	}
}

// TestSamplerUnionIsGlobalBatch: with a per-rank batch b, the union of the
// ranks' k-th batches is the k-th global batch (b·size samples) of the
// single-rank sampler with the same seed — what makes n ranks equal to one
// rank with the global batch.
func TestSamplerUnionIsGlobalBatch(t *testing.T) {
	const n, size, b = 96, 4, 3
	one := shards(t, SamplerConfig{Len: n, Size: 1, Shuffle: true, Seed: 9}, 1)[0]
	sh := shards(t, SamplerConfig{Len: n, Size: size, Shuffle: true, Seed: 9}, 1)
	for k := 0; k*b < n/size; k++ {
		var union []int
		for r := range size {
			union = append(union, sh[r][k*b:(k+1)*b]...)
		}
		global := slices.Clone(one[k*b*size : (k+1)*b*size])
		slices.Sort(union)
		slices.Sort(global)
		if !slices.Equal(union, global) {
			t.Fatalf("batch %d: ranks' union %v, single-rank batch %v", k, union, global)
		}
	}
}

func TestSamplerConfigErrors(t *testing.T) {
	for _, c := range []SamplerConfig{
		{Len: 0, Size: 1},
		{Len: 5, Size: 0},
		{Len: 5, Size: 2, Rank: 2},
		{Len: 5, Size: 2, Rank: -1},
		{Len: 1, Size: 2, DropLast: true},
	} {
		if _, err := NewDistributedSampler(c); !errors.Is(err, comm.ErrInvalidArgument) {
			t.Errorf("%+v: %v, want ErrInvalidArgument", c, err)
		}
	}
}

// TestSamplerEpochIndices: EpochIndices(e) equals SetEpoch(e) + Indices().
func TestSamplerEpochIndices(t *testing.T) {
	a, err := NewDistributedSampler(SamplerConfig{Len: 11, Rank: 1, Size: 3, Shuffle: true, Seed: 4})
	if err != nil {
		t.Fatal(err)
	}
	b, _ := NewDistributedSampler(SamplerConfig{Len: 11, Rank: 1, Size: 3, Shuffle: true, Seed: 4})
	for e := range 3 {
		b.SetEpoch(e)
		if got, want := a.EpochIndices(e), b.Indices(); !slices.Equal(got, want) || a.Epoch() != e {
			t.Fatalf("epoch %d: %v, want %v", e, got, want)
		}
	}
}
