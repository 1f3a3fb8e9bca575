"""Summarizes one bench-compare run: a table on stdout, results.json and results.md.

Inputs (written by scripts/bench-compare.sh into its output directory):
  raw/records.jsonl  one JSON record per (peer, transport, size, round), with
                     the keys of allreduce-bench --json plus peer, transport, round
  raw/launch.txt     `go test -bench Launch ./actors/` output (optional)
  raw/baseline.jsonl memcpy and loopback TCP GB/s before and after (optional)
  meta.json          date, machine, load, versions, settings

Per (peer, transport, size) the figure is the median over rounds of the
per-round median time; algbw = bytes / that time (GB/s, 1e9 B/s) and busbw =
algbw * 2(n-1)/n. The ratios divide ranktree's algbw at the largest size by
Gloo's and by Open MPI's best row (Open MPI may be run bound and unbound). The goals checked are issue 3's "Performance goals".
"""

import argparse
import json
import os
import re
import statistics
import sys

# issue 3, "Performance goals"
GOAL_VS_GLOO = 4.0        # 64 MiB algbw, ranktree / Gloo, at least
GOAL_VS_MPI = 2.0         # 64 MiB algbw, ranktree / Open MPI, at least
GOAL_LAT_US = {"shm": 10.0, "tcp": 60.0}   # 4 B median latency, at most
GOAL_LAUNCH_US = 5.0      # actor launch overhead per op, at most

PEER_ORDER = {"ranktree": 0, "ranktree-base": 1, "gloo": 2, "openmpi": 3}


def sweep(recs):
    """The full-sweep view: {world: {"cols": [(peer, transport)], "rows": [...]}}.

    Per (world, peer, transport, size): mean_us is the median over rounds of
    each round's mean time per op (the mean of the timed loop, as Open MPI's
    scripts report it), mean_us_min the best round, p50_us the median over
    rounds of the per-round medians. vs_openmpi divides a ranktree column's
    mean_us by the best Open MPI column's (below 1: ranktree is faster).
    Records without mean_us (older runs) fall back on time_us."""
    cells = {}
    for r in recs:
        w = int(r.get("world", 2))
        key = (r["peer"], str(r["transport"]))
        c = cells.setdefault(w, {}).setdefault(key, {}).setdefault(int(r["bytes"]), {"mean": [], "p50": []})
        c["mean"].append(float(r.get("mean_us", r["time_us"])))
        c["p50"].append(float(r.get("p50_us", r["time_us"])))
    out = {}
    for w, by_col in sorted(cells.items()):
        cols = sorted(by_col, key=lambda k: (PEER_ORDER.get(k[0], 9), k[1]))
        sizes = sorted({s for v in by_col.values() for s in v})
        rows = []
        for size in sizes:
            row = {"bytes": size, "cols": {}}
            for col in cols:
                c = by_col[col].get(size)
                if c:
                    row["cols"]["%s/%s" % col] = {"mean_us": statistics.median(c["mean"]),
                                                  "mean_us_min": min(c["mean"]),
                                                  "p50_us": statistics.median(c["p50"]),
                                                  "rounds": len(c["mean"])}
            mpi = [v["mean_us"] for k, v in row["cols"].items() if k.startswith("openmpi/")]
            if mpi:
                for k, v in row["cols"].items():
                    if k.startswith("ranktree"):
                        v["vs_openmpi"] = v["mean_us"] / min(mpi)
            rows.append(row)
        out[w] = {"cols": ["%s/%s" % c for c in cols], "rows": rows}
    return out


def sweep_markdown(sw):
    """One table per world size: mean µs (median over rounds, best round in
    brackets) per column, and ranktree / best Open MPI."""
    out = []
    for w, t in sorted(sw.items()):
        rt = [c for c in t["cols"] if c.startswith("ranktree")]
        hdr = ["size"] + ["%s mean us" % c for c in t["cols"]] + ["%s / MPI" % c for c in rt]
        out += ["", "%d ranks, mean time per allreduce in us: median over rounds (best round)" % w, "",
                "| " + " | ".join(hdr) + " |", "|" + "---|" * len(hdr)]
        for row in t["rows"]:
            cells = [fmt_size(row["bytes"])]
            for c in t["cols"]:
                v = row["cols"].get(c)
                cells.append("%.1f (%.1f)" % (v["mean_us"], v["mean_us_min"]) if v else "-")
            for c in rt:
                v = row["cols"].get(c)
                cells.append("%.2fx" % v["vs_openmpi"] if v and "vs_openmpi" in v else "-")
            out.append("| " + " | ".join(cells) + " |")
    return out


def fmt_size(n):
    """n bytes as "4 B", "64 MiB"."""
    for unit, div in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= div and n % div == 0:
            return "%d %s" % (n // div, unit)
    return "%d B" % n


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
    """{(peer, transport): {bytes: summary}} with the median over rounds."""
    groups = {}
    for r in recs:
        key = (r["peer"], str(r["transport"]))
        groups.setdefault(key, {}).setdefault(int(r["bytes"]), []).append(float(r["time_us"]))
    out = {}
    for key, by_size in groups.items():
        out[key] = {}
        for size, times in by_size.items():
            t = statistics.median(times)
            algbw = size / (t * 1e-6) / 1e9 if t > 0 else 0.0
            out[key][size] = {
                "time_us": t,
                "time_us_rounds": times,
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


def build(meta, recs, launch, baseline=None):
    """The results object: rows per (peer, transport) for the smallest world
    measured, ratios, goals, the full sweep per world, inputs."""
    worlds = sorted({int(r.get("world", meta.get("world_size", 2))) for r in recs}) or [int(meta.get("world_size", 2))]
    world = worlds[0]
    all_recs, recs = recs, [r for r in recs if int(r.get("world", world)) == world]
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
    goals = []
    for row in rows:
        if row["peer"] != "ranktree":
            continue
        tr = row["transport"]
        # The throughput goals are for one host, where the engine picks shm.
        if "ratio_vs_gloo" in row and tr == "shm":
            goals.append({"goal": "%s algbw >= %gx Gloo (%s)" % (fmt_size(large), GOAL_VS_GLOO, tr),
                          "value": "%.2fx" % row["ratio_vs_gloo"], "met": row["ratio_vs_gloo"] >= GOAL_VS_GLOO})
        if "ratio_vs_openmpi" in row and tr == "shm":
            goals.append({"goal": "%s algbw >= %gx Open MPI (%s)" % (fmt_size(large), GOAL_VS_MPI, tr),
                          "value": "%.2fx" % row["ratio_vs_openmpi"], "met": row["ratio_vs_openmpi"] >= GOAL_VS_MPI})
        if tr in GOAL_LAT_US and "small_latency_us" in row and small == 4:
            goals.append({"goal": "4 B latency <= %g us (%s)" % (GOAL_LAT_US[tr], tr),
                          "value": "%.1f us" % row["small_latency_us"],
                          "met": row["small_latency_us"] <= GOAL_LAT_US[tr]})
    if launch:
        for parent, subs in sorted(launch.items()):
            if "overhead_us" in subs:
                goals.append({"goal": "launch overhead <= %g us (%s)" % (GOAL_LAUNCH_US, parent),
                              "value": "%.2f us" % subs["overhead_us"],
                              "met": subs["overhead_us"] <= GOAL_LAUNCH_US})
    return {"meta": meta, "world": world, "rows": rows, "launch": launch, "goals": goals,
            "sweep": sweep(all_recs), "baseline": baseline or [], "records": all_recs}


def table(res):
    """The header and rows of the comparison table, as strings."""
    rows = res["rows"]
    small = next((r["small_bytes"] for r in rows if "small_bytes" in r), 4)
    large = next((r["large_bytes"] for r in rows if "large_bytes" in r), 64 << 20)
    hdr = ["peer", "transport", "%s latency (us)" % fmt_size(small),
           "%s time (ms)" % fmt_size(large), "%s algbw (GB/s)" % fmt_size(large),
           "busbw (GB/s)", "ranktree/Gloo", "ranktree/MPI"]
    body = []
    for r in rows:
        def f(k, fmt, scale=1.0):
            return fmt % (r[k] * scale) if k in r else "-"
        body.append([r["peer"], r["transport"], f("small_latency_us", "%.1f"),
                     f("large_time_us", "%.1f", 1e-3), f("large_algbw_GBps", "%.3f"),
                     f("large_busbw_GBps", "%.3f"), f("ratio_vs_gloo", "%.2fx"),
                     f("ratio_vs_openmpi", "%.2fx")])
    return hdr, body


def markdown(res):
    """results.md: settings, the table, baselines, launch overhead, goals."""
    m = res["meta"]
    hdr, body = table(res)
    out = ["# bench-compare results", ""]
    out.append("- date: %s" % m.get("date", "?"))
    out.append("- machine: %s, %s CPU cores, %s" % (m.get("host", "?"), m.get("nproc", "?"), m.get("cpu", "?")))
    out.append("- load: before `%s`; after `%s`" % (m.get("uptime_before", "?"), m.get("uptime_after", "?")))
    out.append("- versions: %s; torch %s; %s; mpi4py %s; numpy %s" % (
        m.get("go", "?"), m.get("torch", "?"), m.get("openmpi", "?"), m.get("mpi4py", "?"), m.get("numpy", "?")))
    out.append("- source: git %s" % m.get("git", "?"))
    out.append("- settings: %s ranks, float32 sum, %s rounds; small sizes %s iters + %s warm-up, large %s iters + %s warm-up" % (
        m.get("worlds", m.get("world_size", 2)), m.get("rounds", "?"), m.get("iters_small", "?"), m.get("warmup_small", "?"),
        m.get("iters_large", "?"), m.get("warmup_large", "?")))
    if m.get("notes"):
        out.append("- notes: %s" % m["notes"])
    out += ["", "%d ranks, smallest and largest size (median per round, median over rounds):" % res.get("world", 2),
            "", "| " + " | ".join(hdr) + " |", "|" + "---|" * len(hdr)]
    for b in body:
        out.append("| " + " | ".join(b) + " |")
    if res.get("sweep") and any(len(t["rows"]) > 2 for t in res["sweep"].values()):
        out += ["", "## Sweep"]
        out += sweep_markdown(res["sweep"])
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
    if res["goals"]:
        out += ["", "Goals (issue 3):", "", "| goal | measured | met |", "|---|---|---|"]
        for g in res["goals"]:
            out.append("| %s | %s | %s |" % (g["goal"], g["value"], "yes" if g["met"] else "NO"))
    rounds = [r for r in res["rows"] if "large_time_us_rounds" in r or "small_latency_us_rounds" in r]
    if rounds:
        out += ["", "Per-round medians (us), small size then large size:", ""]
        for r in rounds:
            out.append("- %s/%s: %s | %s" % (
                r["peer"], r["transport"],
                ", ".join("%.1f" % x for x in r.get("small_latency_us_rounds", [])),
                ", ".join("%.0f" % x for x in r.get("large_time_us_rounds", []))))
    return "\n".join(out) + "\n"


def main():
    """Reads the run directory, writes results.json/results.md, prints results.md."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("dir", help="the bench-compare output directory")
    args = p.parse_args()
    with open(os.path.join(args.dir, "meta.json")) as f:
        meta = json.load(f)
    recs = load_records(os.path.join(args.dir, "raw", "records.jsonl"))
    launch = parse_launch(os.path.join(args.dir, "raw", "launch.txt"))
    baseline = load_baseline(os.path.join(args.dir, "raw", "baseline.jsonl"))
    res = build(meta, recs, launch, baseline)
    with open(os.path.join(args.dir, "results.json"), "w") as f:
        json.dump(res, f, indent=2)
        f.write("\n")
    md = markdown(res)
    with open(os.path.join(args.dir, "results.md"), "w") as f:
        f.write(md)
    sys.stdout.write(md)
    return 0 if recs else 1


if __name__ == "__main__":
    sys.exit(main())
