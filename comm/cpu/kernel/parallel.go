package kernel

import (
	"runtime"
	"sync"

	"github.com/ranktree/ranktree/comm"
)

// ParallelThreshold is the buffer size in bytes from which ReduceParallel
// splits the work across goroutines; below it one goroutine is faster than
// the cost of starting and joining others.
const ParallelThreshold = 256 << 10

// minParallelChunk is the smallest piece (bytes) one goroutine is given.
const minParallelChunk = 64 << 10

// ReduceParallel is Reduce for large buffers: when len(dst) is at least
// ParallelThreshold and GOMAXPROCS > 1 it splits dst and src into up to
// GOMAXPROCS contiguous pieces (each a multiple of 64 bytes, so elements and
// cache lines stay whole, and at least 64 KiB), reduces them concurrently on
// the caller and short-lived goroutines, and returns when all are done. The
// result is bit-identical to Reduce. Errors are those of Reduce.
func ReduceParallel(dst, src []byte, dt comm.DType, op comm.ReduceOp) error {
	t, err := validate("ReduceParallel", dst, src, dt, op)
	if err != nil {
		return err
	}
	parts := min(runtime.GOMAXPROCS(0), len(dst)/minParallelChunk)
	if len(dst) < ParallelThreshold || parts < 2 {
		reduce(dst, src, dt, t)
		return nil
	}
	chunk := (len(dst)/parts + 63) &^ 63
	var wg sync.WaitGroup
	for off := chunk; off < len(dst); off += chunk {
		end := min(off+chunk, len(dst))
		wg.Go(func() { reduce(dst[off:end], src[off:end], dt, t) })
	}
	reduce(dst[:chunk], src[:chunk], dt, t)
	wg.Wait()
	return nil
}
