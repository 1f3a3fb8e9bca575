// Package ddp is ranktree's framework-neutral data-parallel layer: the
// part of torch.nn.parallel.DistributedDataParallel that does not depend
// on a tensor library. A framework adapter (adapters/gorgonia,
// adapters/gomlx) or a hand-written training loop describes its model as
// a list of parameters by name, shape and dtype, with callbacks that
// expose the current values and gradients; ddp keeps its own host copies
// for the reducer (package reducer), so frameworks whose tensors move
// between steps can take part.
//
// The caller's duties, per rank:
//
//  1. Join the job: Init (rankrunner's env contract, or a single process
//     when RANK is unset: the documented fallback) and take its World group.
//  2. Build the model identically on every rank and call Wrap with the
//     same parameter list (names, shapes, dtypes, order) and Config. Wrap
//     is a collective: a list that differs between ranks fails on every
//     rank with a *MismatchError (errors.Is comm.ErrMismatch) naming the
//     first parameter that differs; otherwise every rank ends with rank
//     0's values (DDP's constructor broadcast).
//  3. Optionally call BroadcastState once with optimizer state (momentum,
//     Adam moments, step counters as floats) so every rank starts from
//     rank 0's.
//  4. Shard the data with a DistributedSampler (SetEpoch every epoch) and
//     split the global batch evenly across ranks.
//  5. Each step: forward and backward in the framework, then Sync(ctx)
//     once; afterwards every gradient holds the average over ranks (or
//     what the comm hook computes). Then step the optimizer.
//  6. Gradient accumulation: run the micro-steps' backward inside NoSync,
//     accumulating gradients in the framework; the next Sync reduces the
//     sums.
//  7. Uneven inputs: set Config.Reducer.UnevenInputs and call Join once on
//     every rank when its data runs out.
//  8. On any error from Sync or Join the wrapper is unusable (the
//     reducer's rule): tear the job down or rebuild the group and Wrap again.
//
// Values and gradients are exchanged through the parameters' callbacks
// only: Value and Grad are called from the goroutine that called Wrap,
// Sync, Join or BroadcastState, and the buffer they hand to fn is valid
// only during fn (as GoMLX's MutableFlatData). ddp copies every gradient
// once into the reducer's bucket views and once back, which costs two
// memory passes over the gradients per step.
package ddp
