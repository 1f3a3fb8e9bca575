package reducer

import (
	"context"
	"fmt"
	"slices"

	"github.com/ranktree/ranktree/comm"
)

// Between-iteration controls: no_sync, comm hooks, buffer sync, stats.

// SetRequireSync turns gradient synchronization off (false) or back on
// (true) between iterations (DDP require_backward_grad_sync). While off,
// GradReady and EndBackward do no communication: the caller accumulates
// gradients in its buffers (or GradBuffer views), and the next synced
// iteration reduces the accumulated sums. Changing it during a backward
// pass returns ErrBadState.
func (r *Reducer) SetRequireSync(on bool) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := r.usable(); err != nil {
		return err
	}
	if r.core.phase != phaseIdle {
		return r.stateErr("SetRequireSync(%v) during a backward pass; call it between iterations", on)
	}
	r.requireSync = on
	return nil
}

// NoSync runs fn with gradient synchronization off (DDP no_sync()): use
// it for the accumulation steps before one synced step. The previous
// setting is restored afterwards; fn's error is returned.
func (r *Reducer) NoSync(fn func() error) error {
	r.mu.Lock()
	prev := r.requireSync
	r.mu.Unlock()
	if err := r.SetRequireSync(false); err != nil {
		return err
	}
	err := fn()
	if rerr := r.SetRequireSync(prev); err == nil {
		err = rerr
	}
	return err
}

// RegisterCommHook replaces the built-in allreduce with h (c10d
// register_comm_hook). Register before the first iteration on every rank
// alike. A second registration returns ErrHookRegistered; a nil hook
// comm.ErrInvalidArgument; registering during a backward pass ErrBadState.
func (r *Reducer) RegisterCommHook(h CommHook) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := r.usable(); err != nil {
		return err
	}
	if h == nil {
		return &Error{Rank: r.rank, Iteration: r.core.iter, Param: -1, Err: comm.ErrInvalidArgument, Msg: "RegisterCommHook: nil hook"}
	}
	if r.hook != nil {
		return &Error{Rank: r.rank, Iteration: r.core.iter, Param: -1, Err: ErrHookRegistered,
			Msg: fmt.Sprintf("register_comm_hook can only be called once: hook %q is already registered, %q was refused", r.hook.Name(), h.Name())}
	}
	if r.core.phase != phaseIdle {
		return r.stateErr("RegisterCommHook during a backward pass")
	}
	r.hook = h
	return nil
}

// SyncBuffers broadcasts Config.BroadcastBuffers from rank 0 (DDP
// broadcast_buffers=True does this before every forward). A collective.
func (r *Reducer) SyncBuffers(ctx context.Context) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := r.usable(); err != nil {
		return err
	}
	return broadcastCoalesced(ctx, r.g, r.cfg.BroadcastBuffers, 0, r.cfg.BroadcastChunkBytes, r.core.iter)
}

// Stats returns a snapshot of the reducer's figures (DDPLoggingData).
func (r *Reducer) Stats() Stats {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := Stats{
		Rank: r.rank, WorldSize: r.size, Iterations: r.core.iter, NoSyncCalls: r.noSyncCalls,
		BucketCapBytes: r.cfg.BucketCapBytes, FirstBucketBytes: r.cfg.FirstBucketBytes,
		GradientAsBucketView: r.cfg.GradientAsBucketView, FindUnusedParameters: r.cfg.FindUnusedParameters,
		StaticGraph: r.cfg.StaticGraph, DelayAllReduce: r.cfg.DelayAllReduce,
		BucketSizes: bucketBytes(r.core.lay), BucketParams: r.core.lay.bucketIndices(),
		Rebuilt: r.rebuiltAt != nil, RebuiltOrder: slices.Clone(r.rebuiltAt), RebuiltBucketSizes: slices.Clone(r.rebuiltSize),
		GradReadyOrder: slices.Clone(r.readyOrder), UnusedParams: slices.Clone(r.unusedLast),
	}
	if r.hook != nil {
		s.CommHook = r.hook.Name()
	}
	r.tm.fill(&s)
	return s
}
