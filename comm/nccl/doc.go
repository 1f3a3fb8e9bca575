// Package nccl is the GPU collective engine: a run-time (purego) binding of
// libnccl.so.2 and an Engine that implements comm.Backend the way c10d's
// ProcessGroupNCCL does. Nothing here needs CUDA headers to build; where
// CUDA or NCCL is missing, New fails with an error wrapping
// comm.ErrUnsupported and the rest of the program runs on the CPU engine.
//
// # Binding
//
// Load finds the library (RANKTREE_NCCL_LIB, then libnccl.so.2 on the
// loader path, then the pip wheel's site-packages/nvidia/nccl/lib) and
// binds: version, unique id, ncclCommInitRankConfig (nonblocking, polled
// with ncclCommGetAsyncError), abort, finalize, destroy, split, the
// collectives AllReduce, Broadcast, Reduce, AllGather, ReduceScatter, Send,
// Recv, GroupStart/GroupEnd and RedOpCreatePreMulSum. DataType covers
// every ncclDataType_t (fp8 included); DataTypeOf maps comm.DType (bool as
// ncclUint8; complex64/complex128, which NCCL lacks, are launched as real
// pairs of twice the count, as c10d's view_as_real). Failures are *Error values with ncclGetLastError's text,
// unwrapping to comm.ErrEngine.
//
// # Engine
//
//   - Unique id: rank 0 calls ncclGetUniqueId and stores the 128 bytes
//     under UIDKey(group, epoch, n), n counting the communicators the
//     engine created (c10d's per-PG counter); the other ranks wait for it
//     in the store.
//   - Communicators are cached by (group, device), created lazily by the
//     first op or eagerly in New (Options.EagerInit), with blocking = 0 and
//     a deadline (Options.InitTimeout; an *InitTimeoutError wraps
//     comm.ErrTimeout and the half-made communicator is aborted).
//   - One launch goroutine per engine, locked to its OS thread with the
//     device's primary context current, owns one non-blocking stream per
//     communicator. For each op it records an event on every caller stream
//     (the streams of the op's buffers), makes its stream wait on it,
//     enqueues the NCCL calls and records an end event; the op's Work
//     completes when cuEventQuery says the end event is done. The op, and
//     so its buffers, stay referenced until then.
//   - Waiting: where GOMAXPROCS is at least 4 the launch goroutine polls
//     its queue for Options.SpinIdle (100 µs) after its last op, and each
//     Work's Wait polls for completion for Options.SpinWait (200 µs) before
//     blocking (comm.Work.SetSpinWait), so that a small op costs no OS
//     wake-up on either side (as CUDA spins in cudaStreamSynchronize on
//     hosts with more cores than GPUs). On smaller machines neither spins.
//   - Op mapping: coalesced ops and the list forms of AllGather and
//     ReduceScatter run inside ncclGroupStart/End; AllToAll, Gather and
//     Scatter are grouped Send/Recv; a bool Sum runs as Max and Product as
//     Min; Avg is ncclAvg; PreMulSum is ncclRedOpCreatePreMulSum (host
//     scalar); bitwise reductions and wildcard receives are not supported
//     by NCCL (comm.ErrUnsupported); Barrier is a one-element allreduce.
//   - Failure: AsyncError polls ncclCommGetAsyncError; the launch goroutine
//     polls it too while ops are in flight and on an error fails them with
//     a *comm.EngineError and aborts. Abort (called by the watchdog on a
//     timeout) calls ncclCommAbort, fails every in-flight op with a
//     *comm.AbortedError and returns at once. RANKTREE_FAULT's hang and
//     error faults are honoured.
//
// # Caller's duties
//
//  1. Pass device buffers (comm.DeviceBuffer) on BackendConfig.Device with
//     the stream that produced them; host buffers are rejected.
//  2. Launch ops in the same order on every rank (the communicator actor
//     does this); keep buffers untouched until the Work completes.
//  3. Give the engine a Store when the group has more than one rank.
//  4. Close the engine (it finalizes, or aborts if ops are still running).
//
// # gorgonia.org/cu
//
// Built with -tags cuda (which needs cuda.h through CGO_CFLAGS and links
// libcuda), CuBuffer turns a cu.DevicePtr and cu.Stream into a
// comm.Buffer. Builds without the tag never compile gorgonia.org/cu.
//
// Tests run against a fake libcuda/libnccl compiled from C at test time
// (internal/fakegpu); RANKTREE_GPU_TESTS=1 runs them on the real libraries.
// scripts/reallib-check.sh checks the bindings against NVIDIA's real
// headers and libraries on a machine without a GPU. See
// docs/gpu-verification.md for what has and has not run on a GPU.
package nccl
