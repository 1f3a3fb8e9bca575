package reducer

import (
	"fmt"
	"sort"

	"github.com/ranktree/ranktree/comm"
)

// TensorInfo describes one parameter for bucket assignment: its element
// type, its element count and its device (-1 for host memory).
type TensorInfo struct {
	DType  comm.DType
	Count  int // elements
	Device int // -1 for host memory, else the CUDA device ordinal
}

// Bytes is Count × DType.Size().
func (t TensorInfo) Bytes() int { return t.Count * t.DType.Size() }

type bucketKey struct {
	dtype  comm.DType
	device int
}

// ComputeBucketAssignmentBySize groups tensors into buckets the way c10d's
// compute_bucket_assignment_by_size (reducer.cpp, PyTorch 1.13) does.
//
// Tensors are taken in the sequence given by order (indices into tensors);
// a nil order means 0, 1, …, len(tensors)-1. Each (dtype, device) pair
// fills its own open bucket. A bucket closes as soon as its size in bytes
// reaches or passes its limit; limits (bytes) are consumed one per closed
// bucket and per (dtype, device), the last one repeating: with limits
// {1 MiB, 25 MiB} the first bucket of each dtype is capped at 1 MiB and the
// rest at 25 MiB. Buckets left open at the end are kept.
//
// It returns the buckets (tensor indices, in the order taken) and each
// bucket's limit. With a nil order the buckets are sorted by their smallest
// tensor index, as c10d does when no tensor_indices are given. With an
// order, a bucket's position is the position in order of its last member,
// that is the time the bucket becomes ready if tensors become ready in
// order (c10d keeps closed buckets in closing order and leaves open ones
// in hash-map order; this is the same for closed buckets and deterministic
// for the rest).
//
// Errors (wrapping comm.ErrInvalidArgument): no limits, a limit ≤ 0, an
// invalid dtype, a negative count, or an order that is not a permutation.
func ComputeBucketAssignmentBySize(tensors []TensorInfo, limits []int, order []int) (buckets [][]int, bucketLimits []int, err error) {
	if len(limits) == 0 {
		return nil, nil, fmt.Errorf("%w: reducer: bucket assignment needs at least one size limit", comm.ErrInvalidArgument)
	}
	for i, l := range limits {
		if l <= 0 {
			return nil, nil, fmt.Errorf("%w: reducer: bucket size limit %d is %d bytes; limits must be positive", comm.ErrInvalidArgument, i, l)
		}
	}
	for i, t := range tensors {
		if !t.DType.Valid() || t.Count < 0 {
			return nil, nil, fmt.Errorf("%w: reducer: tensor %d has dtype %v and %d elements", comm.ErrInvalidArgument, i, t.DType, t.Count)
		}
	}
	seq := order
	if seq == nil {
		seq = make([]int, len(tensors))
		for i := range seq {
			seq[i] = i
		}
	} else if err := checkPermutation(order, len(tensors)); err != nil {
		return nil, nil, err
	}

	type accumulator struct {
		indices []int
		size    int
		limit   int
		last    int // position in seq of the last member
	}
	type result struct {
		indices []int
		limit   int
		last    int
	}
	var (
		out      []result
		open     = map[bucketKey]*accumulator{}
		limitPos = map[bucketKey]int{}
		seen     = map[bucketKey]bool{}
		keys     []bucketKey // first-seen order, for a deterministic tail
	)
	for pos, idx := range seq {
		t := tensors[idx]
		key := bucketKey{t.DType, t.Device}
		acc := open[key]
		if acc == nil {
			acc = &accumulator{}
			open[key] = acc
		}
		if !seen[key] {
			seen[key] = true
			keys = append(keys, key)
		}
		lp := limitPos[key]
		acc.indices = append(acc.indices, idx)
		acc.size += t.Bytes()
		acc.last = pos
		acc.limit = limits[lp]
		if acc.size >= acc.limit {
			out = append(out, result{acc.indices, acc.limit, pos})
			delete(open, key)
			if lp+1 < len(limits) {
				limitPos[key] = lp + 1
			}
		}
	}
	for _, key := range keys {
		if acc := open[key]; acc != nil && len(acc.indices) > 0 {
			out = append(out, result{acc.indices, acc.limit, acc.last})
		}
	}
	if order == nil {
		sort.SliceStable(out, func(a, b int) bool { return minInt(out[a].indices) < minInt(out[b].indices) })
	} else {
		sort.SliceStable(out, func(a, b int) bool { return out[a].last < out[b].last })
	}
	buckets = make([][]int, len(out))
	bucketLimits = make([]int, len(out))
	for i, r := range out {
		buckets[i] = r.indices
		bucketLimits[i] = r.limit
	}
	return buckets, bucketLimits, nil
}

func minInt(s []int) int {
	m := s[0]
	for _, v := range s[1:] {
		m = min(m, v)
	}
	return m
}

// checkPermutation reports whether order holds each of 0..n-1 exactly once.
func checkPermutation(order []int, n int) error {
	if len(order) != n {
		return fmt.Errorf("%w: reducer: parameter order has %d entries for %d parameters", comm.ErrInvalidArgument, len(order), n)
	}
	seen := make([]bool, n)
	for _, p := range order {
		if p < 0 || p >= n || seen[p] {
			return fmt.Errorf("%w: reducer: parameter order %v is not a permutation of 0..%d", comm.ErrInvalidArgument, order, n-1)
		}
		seen[p] = true
	}
	return nil
}
