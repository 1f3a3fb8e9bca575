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


def main():
    """One rank under mpirun: measures every size, rank 0 prints."""
    args = common.arg_parser(__doc__.splitlines()[0]).parse_args()
    import numpy as np
    from mpi4py import MPI

    comm = MPI.COMM_WORLD

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
