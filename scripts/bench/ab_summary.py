"""Summarizes scripts/bench-ab.sh: an A/B of builds classed by the host's state.

Reads tag.py records (one JSON object per line) that carry peer, round,
c2c_ns (the round trip of a cache line between CPUs 0 and 1 measured just
before the record's run), c2c_run, bytes and mean_us. A run is in the far
state when its c2c_ns is at least summarize.FAR_C2C times the smallest of
the file (the rule of bench-compare.sh's results.md), else in the near
state; a run without a probe (c2c_ns 0 or missing) is left out. Prints
markdown: per state, a table of each peer's median and best (min) mean_us
over its runs at every size, with the number of runs; then, per size, how
many rounds each peer won (lowest mean_us among the rounds in which every
peer has the size).

    /usr/bin/python3 scripts/bench/ab_summary.py [--title T] records.jsonl

Tests: /usr/bin/python3 -m unittest discover -s scripts/bench -p 'test_*.py'
"""

import argparse
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
import summarize  # noqa: E402


def load(lines):
    """The usable records of lines (JSON text): those with a probe, a size
    and a mean."""
    recs = []
    for line in lines:
        line = line.strip()
        if not line:
            continue
        r = json.loads(line)
        if not r.get("c2c_ns") or "bytes" not in r or "mean_us" not in r:
            continue
        recs.append(r)
    return recs


def classify(recs):
    """recs with "state" set: "far" when c2c_ns >= FAR_C2C times the
    smallest c2c_ns of recs, else "near"."""
    if not recs:
        return []
    near = min(r["c2c_ns"] for r in recs)
    return [dict(r, state="far" if r["c2c_ns"] >= summarize.FAR_C2C * near else "near") for r in recs]


def peers_of(recs):
    """The peers in order of first appearance."""
    seen = []
    for r in recs:
        if r["peer"] not in seen:
            seen.append(r["peer"])
    return seen


def state_table(recs, state, peers):
    """Markdown rows of one state: per size, each peer's median (min) of
    mean_us over its runs in that state."""
    sub = [r for r in recs if r["state"] == state]
    if not sub:
        return []
    runs = {p: len({r["c2c_run"] for r in sub if r["peer"] == p}) for p in peers}
    out = ["### %s state (runs: %s)" % (state, ", ".join("%s %d" % (p, runs[p]) for p in peers)), "",
           "| size | " + " | ".join(peers) + " |", "|---|" + "---|" * len(peers)]
    for b in sorted({r["bytes"] for r in sub}):
        cells = []
        for p in peers:
            v = [r["mean_us"] for r in sub if r["peer"] == p and r["bytes"] == b]
            cells.append("%s (%s)" % (summarize.fmt_us(statistics.median(v)), summarize.fmt_us(min(v))) if v else "-")
        out.append("| %s | %s |" % (common.fmt_size(b), " | ".join(cells)))
    return out + [""]


def wins(recs, peers):
    """Per size, how many rounds each peer had the lowest mean_us, among
    the rounds in which every peer has the size (all states)."""
    by = {}
    for r in recs:
        by.setdefault((r["bytes"], r["round"]), {})[r["peer"]] = r["mean_us"]
    out = {}
    for (b, _), v in sorted(by.items()):
        w = out.setdefault(b, {p: 0 for p in peers})
        if len(v) == len(peers):
            w[min(v, key=v.get)] += 1
    return out


def markdown(recs, title=""):
    """The summary of recs (tag.py records) as markdown lines."""
    recs = classify(recs)
    if not recs:
        return ["no records with a core-to-core probe"]
    peers = peers_of(recs)
    near = min(r["c2c_ns"] for r in recs)
    out = ["# bench-ab results" + (": " + title if title else ""), "",
           "Mean time per op in µs (the timed loop's), median over the runs in each state (best run). A run "
           "is far when the cache-line round trip measured just before it was at least %.1f× the smallest "
           "(%.0f ns)." % (summarize.FAR_C2C, near), ""]
    for st in ("near", "far"):
        out += state_table(recs, st, peers)
    out += ["### rounds won (every state)", "", "| size | " + " | ".join(peers) + " |", "|---|" + "---|" * len(peers)]
    for b, w in wins(recs, peers).items():
        out.append("| %s | %s |" % (common.fmt_size(b), " | ".join(str(w[p]) for p in peers)))
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--title", default="")
    ap.add_argument("records")
    a = ap.parse_args(argv)
    with open(a.records) as f:
        print("\n".join(markdown(load(f), a.title)))


if __name__ == "__main__":
    main()
