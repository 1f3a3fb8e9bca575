package ddp

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/ranktree/ranktree/comm"
	"github.com/ranktree/ranktree/comm/cpu/kernel"
	"github.com/ranktree/ranktree/reducer"
)

// Access hands fn a host buffer viewing one tensor's current contents. fn
// may read and write the buffer; it is valid only while fn runs. The
// buffer must have the Param's dtype and its shape's element count.
// Access returns an error when the tensor is not available (for example
// a framework that has not built its variables yet).
type Access func(fn func(comm.Buffer)) error

// Param is one model parameter (a torch.nn.Parameter) as ddp sees it.
type Param struct {
	// Name identifies the parameter across ranks ("fc1.weight"); it must
	// be unique and non-empty.
	Name string
	// Shape is the parameter's shape (nil: a scalar of one element).
	Shape []int
	// DType is comm.Float32 (the zero DType means Float32) or another
	// floating dtype.
	DType comm.DType
	// Value exposes the parameter's values. Wrap reads them and writes
	// rank 0's back; Join writes the final model back.
	Value Access
	// Grad exposes the parameter's gradient after backward. Sync reads it
	// and writes the reduced gradient back. BroadcastState ignores it.
	Grad Access
}

// Numel is the product of Shape (1 for a nil shape).
func (p Param) Numel() int {
	n := 1
	for _, d := range p.Shape {
		n *= d
	}
	return n
}

func (p Param) dtype() comm.DType {
	if p.DType == 0 {
		return comm.Float32
	}
	return p.DType
}

// Config configures Wrap. The zero Config is valid.
type Config struct {
	// Reducer configures the underlying reducer.Reducer (bucket sizes,
	// UnevenInputs for Join, FindUnusedParameters, logging). ddp always
	// sets GradientAsBucketView (its own buffers are the bucket views) and
	// ignores BroadcastBuffers.
	Reducer reducer.Config
	// CommHook replaces the default averaging allreduce, e.g.
	// reducer.FP16CompressHook() (DDP register_comm_hook). Every rank must
	// pass the same hook.
	CommHook reducer.CommHook
}

// Stats are a Model's timings since Wrap, for reports such as "fraction of
// the step in communication".
type Stats struct {
	// Syncs counts the Sync calls that communicated (NoSync ones excluded).
	Syncs int64
	// SyncTime is the total wall time spent inside those Sync calls
	// (copies in and out plus the allreduces), ns.
	SyncTime time.Duration
	// CommTime is the part of SyncTime between the first bucket's launch
	// and the end of EndBackward: the wait on the collectives, ns.
	CommTime time.Duration
	// Accumulated counts the Accumulate calls since Wrap (micro-steps
	// whose gradients were kept for a later Sync).
	Accumulated int64
	// Reducer is the reducer's own statistics.
	Reducer reducer.Stats
}

// Model is a data-parallel wrapper around one model's parameters (the
// DistributedDataParallel of a framework without autograd hooks). It
// belongs to the training goroutine.
type Model struct {
	g      reducer.Group
	params []Param
	vals   []comm.Buffer // ddp-owned host copies of the values: reducer.Param.Data
	red    *reducer.Reducer

	// acc holds the gradient sums kept by Accumulate (allocated on first
	// use, one host buffer per parameter); accSteps counts the micro-steps
	// in it since the last communicating Sync (0: acc holds nothing).
	acc        []comm.Buffer
	accScratch []comm.Buffer // Accumulate's staging copy (second and later micro-steps)
	accSteps   int

	mu     sync.Mutex
	noSync bool
	stats  Stats
}

// Wrap verifies params across the ranks of g, builds a reducer over
// ddp-owned host copies of the values and broadcasts rank 0's values
// into every rank's parameters (through Value), as
// DistributedDataParallel's constructor does. It is a collective: every
// rank of g calls it with the same parameter list and Config.
//
// Errors, the same on every rank: a *MismatchError (errors.Is
// comm.ErrMismatch) when the lists differ in count, a name, a shape or a
// dtype, naming the first parameter that differs; a *ParamError (errors.Is
// comm.ErrInvalidArgument) when some rank's list is invalid (empty or
// duplicate name, negative dimension, non-floating dtype, missing Value or
// Grad), naming that rank; errors of Value callbacks; reducer errors.
func Wrap(ctx context.Context, g reducer.Group, params []Param, cfg Config) (*Model, error) {
	if g == nil {
		return nil, fmt.Errorf("%w: ddp: nil process group", comm.ErrInvalidArgument)
	}
	if err := agree(ctx, g, params, true, "Wrap"); err != nil {
		return nil, err
	}
	m := &Model{g: g, params: append([]Param(nil), params...)}
	rps := make([]reducer.Param, len(params))
	for i, p := range params {
		m.vals = append(m.vals, comm.NewHostBuffer(p.dtype(), p.Numel()))
		if err := readInto(p.Value, m.vals[i], p.Name, "value"); err != nil {
			return nil, err
		}
		rps[i] = reducer.Param{Name: p.Name, Data: m.vals[i], Shape: shapeOrScalar(p.Shape)}
	}
	rc := cfg.Reducer
	rc.GradientAsBucketView = true
	rc.BroadcastBuffers = nil
	red, err := reducer.New(ctx, g, rps, rc)
	if err != nil {
		return nil, fmt.Errorf("ddp: rank %d: %w", g.Rank(), err)
	}
	if cfg.CommHook != nil {
		if err := red.RegisterCommHook(cfg.CommHook); err != nil {
			return nil, err
		}
	}
	m.red = red
	if err := m.writeValues(); err != nil {
		return nil, err
	}
	return m, nil
}

func shapeOrScalar(s []int) []int {
	if s == nil {
		return []int{1}
	}
	return append([]int(nil), s...)
}

// readInto copies the tensor behind a into dst.
func readInto(a Access, dst comm.Buffer, name, what string) error {
	var bad error
	err := a(func(b comm.Buffer) {
		if b.DType() != dst.DType() || b.Len() != dst.Len() || !b.IsHost() {
			bad = fmt.Errorf("%w: ddp: %s of %q is %v, want host %v×%d", comm.ErrInvalidArgument, what, name, b, dst.DType(), dst.Len())
			return
		}
		comm.CopyBuffer(dst, b)
	})
	if err != nil {
		return fmt.Errorf("ddp: reading the %s of %q: %w", what, name, err)
	}
	return bad
}

// writeFrom copies src into the tensor behind a.
func writeFrom(a Access, src comm.Buffer, name, what string) error {
	var bad error
	err := a(func(b comm.Buffer) {
		if b.DType() != src.DType() || b.Len() != src.Len() || !b.IsHost() {
			bad = fmt.Errorf("%w: ddp: %s of %q is %v, want host %v×%d", comm.ErrInvalidArgument, what, name, b, src.DType(), src.Len())
			return
		}
		comm.CopyBuffer(b, src)
	})
	if err != nil {
		return fmt.Errorf("ddp: writing the %s of %q: %w", what, name, err)
	}
	return bad
}

func (m *Model) writeValues() error {
	for i, p := range m.params {
		if err := writeFrom(p.Value, m.vals[i], p.Name, "value"); err != nil {
			return err
		}
	}
	return nil
}

// Rank is this rank in the wrapped group.
func (m *Model) Rank() int { return m.g.Rank() }

// Size is the number of ranks (the world size of the wrapped group).
func (m *Model) Size() int { return m.g.Size() }

// Params returns the wrapped parameter list (not a copy of the tensors).
func (m *Model) Params() []Param { return append([]Param(nil), m.params...) }

// Reducer is the underlying reducer (Stats, SyncBuffers-free operations).
func (m *Model) Reducer() *reducer.Reducer { return m.red }

// Sync averages every parameter's gradient across ranks (DDP's backward
// hooks and finalize in one call, for frameworks that hand back all
// gradients at once). It reads gradients through Grad in reverse
// parameter order into the reducer's bucket views, marking each ready so
// that full buckets launch while later gradients are still being copied,
// waits for the reductions (reducer.EndBackward), and writes the result
// back through Grad. Inside NoSync it does nothing and returns nil.
//
// Errors: those of Grad callbacks; reducer errors (a *reducer.BucketError
// for a failed collective, after which the Model is unusable;
// reducer.ErrUnfinishedReduction and friends for a rank that skipped a
// step are caught by the reducer's checks).
func (m *Model) Sync(ctx context.Context) error {
	m.mu.Lock()
	skip := m.noSync
	m.mu.Unlock()
	if skip {
		return nil
	}
	start := time.Now()
	var firstLaunch time.Time
	for i := len(m.params) - 1; i >= 0; i-- {
		p := m.params[i]
		gb := m.red.GradBuffer(i)
		if err := readInto(p.Grad, gb, p.Name, "gradient"); err != nil {
			return err
		}
		if m.accSteps > 0 {
			if err := kernel.Reduce(gb.Bytes(), m.acc[i].Bytes(), gb.DType(), comm.Sum); err != nil {
				return fmt.Errorf("ddp: adding the accumulated gradient of %q: %w", p.Name, err)
			}
		}
		if firstLaunch.IsZero() {
			firstLaunch = time.Now()
		}
		if err := m.red.GradReady(i, comm.Buffer{}); err != nil {
			return err
		}
	}
	if firstLaunch.IsZero() {
		firstLaunch = time.Now()
	}
	if err := m.red.EndBackward(ctx); err != nil {
		return err
	}
	m.accSteps = 0
	commEnd := time.Now()
	for i, p := range m.params {
		if err := writeFrom(p.Grad, m.red.GradBuffer(i), p.Name, "gradient"); err != nil {
			return err
		}
	}
	m.mu.Lock()
	m.stats.Syncs++
	m.stats.SyncTime += time.Since(start)
	m.stats.CommTime += commEnd.Sub(firstLaunch)
	m.mu.Unlock()
	return nil
}

// Accumulate keeps this micro-step's gradients (read through Grad) for
// the next communicating Sync, which adds them to the gradients it reads:
// gradient accumulation for frameworks whose backward overwrites the
// gradients instead of adding to them, as Gorgonia's RunAll and GoMLX's
// gradient graph do (torch accumulates into .grad by itself). The DDP
// pattern is
//
//	m.NoSync(func() error {
//		for each micro-batch but the last: backward; m.Accumulate()
//	})
//	backward on the last micro-batch; m.Sync(ctx)    // sum of all micro-steps, averaged over ranks
//
// As with torch's no_sync, Sync reduces the sum of the micro-steps'
// gradients: scale the loss (or the learning rate) by 1/micro-steps for a
// mean. Accumulate works inside NoSync or outside it and never
// communicates. The kept sums cost one host copy of the gradients,
// allocated at the first call (a second, staging copy from the second
// micro-step on); a communicating Sync empties them.
//
// Errors: those of Grad callbacks (a gradient of the wrong dtype or
// length is comm.ErrInvalidArgument); on error the kept sums are left as
// they were before the call.
func (m *Model) Accumulate() error {
	if m.acc == nil {
		m.acc = newGradBuffers(m.params)
	}
	if m.accSteps == 0 { // the first micro-step reads straight into the sums
		if err := m.readGrads(m.acc); err != nil {
			return err
		}
	} else {
		// Read every gradient before adding any, so that a failing
		// callback leaves the kept sums unchanged.
		if m.accScratch == nil {
			m.accScratch = newGradBuffers(m.params)
		}
		if err := m.readGrads(m.accScratch); err != nil {
			return err
		}
		for i, b := range m.accScratch {
			if err := kernel.Reduce(m.acc[i].Bytes(), b.Bytes(), b.DType(), comm.Sum); err != nil {
				return fmt.Errorf("ddp: accumulating the gradient of %q: %w", m.params[i].Name, err)
			}
		}
	}
	m.accSteps++
	m.mu.Lock()
	m.stats.Accumulated++
	m.mu.Unlock()
	return nil
}

func newGradBuffers(params []Param) []comm.Buffer {
	bufs := make([]comm.Buffer, len(params))
	for i, p := range params {
		bufs[i] = comm.NewHostBuffer(p.dtype(), p.Numel())
	}
	return bufs
}

func (m *Model) readGrads(dst []comm.Buffer) error {
	for i, p := range m.params {
		if err := readInto(p.Grad, dst[i], p.Name, "gradient"); err != nil {
			return err
		}
	}
	return nil
}

// NoSync runs fn with gradient synchronization off (DDP no_sync()): Sync
// calls inside fn do nothing, the framework accumulates gradients, and the
// first Sync after NoSync reduces the accumulated sums. fn's error is
// returned.
func (m *Model) NoSync(fn func() error) error {
	if fn == nil {
		return fmt.Errorf("%w: ddp: NoSync(nil)", comm.ErrInvalidArgument)
	}
	m.mu.Lock()
	prev := m.noSync
	m.noSync = true
	m.mu.Unlock()
	err := m.red.NoSync(fn)
	m.mu.Lock()
	m.noSync = prev
	m.mu.Unlock()
	return err
}

// InNoSync reports whether the caller is inside NoSync (Sync does
// nothing). Adapters whose step applies the optimizer right after Sync
// use it to refuse stepping on un-averaged gradients.
func (m *Model) InNoSync() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.noSync
}

// Join is called once by every rank when its inputs run out (uneven
// inputs; torch.distributed.algorithms.Join with DDP): until every rank
// has joined it shadows the other ranks' Sync calls, then every rank gets
// the final model of the last rank to join, written back through Value.
// It needs Config.Reducer.UnevenInputs on every rank. Errors are the
// reducer's (reducer.Reducer.Join) and those of Value callbacks.
func (m *Model) Join(ctx context.Context) error {
	for i, p := range m.params {
		if err := readInto(p.Value, m.vals[i], p.Name, "value"); err != nil {
			return err
		}
	}
	if err := m.red.Join(ctx); err != nil {
		return err
	}
	return m.writeValues()
}

// Stats returns the Model's timings so far.
func (m *Model) Stats() Stats {
	m.mu.Lock()
	s := m.stats
	m.mu.Unlock()
	s.Reducer = m.red.Stats()
	return s
}

// BroadcastState copies rank 0's contents of state (optimizer state such
// as momentum buffers or Adam moments, or any tensors the ranks must
// share) into every rank, through each Param's Value (Grad is not used).
// It is a collective and verifies the lists first: a list that differs
// between ranks fails on every rank with a *MismatchError, as Wrap does.
// Tensors of one dtype travel in one coalesced broadcast.
func BroadcastState(ctx context.Context, g reducer.Group, state []Param) error {
	if g == nil {
		return fmt.Errorf("%w: ddp: nil process group", comm.ErrInvalidArgument)
	}
	if err := agree(ctx, g, state, false, "BroadcastState"); err != nil {
		return err
	}
	byType := map[comm.DType][]int{}
	var order []comm.DType
	for i, p := range state {
		dt := p.dtype()
		if _, ok := byType[dt]; !ok {
			order = append(order, dt)
		}
		byType[dt] = append(byType[dt], i)
	}
	for _, dt := range order {
		idx := byType[dt]
		n := 0
		for _, i := range idx {
			n += state[i].Numel()
		}
		flat := comm.NewHostBuffer(dt, n)
		if g.Rank() == 0 {
			off := 0
			for _, i := range idx {
				k := state[i].Numel()
				if err := readInto(state[i].Value, flat.Slice(off, k), state[i].Name, "state"); err != nil {
					return err
				}
				off += k
			}
		}
		if n > 0 {
			if err := g.Broadcast(ctx, flat, 0).Wait(ctx); err != nil {
				return fmt.Errorf("ddp: rank %d: broadcasting %d %v state elements from rank 0: %w", g.Rank(), n, dt, err)
			}
		}
		if g.Rank() != 0 {
			off := 0
			for _, i := range idx {
				k := state[i].Numel()
				if err := writeFrom(state[i].Value, flat.Slice(off, k), state[i].Name, "state"); err != nil {
					return err
				}
				off += k
			}
		}
	}
	return nil
}
