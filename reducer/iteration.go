package reducer

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/ranktree/ranktree/comm"
)

// The iteration path: begin, GradReady, EndBackward, finalize, rebuild.

// PrepareForBackward starts an iteration explicitly and declares the
// parameters that will get no gradient on this rank (c10d
// prepare_for_backward with the unused set found by the graph traversal);
// they are reduced as zeros. It needs FindUnusedParameters or StaticGraph
// when unused is not empty. Calling it is optional: the first GradReady
// starts an iteration too. Starting an iteration before the previous one
// finished returns ErrUnfinishedReduction. Under NoSync it does nothing.
func (r *Reducer) PrepareForBackward(unused ...int) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := r.usable(); err != nil {
		return err
	}
	if !r.requireSync {
		return nil
	}
	return r.beginLocked(unused)
}

// beginLocked starts an iteration: validation first, then (UnevenInputs)
// the join-count allreduce, then the unused parameters.
func (r *Reducer) beginLocked(unused []int) error {
	set, err := r.core.checkBegin(unused)
	if err != nil {
		return err
	}
	r.tm.onBegin(time.Now())
	r.divFactor = r.size
	if r.cfg.UnevenInputs {
		active, err := r.countActive(1)
		if err != nil {
			return r.fail(err)
		}
		if r.cfg.DivideByActiveRanks {
			r.divFactor = active
		}
	}
	marked, launch := r.core.begin(set)
	for _, p := range marked {
		r.prepareUnusedLocked(p)
	}
	r.launchDueLocked(launch)
	return nil
}

// launchDueLocked launches buckets the core found complete during
// backward, unless Config.DelayAllReduce defers every launch to
// EndBackward.
func (r *Reducer) launchDueLocked(launch []int) {
	if r.cfg.DelayAllReduce {
		return
	}
	for _, b := range launch {
		r.launchLocked(b)
	}
}

// countActive allreduces mine (1 for an active rank, 0 for a joined one)
// and returns the number of active ranks (the Join notification of
// c10d's Join context manager).
func (r *Reducer) countActive(mine int32) (int, error) {
	buf := []int32{mine}
	if err := r.g.AllReduce(r.lctx, comm.HostBuffer(buf), comm.Sum).Wait(r.lctx); err != nil {
		return 0, &BucketError{Rank: r.rank, Iteration: r.core.iter, Bucket: -2, What: "join notification allreduce", Err: err}
	}
	return int(buf[0]), nil
}

// fail makes the reducer unusable and returns err.
func (r *Reducer) fail(err error) error {
	if r.failed == nil {
		r.failed = err
		r.log.Error().Err(err).Int64("iteration", r.core.iter).Msg("reducer failed")
	}
	return err
}

// prepareUnusedLocked zeroes a locally unused parameter's view so it adds
// nothing to the sum; with GradientAsBucketView its content is kept aside
// and restored if the parameter turns out unused on every rank.
func (r *Reducer) prepareUnusedLocked(p int) {
	v := r.view(p)
	if r.cfg.GradientAsBucketView {
		if r.saved == nil {
			r.saved = map[int][]byte{}
		}
		r.saved[p] = slices.Clone(v.Bytes())
	}
	zero(v)
}

// launchLocked starts bucket b's reduction: the hook, or an allreduce with
// Sum of the pre-divided bucket.
func (r *Reducer) launchLocked(b int) {
	r.tm.onLaunch(time.Now())
	spec := r.core.lay.buckets[b]
	if r.hook == nil {
		r.works[b] = r.g.AllReduce(r.lctx, r.bufs[b], comm.Sum)
		return
	}
	w := r.hook.Run(r.lctx, r.g, &GradBucket{
		Index: b, Buffer: r.bufs[b], Params: spec.params, Offsets: spec.offsets, Lengths: spec.counts,
		Shapes: r.shapesOf(spec), DivFactor: r.divFactor, IsLast: b == len(r.bufs)-1, Iteration: r.core.iter,
	})
	if w == nil {
		w = comm.FailedWork(comm.OpAllReduce, fmt.Errorf("%w: reducer: comm hook %q returned no HookWork for bucket %d", comm.ErrInvalidArgument, r.hook.Name(), b))
	}
	r.works[b] = w
}

// shapesOf returns the shapes of spec's parameters, in bucket order.
func (r *Reducer) shapesOf(spec bucketSpec) [][]int {
	out := make([][]int, len(spec.params))
	for i, p := range spec.params {
		out[i] = r.params[p].Shape
	}
	return out
}

// GradReady marks parameter i's gradient ready (c10d autograd_hook →
// mark_variable_ready). grad is the caller's gradient buffer (the
// parameter's dtype and element count); the reducer copies it into the
// bucket divided by the world size (not divided when a comm hook is set),
// and EndBackward writes the averaged result back into it. If grad is the
// view GradBuffer(i), or the zero Buffer, the gradient is taken from the
// view in place, without a copy. When the bucket holding i becomes
// complete and every earlier bucket has launched, its allreduce launches
// (asynchronously); a complete bucket behind an incomplete one waits, so
// every rank launches buckets in the same order whatever order its
// gradients arrive in. The first GradReady of an iteration starts it.
//
// Errors: ErrMarkedTwice (i already marked in this iteration),
// ErrUnfinishedReduction (the previous iteration did not finish),
// ErrStaticGraphChanged, comm.ErrInvalidArgument (bad index, dtype or
// length), ErrBadState. Under NoSync it only checks its arguments.
func (r *Reducer) GradReady(i int, grad comm.Buffer) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := r.usable(); err != nil {
		return err
	}
	if i < 0 || i >= len(r.params) {
		return &Error{Rank: r.rank, Iteration: r.core.iter, Param: -1, Err: comm.ErrInvalidArgument,
			Msg: fmt.Sprintf("GradReady: parameter index %d out of range [0, %d)", i, len(r.params))}
	}
	inView := grad.DType() == 0
	if !inView {
		if !grad.IsHost() || grad.DType() != r.infos[i].DType || grad.Len() != r.infos[i].Count {
			return &Error{Rank: r.rank, Iteration: r.core.iter, Param: i, Name: r.names[i], Err: comm.ErrInvalidArgument,
				Msg: fmt.Sprintf("GradReady: gradient %v does not match the parameter (%v×%d in host memory)", grad, r.infos[i].DType, r.infos[i].Count)}
		}
	}
	if !r.requireSync {
		r.noSyncCalls++
		return nil
	}
	if r.core.phase == phaseIdle {
		if err := r.beginLocked(nil); err != nil {
			return err
		}
	}
	launch, err := r.core.mark(i)
	if err != nil {
		return err
	}
	div := r.divFactor
	if r.hook != nil {
		div = 1
	}
	v := r.view(i)
	if inView || sameMemory(grad, v) {
		r.grads[i] = comm.Buffer{}
		if err := divInto(v, v, div); err != nil {
			return r.fail(err)
		}
	} else {
		r.grads[i] = grad
		r.lastGrad[i] = grad
		if err := divInto(v, grad, div); err != nil {
			return r.fail(err)
		}
	}
	r.tm.onReady(time.Now())
	r.launchDueLocked(launch)
	return nil
}

// EndBackward finishes the iteration (c10d finalize_backward): parameters
// never marked become unused under FindUnusedParameters (or fail with
// ErrMissingGradients / ErrStaticGraphChanged), the remaining buckets
// launch, the local-used map is allreduced when needed, and EndBackward
// waits for the reductions in bucket order (with Config.DelayAllReduce
// every bucket launches here, none during backward). Afterwards every gradient
// buffer passed to GradReady (and every GradBuffer view) holds the
// averaged gradient; gradients of parameters unused on every rank are left
// untouched. After the first synced iteration the buckets are rebuilt once
// in rank 0's observed ready order (a Broadcast). A failed collective
// returns a *BucketError and leaves the reducer unusable; a ctx that ends
// does the same (the collectives stay in flight). Under NoSync it returns nil.
func (r *Reducer) EndBackward(ctx context.Context) error {
	r.mu.Lock()
	if err := r.usable(); err != nil {
		r.mu.Unlock()
		return err
	}
	if !r.requireSync {
		r.mu.Unlock()
		return nil
	}
	if r.core.phase == phaseIdle {
		if err := r.beginLocked(nil); err != nil {
			r.mu.Unlock()
			return err
		}
	}
	unused, launch, needMap, err := r.core.end()
	if err != nil {
		r.mu.Unlock()
		return err
	}
	for _, p := range unused {
		r.prepareUnusedLocked(p)
	}
	if r.cfg.DelayAllReduce {
		launch = r.allBuckets(launch[:0])
	}
	for _, b := range launch {
		r.launchLocked(b)
	}
	if needMap {
		m := mustSlice[int32](r.localUsed)
		for p := range m {
			m[p] = 0
			if r.core.used[p] {
				m[p] = 1
			}
		}
		r.mapWork = r.g.AllReduce(r.lctx, r.localUsed, comm.Sum)
	}
	works, mapWork, iter := slices.Clone(r.works), r.mapWork, r.core.iter
	outs := r.copyBacksLocked(len(works))
	r.mu.Unlock()

	waitStart := time.Now()
	for b, w := range works {
		if err := w.Wait(ctx); err != nil {
			r.mu.Lock()
			defer r.mu.Unlock()
			spec := r.core.lay.buckets[b]
			return r.fail(&BucketError{Rank: r.rank, Iteration: iter, Bucket: b,
				What: fmt.Sprintf("reduction of bucket %d (%v×%d)", b, spec.dtype, spec.numel), Err: err})
		}
		for _, c := range outs[b] {
			comm.CopyBuffer(c.dst, c.src)
		}
	}
	if mapWork != nil {
		if err := mapWork.Wait(ctx); err != nil {
			r.mu.Lock()
			defer r.mu.Unlock()
			return r.fail(&BucketError{Rank: r.rank, Iteration: iter, Bucket: -1, What: "allreduce of the local-used map", Err: err})
		}
	}
	done := time.Now()

	r.mu.Lock()
	defer r.mu.Unlock()
	return r.finalizeLocked(ctx, needMap, waitStart, done)
}

// allBuckets appends every bucket index, in bucket order, to dst: under
// DelayAllReduce every bucket is complete at EndBackward and all launch
// then.
func (r *Reducer) allBuckets(dst []int) []int {
	for b := range r.bufs {
		dst = append(dst, b)
	}
	return dst
}

// copyBack is one locally used parameter's result: its bucket view (src)
// goes back to the caller's gradient buffer (dst).
type copyBack struct{ dst, src comm.Buffer }

// copyBacksLocked groups the copy-backs by bucket, so that EndBackward
// writes each bucket's results as soon as its reduction ends, while later
// buckets are still reducing.
func (r *Reducer) copyBacksLocked(buckets int) [][]copyBack {
	outs := make([][]copyBack, buckets)
	for p := range r.params {
		if g := r.grads[p]; r.core.used[p] && g.Valid() {
			b := r.core.lay.loc[p].bucket
			outs[b] = append(outs[b], copyBack{dst: g, src: r.view(p)})
		}
	}
	return outs
}

// finalizeLocked writes results back, restores untouched gradients, closes
// the iteration in the core and runs the one-time rebuild when due.
func (r *Reducer) finalizeLocked(ctx context.Context, mapReduced bool, waitStart, done time.Time) error {
	if mapReduced {
		m := mustSlice[int32](r.localUsed)
		r.unusedLast = r.unusedLast[:0]
		for p := range m {
			r.globalUsed[p] = m[p] > 0
			if m[p] == 0 {
				r.unusedLast = append(r.unusedLast, p)
			}
		}
	}
	for p := range r.params {
		v := r.view(p)
		switch {
		case r.core.used[p]:
			// Copied back by EndBackward as its bucket completed.
		case r.globalUsed[p]:
			if g := r.lastGrad[p]; g.Valid() && !sameMemory(g, v) {
				comm.CopyBuffer(g, v)
			}
		default:
			if s, ok := r.saved[p]; ok {
				copy(v.Bytes(), s)
			}
		}
	}
	r.readyOrder = slices.Clone(r.core.order)
	clear(r.grads)
	clear(r.works)
	r.saved, r.mapWork = nil, nil
	r.tm.onDone(waitStart, done)
	order := r.core.finalize()
	if order != nil {
		return r.rebuildLocked(ctx, order)
	}
	return nil
}

// rebuildLocked replaces the buckets with an assignment in rank 0's order
// (c10d rebuild_buckets + sync_bucket_indices).
func (r *Reducer) rebuildLocked(ctx context.Context, order []int) error {
	wire := make([]int64, len(order))
	for i, p := range order {
		wire[i] = int64(p)
	}
	if len(wire) > 0 {
		if err := r.g.Broadcast(ctx, comm.HostBuffer(wire), 0).Wait(ctx); err != nil {
			return r.fail(&BucketError{Rank: r.rank, Iteration: r.core.iter, Bucket: -2, What: "broadcast of the rebuilt bucket order", Err: err})
		}
	}
	for i, p := range wire {
		order[i] = int(p)
	}
	lay, err := r.assign(order)
	if err != nil {
		return r.fail(&Error{Rank: r.rank, Iteration: r.core.iter, Param: -1, Err: ErrBadState,
			Msg: fmt.Sprintf("rank 0's rebuilt bucket order is unusable: %v", err)})
	}
	r.installLayout(lay)
	r.rebuiltAt = slices.Clone(order)
	r.rebuiltSize = bucketBytes(lay)
	r.log.Info().Ints("order", order).Ints("bucket_bytes", r.rebuiltSize).Int64("iteration", r.core.iter).Msg("reducer buckets rebuilt")
	return nil
}
