// Package reducer is ranktree's DDP Reducer: data-parallel gradient
// averaging with the semantics of PyTorch 1.13's DistributedDataParallel
// and c10d's reducer.cpp. Gradients are grouped into buckets by size,
// each bucket is allreduced as soon as it is complete, buckets launch in
// the same order on every rank, and communication overlaps the rest of
// backward.
//
// Go has no autograd, so the training loop tells the reducer when each
// parameter's gradient is ready. The caller's duties, per rank:
//
//  1. Build the model identically on every rank and call New with the same
//     parameters (same count, dtypes and shapes) and the same Config. New
//     is a collective: it verifies the model across ranks and overwrites
//     every Param.Data (and Config.BroadcastBuffers) with rank 0's values.
//  2. Optionally register one comm hook (RegisterCommHook: AllReduceHook,
//     FP16CompressHook, BF16CompressHook, PowerSGDHook or
//     BatchedPowerSGDHook with a PowerSGDState, or a FuncHook) before the
//     first iteration, on every rank alike.
//  3. With Config.BroadcastBuffers (batch-norm statistics and the like),
//     call SyncBuffers before each forward pass, as DDP's
//     broadcast_buffers=True does.
//  4. Each iteration, run backward and call GradReady(i, grad) once per
//     parameter as soon as its gradient is final, usually layer by layer in
//     reverse. A parameter used several times in forward gets one call with
//     the summed gradient. With GradientAsBucketView, write the gradient
//     into GradBuffer(i) and pass that view (or the zero Buffer).
//  5. Parameters without a gradient on this rank: with FindUnusedParameters
//     pass them to PrepareForBackward before backward, or simply never mark
//     them, and EndBackward treats them as unused. Without it, every
//     parameter must be marked (else ErrMissingGradients).
//  6. Call EndBackward(ctx) once after backward. It waits for the
//     reductions; afterwards every gradient holds the average over ranks.
//     Then step the optimizer. Do not touch gradient buffers passed to
//     GradReady between GradReady and EndBackward.
//  7. After the first synced iteration's EndBackward the buckets are
//     rebuilt once in rank 0's gradient-ready order: fetch GradBuffer views
//     again after it.
//  8. For gradient accumulation, run the micro-steps inside NoSync (or
//     between SetRequireSync(false) and SetRequireSync(true)),
//     accumulating into your gradient buffers; the next synced iteration
//     reduces the sums.
//  9. With uneven inputs set Config.UnevenInputs and call Join once on
//     every rank when its data runs out; it shadows the other ranks'
//     collectives until all have joined, then syncs the final model.
//  10. On any *BucketError (timeout, abort) the reducer is unusable: tear
//     down or re-create the process group and build a new Reducer.
//
// Design. The bucket assignment (ComputeBucketAssignmentBySize) and the
// per-iteration state machine (ready counters, in-order launch, unused
// parameters, static graph, rebuild decision) are a pure core of plain
// functions and structs with no goroutines, clocks or buffers (core.go);
// the Reducer feeds them events and carries out their actions: copying
// and pre-dividing gradients, launching allreduces on the Group, waiting.
//
// Differences from c10d, by design: the reducer works on host buffers
// only (device buffers give comm.ErrUnsupported); unused parameters
// declared before backward are marked at PrepareForBackward rather than at
// the first hook; a static graph's first iteration reduces buckets as they
// complete instead of delaying every reduction to the end (set
// Config.DelayAllReduce for that); sparse gradients are not supported.
package reducer
