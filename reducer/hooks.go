package reducer

import (
	"context"
	"sync"

	"github.com/ranktree/ranktree/comm"
)

// GradBucket is what a comm hook reduces: one bucket's flat gradients and
// where each parameter sits in it (c10d's GradBucket).
type GradBucket struct {
	// Index is the bucket's index; buckets are handed to the hook in
	// index order, the same on every rank.
	Index int
	// Buffer holds the bucket's local gradients, not pre-divided. When the
	// HookWork's Wait returns nil, Buffer must hold the reduced result the
	// parameters get (usually the average).
	Buffer comm.Buffer
	// Params, Offsets and Lengths give each parameter's index and its
	// element range in Buffer.
	Params, Offsets, Lengths []int
	// Shapes gives each parameter's shape (Param.Shape; the product equals
	// its Lengths entry), parallel to Params: the per-parameter tensor
	// views of c10d's GradBucket.get_per_parameter_tensors. Hooks must not
	// modify it. Nil in a GradBucket built by hand: treat every parameter
	// as one-dimensional.
	Shapes [][]int
	// DivFactor is what the default reduction divides by: the world size,
	// or the active rank count under Join with DivideByActiveRanks.
	DivFactor int
	// IsLast reports whether this is the iteration's last bucket.
	IsLast bool
	// Iteration counts the synced iterations finalized before this one.
	Iteration int64
}

// HookWork is a hook's pending result; *comm.Work satisfies it. Wait
// blocks until the bucket's Buffer holds the result or ctx ends. A hook
// that completes its result itself (torch: a hook returns a Future it
// fulfils) may create a comm.Promise, return its Work and complete the
// Promise when the bucket is ready; comm.FailedWork reports a bucket the
// hook cannot reduce.
type HookWork interface {
	Wait(ctx context.Context) error
}

// CommHook replaces the bucket allreduce (c10d register_comm_hook). Run is
// called once per bucket per synced iteration, in bucket order, on every
// rank; it must launch the same collectives in the same order on every
// rank, must not block on communication, and must not touch the bucket
// after its HookWork completed. Run is called with the reducer's lock held:
// it must not call back into the Reducer. Gradients are not pre-divided
// when a hook is set: dividing is the hook's job (see DivFactor).
//
// The reducer waits for the HookWorks in bucket order, after every bucket
// of the iteration has been Run (and, where the iteration needs it, the
// local-used map allreduce launched), the same way on every rank (also in
// Join's shadow iterations). A hook may therefore launch further
// collectives from Wait, as PowerSGDHook does for its second round trip.
type CommHook interface {
	// Name identifies the hook in Stats and logs ("allreduce", ...).
	Name() string
	// Run starts reducing b across g.
	Run(ctx context.Context, g Group, b *GradBucket) HookWork
}

// FuncHook adapts a function to CommHook, for custom hooks.
type FuncHook struct {
	HookName string
	Fn       func(ctx context.Context, g Group, b *GradBucket) HookWork
}

// Name returns HookName.
func (h FuncHook) Name() string { return h.HookName }

// Run calls Fn.
func (h FuncHook) Run(ctx context.Context, g Group, b *GradBucket) HookWork { return h.Fn(ctx, g, b) }

// AllReduceHook is the default reduction as a hook: divide the bucket by
// DivFactor, then allreduce with Sum (c10d default_hooks.allreduce_hook /
// the builtin ALLREDUCE hook). Dividing first keeps fp16 sums in range.
func AllReduceHook() CommHook { return allReduceHook{} }

type allReduceHook struct{}

// Name is "allreduce".
func (allReduceHook) Name() string { return "allreduce" }

// Run divides the bucket in place and launches an allreduce with Sum.
func (allReduceHook) Run(ctx context.Context, g Group, b *GradBucket) HookWork {
	if err := divInto(b.Buffer, b.Buffer, b.DivFactor); err != nil {
		return comm.FailedWork(comm.OpAllReduce, err)
	}
	return g.AllReduce(ctx, b.Buffer, comm.Sum)
}

// FP16CompressHook casts each bucket to float16 divided by DivFactor,
// allreduces the half-size buffer with Sum and casts the result back into
// the bucket (c10d default_hooks.fp16_compress_hook). Halves the bytes on
// the wire for float32 gradients.
func FP16CompressHook() CommHook { return newCompressHook("fp16_compress", comm.Float16) }

// BF16CompressHook is FP16CompressHook with bfloat16 (c10d
// default_hooks.bf16_compress_hook): the range of float32, 8 bits of
// mantissa.
func BF16CompressHook() CommHook { return newCompressHook("bf16_compress", comm.BFloat16) }

type compressHook struct {
	name string
	to   comm.DType

	mu      sync.Mutex
	scratch map[int]comm.Buffer // by bucket index; reallocated when the size changes
}

func newCompressHook(name string, to comm.DType) *compressHook {
	return &compressHook{name: name, to: to, scratch: map[int]comm.Buffer{}}
}

// Name is "fp16_compress" or "bf16_compress".
func (h *compressHook) Name() string { return h.name }

// Run casts the bucket into a cached scratch buffer (divided by
// DivFactor) and launches its allreduce; Wait casts the sum back.
func (h *compressHook) Run(ctx context.Context, g Group, b *GradBucket) HookWork {
	if b.Buffer.DType() == h.to {
		return allReduceHook{}.Run(ctx, g, b)
	}
	h.mu.Lock()
	s, ok := h.scratch[b.Index]
	if !ok || s.Len() != b.Buffer.Len() {
		s = comm.NewHostBuffer(h.to, b.Buffer.Len())
		h.scratch[b.Index] = s
	}
	h.mu.Unlock()
	if err := castInto(s, b.Buffer, b.DivFactor); err != nil {
		return comm.FailedWork(comm.OpAllReduce, err)
	}
	return &decompressWork{w: g.AllReduce(ctx, s, comm.Sum), from: s, into: b.Buffer}
}

// decompressWork waits for the compressed allreduce and casts the result
// back into the bucket.
type decompressWork struct {
	w          *comm.Work
	from, into comm.Buffer
	once       sync.Once
	err        error
}

// Wait waits for the allreduce, then decompresses into the bucket once.
func (d *decompressWork) Wait(ctx context.Context) error {
	if err := d.w.Wait(ctx); err != nil {
		return err
	}
	d.once.Do(func() { d.err = castInto(d.into, d.from, 1) })
	return d.err
}
