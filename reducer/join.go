package reducer

import (
	"context"
	"fmt"

	"github.com/ranktree/ranktree/comm"
)

// Join is called by a rank that has run out of inputs (uneven inputs;
// torch.distributed.algorithms.Join with DDP's join hook). Until every
// rank has joined it shadows the collectives of the ranks still training:
// each of their synced iterations begins with an allreduce counting
// active ranks (this rank answers 0), then this rank reduces zeros for
// every bucket (through the comm hook if one is registered), the
// local-used map when one is reduced, and the rebuild broadcast when due.
// When the count reaches 0 every rank has joined: the ranks agree on the
// last joiner (highest rank among them) and broadcast its parameters and
// BroadcastBuffers, so all ranks end with the same model (c10d
// _sync_final_model). Every rank calls Join exactly once, at the end of
// its inputs; afterwards GradReady and EndBackward return ErrBadState.
//
// Join needs Config.UnevenInputs (else comm.ErrInvalidArgument) and must
// not be called during a backward pass or under NoSync (ErrBadState).
// Collective failures return a *BucketError.
func (r *Reducer) Join(ctx context.Context) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := r.usable(); err != nil {
		return err
	}
	if !r.cfg.UnevenInputs {
		return &Error{Rank: r.rank, Iteration: r.core.iter, Param: -1, Err: comm.ErrInvalidArgument,
			Msg: "Join needs Config.UnevenInputs on every rank"}
	}
	if !r.requireSync {
		return r.stateErr("Join under NoSync")
	}
	isLast := true
	shadows := 0
	for {
		active, err := r.countActive(0)
		if err != nil {
			return r.fail(err)
		}
		if active == 0 {
			break
		}
		isLast = false
		if err := r.shadowLocked(ctx, active); err != nil {
			return err
		}
		shadows++
	}
	mine := []int32{-1}
	if isLast {
		mine[0] = int32(r.rank)
	}
	if err := r.g.AllReduce(ctx, comm.HostBuffer(mine), comm.Max).Wait(ctx); err != nil {
		return r.fail(&BucketError{Rank: r.rank, Iteration: r.core.iter, Bucket: -2, What: "allreduce electing the last joiner", Err: err})
	}
	auth := int(mine[0])
	state := make([]comm.Buffer, 0, len(r.params)+len(r.cfg.BroadcastBuffers))
	for _, p := range r.params {
		state = append(state, p.Data)
	}
	state = append(state, r.cfg.BroadcastBuffers...)
	if err := broadcastCoalesced(ctx, r.g, state, auth, r.cfg.BroadcastChunkBytes, r.core.iter); err != nil {
		return r.fail(err)
	}
	r.joined = true
	r.log.Info().Int("shadow_iterations", shadows).Int("authoritative_rank", auth).Msg("joined")
	return nil
}

// shadowLocked mirrors one synced iteration of the active ranks with zero
// contributions.
func (r *Reducer) shadowLocked(ctx context.Context, active int) error {
	needMap, err := r.core.shadow()
	if err != nil {
		return err
	}
	div := r.size
	if r.cfg.DivideByActiveRanks {
		div = active
	}
	lay := r.core.lay
	works := make([]HookWork, len(lay.buckets))
	for b, spec := range lay.buckets {
		zeros := comm.NewHostBuffer(spec.dtype, spec.numel)
		if r.hook == nil {
			works[b] = r.g.AllReduce(r.lctx, zeros, comm.Sum)
			continue
		}
		works[b] = r.hook.Run(r.lctx, r.g, &GradBucket{
			Index: b, Buffer: zeros, Params: spec.params, Offsets: spec.offsets, Lengths: spec.counts,
			Shapes: r.shapesOf(spec), DivFactor: div, IsLast: b == len(lay.buckets)-1, Iteration: r.core.iter,
		})
	}
	var mapWork *comm.Work
	if needMap {
		mapWork = r.g.AllReduce(r.lctx, comm.NewHostBuffer(comm.Int32, len(r.params)), comm.Sum)
	}
	for b, w := range works {
		if err := w.Wait(ctx); err != nil {
			return r.fail(&BucketError{Rank: r.rank, Iteration: r.core.iter, Bucket: b,
				What: fmt.Sprintf("shadow reduction of bucket %d while joined", b), Err: err})
		}
	}
	if mapWork != nil {
		if err := mapWork.Wait(ctx); err != nil {
			return r.fail(&BucketError{Rank: r.rank, Iteration: r.core.iter, Bucket: -1, What: "shadow allreduce of the local-used map while joined", Err: err})
		}
	}
	if order := r.core.finishShadow(); order != nil {
		return r.rebuildLocked(ctx, order)
	}
	return nil
}
