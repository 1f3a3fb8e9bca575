package reducer

import (
	"context"
	"fmt"
	"slices"

	"github.com/ranktree/ranktree/comm"
)

// Cross-rank model verification and parameter broadcast, as DDP's
// constructor does (c10d verify_params_across_processes and
// _sync_module_states).

// verifyModel checks that every rank holds the same parameter count and,
// per parameter, the same dtype and shape. Two allgathers: the count and
// the largest rank, then one fixed-size record per parameter. Every rank
// sees the same gathered data, so every rank returns the same verdict.
func verifyModel(ctx context.Context, g Group, params []Param, iter int64) error {
	rank, size := g.Rank(), g.Size()
	maxDims := 0
	for _, p := range params {
		maxDims = max(maxDims, len(p.Shape))
	}
	head := []int64{int64(len(params)), int64(maxDims)}
	heads := make([]int64, 2*size)
	if err := g.AllGatherInto(ctx, comm.HostBuffer(heads), comm.HostBuffer(head)).Wait(ctx); err != nil {
		return &BucketError{Rank: rank, Iteration: iter, Bucket: -2, What: "allgather of parameter counts", Err: err}
	}
	for r := 1; r < size; r++ {
		if heads[2*r] != heads[0] {
			return &Error{Rank: rank, Iteration: iter, Param: -1, Err: ErrModelMismatch,
				Msg: fmt.Sprintf("DDP expects same model across all ranks, but rank %d has %d params, while rank 0 has inconsistent %d params", r, heads[2*r], heads[0])}
		}
	}
	k := 0
	for r := range size {
		k = max(k, int(heads[2*r+1]))
	}
	width := 2 + k // dtype, ndim, dims padded with -1
	rec := make([]int64, len(params)*width)
	for i, p := range params {
		row := rec[i*width : (i+1)*width]
		row[0], row[1] = int64(p.Data.DType()), int64(len(p.Shape))
		for d := range k {
			row[2+d] = -1
			if d < len(p.Shape) {
				row[2+d] = int64(p.Shape[d])
			}
		}
	}
	all := make([]int64, len(rec)*size)
	if len(rec) > 0 {
		if err := g.AllGatherInto(ctx, comm.HostBuffer(all), comm.HostBuffer(rec)).Wait(ctx); err != nil {
			return &BucketError{Rank: rank, Iteration: iter, Bucket: -2, What: "allgather of parameter shapes", Err: err}
		}
	}
	describe := func(row []int64) string {
		dims := make([]int, row[1])
		for d := range dims {
			dims[d] = int(row[2+d])
		}
		return fmt.Sprintf("%v %v", comm.DType(row[0]), dims)
	}
	for r := 1; r < size; r++ {
		for i := range params {
			ref := all[i*width : (i+1)*width]
			got := all[(r*len(params)+i)*width : (r*len(params)+i+1)*width]
			if !slices.Equal(ref, got) {
				return &Error{Rank: rank, Iteration: iter, Param: i, Name: params[i].Name, Err: ErrModelMismatch,
					Msg: fmt.Sprintf("DDP expects same model across all ranks: params[%d] on rank %d with sizes %s appears not to match sizes of the same param on rank 0 (%s)", i, r, describe(got), describe(ref))}
			}
		}
	}
	return nil
}

// broadcastCoalesced broadcasts bufs from root, packing consecutive buffers
// of one dtype into flat chunks of at most chunkBytes (a larger buffer goes
// alone) so a model of many small tensors costs few collectives. Every
// rank must pass buffers of the same dtypes and lengths.
func broadcastCoalesced(ctx context.Context, g Group, bufs []comm.Buffer, root, chunkBytes int, iter int64) error {
	for start := 0; start < len(bufs); {
		dt := bufs[start].DType()
		end, bytes := start, 0
		for end < len(bufs) && bufs[end].DType() == dt && (end == start || bytes+bufs[end].NumBytes() <= chunkBytes) {
			bytes += bufs[end].NumBytes()
			end++
		}
		group := bufs[start:end]
		var flat comm.Buffer
		if len(group) == 1 {
			flat = group[0]
		} else {
			n := 0
			for _, b := range group {
				n += b.Len()
			}
			flat = comm.NewHostBuffer(dt, n)
			if g.Rank() == root {
				off := 0
				for _, b := range group {
					comm.CopyBuffer(flat.Slice(off, b.Len()), b)
					off += b.Len()
				}
			}
		}
		if err := g.Broadcast(ctx, flat, root).Wait(ctx); err != nil {
			return &BucketError{Rank: g.Rank(), Iteration: iter, Bucket: -2,
				What: fmt.Sprintf("broadcast of parameters %d..%d (%v) from rank %d", start, end-1, flat, root), Err: err}
		}
		if len(group) > 1 && g.Rank() != root {
			off := 0
			for _, b := range group {
				comm.CopyBuffer(b, flat.Slice(off, b.Len()))
				off += b.Len()
			}
		}
		start = end
	}
	return nil
}
