package reducer

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"sync"

	"github.com/ranktree/ranktree/comm"
)

// PowerSGDConfig holds the hyperparameters of the PowerSGD hooks, the
// arguments of torch's PowerSGDState (torch.distributed.algorithms.
// ddp_comm_hooks.powerSGD_hook). Start from DefaultPowerSGDConfig: its
// booleans are on, as torch's defaults are. Every rank must use the same
// configuration.
type PowerSGDConfig struct {
	// MatrixApproximationRank is the rank r of the approximation M ≈ P·Qᵀ
	// (≥ 1; default 1). Lower is stronger compression; 1–4 is typical.
	MatrixApproximationRank int
	// StartPowerSGDIter is the number of synced iterations reduced by a
	// plain allreduce (divide by DivFactor, Sum) before compression starts
	// (default 1000). It must be > 1 when UseErrorFeedback or WarmStart
	// is set, as in torch, because the reducer rebuilds its buckets after
	// the first iteration and the per-bucket state is keyed by bucket.
	StartPowerSGDIter int64
	// MinCompressionRate: a tensor is compressed only if
	// (rows+cols)·r·MinCompressionRate < rows·cols; the others are
	// allreduced uncompressed (≥ 0; default 2).
	MinCompressionRate float64
	// UseErrorFeedback adds each bucket's local compression error of the
	// previous iteration to its gradients before compressing (default on).
	UseErrorFeedback bool
	// WarmStart reuses the previous iteration's Q (re-orthogonalized)
	// instead of a fresh random one (default on).
	WarmStart bool
	// OrthogonalizationEpsilon is added to each column norm in the
	// Gram-Schmidt step so all-zero columns stay finite (≥ 0; default 0).
	OrthogonalizationEpsilon float64
	// RandomSeed seeds the generator that seeds every random Q init. The
	// same seed on every rank gives the same Q everywhere (default 0).
	RandomSeed uint64
}

// DefaultPowerSGDConfig returns torch's PowerSGDState defaults: rank 1,
// start at iteration 1000, minimum compression rate 2, error feedback and
// warm start on, epsilon 0, seed 0.
func DefaultPowerSGDConfig() PowerSGDConfig {
	return PowerSGDConfig{
		MatrixApproximationRank: 1,
		StartPowerSGDIter:       1000,
		MinCompressionRate:      2,
		UseErrorFeedback:        true,
		WarmStart:               true,
	}
}

func (c PowerSGDConfig) validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: reducer: PowerSGDConfig: "+format, append([]any{comm.ErrInvalidArgument}, args...)...)
	}
	switch {
	case c.MatrixApproximationRank < 1:
		return bad("MatrixApproximationRank %d, want ≥ 1", c.MatrixApproximationRank)
	case c.StartPowerSGDIter < 0:
		return bad("StartPowerSGDIter %d, want ≥ 0", c.StartPowerSGDIter)
	case (c.UseErrorFeedback || c.WarmStart) && c.StartPowerSGDIter <= 1:
		return bad("StartPowerSGDIter %d: expect > 1 when UseErrorFeedback or WarmStart is on, because PowerSGD can only be applied after the buckets are rebuilt at the end of the first iteration", c.StartPowerSGDIter)
	case !(c.MinCompressionRate >= 0) || math.IsInf(c.MinCompressionRate, 0):
		return bad("MinCompressionRate %v, want a finite value ≥ 0", c.MinCompressionRate)
	case !(c.OrthogonalizationEpsilon >= 0) || math.IsInf(c.OrthogonalizationEpsilon, 0):
		return bad("OrthogonalizationEpsilon %v, want a finite value ≥ 0", c.OrthogonalizationEpsilon)
	}
	return nil
}

// PowerSGDState is the hyperparameters and the state PowerSGD keeps
// between iterations (torch PowerSGDState): the iteration count, the
// seed generator, and per bucket index the local error (error feedback)
// and the last P and Q (warm start). Give one state to one hook of one
// Reducer; it is safe for the reducer's use (Run under the reducer's lock,
// Wait from EndBackward).
type PowerSGDState struct {
	cfg PowerSGDConfig

	mu      sync.Mutex
	rng     *rand.Rand
	iter    int64
	buckets map[int]*psgdBucket
	before  int64 // elements before compression, summed over compressed iterations
	after   int64 // elements on the wire after compression
}

// psgdBucket is the state kept for one bucket index.
type psgdBucket struct {
	numel  int // bucket length (padded for the batched hook) the state belongs to
	pLen   int // P and Q lengths the state belongs to
	qLen   int
	errBuf any // []T: the local error of the last compressed iteration
	p, q   any // []T: the last P and Q (warm start)
}

// NewPowerSGDState validates cfg and returns a fresh state. Errors wrap
// comm.ErrInvalidArgument (rank < 1, StartPowerSGDIter ≤ 1 with error
// feedback or warm start, a negative or non-finite rate or epsilon).
func NewPowerSGDState(cfg PowerSGDConfig) (*PowerSGDState, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	return &PowerSGDState{
		cfg:     cfg,
		rng:     rand.New(rand.NewPCG(cfg.RandomSeed, 0x5bd1e995)),
		buckets: map[int]*psgdBucket{},
	}, nil
}

// Config returns the state's configuration.
func (s *PowerSGDState) Config() PowerSGDConfig { return s.cfg }

// Iter is the number of iterations the hook has finished (torch
// PowerSGDState.iter): it grows when the iteration's last bucket is done.
func (s *PowerSGDState) Iter() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.iter
}

// CompressionStats returns the effective compression rate (elements
// before / after; 0 before compression starts) and the element counts
// summed over every compressed bucket so far (torch
// PowerSGDState.compression_stats).
func (s *PowerSGDState) CompressionStats() (rate float64, before, after int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.after > 0 {
		rate = float64(s.before) / float64(s.after)
	}
	return rate, s.before, s.after
}

// bucketState returns the state of bucket idx, reset when the bucket's
// sizes changed (a rebuilt layout; the same on every rank), with a zero
// error and no warm-start memory. created reports whether it was
// (re)created. The caller holds s.mu.
func (s *PowerSGDState) bucketState(idx, numel, pLen, qLen int) (st *psgdBucket, created bool) {
	st = s.buckets[idx]
	if st == nil || st.numel != numel || st.pLen != pLen || st.qLen != qLen {
		st = &psgdBucket{numel: numel, pLen: pLen, qLen: qLen}
		s.buckets[idx] = st
		created = true
	}
	return st, created
}

// finishIter counts an iteration when its last bucket is done (torch
// maybe_increase_iter).
func (s *PowerSGDState) finishIter(isLast bool) {
	if isLast {
		s.mu.Lock()
		s.iter++
		s.mu.Unlock()
	}
}

// PowerSGDHook returns the PowerSGD comm hook with the semantics of
// torch's powerSGD_hook (Vogels et al., "PowerSGD: Practical Low-Rank
// Gradient Compression for Distributed Optimization", 2019). For the
// first StartPowerSGDIter iterations it is AllReduceHook. Afterwards, per
// bucket:
//
//  1. With error feedback, the previous local error is added to the
//     bucket (the sum is kept as the iteration's input).
//  2. Each parameter is viewed as an n×m matrix (n = Shapes[i][0], m the
//     product of the other dimensions); with r = min(n, m, rank), one that
//     passes the MinCompressionRate test is compressed, the others (every
//     one- or zero-dimensional parameter) are copied into one contiguous
//     buffer and allreduced (Sum, then divided by DivFactor).
//  3. Each compressed M gets a Q (m×r): a fresh standard normal one drawn
//     from a seed the state's generator gives (the same on every rank), or
//     with WarmStart the previous iteration's; Q is orthogonalized.
//  4. P = M·Q for every M; all Ps are allreduced as one buffer (Sum).
//  5. Each P is orthogonalized (Gram-Schmidt), Q = Mᵀ·P, all Qs are
//     allreduced as one buffer (Sum) and divided by DivFactor.
//  6. M = P·Qᵀ replaces each compressed gradient; with error feedback the
//     local error (input − result) is kept for the next iteration.
//
// Collectives per bucket: the uncompressed allreduce and the P allreduce
// start in Run; the Q allreduce needs the reduced P, so it starts when the
// reducer waits for the bucket (EndBackward waits in bucket order, so the
// order is the same on every rank): only the first round trip overlaps
// backward. float32 and float64 buckets are computed in their own type;
// float16 and bfloat16 ones in a float32 copy (P, Q and the uncompressed
// parameters then travel as float32, where torch keeps the half type),
// cast back at the end. Compressed gradients are approximations, the
// uncompressed ones exact averages. Parameter shapes come from
// GradBucket.Shapes; without them every parameter is uncompressed.
func PowerSGDHook(state *PowerSGDState) CommHook { return &powerSGDHook{s: state} }

// BatchedPowerSGDHook returns the batched PowerSGD hook with the
// semantics of torch's batched_powerSGD_hook: after StartPowerSGDIter
// plain iterations, the whole bucket (N elements) is viewed as one
// s×s matrix, s = ⌈√N⌉, zero-padded, and compressed at rank
// min(s, MatrixApproximationRank) with the steps of PowerSGDHook (error
// feedback over the padded matrix, Q always re-orthogonalized). One P and
// one Q per bucket (torch calls it faster for its fewer kernels; on the
// CPU here its compute is about that of PowerSGDHook at the same rank,
// see BenchmarkPowerSGDHook), but batching unrelated parameters destroys
// low-rank structure: use
// rank 1, and prefer PowerSGDHook when accuracy matters. On the MNIST
// example's MLP (lr 0.02, momentum 0.9) the 200k-element first-layer
// bucket compressed at rank 1 diverged with error feedback and converged,
// slowly, without it (examples/mnist/internal/ddp TestPowerSGDConverges).
func BatchedPowerSGDHook(state *PowerSGDState) CommHook {
	return &powerSGDHook{s: state, batched: true}
}

type powerSGDHook struct {
	s       *PowerSGDState
	batched bool
}

// Name is "powerSGD" or "batched_powerSGD".
func (h *powerSGDHook) Name() string {
	if h.batched {
		return "batched_powerSGD"
	}
	return "powerSGD"
}

// Run reduces b: a plain allreduce before StartPowerSGDIter, else the
// PowerSGD steps (see PowerSGDHook).
func (h *powerSGDHook) Run(ctx context.Context, g Group, b *GradBucket) HookWork {
	if h.s == nil {
		return comm.FailedWork(comm.OpAllReduce, fmt.Errorf("%w: reducer: PowerSGD hook without a PowerSGDState (use NewPowerSGDState)", comm.ErrInvalidArgument))
	}
	if h.s.Iter() < h.s.cfg.StartPowerSGDIter {
		h.s.finishIter(b.IsLast)
		return allReduceHook{}.Run(ctx, g, b)
	}
	switch b.Buffer.DType() {
	case comm.Float32:
		return runPowerSGD(h, ctx, g, b, mustSlice[float32](b.Buffer), comm.Buffer{})
	case comm.Float64:
		return runPowerSGD(h, ctx, g, b, mustSlice[float64](b.Buffer), comm.Buffer{})
	case comm.Float16, comm.BFloat16:
		// Compute in a float32 copy; the result is cast back at the end.
		work := make([]float32, b.Buffer.Len())
		if err := castInto(comm.HostBuffer(work), b.Buffer, 1); err != nil {
			return comm.FailedWork(comm.OpAllReduce, err)
		}
		return runPowerSGD(h, ctx, g, b, work, b.Buffer)
	}
	return comm.FailedWork(comm.OpAllReduce, fmt.Errorf("%w: reducer: %s hook: bucket %d holds %v gradients; PowerSGD needs a floating dtype",
		comm.ErrUnsupported, h.Name(), b.Index, b.Buffer.DType()))
}

// psgdMatrix is one compressed n×m matrix: where it lies in the working
// buffer and where its P and Q lie in the flat P and Q buffers.
type psgdMatrix struct {
	off, n, m, r int
	pOff, qOff   int
}

// psgdSpan is an uncompressed parameter's element range in the bucket.
type psgdSpan struct{ off, n int }

// psgdWork carries a bucket from Run to Wait.
type psgdWork[T psgdFloat] struct {
	s       *PowerSGDState
	st      *psgdBucket
	lctx    context.Context
	g       Group
	div     int
	isLast  bool
	bucket  []T         // the bucket's buffer, or its float32 copy
	out     comm.Buffer // a half-precision bucket the result is cast into; else invalid
	mat     []T         // where the matrices live: bucket, or the padded copy (batched)
	input   []T         // the input after error feedback (nil without error feedback)
	spans   []psgdSpan
	unc     []T
	uWork   *comm.Work
	mats    []psgdMatrix
	p, q    []T
	pWork   *comm.Work
	batched bool

	once sync.Once
	err  error
}

// Wait finishes the bucket once (the Q round trip and the decompression)
// and returns its error.
func (w *psgdWork[T]) Wait(ctx context.Context) error {
	w.once.Do(func() { w.err = w.finish(ctx) })
	return w.err
}

// runPowerSGD runs steps 1–4 of PowerSGDHook (or its batched form) on
// buf, the bucket's values, and returns the work that runs the rest. out
// is the half-precision bucket buf was cast from, or the zero Buffer.
func runPowerSGD[T psgdFloat](h *powerSGDHook, ctx context.Context, g Group, b *GradBucket, buf []T, out comm.Buffer) HookWork {
	s, cfg := h.s, h.s.cfg
	if b.DivFactor < 1 {
		return comm.FailedWork(comm.OpAllReduce, fmt.Errorf("%w: reducer: %s hook: bucket %d has DivFactor %d", comm.ErrInvalidArgument, h.Name(), b.Index, b.DivFactor))
	}
	w := &psgdWork[T]{s: s, lctx: ctx, g: g, div: b.DivFactor, isLast: b.IsLast, bucket: buf, out: out, batched: h.batched}

	// The plan: which parameters are compressed, and the P and Q sizes.
	var before, after int64
	pLen, qLen, numel := 0, 0, len(buf)
	if h.batched {
		side := int(math.Ceil(math.Sqrt(float64(len(buf)))))
		if side > 0 {
			r := min(side, cfg.MatrixApproximationRank)
			w.mats = []psgdMatrix{{off: 0, n: side, m: side, r: r}}
			pLen, qLen, numel = side*r, side*r, side*side
		}
		before, after = int64(len(buf)), int64(pLen+qLen)
	} else {
		if b.Shapes != nil && len(b.Shapes) != len(b.Params) {
			return comm.FailedWork(comm.OpAllReduce, fmt.Errorf("%w: reducer: %s hook: bucket %d has %d shapes for %d parameters", comm.ErrInvalidArgument, h.Name(), b.Index, len(b.Shapes), len(b.Params)))
		}
		for i := range b.Params {
			off, cnt := b.Offsets[i], b.Lengths[i]
			if off < 0 || cnt < 0 || off+cnt > len(buf) {
				return comm.FailedWork(comm.OpAllReduce, fmt.Errorf("%w: reducer: %s hook: bucket %d: parameter %d range [%d, %d) outside the bucket of %d", comm.ErrInvalidArgument, h.Name(), b.Index, b.Params[i], off, off+cnt, len(buf)))
			}
			n, m := cnt, 1
			if b.Shapes != nil && len(b.Shapes[i]) >= 2 {
				n = b.Shapes[i][0]
				if n > 0 {
					m = cnt / n
				}
				if n*m != cnt {
					return comm.FailedWork(comm.OpAllReduce, fmt.Errorf("%w: reducer: %s hook: bucket %d: parameter %d has shape %v but %d elements", comm.ErrInvalidArgument, h.Name(), b.Index, b.Params[i], b.Shapes[i], cnt))
				}
			}
			before += int64(cnt)
			r := min(n, m, cfg.MatrixApproximationRank)
			if b.Shapes != nil && len(b.Shapes[i]) >= 2 && cnt > 0 && float64((n+m)*r)*cfg.MinCompressionRate < float64(n*m) {
				w.mats = append(w.mats, psgdMatrix{off: off, n: n, m: m, r: r, pOff: pLen, qOff: qLen})
				pLen += n * r
				qLen += m * r
				after += int64((n + m) * r)
			} else {
				w.spans = append(w.spans, psgdSpan{off: off, n: cnt})
				after += int64(cnt)
			}
		}
	}

	s.mu.Lock()
	st, created := s.bucketState(b.Index, numel, pLen, qLen)
	s.before += before
	s.after += after
	randomize := created || !cfg.WarmStart || st.q == nil
	var seed uint64
	if randomize {
		seed = s.rng.Uint64() // one draw per initialization, in bucket order: the same on every rank
	}
	s.mu.Unlock()
	w.st = st

	// The working matrix: the bucket itself, or its zero-padded square.
	w.mat = buf
	if h.batched {
		w.mat = make([]T, numel)
		copy(w.mat, buf)
	}
	if cfg.UseErrorFeedback {
		if e, ok := st.errBuf.([]T); ok && len(e) == len(w.mat) {
			axpy(1, e, w.mat)
		}
		w.input = append([]T(nil), w.mat...)
	}

	// Uncompressed parameters: one contiguous allreduce.
	if len(w.spans) > 0 {
		total := 0
		for _, sp := range w.spans {
			total += sp.n
		}
		w.unc = make([]T, 0, total)
		for _, sp := range w.spans {
			w.unc = append(w.unc, w.mat[sp.off:sp.off+sp.n]...)
		}
		w.uWork = g.AllReduce(ctx, comm.HostBuffer(w.unc), comm.Sum)
	}

	// Compressed matrices: Q (fresh or warm), P = M·Q, allreduce P.
	if len(w.mats) > 0 {
		if randomize {
			w.p, w.q = make([]T, pLen), make([]T, qLen)
			fillNormal(w.q, seed)
		} else {
			w.p, w.q = st.p.([]T), st.q.([]T)
		}
		for _, mt := range w.mats {
			q := w.q[mt.qOff : mt.qOff+mt.m*mt.r]
			orthogonalize(q, mt.m, mt.r, cfg.OrthogonalizationEpsilon)
			mulMQ(w.mat[mt.off:], mt.n, mt.m, q, mt.r, w.p[mt.pOff:mt.pOff+mt.n*mt.r])
		}
		// P is not divided: it is orthogonalized next.
		w.pWork = g.AllReduce(ctx, comm.HostBuffer(w.p), comm.Sum)
	}
	return w
}

// finish runs steps 5–6: unpack the uncompressed average, orthogonalize
// the reduced Ps, Q = Mᵀ·P, allreduce Q, decompress, keep the error.
func (w *psgdWork[T]) finish(ctx context.Context) error {
	cfg := w.s.cfg
	if w.uWork != nil {
		if err := w.uWork.Wait(ctx); err != nil {
			return err
		}
		if err := divInto(comm.HostBuffer(w.unc), comm.HostBuffer(w.unc), w.div); err != nil {
			return err
		}
		i := 0
		for _, sp := range w.spans {
			copy(w.mat[sp.off:sp.off+sp.n], w.unc[i:i+sp.n])
			i += sp.n
		}
	}
	if w.pWork != nil {
		if err := w.pWork.Wait(ctx); err != nil {
			return err
		}
		for _, mt := range w.mats {
			p := w.p[mt.pOff : mt.pOff+mt.n*mt.r]
			orthogonalize(p, mt.n, mt.r, cfg.OrthogonalizationEpsilon)
			mulMtP(w.mat[mt.off:], mt.n, mt.m, p, mt.r, w.q[mt.qOff:mt.qOff+mt.m*mt.r])
		}
		if err := w.g.AllReduce(w.lctx, comm.HostBuffer(w.q), comm.Sum).Wait(ctx); err != nil {
			return err
		}
		if err := divInto(comm.HostBuffer(w.q), comm.HostBuffer(w.q), w.div); err != nil {
			return err
		}
		for _, mt := range w.mats {
			mulPQt(w.p[mt.pOff:mt.pOff+mt.n*mt.r], mt.n, w.q[mt.qOff:mt.qOff+mt.m*mt.r], mt.m, mt.r, w.mat[mt.off:mt.off+mt.n*mt.m])
		}
	}
	if w.batched {
		copy(w.bucket, w.mat)
	}
	if w.out.Valid() {
		if err := castInto(w.out, comm.HostBuffer(w.bucket), 1); err != nil {
			return err
		}
	}
	w.s.mu.Lock()
	if cfg.UseErrorFeedback {
		for i, v := range w.mat {
			w.input[i] -= v
		}
		w.st.errBuf = w.input
	}
	if cfg.WarmStart && w.q != nil {
		w.st.p, w.st.q = w.p, w.q
	} else {
		w.st.p, w.st.q = nil, nil
	}
	w.s.mu.Unlock()
	w.s.finishIter(w.isLast)
	return nil
}
