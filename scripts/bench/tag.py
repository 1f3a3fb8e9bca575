"""Filters benchmark output into tagged JSON records (one per line).

Reads stdin: lines from allreduce-bench --json under rankrunner ("[rank 0] "
prefix, possibly ANSI-coloured) or from the peer scripts (bare JSON). Keeps
the JSON objects that carry "bytes" and "time_us" from rank 0 (or with no
rank prefix), adds the fields given with --set key=value, and prints them
one per line on stdout. Everything else is dropped. Exit status 1 when no
record was found, so the caller can tell a failed run.

    ... | python3 scripts/bench/tag.py --set peer=ranktree --set transport=shm --set round=1
"""

import argparse
import json
import re
import sys

_PREFIX = re.compile(r"^(?:\x1b\[[0-9;]*m)?\[rank (\d+)\](?:\x1b\[[0-9;]*m)?\s*")


def main():
    """Filters stdin to stdout; exit status 1 when nothing matched."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="field to add to every record (a number when it parses as one)")
    args = p.parse_args()
    extra = {}
    for kv in args.set:
        k, _, v = kv.partition("=")
        try:
            extra[k] = int(v)
        except ValueError:
            extra[k] = v
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
        if not isinstance(rec, dict) or "bytes" not in rec or "time_us" not in rec:
            continue
        rec.update(extra)
        sys.stdout.write(json.dumps(rec) + "\n")
        found += 1
    return 0 if found else 1


if __name__ == "__main__":
    sys.exit(main())
