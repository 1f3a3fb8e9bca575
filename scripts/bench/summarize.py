"""Summarizes one bench-compare run: a table on stdout, results.json and results.md.

Inputs (written by scripts/bench-compare.sh into its output directory):
  raw/records.jsonl  one JSON record per (collective, world, peer, transport,
                     size, round), with the keys of allreduce-bench --json plus
                     peer, transport, world, round; or {"unsupported": why} for a
                     collective a peer cannot run
  raw/late.jsonl     allreduce-bench --late-rank records (LATE=1; optional)
  raw/launch.txt     `go test -bench Launch ./actors/` output (optional)
  raw/baseline.jsonl memcpy and loopback TCP GB/s before and after (optional)
  meta.json          date, machine, load, versions, settings

The headline figure of a cell (collective, world, peer, transport, size) is
the mean time per op: each round's mean of its timed loop (the slowest
rank's time per iteration, as Open MPI's scripts report it, tails
included), and the median of those over the rounds; the best round, the
per-round medians (p50) and 90th percentiles (p90) are kept beside it.
algbw = bytes / mean time (GB/s, 1e9 B/s; nccl-tests uses the mean too).
Sizes are keyed by the size asked for (req_bytes), as every peer lays
buffers out the same way (common.layout; nccl-tests' convention).

Stability: per cell, the median over rounds of the per-round mean divided
by the best round's; a cell above STABLE_LIMIT (issue 15: 1.5x) is flagged.

Goals checked (goals.py): issue 3's "Performance goals" (2 ranks, smallest
and largest size) and issue 15's "What must hold".

Tests: /usr/bin/python3 -m unittest discover -s scripts/bench -p 'test_*.py'
"""

import argparse
import json
import os
import re
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import coll_rank, fmt_size  # noqa: E402
from goals import GOAL15_WAIT_CPU_PCT, GOAL15_WAKE_US, STABLE_LIMIT, goals3, goals15  # noqa: E402

PEER_ORDER = {"ranktree": 0, "ranktree-base": 1, "gloo": 2, "openmpi": 3}

SIZE_CONVENTION = (
    "size S is nccl-tests': the buffer of allreduce and broadcast, the gathered output of allgather "
    "(each rank sends S/n), the input of reducescatter (each rank receives S/n); float32, so the count "
    "is S/4, rounded down to a multiple of n (at least n) for allgather and reducescatter: a size "
    "whose bytes changed shows the bytes used in brackets. Every peer uses this layout.")


def coll_of(r):
    """The record's collective (records before COLLECTIVES are allreduce)."""
    return r.get("collective", "allreduce")


def req_of(r):
    """The size asked for (req_bytes; older records only have bytes)."""
    return int(r.get("req_bytes", r["bytes"]))


def mean_of(r):
    """The record's mean time per op (time_us, the median, in older records)."""
    return float(r.get("mean_us", r["time_us"]))


def col_name(peer, transport):
    """A column's name: "peer/transport"."""
    return "%s/%s" % (peer, transport)


def cell(recs):
    """One cell's figures from its records (one per round)."""
    means = [mean_of(r) for r in recs]
    p50 = [float(r.get("p50_us", r["time_us"])) for r in recs]
    p90 = [float(r["p90_us"]) for r in recs if "p90_us" in r]
    c = {"mean_us": statistics.median(means), "mean_us_min": min(means), "mean_us_rounds": means,
         "p50_us": statistics.median(p50), "rounds": len(means),
         "used_bytes": int(recs[0]["bytes"])}
    c["spread"] = c["mean_us"] / c["mean_us_min"] if c["mean_us_min"] > 0 else 1.0
    if p90:
        c["p90_us"] = statistics.median(p90)
    p99 = [float(r["p99_us"]) for r in recs if "p99_us" in r]
    if p99:
        c["p99_us"] = statistics.median(p99)
    return c


def sweep(recs):
    """The per-collective view: a list of tables, one per (collective, world),
    each {"collective", "world", "cols": ["peer/transport"], "rows": [{"bytes"
    (asked for), "used_bytes", "cols": {col: cell}}]}. A cell (see cell())
    has mean_us (median over rounds of the per-round mean), mean_us_min (the
    best round), p50_us and p90_us (medians over rounds), spread (mean_us /
    mean_us_min) and, for ranktree columns, vs_openmpi: its mean_us over the
    best Open MPI column's (below 1: ranktree is faster)."""
    groups = {}
    for r in recs:
        if "unsupported" in r:
            continue
        t = (coll_of(r), int(r.get("world", 2)))
        key = (r["peer"], str(r["transport"]))
        groups.setdefault(t, {}).setdefault(key, {}).setdefault(req_of(r), []).append(r)
    out = []
    for (coll, w), by_col in sorted(groups.items(), key=lambda kv: (coll_rank(kv[0][0]), kv[0])):
        cols = sorted(by_col, key=lambda k: (PEER_ORDER.get(k[0], 9), k[1]))
        sizes = sorted({s for v in by_col.values() for s in v})
        rows = []
        for size in sizes:
            row = {"bytes": size, "cols": {}}
            for col in cols:
                if size in by_col[col]:
                    row["cols"][col_name(*col)] = cell(by_col[col][size])
            row["used_bytes"] = next(iter(row["cols"].values()))["used_bytes"]
            mpi = [v["mean_us"] for k, v in row["cols"].items() if k.startswith("openmpi/")]
            if mpi and min(mpi) > 0:
                for k, v in row["cols"].items():
                    if k.startswith("ranktree"):
                        v["vs_openmpi"] = v["mean_us"] / min(mpi)
            rows.append(row)
        out.append({"collective": coll, "world": w, "cols": [col_name(*c) for c in cols], "rows": rows})
    return out


def fmt_us(x):
    """A time in µs with 3 significant figures or so."""
    if x < 10:
        return "%.2f" % x
    if x < 1000:
        return "%.1f" % x
    return "%.0f" % x


def size_label(row):
    """The size asked for, and the bytes used when the layout changed them."""
    s = fmt_size(row["bytes"])
    if row.get("used_bytes", row["bytes"]) != row["bytes"]:
        s += " (%d B)" % row["used_bytes"]
    return s


def md_table(hdr, body):
    """A markdown table from a header and rows of strings."""
    return ["| " + " | ".join(hdr) + " |", "|" + "---|" * len(hdr)] + ["| " + " | ".join(b) + " |" for b in body]


def sweep_markdown(sw):
    """Per (collective, world): the mean table (median over rounds, best round
    in brackets, ranktree / best Open MPI) and the p50 / p90 table."""
    out = []
    last = None
    for t in sw:
        if t["collective"] != last:
            out += ["", "### %s" % t["collective"]]
            last = t["collective"]
        rt = [c for c in t["cols"] if c.startswith("ranktree")]
        hdr = ["size"] + ["%s mean" % c for c in t["cols"]] + ["%s / MPI" % c for c in rt]
        body = []
        for row in t["rows"]:
            cells = [size_label(row)]
            for c in t["cols"]:
                v = row["cols"].get(c)
                cells.append("%s (%s)" % (fmt_us(v["mean_us"]), fmt_us(v["mean_us_min"])) if v else "-")
            for c in rt:
                v = row["cols"].get(c)
                cells.append("%.2fx" % v["vs_openmpi"] if v and "vs_openmpi" in v else "-")
            body.append(cells)
        out += ["", "%s, %d ranks: mean time per op in us, median over rounds (best round); "
                "ranktree / MPI divides the means" % (t["collective"], t["world"]), ""]
        out += md_table(hdr, body)
        body = []
        for row in t["rows"]:
            cells = [size_label(row)]
            for c in t["cols"]:
                v = row["cols"].get(c)
                cells.append("%s / %s / %s" % (fmt_us(v["p50_us"]), fmt_us(v["p90_us"]) if "p90_us" in v else "-",
                                                fmt_us(v["p99_us"]) if "p99_us" in v else "-") if v else "-")
            body.append(cells)
        out += ["", "%s, %d ranks: median / p90 / p99 time per op in us (each the median over rounds; "
                "p99: the rare slow ops that move the mean)" % (t["collective"], t["world"]), ""]
        out += md_table(["size"] + ["%s p50 / p90 / p99" % c for c in t["cols"]], body)
    return out


def stability(sw):
    """{"cells": n, "flagged": [(collective, world, col, size, spread, rounds)],
    "rounds_max": k}: the cells measured in 2 rounds or more and those whose
    median over rounds exceeds STABLE_LIMIT x the best round."""
    n, flagged, rmax = 0, [], 0
    for t in sw:
        for row in t["rows"]:
            for c, v in row["cols"].items():
                rmax = max(rmax, v["rounds"])
                if v["rounds"] < 2:
                    continue
                n += 1
                if v["spread"] > STABLE_LIMIT:
                    flagged.append((t["collective"], t["world"], c, row["bytes"], v["spread"], v["rounds"]))
    return {"cells": n, "flagged": flagged, "rounds_max": rmax}


def stability_markdown(sw):
    """Per (collective, world): median over rounds / best round of the mean,
    flagged above STABLE_LIMIT."""
    st = stability(sw)
    if st["rounds_max"] < 2:
        return ["", "## Stability", "", "One round only: run ROUNDS=3 (or more) to see the spread from run to run."]
    out = ["", "## Stability", "",
           "Per cell: median over rounds of the per-round mean / best round's mean (issue 15: at most %gx; "
           "**bold !** above). %d of %d cells above %gx." % (STABLE_LIMIT, len(st["flagged"]), st["cells"], STABLE_LIMIT)]
    for t in sw:
        body = []
        for row in t["rows"]:
            cells = [size_label(row)]
            for c in t["cols"]:
                v = row["cols"].get(c)
                if not v:
                    cells.append("-")
                    continue
                s = "%s / %s = %.2fx" % (fmt_us(v["mean_us"]), fmt_us(v["mean_us_min"]), v["spread"])
                if v["rounds"] >= 2 and v["spread"] > STABLE_LIMIT:
                    s = "**%s !**" % s
                cells.append(s)
            body.append(cells)
        out += ["", "%s, %d ranks: median / best (us)" % (t["collective"], t["world"]), ""]
        out += md_table(["size"] + t["cols"], body)
    return out


def load_records(path):
    """The JSON lines of path; [] when it does not exist."""
    recs = []
    if os.path.exists(path):
        with open(path) as f:
            for line in f:
                line = line.strip()
                if line:
                    recs.append(json.loads(line))
    return recs


def aggregate(recs, world):
    """{(peer, transport): {size: summary}}: per size the median over rounds
    of the per-round mean (mean_us), p50 and p90, and the algbw and busbw of
    the mean time (allreduce's bus factor)."""
    groups = {}
    for r in recs:
        key = (r["peer"], str(r["transport"]))
        groups.setdefault(key, {}).setdefault(req_of(r), []).append(r)
    out = {}
    for key, by_size in groups.items():
        out[key] = {}
        for size, rs in by_size.items():
            c = cell(rs)
            t = c["mean_us"]
            algbw = c["used_bytes"] / (t * 1e-6) / 1e9 if t > 0 else 0.0
            out[key][size] = {
                "time_us": t,
                "time_us_rounds": c["mean_us_rounds"],
                "p50_us": c["p50_us"],
                "p90_us": c.get("p90_us"),
                "algbw_GBps": algbw,
                "busbw_GBps": algbw * 2.0 * (world - 1) / world,
            }
    return out


_BENCH = re.compile(r"^(Benchmark\S+?)(?:-\d+)?\s+(\d+)\s+([\d.]+) ns/op")


def parse_launch(path):
    """{benchmark: {sub: median ns/op}} and per-benchmark overhead in µs."""
    if not os.path.exists(path):
        return None
    vals = {}
    with open(path) as f:
        for line in f:
            m = _BENCH.match(line.strip())
            if m:
                vals.setdefault(m.group(1), []).append(float(m.group(3)))
    if not vals:
        return None
    res = {}
    for name, xs in vals.items():
        parent, _, sub = name.partition("/")
        res.setdefault(parent, {})[sub or "-"] = statistics.median(xs)
    for parent, subs in res.items():
        if "direct" in subs and "processgroup" in subs:
            subs["overhead_us"] = (subs["processgroup"] - subs["direct"]) / 1e3
    return res


def load_baseline(path):
    """The baseline records (raw/baseline.jsonl)."""
    return [dict(r) for r in load_records(path)]


def summary_rows(recs, world):
    """The summary rows of allreduce on world ranks: per (peer, transport) the
    smallest and largest size's mean, p50, p90, algbw and the ratios."""
    agg = aggregate(recs, world)
    sizes = sorted({s for v in agg.values() for s in v})
    small, large = (sizes[0], sizes[-1]) if sizes else (None, None)
    base = {}
    for (peer, tr), v in agg.items():
        if peer in ("gloo", "openmpi") and large in v:
            # the peer's best row: the comparison most favourable to the peer
            base[peer] = max(base.get(peer, 0.0), v[large]["algbw_GBps"])
    rows = []
    for (peer, tr) in sorted(agg, key=lambda k: (PEER_ORDER.get(k[0], 9), k[1])):
        v = agg[(peer, tr)]
        row = {"peer": peer, "transport": tr}
        if small in v:
            row["small_bytes"] = small
            row["small_latency_us"] = v[small]["time_us"]
            row["small_p50_us"] = v[small]["p50_us"]
            if v[small]["p90_us"] is not None:
                row["small_p90_us"] = v[small]["p90_us"]
            row["small_latency_us_rounds"] = v[small]["time_us_rounds"]
        if large in v:
            row["large_bytes"] = large
            row["large_time_us"] = v[large]["time_us"]
            row["large_algbw_GBps"] = v[large]["algbw_GBps"]
            row["large_busbw_GBps"] = v[large]["busbw_GBps"]
            row["large_time_us_rounds"] = v[large]["time_us_rounds"]
            if peer == "ranktree":
                for b in ("gloo", "openmpi"):
                    if base.get(b):
                        row["ratio_vs_" + b] = v[large]["algbw_GBps"] / base[b]
        rows.append(row)
    return rows, small, large


LATE_FIELDS = ("wait_cpu_pct", "wake_us", "lag_us", "late_op_us")


def late_rows(recs):
    """Per peer (ranktree first) and size asked for: the late-arrival
    figures, each the median over rounds (wait_cpu_pct_max and wake_us_max:
    the largest, wake_us_min the smallest)."""
    by = {}
    for r in recs:
        by.setdefault((r.get("peer", "ranktree"), req_of(r)), []).append(r)
    out = []
    for (peer, size), rs in sorted(by.items(), key=lambda kv: (kv[0][0] != "ranktree", kv[0][0], kv[0][1])):
        row = {"peer": peer, "bytes": size, "used_bytes": int(rs[0]["bytes"]), "rounds": len(rs),
               "late_us": float(rs[0].get("late_us", 0)), "late_rank": rs[0].get("late_rank"),
               "transport": rs[0].get("transport"), "world": rs[0].get("world"),
               "late_busy": bool(rs[0].get("late_busy", False))}
        for k in LATE_FIELDS:
            row[k] = statistics.median(float(r.get(k, 0)) for r in rs)
        row["wait_cpu_pct_max"] = max(float(r.get("wait_cpu_pct_max", 0)) for r in rs)
        row["wake_us_min"] = min(float(r.get("wake_us_min", 0)) for r in rs)
        row["wake_us_max"] = max(float(r.get("wake_us_max", 0)) for r in rs)
        out.append(row)
    return out


def late_markdown(rows):
    """The late-arrival table."""
    if not rows:
        return []
    r0 = rows[0]  # ranktree's first (late_rows)
    out = ["", "## Late arrival", "",
           "allreduce, %s ranks, %s: rank %s launches every timed iteration %.0f us late, %s in between "
           "(allreduce-bench --late-rank%s). wait CPU: the waiting rank's process CPU from its launch to its return, %% of one core "
           "(median over iterations, max); wake: from the late rank's launch to the waiting rank's return (median, "
           "min-max; the op's own time is in it); lag: the waiting rank's return after the late rank's own; late rank's op: its own launch to return "
           "(wake is about that plus lag). Issue 15: at most %g%% and %g us." % (
               r0.get("world"), r0.get("transport"), r0.get("late_rank"), r0["late_us"],
               "busy" if r0.get("late_busy") else "asleep", " --late-busy" if r0.get("late_busy") else "",
               GOAL15_WAIT_CPU_PCT, GOAL15_WAKE_US), ""]
    if any(r["peer"] != "ranktree" for r in rows):
        out[-1:-1] = ["", "Open MPI's rows: mpi_allreduce.py --late-rank, the same pattern and figures; its times "
                      "include Python's own call path, which after the delay also runs from cold caches."]
    body = []
    for r in rows:
        body.append([r["peer"], size_label(r), "%.1f (%.1f)" % (r["wait_cpu_pct"], r["wait_cpu_pct_max"]),
                     "%s (%s-%s)" % (fmt_us(r["wake_us"]), fmt_us(r["wake_us_min"]), fmt_us(r["wake_us_max"])),
                     fmt_us(r["lag_us"]), fmt_us(r["late_op_us"]) if r.get("late_op_us") else "-", str(r["rounds"])])
    return out + md_table(["peer", "size", "wait CPU % (max)", "wake us (min-max)", "lag us", "late rank's op us", "rounds"], body)


def unsupported_list(recs):
    """Distinct (peer, collective, why) of the records of collectives a peer cannot run."""
    seen = []
    for r in recs:
        if "unsupported" in r:
            k = (r["peer"], coll_of(r), r["unsupported"])
            if k not in seen:
                seen.append(k)
    return seen


def substitutes_list(recs):
    """Distinct (peer, collective, api) where a peer ran another call than
    its first choice (the api names what was refused; gloo_allreduce.py)."""
    seen = []
    for r in recs:
        if "refused" in str(r.get("api", "")):
            k = (r["peer"], coll_of(r), r["api"])
            if k not in seen:
                seen.append(k)
    return seen


# FAR_C2C: a run whose cache-line round trip between CPUs 0 and 1 (c2c_ns,
# allreduce-bench --c2c-probe just before it) is at least this many times
# the smallest of the sweep ran in the host's far state (docs/benchmarks.md,
# "Issue 15, session 14": about 55 against 320 ns on the development VM).
FAR_C2C = 3.0


def c2c_rows(recs):
    """The core-to-core round trip recorded before each run (c2c_ns), one
    row per peer, transport, collective and world with the rounds' values in
    round order, and whether each was in the far state. Records without it
    (older scripts, a probe that failed) are left out."""
    runs = {}
    for r in recs:
        if "c2c_ns" not in r or not isinstance(r["c2c_ns"], (int, float)):
            continue
        coll = coll_of(r) + (" (late arrival)" if "wake_us" in r else "")
        key = (r.get("peer", "?"), r.get("transport", "?"), coll, int(r.get("world", 2)))
        # a run's records share its probe (c2c_run numbers the probes;
        # without it, records with equal values count as one run)
        rd = runs.setdefault(key, {}).setdefault(int(r.get("round", 0)), {})
        rd.setdefault(r.get("c2c_run", r["c2c_ns"]), r["c2c_ns"])
    runs = {k: {rd: list(probes.values()) for rd, probes in rounds.items()} for k, rounds in runs.items()}
    allv = [v for rounds in runs.values() for vals in rounds.values() for v in vals]
    if not allv:
        return []
    near = min(allv)
    rows = []
    for (peer, tr, coll, world), rounds in sorted(runs.items()):
        vals = [v for rd in sorted(rounds) for v in rounds[rd]]
        rows.append({"peer": peer, "transport": tr, "collective": coll, "world": world,
                     "rounds": [rounds[rd] for rd in sorted(rounds)],
                     "far": sum(1 for v in vals if v >= FAR_C2C * near), "runs": len(vals)})
    return rows


def c2c_markdown(rows):
    """The c2c table, or nothing."""
    if not rows:
        return []
    near = min(v for r in rows for rd in r["rounds"] for v in rd)
    out = ["", "## The host's state before each run", "",
           "Round trip of a cache line between CPUs 0 and 1 (`allreduce-bench --c2c-probe`, ns) just before each "
           "run, per round (a ranktree round has two runs: its small sizes, then its large ones). A run at or "
           "above %.1f× the smallest (%.0f ns), marked *, started in the host's far state, in which every "
           "shared-memory exchange is slower (docs/benchmarks.md, \"Issue 15, session 14\")." % (FAR_C2C, near), "",
           "| peer | transport | collective | ranks | rounds | far runs |", "|---|---|---|---|---|---|"]
    for r in rows:
        rounds = "; ".join(", ".join("%.0f%s" % (v, "*" if v >= FAR_C2C * near else "") for v in rd)
                           for rd in r["rounds"])
        out.append("| %s | %s | %s | %d | %s | %d of %d |" % (
            r["peer"], r["transport"], r["collective"], r["world"], rounds, r["far"], r["runs"]))
    return out


def build(meta, recs, launch, baseline=None, late=None):
    """The results object: the allreduce summary rows for the smallest world
    measured, ratios, goals, the per-collective sweep, stability, the
    late-arrival rows, inputs."""
    measured = [r for r in recs if "unsupported" not in r]
    worlds = sorted({int(r.get("world", meta.get("world_size", 2))) for r in measured}) or [int(meta.get("world_size", 2))]
    world = worlds[0]
    ar = [r for r in measured if coll_of(r) == "allreduce" and int(r.get("world", world)) == world]
    rows, small, large = summary_rows(ar, world)
    sw = sweep(measured)
    lr = late_rows(late or [])
    return {"meta": meta, "world": world, "rows": rows, "launch": launch,
            "goals": goals3(rows, small, large, launch),
            "goals15": goals15(sw, [r for r in lr if r["peer"] == "ranktree"]),
            "sweep": sw, "stability": stability(sw), "late": lr, "c2c": c2c_rows(recs + (late or [])),
            "unsupported": [{"peer": p, "collective": c, "why": w} for p, c, w in unsupported_list(recs)],
            "substitutes": [{"peer": p, "collective": c, "api": a} for p, c, a in substitutes_list(recs)],
            "baseline": baseline or [], "records": recs, "late_records": late or []}


def table(res):
    """The header and rows of the summary table, as strings."""
    rows = res["rows"]
    small = next((r["small_bytes"] for r in rows if "small_bytes" in r), 4)
    large = next((r["large_bytes"] for r in rows if "large_bytes" in r), 64 << 20)
    hdr = ["peer", "transport", "%s mean (us)" % fmt_size(small), "p50 / p90 (us)",
           "%s mean (ms)" % fmt_size(large), "%s algbw (GB/s)" % fmt_size(large),
           "busbw (GB/s)", "ranktree/Gloo", "ranktree/MPI"]
    body = []
    for r in rows:
        def f(k, fmt, scale=1.0):
            return fmt % (r[k] * scale) if k in r else "-"
        body.append([r["peer"], r["transport"], f("small_latency_us", "%.2f"),
                     "%s / %s" % (f("small_p50_us", "%.2f"), f("small_p90_us", "%.2f")),
                     f("large_time_us", "%.2f", 1e-3), f("large_algbw_GBps", "%.3f"),
                     f("large_busbw_GBps", "%.3f"), f("ratio_vs_gloo", "%.2fx"),
                     f("ratio_vs_openmpi", "%.2fx")])
    return hdr, body


def goals_markdown(title, goals):
    """A goals table."""
    if not goals:
        return []
    met = {True: "yes", False: "NO", None: "n/a"}
    return ["", title, ""] + md_table(["goal", "measured", "met"],
                                      [[g["goal"], g["value"], met[g["met"]]] for g in goals])


def header_markdown(m):
    """The settings lines of results.md."""
    out = ["# bench-compare results", ""]
    out.append("- date: %s" % m.get("date", "?"))
    out.append("- machine: %s, %s CPU cores, %s" % (m.get("host", "?"), m.get("nproc", "?"), m.get("cpu", "?")))
    out.append("- load: before `%s`; after `%s`" % (m.get("uptime_before", "?"), m.get("uptime_after", "?")))
    out.append("- versions: %s; torch %s; %s; mpi4py %s; numpy %s" % (
        m.get("go", "?"), m.get("torch", "?"), m.get("openmpi", "?"), m.get("mpi4py", "?"), m.get("numpy", "?")))
    out.append("- source: git %s" % m.get("git", "?"))
    out.append("- settings: %s ranks; %s; float32 (sum where it reduces); %s rounds; small sizes %s iters + %s warm-up, "
               "from 1 MiB %s iters + %s warm-up" % (
                   m.get("worlds", m.get("world_size", 2)), m.get("collectives", "allreduce"), m.get("rounds", "?"),
                   m.get("iters_small", "?"), m.get("warmup_small", "?"), m.get("iters_large", "?"), m.get("warmup_large", "?")))
    out.append("- timing: per size, warm-up, a barrier, then the timed loop; each iteration's time is the slowest "
               "rank's (Max allreduce); a record has the loop's mean (the headline: what Open MPI's scripts "
               "report), median and p90; a cell is the median over rounds (separate process launches)")
    out.append("- sizes: " + SIZE_CONVENTION)
    if m.get("late"):
        out.append("- late-arrival pass: %s" % m["late"])
    if m.get("notes"):
        out.append("- notes: %s" % m["notes"])
    return out


def markdown(res):
    """results.md: settings, the summary, goals, the sweep, stability, late
    arrival, what was not measured, baselines, launch overhead."""
    hdr, body = table(res)
    out = header_markdown(res["meta"])
    if body:
        out += ["", "## Summary", "",
                "allreduce, %d ranks, smallest and largest size: mean time per op (median over rounds of each "
                "round's mean), p50 / p90 (medians over rounds); algbw from the mean:" % res.get("world", 2), ""]
        out += md_table(hdr, body)
    out += goals_markdown("Goals (issue 3):", res["goals"])
    out += goals_markdown("Goals (issue 15, \"What must hold\"):", res.get("goals15", []))
    if res.get("sweep"):
        out += ["", "## Sweep"]
        out += sweep_markdown(res["sweep"])
        out += stability_markdown(res["sweep"])
    out += late_markdown(res.get("late", []))
    out += c2c_markdown(res.get("c2c", []))
    if res.get("unsupported") or res.get("substitutes"):
        out += ["", "## Not measured, or measured with another call", ""]
        for u in res.get("unsupported", []):
            out.append("- %s %s: not measured: %s" % (u["peer"], u["collective"], u["why"]))
        for u in res.get("substitutes", []):
            out.append("- %s %s: measured with %s" % (u["peer"], u["collective"], u["api"]))
    if res.get("baseline"):
        out += ["", "Baselines (scripts/bench/baseline.py, one thread / one stream):", ""]
        for b in res["baseline"]:
            out.append("- %s: memcpy %.2f GB/s, loopback TCP %.2f GB/s (%s)" % (
                b.get("when", "?"), b["memcpy_GBps"], b["tcp_loopback_GBps"], fmt_size(b["bytes"])))
    if res["launch"]:
        out += ["", "Actor launch overhead (`go test -run '^$' -bench Launch ./actors/`, median ns/op; "
                "overhead = processgroup - direct, a negative value is noise):", "",
                "| benchmark | direct (ns/op) | processgroup (ns/op) | pipelined (ns/op) | overhead (us/op) |",
                "|---|---|---|---|---|"]
        for parent, s in sorted(res["launch"].items()):
            out.append("| %s | %s | %s | %s | %s |" % (
                parent, "%.0f" % s["direct"] if "direct" in s else "-",
                "%.0f" % s["processgroup"] if "processgroup" in s else "-",
                "%.0f" % s["processgroup-pipelined"] if "processgroup-pipelined" in s else "-",
                "%.2f" % s["overhead_us"] if "overhead_us" in s else "-"))
    rounds = [r for r in res["rows"] if "large_time_us_rounds" in r or "small_latency_us_rounds" in r]
    if rounds:
        out += ["", "Per-round means (us), allreduce, %d ranks, smallest size | largest size:" % res.get("world", 2), ""]
        for r in rounds:
            out.append("- %s/%s: %s | %s" % (
                r["peer"], r["transport"],
                ", ".join(fmt_us(x) for x in r.get("small_latency_us_rounds", [])),
                ", ".join(fmt_us(x) for x in r.get("large_time_us_rounds", []))))
    return "\n".join(out) + "\n"


def main():
    """Reads the run directory, writes results.json/results.md, prints results.md."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("dir", help="the bench-compare output directory")
    args = p.parse_args()
    with open(os.path.join(args.dir, "meta.json")) as f:
        meta = json.load(f)
    recs = load_records(os.path.join(args.dir, "raw", "records.jsonl"))
    late = load_records(os.path.join(args.dir, "raw", "late.jsonl"))
    launch = parse_launch(os.path.join(args.dir, "raw", "launch.txt"))
    baseline = load_baseline(os.path.join(args.dir, "raw", "baseline.jsonl"))
    res = build(meta, recs, launch, baseline, late)
    with open(os.path.join(args.dir, "results.json"), "w") as f:
        json.dump(res, f, indent=2)
        f.write("\n")
    md = markdown(res)
    with open(os.path.join(args.dir, "results.md"), "w") as f:
        f.write(md)
    sys.stdout.write(md)
    return 0 if recs or late else 1


if __name__ == "__main__":
    sys.exit(main())
