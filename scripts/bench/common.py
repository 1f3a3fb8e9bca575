"""Shared helpers of the peer benchmarks (Gloo, Open MPI) in scripts/bench.

The peers are measured exactly as examples/allreduce-bench measures
ranktree (its internal/bench package, after nccl-tests' *_perf programs):

  * per size: --warmup untimed ops, a barrier, then --iters timed ops back
    to back, each timed on every rank from launch to completion;
  * a Max allreduce of the per-iteration times gives the slowest rank's
    time per iteration; time_us and p50_us are the median of those, mean_us
    their mean (what Open MPI's usual scripts report), p90_us the 90th
    percentile;
  * the size S of a message is nccl-tests' (layout(), as allreduce-bench's
    Collective.Layout): the one buffer of allreduce and broadcast, the
    gathered output of allgather (each rank sends S/n), the input of
    reducescatter (each rank receives S/n); for the last two the float32
    count is rounded down to a multiple of n, at least n;
  * algbw_GBps = bytes / time (1 GB = 1e9 B); busbw_GBps = algbw * factor,
    nccl-tests' bus factor: 2(n-1)/n for allreduce, (n-1)/n for allgather
    and reducescatter, 1 for broadcast.

Rank 0 prints one JSON object per size with the keys of allreduce-bench
--json (collective, req_bytes, bytes, count, type, redop, time_us,
algbw_GBps, busbw_GBps, mean_us, p50_us, p90_us), plus "peer",
"transport" and "iters". A collective the peer cannot run gives one record
{"peer", "collective", "unsupported": why} instead (unsupported()).

Tests: /usr/bin/python3 -m unittest discover -s scripts/bench -p 'test_*.py'
"""

import argparse
import json
import re
import sys
import time

# The collectives the peer scripts measure (allreduce-bench's --collective names).
COLLECTIVES = ("allreduce", "allgather", "reducescatter", "broadcast")

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


def fmt_size(n):
    """n bytes as "4 B", "64 MiB"."""
    for unit, div in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= div and n % div == 0:
            return "%d %s" % (n // div, unit)
    return "%d B" % n


def coll_rank(collective):
    """The collective's place in COLLECTIVES (tables follow it); unknown ones last."""
    return COLLECTIVES.index(collective) if collective in COLLECTIVES else len(COLLECTIVES)


def split_sizes(sizes, limit=1 << 20):
    """(sizes below limit, sizes at or above it): the small and large iteration counts."""
    return [s for s in sizes if s < limit], [s for s in sizes if s >= limit]


def layout(collective, nbytes, n, elem=4):
    """(count, in_count, out_count) in elements for a message of nbytes on n
    ranks, as allreduce-bench's Collective.Layout: count = nbytes/elem (at
    least 1), rounded down to a multiple of n (at least n) for allgather and
    reducescatter; out_count 0 means in place (allreduce, broadcast)."""
    count = max(nbytes // elem, 1)
    if collective == "allgather":
        count = max(count // n * n, n)
        return count, count // n, count
    if collective == "reducescatter":
        count = max(count // n * n, n)
        return count, count, count // n
    if collective in ("allreduce", "broadcast"):
        return count, count, 0
    raise ValueError("unknown collective %r (want one of %s)" % (collective, ", ".join(COLLECTIVES)))


def bus_factor(collective, n):
    """busbw / algbw for n ranks (nccl-tests' PERFORMANCE.md)."""
    if n < 1:
        return 0.0
    f = (n - 1) / float(n)
    return {"allreduce": 2 * f, "allgather": f, "reducescatter": f, "broadcast": 1.0}[collective]


def arg_parser(desc):
    """The flags every peer benchmark takes (a subset of allreduce-bench's)."""
    p = argparse.ArgumentParser(description=desc)
    p.add_argument("--collective", choices=COLLECTIVES, default="allreduce",
                   help="the collective measured (default allreduce; float32, sum where it reduces, root 0)")
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
    """(mean, median, 90th and 99th percentile by nearest rank) of times_us."""
    s = sorted(times_us)
    k = max(-(-9 * len(s) // 10) - 1, 0)
    k99 = max(-(-99 * len(s) // 100) - 1, 0)
    return sum(s) / len(s), median(s), s[k], s[k99]


def result(peer, transport, n, size, times_us, collective="allreduce"):
    """The JSON record of one size (requested bytes) from the slowest-rank
    times in µs; bytes and count are those layout() makes of size."""
    t = median(times_us)
    mean, p50, p90, p99 = summarize(times_us)
    count = layout(collective, size, n)[0]
    nbytes = 4 * count
    algbw = nbytes / (t * 1e-6) / 1e9 if t > 0 else 0.0
    return {
        "peer": peer,
        "transport": transport,
        "collective": collective,
        "req_bytes": size,
        "bytes": nbytes,
        "count": count,
        "type": "float32",
        "redop": "sum" if collective in ("allreduce", "reducescatter") else "none",
        "time_us": round(t, 3),
        "algbw_GBps": round(algbw, 6),
        "busbw_GBps": round(algbw * bus_factor(collective, n), 6),
        "mean_us": round(mean, 3),
        "p50_us": round(p50, 3),
        "p90_us": round(p90, 3),
        "p99_us": round(p99, 3),
        "iters": len(times_us),
    }


def unsupported(peer, collective, why):
    """The record of a collective the peer cannot run, and why."""
    return {"peer": peer, "collective": collective, "unsupported": why}


def time_loop(op, warmup, iters, barrier, clock_ns=time.perf_counter_ns):
    """Runs op warmup times, then barrier(), then iters timed times; the
    per-iteration times of this rank in µs."""
    for _ in range(warmup):
        op()
    barrier()
    times = [0.0] * iters
    for i in range(iters):
        t0 = clock_ns()
        op()
        times[i] = (clock_ns() - t0) / 1e3
    return times


def measure_all(args, n, lead, make_op, barrier, max_reduce, peer, transport, extra=None):
    """Measures args.collective at every size of args.sizes and emits the
    records on the lead rank: make_op(size) returns the op of one size
    (its buffers allocated), max_reduce(times) the elementwise maximum of
    every rank's times; extra is merged into each record."""
    for size in args.sizes:
        warmup, iters = iters_for(args, size)
        op = make_op(size)
        times = max_reduce(time_loop(op, warmup, iters, barrier))
        if lead:
            rec = result(peer, transport, n, size, times, args.collective)
            rec.update(extra or {})
            emit(rec)


def late_figures(rows, n, late_rank):
    """The late-arrival figures of one size, as allreduce-bench's RunLate
    computes them, from rows: per iteration, every rank's
    [launch ns, return ns, process CPU ns] (3n integers, wall clock shared
    by the ranks of one host). wait_cpu_pct: the waiting ranks' CPU from
    launch to return, % of one core (median over iterations of the worst
    waiting rank; _max the largest; _all the ratio of the sums); wake_us:
    the late rank's launch to the last waiting rank's return; late_op_us:
    the late rank's own launch to return; lag_us: wake minus late_op
    (median, min). Times in µs."""
    cpu_pct, wake, lag, own = [], [], [], []
    cpu_sum, wall_sum = 0, 0
    for row in rows:
        arrived, late_end = row[3 * late_rank], row[3 * late_rank + 1]
        worst, last = 0.0, 0.0
        for r in range(n):
            if r == late_rank:
                continue
            start, end, cpu = row[3 * r], row[3 * r + 1], row[3 * r + 2]
            if end > start:
                worst = max(worst, 100.0 * cpu / (end - start))
                cpu_sum += cpu
                wall_sum += end - start
            last = max(last, (end - arrived) / 1e3)
        o = (late_end - arrived) / 1e3
        cpu_pct.append(worst)
        wake.append(last)
        own.append(o)
        lag.append(last - o)
    return {"wait_cpu_pct": median(cpu_pct), "wait_cpu_pct_max": max(cpu_pct),
            "wait_cpu_pct_all": 100.0 * cpu_sum / wall_sum if wall_sum else 0.0,
            "wake_us": median(wake), "wake_us_min": min(wake), "wake_us_max": max(wake),
            "lag_us": median(lag), "lag_us_min": min(lag), "late_op_us": median(own)}


def emit(rec):
    """Prints one record as a JSON line on stdout and flushes."""
    sys.stdout.write(json.dumps(rec) + "\n")
    sys.stdout.flush()
