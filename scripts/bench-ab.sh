#!/usr/bin/env bash
# bench-ab.sh: an A/B of two ranktree builds (and Open MPI) classed by the
# host's state, for a change whose effect is smaller than the host's swings.
#
# For DURATION seconds, rounds of short runs: this tree's build
# ("ranktree"), the build of git revision BASE_REV ("ranktree-base") and,
# if mpirun is there, Open MPI (scripts/bench/mpi_allreduce.py, launched as
# bench-compare.sh launches it), one run each per round, the order
# reversed every round. Each run is one launch of COLLECTIVE at every size
# of SIZES, NPROC ranks over shm, ITERS timed ops a size (the mean of the
# timed loop, as bench-compare.sh records it), preceded by
# allreduce-bench --c2c-probe: on a VM the host moves the two vCPUs
# between cores that share a cache and cores that do not, which moves
# every shared-memory time by up to 3x for seconds at a time
# (docs/benchmarks.md, "Issue 15, session 14"). A 3-round sweep cannot
# tell a 10 % change from that; many short runs, each classed by its own
# probe, can. results.md gives, per state (near, far: scripts/bench/
# ab_summary.py) and size, each peer's median and best run, and how many
# rounds each peer won.
#
# Usage: BASE_REV=<rev> scripts/bench-ab.sh [OUTDIR]
#   OUTDIR defaults to ${TMPDIR:-/tmp}/ranktree-ab-<UTC time>; it receives
#   results.md, raw/records.jsonl (tag.py records with round, c2c_ns and
#   c2c_run) and raw/*.log (the last run of each peer).
#
# Environment (defaults in brackets):
#   BASE_REV [required]  DURATION [300]  NPROC [2]  COLLECTIVE [allreduce]
#   SIZES ["4..16KiB"]   ITERS [2000]  WARMUP [200]
#   PEERS ["ranktree ranktree-base openmpi"]  PY [/usr/bin/python3]
#
# Not part of CI (its figures depend on the machine); the summary's tests:
# /usr/bin/python3 -m unittest discover -s scripts/bench -p 'test_*.py'
set -euo pipefail
export PYTHONDONTWRITEBYTECODE=1

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BENCH="$ROOT/scripts/bench"
OUT=${1:-${TMPDIR:-/tmp}/ranktree-ab-$(date -u +%Y%m%dT%H%M%SZ)}
BASE_REV=${BASE_REV:?set BASE_REV to the revision to compare with}
DURATION=${DURATION:-300}
NPROC=${NPROC:-2}
COLLECTIVE=${COLLECTIVE:-allreduce}
SIZES=${SIZES:-4..16KiB}
ITERS=${ITERS:-2000}
WARMUP=${WARMUP:-200}
PEERS=${PEERS:-ranktree ranktree-base openmpi}
PY=${PY:-/usr/bin/python3}
RUN_TIMEOUT=${RUN_TIMEOUT:-300}

log() { echo "[bench-ab $(date -u +%H:%M:%S)] $*" >&2; }

mkdir -p "$OUT/raw" "$OUT/bin" "$OUT/bin-base" "$OUT/src-base"
SIZE_LIST=$("$PY" -c 'import sys; sys.path.insert(0, sys.argv[1]); import common; print(",".join(map(str, common.parse_sizes(sys.argv[2]))))' "$BENCH" "$SIZES")
log "building this tree and $BASE_REV; output in $OUT"
(cd "$ROOT" && go build -o "$OUT/bin/" ./cmd/rankrunner ./examples/allreduce-bench)
git -C "$ROOT" archive "$BASE_REV" | tar -x -C "$OUT/src-base"
(cd "$OUT/src-base" && go build -o "$OUT/bin-base/" ./cmd/rankrunner ./examples/allreduce-bench)
if [[ " $PEERS " == *" openmpi "* ]] && ! command -v mpirun >/dev/null; then
	log "no mpirun: Open MPI left out"
	PEERS=${PEERS//openmpi/}
fi

C2C_RUN=0
# run PEER ROUND: one run of PEER, its probe first, its records tagged.
run() {
	local lg="$OUT/raw/$1.log" c2c
	C2C_RUN=$((C2C_RUN + 1))
	c2c=$("$OUT/bin/allreduce-bench" --c2c-probe 2>/dev/null |
		"$PY" -c 'import json,sys; print(round(json.loads(sys.stdin.read())["c2c_ns"]))' 2>/dev/null || echo 0)
	case $1 in
	ranktree | ranktree-base)
		local bin="$OUT/bin"
		[ "$1" = ranktree ] || bin="$OUT/bin-base"
		timeout "$RUN_TIMEOUT" "$bin/rankrunner" --nproc-per-node "$NPROC" "$bin/allreduce-bench" \
			--collective "$COLLECTIVE" --transport shm --sizes "$SIZE_LIST" --iters "$ITERS" --warmup "$WARMUP" \
			--json >"$lg" 2>&1 || true
		;;
	openmpi)
		timeout "$RUN_TIMEOUT" mpirun --allow-run-as-root --oversubscribe -np "$NPROC" "$PY" "$BENCH/mpi_allreduce.py" \
			--collective "$COLLECTIVE" --sizes "$SIZE_LIST" --iters "$ITERS" --warmup "$WARMUP" \
			--large-iters "$ITERS" --large-warmup "$WARMUP" >"$lg" 2>&1 || true
		;;
	esac
	"$PY" "$BENCH/tag.py" --set "peer=$1" --set "round=$2" --set "collective=$COLLECTIVE" --set "world=$NPROC" \
		--set "c2c_ns=$c2c" --set "c2c_run=$C2C_RUN" --sizes "$SIZE_LIST" <"$lg" >>"$OUT/raw/records.jsonl" ||
		log "no results from $1 in round $2; see $lg"
}

read -r -a order <<<"$PEERS"
end=$((SECONDS + DURATION))
round=0
while ((SECONDS < end)); do
	round=$((round + 1))
	for peer in "${order[@]}"; do
		run "$peer" "$round"
	done
	order=($(printf '%s\n' "${order[@]}" | tac))
done
log "$round rounds; summarizing"
"$PY" "$BENCH/ab_summary.py" --title "$COLLECTIVE, $NPROC ranks, shm: this tree ($(git -C "$ROOT" describe --always --dirty)) against $BASE_REV" \
	"$OUT/raw/records.jsonl" >"$OUT/results.md"
log "wrote $OUT/results.md"
