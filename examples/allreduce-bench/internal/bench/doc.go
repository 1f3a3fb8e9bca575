// Package bench is the measurement and formatting core of the
// allreduce-bench example, kept apart from main so it can be tested without
// a running job. It follows nccl-tests (all_reduce_perf and friends): for
// each message size it runs warm-up iterations, then timed ones, and reports
// bytes, count, type, redop, time_us (median over the timed iterations of the
// slowest rank's time), algbw_GBps and busbw_GBps.
//
// Definitions (nccl-tests' doc/PERFORMANCE.md), with n ranks and S bytes:
//
//	algbw = S / time                       (GB/s, 1 GB = 1e9 bytes)
//	busbw = algbw × factor, where factor is
//	        allreduce            2(n-1)/n
//	        allgather            (n-1)/n
//	        reducescatter        (n-1)/n
//	        alltoall             (n-1)/n
//	        broadcast            1
//
// S is the size of the whole buffer, as in nccl-tests: the one buffer of
// allreduce and broadcast, the gathered output of allgather, the input of
// reducescatter, each rank's send (= receive) buffer of alltoall. For the
// last three the element count is rounded down to a multiple of n (at least
// n), and the reported bytes and count are the ones actually used.
//
// Caller's duties:
//
//  1. Build a Config (ParseSizes, ParseCollective, comm.ParseReduceOp,
//     comm.ParseDType help with flags) and call Run with a Group — a
//     *comm.ProcessGroup satisfies it — on every rank with the same Config.
//  2. Print on rank 0 only: every rank gets the same Results (times are
//     combined across ranks with a Max allreduce), so printing on all ranks
//     would repeat them. FormatHeader/FormatRow give nccl-tests' text table,
//     Result's JSON encoding the --json lines.
package bench
