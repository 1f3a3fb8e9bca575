// Package gorgonia makes a Gorgonia (gorgonia.org/gorgonia v0.9.18)
// training program data-parallel over ranktree: the counterpart of
// wrapping a torch module in DistributedDataParallel.
//
// The added lines, in a program that already builds learnables, a
// TapeMachine with BindDualValues and a Solver:
//
//	rt, err := ddp.Init(ctx)                                  // rankrunner's env, or one process
//	defer rt.Close(ctx)
//	dp, err := rtgorgonia.Wrap(ctx, rt.World(), learnables, ddp.Config{})
//	solver = dp.Solver(solver)                                // Step averages gradients first
//	// and shard the data: ddp.NewDistributedSampler(...)
//
// Caller's duties, per rank:
//
//  1. Create the learnables with values (gorgonia.WithInit or Let) in
//     the same order, with the same names and shapes on every rank, and
//     call Wrap with them: it is a collective; every rank then holds rank
//     0's values (so the unseeded global random source Gorgonia's
//     initialisers use does not matter).
//  2. Build the VM with BindDualValues(learnables...) so that every
//     learnable has a gradient after RunAll.
//  3. Each step: RunAll, then Step the wrapped solver with the same
//     learnables (NodesToValueGrads(learnables)); it averages the
//     gradients across ranks (Model.Sync) and calls the inner solver.
//     Then Reset the VM.
//  4. Give each rank batch = global batch / world size and compute a mean
//     loss over the local batch: the averaged gradient is then the
//     gradient of the global batch's mean loss.
//
// Gradient accumulation (DDP no_sync) needs nothing more: RunAll adds to
// the learnables' gradients until a solver's Step zeroes them, so run the
// micro-batches but the last under NoSync without stepping, then RunAll
// the last one and Step outside it; Step averages the summed gradients:
//
//	dp.Model().NoSync(func() error {
//		for each micro-batch but the last: RunAll; Reset   // gradients add up
//	})
//	RunAll on the last micro-batch; solver.Step(...)      // sum of the micro-steps, averaged over ranks
//
// Gorgonia's tensors keep their storage across steps, so the callbacks
// hand ddp the tensors' own []float32 or []float64.
package gorgonia

import (
	"context"
	"fmt"

	"gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	_ "go4.org/unsafe/assume-no-moving-gc" // gorgonia.org/tensor panics at init on Go ≥ 1.22 without it

	"github.com/ranktree/ranktree/comm"
	"github.com/ranktree/ranktree/ddp"
	"github.com/ranktree/ranktree/reducer"
)

// DDP is a data-parallel wrapper around a Gorgonia model's learnables.
type DDP struct {
	ctx   context.Context
	nodes gorgonia.Nodes
	model *ddp.Model
}

// Wrap verifies learnables across the ranks of g and broadcasts rank 0's
// values into them (ddp.Wrap). Each learnable becomes a ddp.Param named
// by the node's name (unique names are required; Gorgonia's own names
// are used as given), with its shape and dtype (float32 or float64).
// ctx bounds Wrap and is kept for the wrapped solver's Steps (they have
// no ctx argument in Gorgonia's Solver interface).
//
// Errors: comm.ErrInvalidArgument for a learnable without a value or of
// a non-float dtype; those of ddp.Wrap (a *ddp.MismatchError when the
// ranks' learnables differ, on every rank).
func Wrap(ctx context.Context, g reducer.Group, learnables gorgonia.Nodes, cfg ddp.Config) (*DDP, error) {
	params := make([]ddp.Param, len(learnables))
	for i, n := range learnables {
		n := n
		if n.Value() == nil {
			return nil, fmt.Errorf("%w: adapters/gorgonia: learnable %d (%s) has no value; create it WithInit", comm.ErrInvalidArgument, i, n.Name())
		}
		dt, err := dtypeOf(n.Dtype())
		if err != nil {
			return nil, fmt.Errorf("adapters/gorgonia: learnable %d (%s): %w", i, n.Name(), err)
		}
		params[i] = ddp.Param{
			Name:  n.Name(),
			Shape: append([]int(nil), n.Shape()...),
			DType: dt,
			Value: func(fn func(comm.Buffer)) error { return access(n.Value(), "value", n, fn) },
			Grad: func(fn func(comm.Buffer)) error {
				gv, err := n.Grad()
				if err != nil {
					return fmt.Errorf("%w (bind the learnables with gorgonia.BindDualValues and run the VM first)", err)
				}
				return access(gv, "gradient", n, fn)
			},
		}
	}
	m, err := ddp.Wrap(ctx, g, params, cfg)
	if err != nil {
		return nil, err
	}
	return &DDP{ctx: ctx, nodes: learnables, model: m}, nil
}

func dtypeOf(dt tensor.Dtype) (comm.DType, error) {
	switch dt {
	case tensor.Float32:
		return comm.Float32, nil
	case tensor.Float64:
		return comm.Float64, nil
	}
	return 0, fmt.Errorf("%w: dtype %v, want float32 or float64", comm.ErrInvalidArgument, dt)
}

// access hands fn the storage of v (a *tensor.Dense or a scalar F32/F64).
func access(v gorgonia.Value, what string, n *gorgonia.Node, fn func(comm.Buffer)) error {
	switch t := v.(type) {
	case *tensor.Dense:
		switch d := t.Data().(type) {
		case []float32:
			fn(comm.HostBuffer(d))
			return nil
		case []float64:
			fn(comm.HostBuffer(d))
			return nil
		case float32:
			s := []float32{d}
			fn(comm.HostBuffer(s))
			t.Set(0, s[0])
			return nil
		case float64:
			s := []float64{d}
			fn(comm.HostBuffer(s))
			t.Set(0, s[0])
			return nil
		}
	case *gorgonia.F32:
		s := []float32{float32(*t)}
		fn(comm.HostBuffer(s))
		*t = gorgonia.F32(s[0])
		return nil
	case *gorgonia.F64:
		s := []float64{float64(*t)}
		fn(comm.HostBuffer(s))
		*t = gorgonia.F64(s[0])
		return nil
	}
	return fmt.Errorf("%w: adapters/gorgonia: %s of %s is a %T, want a float32/float64 *tensor.Dense", comm.ErrInvalidArgument, what, n.Name(), v)
}

// Model is the underlying ddp.Model (NoSync, Join, Stats, Rank, Size).
func (d *DDP) Model() *ddp.Model { return d.model }

// Sync averages the learnables' gradients across ranks now (ddp.Model.Sync);
// the wrapped solver calls it for you.
func (d *DDP) Sync(ctx context.Context) error { return d.model.Sync(ctx) }

// Solver wraps s so that its Step first averages the learnables'
// gradients across ranks and then steps s. Step's model argument must be
// the wrapped learnables (NodesToValueGrads(learnables)); gradients are
// read from the learnables given to Wrap.
func (d *DDP) Solver(s gorgonia.Solver) gorgonia.Solver { return &solver{d: d, inner: s} }

type solver struct {
	d     *DDP
	inner gorgonia.Solver
}

// Step averages gradients (ddp.Model.Sync with Wrap's ctx) and steps the
// inner solver. Errors of the sync are returned and the inner solver is
// not stepped; inside Model().NoSync it returns comm.ErrUnsupported
// (stepping there would apply un-averaged gradients; RunAll there
// accumulates, see the package documentation).
func (s *solver) Step(model []gorgonia.ValueGrad) error {
	if len(model) != len(s.d.nodes) {
		return fmt.Errorf("%w: adapters/gorgonia: Step with %d values, the wrapped model has %d learnables", comm.ErrInvalidArgument, len(model), len(s.d.nodes))
	}
	if s.d.model.InNoSync() {
		return fmt.Errorf("%w: adapters/gorgonia: solver Step inside NoSync would apply this rank's own gradients; accumulate under NoSync and Step after it", comm.ErrUnsupported)
	}
	if err := s.d.model.Sync(s.d.ctx); err != nil {
		return err
	}
	return s.inner.Step(model)
}
