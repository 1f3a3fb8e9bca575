"""Shared helpers of the peer benchmarks (Gloo, Open MPI) in scripts/bench.

The peers are measured exactly as examples/allreduce-bench measures
ranktree (its internal/bench package, after nccl-tests' all_reduce_perf):

  * per size: --warmup untimed in-place allreduces, a barrier, then --iters
    timed allreduces back to back, each timed on every rank from launch to
    completion;
  * a Max allreduce of the per-iteration times gives the slowest rank's
    time per iteration; time_us and p50_us are the median of those, mean_us
    their mean (what Open MPI's usual scripts report), p90_us the 90th
    percentile;
  * algbw_GBps = bytes / time (1 GB = 1e9 B); busbw_GBps = algbw * 2(n-1)/n
    (nccl-tests' allreduce bus factor).

Rank 0 prints one JSON object per size with the keys bytes, count, type,
redop, time_us, algbw_GBps, busbw_GBps (the same keys as allreduce-bench
--json), plus "peer" and "transport".
"""

import argparse
import json
import re
import sys

_UNITS = {"": 1, "B": 1, "KIB": 1 << 10, "MIB": 1 << 20, "GIB": 1 << 30,
          "KB": 1000, "MB": 1000 ** 2, "GB": 1000 ** 3, "K": 1 << 10,
          "M": 1 << 20, "G": 1 << 30}


def parse_size(s):
    """Parses "4", "4KiB", "64MiB" (binary units as allreduce-bench) to bytes."""
    m = re.fullmatch(r"\s*(\d+)\s*([A-Za-z]*)\s*", s)
    if not m or m.group(2).upper() not in _UNITS:
        raise argparse.ArgumentTypeError("bad size %r (want e.g. 4, 4KiB, 64MiB)" % s)
    return int(m.group(1)) * _UNITS[m.group(2).upper()]


def parse_sizes(s):
    """Parses a comma-separated size list; "A..B" doubles from A to B (as allreduce-bench)."""
    out = []
    for x in s.split(","):
        if not x.strip():
            continue
        lo, sep, hi = x.partition("..")
        if not sep:
            out.append(parse_size(x))
            continue
        a, b = parse_size(lo), parse_size(hi)
        if a <= 0 or b < a:
            raise argparse.ArgumentTypeError("bad size range %r" % x)
        while a <= b:
            out.append(a)
            a *= 2
    return out


def split_sizes(sizes, limit=1 << 20):
    """(sizes below limit, sizes at or above it): the small and large iteration counts."""
    return [s for s in sizes if s < limit], [s for s in sizes if s >= limit]


def arg_parser(desc):
    """The flags every peer benchmark takes (a subset of allreduce-bench's)."""
    p = argparse.ArgumentParser(description=desc)
    p.add_argument("--sizes", type=parse_sizes, default=[4, 64 << 20],
                   help="comma-separated message sizes in bytes (default 4,64MiB)")
    p.add_argument("--iters", type=int, default=200,
                   help="timed iterations per size (default 200)")
    p.add_argument("--warmup", type=int, default=20,
                   help="untimed iterations per size (default 20)")
    p.add_argument("--large-iters", type=int, default=20,
                   help="timed iterations for sizes >= 1 MiB (default 20)")
    p.add_argument("--large-warmup", type=int, default=3,
                   help="untimed iterations for sizes >= 1 MiB (default 3)")
    return p


def iters_for(args, size):
    """(warmup, iters) for a message of size bytes."""
    if size >= (1 << 20):
        return args.large_warmup, args.large_iters
    return args.warmup, args.iters


def median(xs):
    """The middle value (mean of the two middle values for an even count)."""
    s = sorted(xs)
    m = len(s) // 2
    if len(s) % 2:
        return s[m]
    return (s[m - 1] + s[m]) / 2.0


def summarize(times_us):
    """(mean, median, 90th percentile by nearest rank) of times_us."""
    s = sorted(times_us)
    k = max(-(-9 * len(s) // 10) - 1, 0)
    return sum(s) / len(s), median(s), s[k]


def result(peer, transport, n, size, times_us):
    """The JSON record of one size from the slowest-rank times in µs."""
    t = median(times_us)
    mean, p50, p90 = summarize(times_us)
    algbw = size / (t * 1e-6) / 1e9 if t > 0 else 0.0
    return {
        "peer": peer,
        "transport": transport,
        "bytes": size,
        "count": size // 4,
        "type": "float32",
        "redop": "sum",
        "time_us": round(t, 3),
        "algbw_GBps": round(algbw, 6),
        "busbw_GBps": round(algbw * 2.0 * (n - 1) / n, 6),
        "mean_us": round(mean, 3),
        "p50_us": round(p50, 3),
        "p90_us": round(p90, 3),
        "iters": len(times_us),
    }


def emit(rec):
    """Prints one record as a JSON line on stdout and flushes."""
    sys.stdout.write(json.dumps(rec) + "\n")
    sys.stdout.flush()
