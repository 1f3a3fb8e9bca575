package reducer

import (
	"context"
	"fmt"
	"slices"
	"sync"

	"github.com/rs/zerolog"

	"github.com/ranktree/ranktree/comm"
)

// Group is the part of a process group the reducer uses; *comm.ProcessGroup
// satisfies it. Collectives are asynchronous and every rank must issue them
// in the same order (c10d ProcessGroup semantics).
type Group interface {
	Rank() int
	Size() int
	AllReduce(ctx context.Context, buf comm.Buffer, op comm.ReduceOp, opts ...comm.OpOption) *comm.Work
	Broadcast(ctx context.Context, buf comm.Buffer, root int, opts ...comm.OpOption) *comm.Work
	AllGatherInto(ctx context.Context, out, in comm.Buffer, opts ...comm.OpOption) *comm.Work
}

// Param is one model parameter (a torch.nn.Parameter).
type Param struct {
	// Name appears in errors and logs ("fc1.weight"); empty means "params[i]".
	Name string
	// Data holds the parameter's values in host memory, a floating dtype.
	// New overwrites it with rank 0's values; Join with the last joiner's.
	Data comm.Buffer
	// Shape is the parameter's shape; its product must equal Data.Len().
	// Nil means one dimension of Data.Len().
	Shape []int
}

// Reducer averages gradients across the ranks of a Group in buckets,
// launching each bucket's allreduce as soon as the bucket is complete and
// every earlier bucket has launched, so communication overlaps the rest of
// backward (c10d Reducer, PyTorch 1.13). See the package documentation for
// the caller's duties. GradReady may be called from several goroutines;
// the other methods belong to the training goroutine.
type Reducer struct {
	g          Group
	rank, size int
	cfg        Config
	log        zerolog.Logger
	lctx       context.Context // launch context: New's ctx without its cancellation
	params     []Param
	infos      []TensorInfo
	names      []string

	mu          sync.Mutex
	core        *core
	bufs        []comm.Buffer // bucket storage, by bucket index
	grads       []comm.Buffer // this iteration's GradReady buffers (zero: the view itself)
	lastGrad    []comm.Buffer // the last caller buffer per parameter (results for locally unused params)
	saved       map[int][]byte
	works       []HookWork // this iteration's bucket reductions, by bucket index
	mapWork     *comm.Work
	localUsed   comm.Buffer // int32 × len(params)
	globalUsed  []bool
	hook        CommHook
	requireSync bool
	divFactor   int
	joined      bool
	failed      error
	tm          timing
	noSyncCalls int64
	rebuiltAt   []int
	rebuiltSize []int
	readyOrder  []int
	unusedLast  []int
}

// New builds a Reducer over g for params, following DDP's constructor: it
// checks that every rank has the same parameter count, dtypes and shapes
// (ErrModelMismatch otherwise, on every rank), broadcasts rank 0's
// parameters and Config.BroadcastBuffers so all ranks start identical, and
// assigns buckets as DDP's constructor does (assignInitial): by size in
// parameter order, then the bucket list reversed, since backward usually
// produces gradients in reverse order. New is a collective: every
// rank of g must call it with the same Config. ctx bounds New's own
// collectives; its values (not its cancellation) flow to later launches.
// Parameters must be host buffers of a floating dtype.
func New(ctx context.Context, g Group, params []Param, cfg Config) (*Reducer, error) {
	if g == nil {
		return nil, fmt.Errorf("%w: reducer: nil Group", comm.ErrInvalidArgument)
	}
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	r := &Reducer{
		g: g, rank: g.Rank(), size: g.Size(), cfg: cfg,
		lctx:        context.WithoutCancel(ctx),
		params:      slices.Clone(params),
		requireSync: true,
		divFactor:   g.Size(),
	}
	r.log = cfg.Log.With().Str("component", "reducer").Int("rank", r.rank).Int("world_size", r.size).Logger()
	for i := range r.params {
		p := &r.params[i]
		if p.Name == "" {
			p.Name = fmt.Sprintf("params[%d]", i)
		}
		if p.Shape == nil {
			p.Shape = []int{p.Data.Len()}
		}
		if err := checkParam(r.rank, i, *p); err != nil {
			return nil, err
		}
		r.infos = append(r.infos, TensorInfo{DType: p.Data.DType(), Count: p.Data.Len(), Device: -1})
		r.names = append(r.names, p.Name)
	}
	if err := verifyModel(ctx, g, r.params, 0); err != nil {
		return nil, err
	}
	state := make([]comm.Buffer, 0, len(r.params)+len(cfg.BroadcastBuffers))
	for _, p := range r.params {
		state = append(state, p.Data)
	}
	state = append(state, cfg.BroadcastBuffers...)
	if err := broadcastCoalesced(ctx, g, state, 0, cfg.BroadcastChunkBytes, 0); err != nil {
		return nil, err
	}
	n := len(r.params)
	lay, err := r.assignInitial()
	if err != nil {
		return nil, err
	}
	r.core = newCore(r.rank, r.names, lay, cfg.FindUnusedParameters, cfg.StaticGraph)
	r.installLayout(lay)
	r.grads = make([]comm.Buffer, n)
	r.lastGrad = make([]comm.Buffer, n)
	r.localUsed = comm.NewHostBuffer(comm.Int32, n)
	r.globalUsed = make([]bool, n)
	for i := range r.globalUsed {
		r.globalUsed[i] = true
	}
	r.log.Debug().Int("params", n).Int("buckets", len(lay.buckets)).Ints("bucket_bytes", bucketBytes(lay)).Msg("reducer ready")
	return r, nil
}

func checkParam(rank, i int, p Param) error {
	bad := func(format string, args ...any) error {
		return &Error{Rank: rank, Param: i, Name: p.Name, Err: comm.ErrInvalidArgument, Msg: fmt.Sprintf(format, args...)}
	}
	if !p.Data.Valid() {
		return bad("invalid Data buffer")
	}
	if !p.Data.IsHost() {
		return &Error{Rank: rank, Param: i, Name: p.Name, Err: comm.ErrUnsupported, Msg: fmt.Sprintf("Data %v is on a device; the reducer handles host parameters only", p.Data)}
	}
	if !p.Data.DType().IsFloating() {
		return bad("dtype %v: parameters with gradients must have a floating dtype", p.Data.DType())
	}
	numel := 1
	for _, d := range p.Shape {
		if d < 0 {
			return bad("negative dimension in shape %v", p.Shape)
		}
		numel *= d
	}
	if numel != p.Data.Len() {
		return bad("shape %v holds %d elements but Data has %d", p.Shape, numel, p.Data.Len())
	}
	return nil
}

// assignInitial computes the layout DDP starts with: c10d's
// compute_bucket_assignment_by_size over the parameters in index order
// with limits [FirstBucketBytes, BucketCapBytes], buckets sorted by their
// smallest parameter index, then the bucket list (and their limits)
// reversed, as torch.nn.parallel.DistributedDataParallel passes
// list(reversed(bucket_indices)) to the Reducer. The first bucket launched
// thus holds the last parameters, and the small first-bucket limit applies
// to the bucket holding parameter 0, launched last. With
// FindUnusedParameters there is no rebuild, so this layout stays.
func (r *Reducer) assignInitial() (*layout, error) {
	buckets, limits, err := ComputeBucketAssignmentBySize(r.infos, []int{r.cfg.FirstBucketBytes, r.cfg.BucketCapBytes}, nil)
	if err != nil {
		return nil, err
	}
	slices.Reverse(buckets)
	slices.Reverse(limits)
	return newLayout(r.infos, buckets, limits)
}

// assign computes a layout with parameters taken in order.
func (r *Reducer) assign(order []int) (*layout, error) {
	buckets, limits, err := ComputeBucketAssignmentBySize(r.infos, []int{r.cfg.FirstBucketBytes, r.cfg.BucketCapBytes}, order)
	if err != nil {
		return nil, err
	}
	return newLayout(r.infos, buckets, limits)
}

// installLayout allocates the bucket storage of lay and copies every
// parameter's current view content over, so GradBuffer views keep their
// values across a rebuild.
func (r *Reducer) installLayout(lay *layout) {
	bufs := make([]comm.Buffer, len(lay.buckets))
	for b, spec := range lay.buckets {
		bufs[b] = comm.NewHostBuffer(spec.dtype, spec.numel)
	}
	if r.bufs != nil {
		old := r.core.lay
		for p := range r.params {
			comm.CopyBuffer(viewOf(lay, bufs, p), viewOf(old, r.bufs, p))
		}
	}
	r.core.setLayout(lay)
	r.bufs = bufs
	r.works = make([]HookWork, len(lay.buckets))
}

func viewOf(l *layout, bufs []comm.Buffer, p int) comm.Buffer {
	loc := l.loc[p]
	return bufs[loc.bucket].Slice(loc.offset, loc.count)
}

func bucketBytes(l *layout) []int {
	out := make([]int, len(l.buckets))
	for i, b := range l.buckets {
		out[i] = b.numel * b.dtype.Size()
	}
	return out
}

func (r *Reducer) view(p int) comm.Buffer { return viewOf(r.core.lay, r.bufs, p) }

// GradBuffer returns parameter i's view into its bucket: with
// GradientAsBucketView, the buffer the caller writes (or accumulates) the
// gradient into before GradReady(i, GradBuffer(i)) or GradReady(i,
// comm.Buffer{}); after EndBackward it holds the averaged gradient. The
// view changes once, at the bucket rebuild after the first synced
// iteration (its values are carried over): fetch it again after that
// EndBackward. An out-of-range i gives the zero Buffer.
func (r *Reducer) GradBuffer(i int) comm.Buffer {
	r.mu.Lock()
	defer r.mu.Unlock()
	if i < 0 || i >= len(r.params) {
		return comm.Buffer{}
	}
	return r.view(i)
}

func (r *Reducer) stateErr(format string, args ...any) error {
	return &Error{Rank: r.rank, Iteration: r.core.iter, Param: -1, Err: ErrBadState, Msg: fmt.Sprintf(format, args...)}
}

// usable returns the error that forbids any call, or nil.
func (r *Reducer) usable() error {
	if r.failed != nil {
		return r.stateErr("the reducer failed earlier and cannot be used: %v", r.failed)
	}
	if r.joined {
		return r.stateErr("this rank has joined (Join); it takes no further iterations")
	}
	return nil
}
