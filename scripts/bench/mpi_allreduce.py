"""Open MPI allreduce benchmark: mpi4py Allreduce on numpy float32, MPI.SUM.

Run it under mpirun; rank 0 prints the JSON lines (see common.py):

    mpirun --allow-run-as-root --oversubscribe -np 2 \
        /usr/bin/python3 scripts/bench/mpi_allreduce.py --sizes 4,64MiB

The allreduce is in place (MPI.IN_PLACE), as torch.distributed's and
ranktree's are. The transport recorded is the BTL list Open MPI was given
(OMPI_MCA_btl), "default" when unset: on one host that is shared memory
(vader/sm) between the two ranks.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402


def main():
    """One rank under mpirun: measures every size, rank 0 prints."""
    args = common.arg_parser(__doc__.splitlines()[0]).parse_args()
    import numpy as np
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    rank, n = comm.Get_rank(), comm.Get_size()
    btl = os.environ.get("OMPI_MCA_btl", "default (shm: vader)")
    for size in args.sizes:
        warmup, iters = common.iters_for(args, size)
        buf = np.zeros(size // 4, dtype=np.float32)
        for _ in range(warmup):
            comm.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM)
        comm.Barrier()
        times = np.zeros(iters, dtype=np.float64)
        for i in range(iters):
            t0 = MPI.Wtime()
            comm.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM)
            times[i] = (MPI.Wtime() - t0) * 1e6
        comm.Allreduce(MPI.IN_PLACE, times, op=MPI.MAX)
        if rank == 0:
            rec = common.result("openmpi", btl, n, size, times.tolist())
            rec["mpi"] = MPI.Get_library_version().splitlines()[0].strip().strip("\x00").strip()
            common.emit(rec)
    comm.Barrier()
    return 0


if __name__ == "__main__":
    sys.exit(main())
