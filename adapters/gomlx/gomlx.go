// Package gomlx makes a GoMLX (github.com/gomlx/gomlx v0.26.0) training
// program data-parallel over ranktree: a Trainer with the constructor
// arguments of train.NewTrainer that averages gradients across processes
// the way torch.nn.parallel.DistributedDataParallel does.
//
// GoMLX's train.Trainer computes and applies gradients inside one compiled
// graph, with no place for the host to reduce them. This Trainer splits a
// step into two graphs: graph 1 runs the model and the loss and returns
// [loss, gradients..., train metrics...]; the host averages the gradients
// through ranktree (ddp.Model.Sync: reducer buckets, c10d order, comm
// hooks); graph 2 feeds the averaged gradients to the optimizer's
// UpdateGraphWithGradients (train.OptimizeWithGradients: SGD and the Adam
// family implement it), which updates the variables.
//
// The added lines, in a program that trains with train.NewTrainer and
// the pure-Go backend (import _ "github.com/gomlx/gomlx/backends/simplego";
// never the XLA backend on machines without network, it downloads its
// plugin at start):
//
//	rt, err := ddp.Init(ctx)                // rankrunner's env, or one process
//	defer rt.Close(ctx)
//	trainer, err := rtgomlx.NewTrainer(ctx, rt.World(), ddp.Config{},
//		backend, mlctx, modelFn, lossFn, optimizer, trainMetrics, evalMetrics) // was train.NewTrainer(backend, ...)
//	// and shard the data: ddp.NewDistributedSampler(...) in the Dataset
//
// Caller's duties, per rank:
//
//  1. Build the same model (same variable scopes and shapes) on every rank.
//     Variables exist only after the first graph build, so the first
//     TrainStep is a collective: it builds graph 1, wraps the trainable
//     variables with ddp.Wrap (which checks them across ranks and
//     broadcasts rank 0's values), then runs graph 1 again on the
//     broadcast values.
//  2. Feed each rank global batch / world size samples per step (a
//     Dataset over a ddp.DistributedSampler shard); the loss must be a
//     mean over the local batch so the averaged gradient is the global
//     batch's.
//  3. Call TrainStep (or Train) the same number of times on every rank.
//  4. Eval with any GoMLX Dataset and eval metrics (train.Trainer's Eval on
//     the same variables).
//
// Gradient accumulation: TrainStep inside Model().NoSync keeps the
// micro-step's gradients instead of stepping (see TrainStep); Wrap makes
// Model() usable before the first step.
//
// Train metrics returned by TrainStep are this rank's (computed on its
// local batch); the loss is this rank's local mean.
package gomlx

import (
	stdctx "context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/gomlx/gomlx/backends"
	"github.com/gomlx/gomlx/pkg/core/dtypes"
	"github.com/gomlx/gomlx/pkg/core/graph"
	"github.com/gomlx/gomlx/pkg/core/tensors"
	"github.com/gomlx/gomlx/pkg/ml/context"
	"github.com/gomlx/gomlx/pkg/ml/train"
	"github.com/gomlx/gomlx/pkg/ml/train/metrics"
	"github.com/gomlx/gomlx/pkg/ml/train/optimizers"

	"github.com/ranktree/ranktree/comm"
	"github.com/ranktree/ranktree/ddp"
	"github.com/ranktree/ranktree/reducer"
)

// Trainer is a data-parallel counterpart of GoMLX's train.Trainer. It
// belongs to one goroutine.
type Trainer struct {
	sctx      stdctx.Context
	g         reducer.Group
	cfg       ddp.Config
	backend   backends.Backend
	mlctx     *context.Context
	modelFn   train.ModelFn
	lossFn    train.LossFn
	opt       train.OptimizeWithGradients
	trainMets []metrics.Interface
	eval      *train.Trainer

	gradExecs map[string]*gradExec
	apply     *context.Exec
	vars      []*context.Variable // trainable variables in gradient order
	grads     []*tensors.Tensor   // this step's gradients (graph 1's outputs)
	model     *ddp.Model
	steps     int64
	times     Times
}

// Times are a Trainer's accumulated step phases (wall time).
type Times struct {
	// Steps counts the TrainStep calls that updated the variables (the
	// micro-steps kept under NoSync are Model().Stats().Accumulated).
	Steps int64
	// Forward is the time in graph 1 (model, loss, gradients), Sync in
	// ddp.Model.Sync (host copies and allreduces) and ddp.Model.Accumulate,
	// Apply in graph 2 (the optimizer).
	Forward, Sync, Apply time.Duration
}

type gradExec struct {
	exec                *context.Exec
	numInputs, numLabel int
}

// NewTrainer returns a data-parallel Trainer over the ranks of g. The
// arguments after cfg are train.NewTrainer's; optimizer must implement
// train.OptimizeWithGradients (optimizers.StochasticGradientDescent, Adam,
// AdamW ... do). ctx bounds the collectives of every later TrainStep (Wrap
// at the first one, Sync at each). Nothing is communicated until the
// first TrainStep.
//
// Errors: comm.ErrInvalidArgument for a nil group, backend, context,
// model function or optimizer, or an optimizer without
// UpdateGraphWithGradients.
func NewTrainer(ctx stdctx.Context, g reducer.Group, cfg ddp.Config, backend backends.Backend, mlctx *context.Context,
	modelFn train.ModelFn, lossFn train.LossFn, optimizer optimizers.Interface,
	trainMetrics, evalMetrics []metrics.Interface) (*Trainer, error) {
	switch {
	case g == nil || backend == nil || mlctx == nil || modelFn == nil || lossFn == nil || optimizer == nil:
		return nil, fmt.Errorf("%w: adapters/gomlx: NewTrainer needs a group, backend, context, model function, loss function and optimizer", comm.ErrInvalidArgument)
	}
	opt, ok := optimizer.(train.OptimizeWithGradients)
	if !ok {
		return nil, fmt.Errorf("%w: adapters/gomlx: optimizer %T has no UpdateGraphWithGradients (train.OptimizeWithGradients); use SGD or an Adam variant", comm.ErrInvalidArgument, optimizer)
	}
	t := &Trainer{
		sctx: ctx, g: g, cfg: cfg, backend: backend, mlctx: mlctx,
		modelFn: modelFn, lossFn: lossFn, opt: opt, trainMets: trainMetrics,
		gradExecs: map[string]*gradExec{},
	}
	// Evaluation reuses GoMLX's own Trainer on the same variables; its
	// graphs are built after ours, so the context must not insist on
	// creating the variables.
	t.eval = train.NewTrainer(backend, mlctx.Checked(false), modelFn, lossFn, optimizer, nil, evalMetrics)
	return t, nil
}

// Model is the ddp.Model over the trainable variables; nil before the
// first TrainStep.
func (t *Trainer) Model() *ddp.Model { return t.model }

// Times returns the accumulated step phases.
func (t *Trainer) Times() Times { return t.times }

// Context is the GoMLX context holding the variables.
func (t *Trainer) Context() *context.Context { return t.mlctx }

// Eval runs the evaluation metrics over ds (train.Trainer.Eval): the mean
// loss first, then evalMetrics, on this rank's model (identical on every
// rank after a TrainStep).
func (t *Trainer) Eval(ds train.Dataset) ([]*tensors.Tensor, error) { return t.eval.Eval(ds) }

// EvalMetrics are the metrics Eval returns, in order.
func (t *Trainer) EvalMetrics() []metrics.Interface { return t.eval.EvalMetrics() }

// gradGraph is graph 1: model, loss, gradients, train metrics.
func (t *Trainer) gradGraph(spec any, ctx *context.Context, inputs, labels []*graph.Node) []*graph.Node {
	g := inputs[0].Graph()
	ctx.SetTraining(g, true)
	predictions := t.modelFn(ctx, spec, inputs)
	base := t.lossFn(labels, predictions)
	if !base.Shape().IsScalar() {
		base = graph.ReduceAllMean(base)
	}
	train.SetLossNoRegularization(ctx, base)
	train.AddLoss(ctx, base)
	loss := train.GetLosses(ctx, g)
	grads := ctx.BuildTrainableVariablesGradientsGraph(loss)
	vars := make([]*context.Variable, 0, len(grads))
	for v := range ctx.IterVariables() {
		if v.Trainable && v.InUseByGraph(g) {
			vars = append(vars, v)
		}
	}
	if t.vars == nil {
		t.vars = vars
	}
	out := append([]*graph.Node{loss}, grads...)
	for _, m := range t.trainMets {
		out = append(out, m.UpdateGraph(ctx, labels, predictions))
	}
	return out
}

// applyGraph is graph 2: the optimizer on the host-averaged gradients.
func (t *Trainer) applyGraph(ctx *context.Context, grads []*graph.Node) {
	g := grads[0].Graph()
	ctx.SetTraining(g, true)
	for _, v := range t.vars {
		v.ValueGraph(g) // mark the variables used by this graph, in graph 1's order
	}
	t.opt.UpdateGraphWithGradients(ctx, grads, t.vars[0].DType())
	train.ExecPerStepUpdateGraphFn(ctx, g)
}

// runGrad runs graph 1 for spec.
func (t *Trainer) runGrad(spec any, inputs, labels []*tensors.Tensor) ([]*tensors.Tensor, error) {
	key := fmt.Sprint(spec)
	ge, ok := t.gradExecs[key]
	if !ok {
		mlctx := t.mlctx
		if len(t.gradExecs) > 0 {
			mlctx = mlctx.Checked(false)
		}
		ni, nl := len(inputs), len(labels)
		exec, err := context.NewExec(t.backend, mlctx, func(ctx *context.Context, all []*graph.Node) []*graph.Node {
			return t.gradGraph(spec, ctx, all[:ni], all[ni:])
		})
		if err != nil {
			return nil, err
		}
		ge = &gradExec{exec: exec.WithName("ranktree gradients"), numInputs: ni, numLabel: nl}
		t.gradExecs[key] = ge
	}
	if len(inputs) != ge.numInputs || len(labels) != ge.numLabel {
		return nil, fmt.Errorf("%w: adapters/gomlx: %d inputs and %d labels for spec %v, earlier %d and %d",
			comm.ErrInvalidArgument, len(inputs), len(labels), spec, ge.numInputs, ge.numLabel)
	}
	args := make([]any, 0, len(inputs)+len(labels))
	for _, x := range inputs {
		args = append(args, x)
	}
	for _, x := range labels {
		args = append(args, x)
	}
	return ge.exec.Exec(args...)
}

// Wrap makes the model's variables exist and wraps them, without
// training: it builds and runs graph 1 once on the batch (whose gradients
// it discards: they come from this rank's own initial values), then
// ddp.Wrap checks the trainable variables across ranks and broadcasts
// rank 0's values into them. It is a collective. The first TrainStep
// calls it; call it yourself to use Model() (NoSync from the first step
// on, BroadcastState, Stats) before training. Later calls do nothing.
//
// Errors: GoMLX's graph errors; comm.ErrInvalidArgument for a model
// without trainable variables or with a non-float variable; ddp.Wrap's
// (a *ddp.MismatchError on every rank when the ranks' variables differ).
func (t *Trainer) Wrap(spec any, inputs, labels []*tensors.Tensor) error {
	if t.model != nil {
		return nil
	}
	if len(inputs) == 0 {
		return fmt.Errorf("%w: adapters/gomlx: Wrap without inputs", comm.ErrInvalidArgument)
	}
	outs, err := t.runGrad(spec, inputs, labels)
	if err != nil {
		return err
	}
	finalize(outs)
	return t.wrap()
}

// wrap registers the trainable variables with ddp (a collective).
func (t *Trainer) wrap() error {
	if len(t.vars) == 0 {
		return fmt.Errorf("%w: adapters/gomlx: the model has no trainable variables", comm.ErrInvalidArgument)
	}
	params := make([]ddp.Param, len(t.vars))
	for i, v := range t.vars {
		dt, err := dtypeOf(v.DType())
		if err != nil {
			return fmt.Errorf("adapters/gomlx: variable %s: %w", v.ScopeAndName(), err)
		}
		params[i] = ddp.Param{
			Name: v.ScopeAndName(), Shape: append([]int(nil), v.Shape().Dimensions...), DType: dt,
			Value: func(fn func(comm.Buffer)) error {
				val, err := v.Value() // a new tensor after every step: look it up each time
				if err != nil {
					return err
				}
				return access(val, fn)
			},
			Grad: func(fn func(comm.Buffer)) error {
				if i >= len(t.grads) || t.grads[i] == nil {
					return errors.New("no gradient computed yet")
				}
				return access(t.grads[i], fn)
			},
		}
	}
	m, err := ddp.Wrap(t.sctx, t.g, params, t.cfg)
	if err != nil {
		return err
	}
	t.model = m
	return nil
}

func dtypeOf(dt dtypes.DType) (comm.DType, error) {
	switch dt {
	case dtypes.Float32:
		return comm.Float32, nil
	case dtypes.Float64:
		return comm.Float64, nil
	}
	return 0, fmt.Errorf("%w: dtype %s, want float32 or float64", comm.ErrInvalidArgument, dt)
}

// access hands fn the tensor's flat data, valid only inside
// MutableFlatData's callback (GoMLX invalidates device copies).
func access(x *tensors.Tensor, fn func(comm.Buffer)) error {
	var bad error
	err := x.MutableFlatData(func(flat any) {
		switch d := flat.(type) {
		case []float32:
			fn(comm.HostBuffer(d))
		case []float64:
			fn(comm.HostBuffer(d))
		default:
			bad = fmt.Errorf("%w: adapters/gomlx: tensor data %T, want []float32 or []float64", comm.ErrInvalidArgument, flat)
		}
	})
	if err != nil {
		return err
	}
	return bad
}

// TrainStep trains one step on this rank's batch (train.Trainer.TrainStep
// semantics): graph 1, the cross-rank gradient average, graph 2. It
// returns [loss, train metrics...] of this rank's batch. The first call
// is also the collective that wraps the model (see the package doc). The
// tensors in inputs and labels are not finalized.
//
// Gradient accumulation (DDP no_sync): inside Model().NoSync, TrainStep
// runs graph 1 only and keeps the gradients (ddp.Model.Accumulate); it
// neither communicates nor applies the optimizer. The next TrainStep
// outside NoSync adds the kept gradients to its own, averages the sum
// across ranks and applies it once:
//
//	trainer.Model().NoSync(func() error { // after the first TrainStep
//		for each micro-batch but the last: trainer.TrainStep(...)
//	})
//	trainer.TrainStep(last micro-batch)    // one update on the sum of the micro-steps
//
// As with torch's no_sync the update uses the sum of the micro-steps'
// gradients: scale the learning rate (or the loss) by 1/micro-steps for
// their mean.
//
// Errors: graph build/execution errors from GoMLX; ddp and reducer errors
// (after which the Trainer is unusable: tear the job down).
func (t *Trainer) TrainStep(spec any, inputs, labels []*tensors.Tensor) ([]*tensors.Tensor, error) {
	if len(inputs) == 0 {
		return nil, fmt.Errorf("%w: adapters/gomlx: TrainStep without inputs", comm.ErrInvalidArgument)
	}
	start := time.Now()
	if err := t.Wrap(spec, inputs, labels); err != nil {
		return nil, err
	}
	outs, err := t.runGrad(spec, inputs, labels)
	if err != nil {
		return nil, err
	}
	n := len(t.vars)
	if len(outs) < 1+n {
		return nil, fmt.Errorf("adapters/gomlx: graph 1 returned %d outputs, want ≥ %d", len(outs), 1+n)
	}
	t.grads = outs[1 : 1+n]
	fwd := time.Now()
	if t.model.InNoSync() {
		err := t.model.Accumulate()
		finalize(t.grads)
		t.grads = nil
		t.times.Forward += fwd.Sub(start)
		t.times.Sync += time.Since(fwd)
		if err != nil {
			return nil, err
		}
		return append([]*tensors.Tensor{outs[0]}, outs[1+n:]...), nil
	}
	if err := t.model.Sync(t.sctx); err != nil {
		return nil, err
	}
	synced := time.Now()
	if t.apply == nil {
		apply, err := context.NewExec(t.backend, t.mlctx.Checked(false), t.applyGraph)
		if err != nil {
			return nil, err
		}
		t.apply = apply.WithName("ranktree optimizer")
	}
	args := make([]any, n)
	for i, g := range t.grads {
		args[i] = g
	}
	if _, err := t.apply.Exec(args...); err != nil {
		return nil, err
	}
	finalize(t.grads)
	t.grads = nil
	done := time.Now()
	t.times.Steps++
	t.times.Forward += fwd.Sub(start)
	t.times.Sync += synced.Sub(fwd)
	t.times.Apply += done.Sub(synced)
	return append([]*tensors.Tensor{outs[0]}, outs[1+n:]...), nil
}

func finalize(ts []*tensors.Tensor) {
	for _, x := range ts {
		if x != nil {
			_ = x.FinalizeAll()
		}
	}
}

// Train runs TrainStep over ds until it returns io.EOF (one epoch of a
// finite dataset), finalizing the yielded tensors, and calls onStep (if
// not nil) after each step with the step's metrics. It returns the number
// of steps. Every rank's ds must yield the same number of batches.
func (t *Trainer) Train(ds train.Dataset, onStep func(step int, metrics []*tensors.Tensor) error) (int, error) {
	steps := 0
	for {
		spec, inputs, labels, err := ds.Yield()
		if errors.Is(err, io.EOF) {
			return steps, nil
		}
		if err != nil {
			return steps, err
		}
		mets, err := t.TrainStep(spec, inputs, labels)
		finalize(inputs)
		finalize(labels)
		if err != nil {
			return steps, err
		}
		steps++
		if onStep != nil {
			if err := onStep(steps, mets); err != nil {
				return steps, err
			}
		}
		finalize(mets)
	}
}
