"""Gloo allreduce benchmark: torch.distributed, backend "gloo", float32 sum.

Run without --rank it launches --nproc copies of itself (ranks 0..n-1) on
127.0.0.1 (GLOO_SOCKET_IFNAME=lo unless set), rendezvous through a tcp://
store on a free port; rank 0 prints the JSON lines (see common.py for what
is measured and printed).

    /usr/bin/python3 scripts/bench/gloo_allreduce.py --sizes 4,64MiB
"""

import argparse
import os
import socket
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402


def free_port():
    """A TCP port free on 127.0.0.1 now (for the rendezvous store)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(args, argv):
    """Starts args.nproc ranks of this script with argv; the first nonzero exit status."""
    port = free_port()
    env = dict(os.environ)
    env.setdefault("GLOO_SOCKET_IFNAME", "lo")  # the data plane on loopback, as the store
    procs = []
    for r in range(args.nproc):
        cmd = [sys.executable, os.path.abspath(__file__), "--rank", str(r),
               "--port", str(port)] + argv
        procs.append(subprocess.Popen(cmd, env=env))
    rc = 0
    for p in procs:
        rc = rc or p.wait()
    return rc


def rank_main(args):
    """One rank: joins the gloo group, measures every size, rank 0 prints."""
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%d" % args.port,
                            rank=args.rank, world_size=args.nproc)
    n = dist.get_world_size()
    for size in args.sizes:
        warmup, iters = common.iters_for(args, size)
        t = torch.zeros(size // 4, dtype=torch.float32)
        for _ in range(warmup):
            dist.all_reduce(t, op=dist.ReduceOp.SUM)
        dist.barrier()
        times = torch.zeros(iters, dtype=torch.float64)
        for i in range(iters):
            t0 = time.perf_counter_ns()
            dist.all_reduce(t, op=dist.ReduceOp.SUM)
            times[i] = (time.perf_counter_ns() - t0) / 1e3
        dist.all_reduce(times, op=dist.ReduceOp.MAX)
        if args.rank == 0:
            rec = common.result("gloo", "tcp (loopback)", n, size, times.tolist())
            rec["torch"] = torch.__version__
            common.emit(rec)
    dist.barrier()
    dist.destroy_process_group()
    return 0


def main():
    """Launcher without --rank, one rank with it."""
    p = common.arg_parser(__doc__.splitlines()[0])
    p.add_argument("--nproc", type=int, default=2, help="ranks (default 2)")
    p.add_argument("--rank", type=int, default=-1, help=argparse.SUPPRESS)
    p.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.rank < 0:
        return launch(args, sys.argv[1:])
    return rank_main(args)


if __name__ == "__main__":
    sys.exit(main())
