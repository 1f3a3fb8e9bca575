"""Machine baselines for reading the allreduce figures: memcpy and loopback TCP.

Prints one JSON object on stdout:
  memcpy_GBps        numpy copyto of --bytes float32 (one thread), bytes / median time
  tcp_loopback_GBps  one TCP stream on 127.0.0.1 from a child process, bytes / median time

GB/s is 1e9 B/s, as algbw. Both are upper bounds of a sort: a 2-rank ring
allreduce moves S/2 each way per phase, and an shm transport copies each
byte at least once.

    /usr/bin/python3 scripts/bench/baseline.py --bytes 64MiB
"""

import json
import multiprocessing as mp
import os
import socket
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402


def memcpy_gbps(size, iters):
    """GB/s of one numpy copy of size bytes, median of iters."""
    import numpy as np
    src = np.ones(size // 4, dtype=np.float32)
    dst = np.zeros_like(src)
    np.copyto(dst, src)
    ts = []
    for _ in range(iters):
        t0 = time.perf_counter()
        np.copyto(dst, src)
        ts.append(time.perf_counter() - t0)
    return size / common.median(ts) / 1e9


def _sink(port, size, iters):
    """The receiving process: reads iters+1 transfers, acknowledging each."""
    with socket.create_connection(("127.0.0.1", port)) as s:
        buf = bytearray(1 << 20)
        view = memoryview(buf)
        for _ in range(iters + 1):
            left = size
            while left:
                n = s.recv_into(view[:min(left, len(buf))])
                if n == 0:
                    return
                left -= n
            s.sendall(b"k")


def tcp_gbps(size, iters):
    """GB/s of one loopback TCP stream sending size bytes, median of iters."""
    with socket.socket() as ls:
        ls.bind(("127.0.0.1", 0))
        ls.listen(1)
        port = ls.getsockname()[1]
        child = mp.get_context("spawn").Process(target=_sink, args=(port, size, iters))
        child.start()
        conn, _ = ls.accept()
    data = memoryview(bytearray(size))
    ts = []
    with conn:
        for i in range(iters + 1):
            t0 = time.perf_counter()
            conn.sendall(data)
            conn.recv(1)
            if i:  # the first transfer warms the connection up
                ts.append(time.perf_counter() - t0)
    child.join()
    return size / common.median(ts) / 1e9


def main():
    """Measures both baselines and prints them as one JSON line."""
    args = argparse_parser().parse_args()
    out = {
        "bytes": args.bytes,
        "memcpy_GBps": round(memcpy_gbps(args.bytes, args.iters), 3),
        "tcp_loopback_GBps": round(tcp_gbps(args.bytes, args.iters), 3),
    }
    print(json.dumps(out))
    return 0


def argparse_parser():
    """The script's flags."""
    import argparse
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bytes", type=common.parse_size, default=64 << 20, help="transfer size (default 64MiB)")
    p.add_argument("--iters", type=int, default=10, help="timed transfers (default 10)")
    return p


if __name__ == "__main__":
    sys.exit(main())
