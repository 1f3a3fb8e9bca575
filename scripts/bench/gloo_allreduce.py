"""Gloo collective benchmark: torch.distributed, backend "gloo", float32 (sum where it reduces).

Run without --rank it launches --nproc copies of itself (ranks 0..n-1) on
127.0.0.1 (GLOO_SOCKET_IFNAME=lo unless set), rendezvous through a tcp://
store on a free port; rank 0 prints the JSON lines (see common.py for what
is measured, how a size maps to buffers, and what is printed).

    /usr/bin/python3 scripts/bench/gloo_allreduce.py --sizes 4,64MiB [--collective allgather]

--collective picks the call, on buffers laid out as allreduce-bench's:
  allreduce      all_reduce(t, SUM), in place
  allgather      all_gather_into_tensor(out of S bytes, in of S/n bytes); where
                 the installed torch's Gloo lacks it (torch 1.13 does), all_gather
                 into a list of n views of the output tensor, and the record's
                 "api" says so
  reducescatter  reduce_scatter_tensor(out of S/n bytes, in of S bytes, SUM); else
                 reduce_scatter over a list of n views; where Gloo has neither
                 (torch 1.13), one record {"unsupported": why} and no timings
  broadcast      broadcast(t of S bytes, src=0)
Which call is used is decided once by trying it on a tiny tensor, on every
rank alike (Gloo refuses an unsupported call locally, before any traffic).
"""

import argparse
import os
import socket
import subprocess
import sys

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


def calls(dist, collective):
    """The candidate calls of collective, best first: (api name, f(out, in, n))."""
    def views(out, n):
        return list(out.chunk(n))

    if collective == "allgather":
        return [("all_gather_into_tensor", lambda out, inp, n: dist.all_gather_into_tensor(out, inp)),
                ("all_gather into n views", lambda out, inp, n: dist.all_gather(views(out, n), inp))]
    if collective == "reducescatter":
        return [("reduce_scatter_tensor",
                 lambda out, inp, n: dist.reduce_scatter_tensor(out, inp, op=dist.ReduceOp.SUM)),
                ("reduce_scatter over n views",
                 lambda out, inp, n: dist.reduce_scatter(out, views(inp, n), op=dist.ReduceOp.SUM))]
    if collective == "broadcast":
        return [("broadcast", lambda out, inp, n: dist.broadcast(inp, src=0))]
    return [("all_reduce", lambda out, inp, n: dist.all_reduce(inp, op=dist.ReduceOp.SUM))]


def pick_call(dist, torch, collective, n):
    """(api, call) of the first candidate Gloo runs, tried on a tiny
    buffer; (None, why) when it runs none. The api string names what was
    refused before it."""
    refused = []
    for name, call in calls(dist, collective):
        _, inc, outc = common.layout(collective, 4 * n, n)
        inp, out = torch.zeros(inc, dtype=torch.float32), torch.zeros(outc, dtype=torch.float32)
        try:
            call(out, inp, n)
        except (RuntimeError, AttributeError, ValueError) as e:
            refused.append("%s: %s" % (name, str(e).splitlines()[0] if str(e) else type(e).__name__))
            continue
        return name + ("" if not refused else " (refused: %s)" % "; ".join(refused)), call
    return None, "torch %s's Gloo refuses it: %s" % (torch.__version__, "; ".join(refused))


def rank_main(args):
    """One rank: joins the gloo group, measures every size, rank 0 prints."""
    import warnings

    import torch
    import torch.distributed as dist

    warnings.filterwarnings("ignore", category=UserWarning)  # torch 1.13 warns on every _all_gather_base
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%d" % args.port,
                            rank=args.rank, world_size=args.nproc)
    n = dist.get_world_size()
    api, call = pick_call(dist, torch, args.collective, n)
    if api is None:
        if args.rank == 0:
            rec = common.unsupported("gloo", args.collective, call)
            rec["torch"] = torch.__version__
            common.emit(rec)
    else:
        def make_op(size):
            _, inc, outc = common.layout(args.collective, size, n)
            inp, out = torch.zeros(inc, dtype=torch.float32), torch.zeros(outc, dtype=torch.float32)
            return lambda: call(out, inp, n)

        def max_reduce(times):
            t = torch.tensor(times, dtype=torch.float64)
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
            return t.tolist()

        common.measure_all(args, n, args.rank == 0, make_op, dist.barrier, max_reduce,
                           "gloo", "tcp (loopback)", {"torch": torch.__version__, "api": api})
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
