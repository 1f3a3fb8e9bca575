"""Filters benchmark output into tagged JSON records (one per line).

Reads stdin: lines from allreduce-bench --json under rankrunner ("[rank 0] "
prefix, possibly ANSI-coloured) or from the peer scripts (bare JSON). Keeps
the JSON objects from rank 0 (or with no rank prefix) that are records: a
size's timings ("bytes" and "time_us"), a late-arrival result ("bytes" and
"wake_us"), or a collective a peer cannot run ("unsupported"). It adds the
fields given with --set key=value and prints them one per line on stdout.
Everything else is dropped. Exit status 1 when no record was found, so the
caller can tell a failed run.

A record without "req_bytes" (allreduce-bench before it printed the size
asked for, e.g. a BASE_REV build) gets it from --sizes, the sizes the run
was given in their order: the next one whose layout (common.layout, with
the record's collective and --set world) gives the record's bytes. Without
--sizes, req_bytes = bytes.

    ... | python3 scripts/bench/tag.py --set peer=ranktree --set transport=shm --set round=1 --sizes 4,8,16

Tests: /usr/bin/python3 -m unittest discover -s scripts/bench -p 'test_*.py'
"""

import argparse
import json
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

_PREFIX = re.compile(r"^(?:\x1b\[[0-9;]*m)?\[rank (\d+)\](?:\x1b\[[0-9;]*m)?\s*")


def is_record(rec):
    """Whether a parsed JSON value is a benchmark record (see the module doc)."""
    if not isinstance(rec, dict):
        return False
    if "unsupported" in rec:
        return True
    return "bytes" in rec and ("time_us" in rec or "wake_us" in rec)


class ReqSizes:
    """Assigns req_bytes to records that lack it, from the requested sizes in order."""

    def __init__(self, sizes, world):
        self.sizes, self.world, self.next = sizes or [], world, 0

    def fill(self, rec):
        if "req_bytes" in rec or "bytes" not in rec:
            return
        coll = rec.get("collective", "allreduce")
        for i in range(self.next, len(self.sizes)):
            s = self.sizes[i]
            try:
                used = 4 * common.layout(coll, s, self.world)[0]
            except ValueError:
                break
            if used == rec["bytes"]:
                rec["req_bytes"], self.next = s, i + 1
                return
        rec["req_bytes"] = rec["bytes"]


def main():
    """Filters stdin to stdout; exit status 1 when nothing matched."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="field to add to every record (a number when it parses as one)")
    p.add_argument("--sizes", type=common.parse_sizes, default=None,
                   help="the sizes the run was given, in order (fills a missing req_bytes)")
    args = p.parse_args()
    extra = {}
    for kv in args.set:
        k, _, v = kv.partition("=")
        try:
            extra[k] = int(v)
        except ValueError:
            extra[k] = v
    req = ReqSizes(args.sizes, int(extra.get("world", 2)))
    found = 0
    for line in sys.stdin:
        m = _PREFIX.match(line)
        if m:
            if m.group(1) != "0":
                continue
            line = line[m.end():]
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if not is_record(rec):
            continue
        rec.update(extra)
        req.fill(rec)
        sys.stdout.write(json.dumps(rec) + "\n")
        found += 1
    return 0 if found else 1


if __name__ == "__main__":
    sys.exit(main())
