"""Open MPI collective benchmark: mpi4py on numpy float32 (MPI.SUM where it reduces).

Run it under mpirun; rank 0 prints the JSON lines (see common.py for what
is measured, how a size maps to buffers, and what is printed):

    mpirun --allow-run-as-root --oversubscribe -np 2 \\
        /usr/bin/python3 scripts/bench/mpi_allreduce.py --sizes 4,64MiB [--collective allgather]

--collective picks the call, on buffers laid out as allreduce-bench's:
  allreduce      Allreduce(MPI.IN_PLACE, buf, MPI.SUM), in place as
                 torch.distributed's and ranktree's are
  allgather      Allgather(send of S/n bytes, recv of S bytes)
  reducescatter  Reduce_scatter_block(send of S bytes, recv of S/n bytes, MPI.SUM)
  broadcast      Bcast(buf of S bytes, root=0)
With --late-rank R --late-us US (allreduce only) it runs allreduce-bench's
late-arrival measurement instead (examples/allreduce-bench, RunLate): per
size, --warmup untimed allreduces, then --iters iterations, each after a
Barrier, in which rank R sleeps US µs (--late-busy: spins) before it
launches; every rank records its launch and return (wall clock) and its
process CPU time around the call, and rank 0 prints one record of the
figures common.late_figures computes (the same JSON fields). Python's own
path is in these times: after a sleep it runs from cold caches too.
The transport recorded is the BTL list Open MPI was given (OMPI_MCA_btl),
"default" when unset: on one host that is shared memory (vader/sm)
between the ranks.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402


def make_op(comm, MPI, np, collective, size):
    """The op of one size: a function that runs collective once."""
    _, inc, outc = common.layout(collective, size, comm.Get_size())
    send = np.zeros(inc, dtype=np.float32)
    recv = np.zeros(outc, dtype=np.float32)
    if collective == "allreduce":
        return lambda: comm.Allreduce(MPI.IN_PLACE, send, op=MPI.SUM)
    if collective == "allgather":
        return lambda: comm.Allgather(send, recv)
    if collective == "reducescatter":
        return lambda: comm.Reduce_scatter_block(send, recv, op=MPI.SUM)
    return lambda: comm.Bcast(send, root=0)


def run_late(args, comm, MPI, np, btl, lib):
    """The late-arrival pass (see the module's doc); rank 0 prints."""
    import time
    n, me = comm.Get_size(), comm.Get_rank()
    for size in args.sizes:
        _, inc, _ = common.layout("allreduce", size, n)
        buf = np.zeros(inc, dtype=np.float32)
        for _ in range(args.warmup):
            comm.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM)
        rows = []
        row = np.zeros(3 * n, dtype=np.int64)
        for _ in range(args.iters):
            comm.Barrier()
            if me == args.late_rank:
                if args.late_busy:
                    end = time.perf_counter() + args.late_us / 1e6
                    while time.perf_counter() < end:
                        pass
                else:
                    time.sleep(args.late_us / 1e6)
            c0 = time.process_time_ns()
            t0 = time.time_ns()
            comm.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM)
            t1 = time.time_ns()
            c1 = time.process_time_ns()
            row[:] = 0
            row[3 * me:3 * me + 3] = (t0, t1, c1 - c0)
            comm.Allreduce(MPI.IN_PLACE, row, op=MPI.SUM)
            rows.append(row.tolist())
        if me == 0:
            rec = {"peer": "openmpi", "transport": btl, "world_size": n, "collective": "allreduce",
                   "req_bytes": size, "bytes": inc * 4, "count": inc, "late_rank": args.late_rank,
                   "late_us": float(args.late_us), "skew": "fixed", "blocking": True, "late_busy": args.late_busy,
                   "mpi": lib}
            rec.update(common.late_figures(rows, n, args.late_rank))
            common.emit(rec)


def main():
    """One rank under mpirun: measures every size, rank 0 prints."""
    ap = common.arg_parser(__doc__.splitlines()[0])
    ap.add_argument("--late-rank", type=int, default=-1,
                    help="late-arrival mode (allreduce): this rank launches every timed iteration --late-us late")
    ap.add_argument("--late-us", type=int, default=5000, help="the late rank's delay, µs")
    ap.add_argument("--late-busy", action="store_true", help="the late rank spins through its delay instead of sleeping")
    args = ap.parse_args()
    import numpy as np
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    if args.late_rank >= 0:
        if args.collective != "allreduce" or args.late_rank >= comm.Get_size() or comm.Get_size() < 2 or args.late_us <= 0:
            if comm.Get_rank() == 0:
                sys.stderr.write("--late-rank needs --collective allreduce, a rank of the world (of 2 ranks or more) and --late-us > 0\n")
            return 2
        btl = os.environ.get("OMPI_MCA_btl", "shm")
        lib = MPI.Get_library_version().splitlines()[0].strip().strip("\x00").strip()
        run_late(args, comm, MPI, np, btl, lib)
        comm.Barrier()
        return 0

    def max_reduce(times):
        t = np.array(times, dtype=np.float64)
        comm.Allreduce(MPI.IN_PLACE, t, op=MPI.MAX)
        return t.tolist()

    btl = os.environ.get("OMPI_MCA_btl", "default (shm: vader)")
    lib = MPI.Get_library_version().splitlines()[0].strip().strip("\x00").strip()
    common.measure_all(args, comm.Get_size(), comm.Get_rank() == 0,
                       lambda size: make_op(comm, MPI, np, args.collective, size),
                       comm.Barrier, max_reduce, "openmpi", btl, {"mpi": lib})
    comm.Barrier()
    return 0


if __name__ == "__main__":
    sys.exit(main())
