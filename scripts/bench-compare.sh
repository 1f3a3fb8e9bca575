#!/usr/bin/env bash
# bench-compare.sh: ranktree's CPU collectives side by side with Gloo and Open MPI.
#
# A full sweep, in one run on this machine: float32 collectives (sum where
# they reduce) at every size of SIZES (default 4 B..64 MiB, doubling), every
# collective of COLLECTIVES (default allreduce) and every world size of
# WORLDS (default 2, 3 and 4 ranks), for (issue 15; the tables in
# docs/benchmarks.md come from it):
#   ranktree       examples/allreduce-bench --collective C under cmd/rankrunner,
#                  --transport shm and tcp
#   ranktree-base  the same, built from git revision BASE_REV (only when BASE_REV
#                  is set): a before/after comparison measured side by side
#   gloo           torch.distributed, backend gloo, tcp:// store on 127.0.0.1
#                  (scripts/bench/gloo_allreduce.py --collective C: all_reduce,
#                  all_gather_into_tensor or all_gather, reduce_scatter_tensor,
#                  broadcast; a call the installed torch's Gloo refuses is listed
#                  under "Not measured" in results.md)
#   openmpi        mpi4py on numpy buffers under mpirun, default BTLs (shared memory)
#                  (scripts/bench/mpi_allreduce.py --collective C: Allreduce in place,
#                  Allgather, Reduce_scatter_block, Bcast)
#   late           (LATE=1) allreduce-bench --late-rank 1 --late-us LATE_US, shm, 2
#                  ranks: the waiting rank's CPU % and wake-up latency per size;
#                  and, if PEERS has openmpi, mpi_allreduce.py --late-rank the same way;
#                  issue 15's late goals are judged on the sizes up to 64 KiB
#                  (scripts/bench/goals.py, GOAL15_LATE_MAX_BYTES)
#   launch         go test -bench Launch ./actors/ (actor launch overhead; LAUNCH_BENCH=1)
#   baseline       memcpy and one loopback TCP stream of the largest size, before and
#                  after the peers (scripts/bench/baseline.py), to show what the load left
# Every peer is timed the same way as allreduce-bench: warm-up, barrier, timed
# ops back to back, slowest rank per iteration (Max allreduce); each record
# has the mean (mean_us, what Open MPI's scripts report, tails included; the
# headline), median (time_us, p50_us) and p90 (p90_us) of those times;
# ranktree's also has the CPU each rank ran on (placement). A size S means
# the same for every peer (nccl-tests'; allreduce-bench's Layout and
# scripts/bench/common.py layout()): the buffer of allreduce and broadcast,
# the gathered output of allgather, the input of reducescatter, the float32
# count rounded down to a multiple of n for the last two. The peers run
# round-robin, ROUNDS times (each a separate launch), for each world size in
# turn; the summary gives per collective, world and size the median over
# rounds of the per-round mean, the best round, p50/p90, ranktree / Open
# MPI, and the stability (median / best round, flagged above 1.5x). uptime
# is recorded before and after.
#
# Usage: scripts/bench-compare.sh [OUTDIR]
#   OUTDIR defaults to ${TMPDIR:-/tmp}/ranktree-bench-<UTC time>. It receives
#   results.md, results.json, meta.json, raw/records.jsonl (one JSON record
#   per collective, peer, transport, world, size and round), raw/late.jsonl
#   (LATE=1), raw/baseline.jsonl, raw/launch.txt and raw/*.log. Every
#   record carries c2c_ns, the round trip of a cache line between CPUs 0
#   and 1 measured just before its run (allreduce-bench --c2c-probe): on a
#   VM the host's placement of the vCPUs moves it by about 6x and every
#   shared-memory time with it; results.md lists it per run.
#
# Environment (defaults in brackets):
#   PY            python with torch, mpi4py, numpy [/usr/bin/python3: Debian's,
#                 not a pyenv/venv python, which lacks python3-torch]
#   SIZES ["4..64MiB"]  comma-separated sizes, "A..B" doubling
#   COLLECTIVES ["allreduce"]: any of "allreduce allgather reducescatter broadcast"
#   WORLDS ["2 3 4"]    ROUNDS [3]   TRANSPORTS ["shm tcp"]
#   ITERS_SMALL [1000] WARMUP_SMALL [100]: sizes below 1 MiB
#   ITERS_LARGE [20] WARMUP_LARGE [3]: sizes from 1 MiB
#   PEERS ["ranktree gloo openmpi"]   BASE_REV [unset]: adds ranktree-base
#   BLOCKING [unset: each build's default]: true or false, passed as
#                 --blocking=$BLOCKING to every allreduce-bench build that has the
#                 flag (a build from before it, e.g. an older BASE_REV, runs the
#                 async form, AllReduce(...).Wait; its records have no "blocking"
#                 key). The default is the blocking form (comm.Blocking), timed
#                 as MPI_Allreduce and torch's default all_reduce are
#   LATE [0; 1: the late-arrival pass]  LATE_SIZES [$SIZES]  LATE_ITERS [20]
#   LATE_WARMUP [3]  LATE_US [5000]  LATE_ROUNDS [1]
#   LATE_BUSY [0; 1: the late rank spends its delay busy (--late-busy), as a
#                 rank computing its step, instead of asleep]
#   LAUNCH_BENCH [0: skip the actors benchmark]  LAUNCH_COUNT [3]
#   NO_INSTALL [unset: apt-get install what is missing]
#   MPI_BINDS ["default"]: one Open MPI run per entry, "default" with
#                 mpirun's own binding (a core per rank), others as --bind-to X
#   NOTES: free text for meta.json (what else ran on the machine)
#
# The helpers' tests: /usr/bin/python3 -m unittest discover -s scripts/bench -p 'test_*.py'
#
# Missing peers are installed with apt-get (python3-torch, openmpi-bin,
# python3-mpi4py; root or sudo needed). Not part of CI: a full sweep takes
# tens of minutes and its figures depend on the machine and its load.
set -euo pipefail
export PYTHONDONTWRITEBYTECODE=1 # keep scripts/bench free of __pycache__

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BENCH="$ROOT/scripts/bench"
OUT=${1:-${TMPDIR:-/tmp}/ranktree-bench-$(date -u +%Y%m%dT%H%M%SZ)}
PY=${PY:-/usr/bin/python3}
ROUNDS=${ROUNDS:-3}
SIZES=${SIZES:-4..64MiB}
WORLDS=${WORLDS:-2 3 4}
TRANSPORTS=${TRANSPORTS:-shm tcp}
BASE_REV=${BASE_REV:-}
BLOCKING=${BLOCKING:-}
PEERS=${PEERS:-ranktree gloo openmpi}
ITERS_SMALL=${ITERS_SMALL:-1000}
WARMUP_SMALL=${WARMUP_SMALL:-100}
ITERS_LARGE=${ITERS_LARGE:-20}
WARMUP_LARGE=${WARMUP_LARGE:-3}
LAUNCH_BENCH=${LAUNCH_BENCH:-0}
LAUNCH_COUNT=${LAUNCH_COUNT:-3}
RUN_TIMEOUT=${RUN_TIMEOUT:-600}
MPI_BINDS=${MPI_BINDS:-default}
COLLECTIVES=${COLLECTIVES:-allreduce}
LATE=${LATE:-0}
LATE_SIZES=${LATE_SIZES:-$SIZES}
LATE_ITERS=${LATE_ITERS:-20}
LATE_WARMUP=${LATE_WARMUP:-3}
LATE_US=${LATE_US:-5000}
LATE_ROUNDS=${LATE_ROUNDS:-1}
LATE_BUSY=${LATE_BUSY:-0}

log() { printf '[bench-compare %s] %s\n' "$(date -u +%H:%M:%S)" "$*" >&2; }

# install_peers installs the Debian packages of the peers that are missing.
install_peers() {
	local need=()
	command -v mpirun >/dev/null 2>&1 || need+=(openmpi-bin)
	"$PY" -c 'import numpy' >/dev/null 2>&1 || need+=(python3-numpy)
	"$PY" -c 'import torch.distributed' >/dev/null 2>&1 || need+=(python3-torch)
	"$PY" -c 'import mpi4py' >/dev/null 2>&1 || need+=(python3-mpi4py)
	[ ${#need[@]} -eq 0 ] && return 0
	if [ -n "${NO_INSTALL:-}" ]; then
		log "missing ${need[*]} and NO_INSTALL is set"
		return 1
	fi
	local sudo=()
	[ "$(id -u)" -eq 0 ] || sudo=(sudo)
	log "installing ${need[*]}"
	export DEBIAN_FRONTEND=noninteractive
	if ! "${sudo[@]}" apt-get install -y "${need[@]}" >"$OUT/raw/apt.log" 2>&1; then
		"${sudo[@]}" apt-get update >>"$OUT/raw/apt.log" 2>&1
		"${sudo[@]}" apt-get install -y "${need[@]}" >>"$OUT/raw/apt.log" 2>&1
	fi
}

# record PEER TRANSPORT ROUND COLLECTIVE LOG [DEST]: appends LOG's rank-0
# JSON records to DEST (raw/records.jsonl), tagged with the peer, transport,
# round, collective and world size, and with the host's state that the last
# probe_c2c measured (c2c_ns, c2c_run).
record() {
	local c2c=()
	if [ -n "$C2C" ]; then
		c2c=(--set "c2c_ns=$C2C" --set "c2c_run=$C2C_RUN")
	fi
	if ! "$PY" "$BENCH/tag.py" --set "peer=$1" --set "transport=$2" --set "round=$3" --set "collective=$4" \
		--set "world=$NPROC" "${c2c[@]}" --sizes "$SMALL_SIZES,$LARGE_SIZES" <"$5" >>"${6:-$OUT/raw/records.jsonl}"; then
		log "no results from $1/$2 $4 round $3; see $5"
		tail -5 "$5" >&2 || true
	fi
}

# probe_c2c: sets C2C to the round trip of a cache line between CPUs 0
# and 1 in whole ns (allreduce-bench --c2c-probe, about 10 ms), the host's
# state for the run about to start, which record adds to its records
# (c2c_ns, with c2c_run numbering the probes); empty if the probe fails
# (one CPU, an older build).
C2C= C2C_RUN=0
probe_c2c() {
	C2C_RUN=$((C2C_RUN + 1))
	C2C=$("$OUT/bin/allreduce-bench" --c2c-probe 2>/dev/null |
		"$PY" -c 'import json,sys; print(round(json.loads(sys.stdin.read())["c2c_ns"]))' 2>/dev/null || true)
}

# blocking_flag BINDIR: --blocking=$BLOCKING if BLOCKING is set and
# BINDIR's allreduce-bench has the flag (older builds do not), else nothing.
blocking_flag() {
	[ -n "$BLOCKING" ] || return 0
	local usage
	usage=$("$1/allreduce-bench" -h 2>&1 || true) # -h exits 2
	case $usage in
	*-blocking*) echo "--blocking=$BLOCKING" ;;
	esac
}

# ranktree_with NAME BINDIR ROUND: allreduce-bench from BINDIR, every
# collective and transport.
ranktree_with() {
	local tr coll
	local bflag=()
	mapfile -t bflag < <(blocking_flag "$2")
	for coll in $COLLECTIVES; do
		for tr in $TRANSPORTS; do
			local lg="$OUT/raw/$1-$coll-$tr-w$NPROC-r$3.log"
			local lgl="$OUT/raw/$1-$coll-$tr-w$NPROC-r$3-large.log"
			log "$1 $coll $tr, $NPROC ranks, round $3"
			# Two runs, each with its own probe of the host's state.
			if [ -n "$SMALL_SIZES" ]; then
				probe_c2c
				timeout "$RUN_TIMEOUT" "$2/rankrunner" --nproc-per-node "$NPROC" "$2/allreduce-bench" \
					--collective "$coll" --op sum --dtype float32 --sizes "$SMALL_SIZES" \
					--iters "$ITERS_SMALL" --warmup "$WARMUP_SMALL" --transport "$tr" "${bflag[@]}" --json >"$lg" 2>&1 || true
				record "$1" "$tr" "$3" "$coll" "$lg"
			fi
			if [ -n "$LARGE_SIZES" ]; then
				probe_c2c
				timeout "$RUN_TIMEOUT" "$2/rankrunner" --nproc-per-node "$NPROC" "$2/allreduce-bench" \
					--collective "$coll" --op sum --dtype float32 --sizes "$LARGE_SIZES" \
					--iters "$ITERS_LARGE" --warmup "$WARMUP_LARGE" --transport "$tr" "${bflag[@]}" --json >"$lgl" 2>&1 || true
				record "$1" "$tr" "$3" "$coll" "$lgl"
			fi
		done
	done
}

run_ranktree() { ranktree_with ranktree "$OUT/bin" "$1"; }          # ROUND
run_ranktree-base() { ranktree_with ranktree-base "$OUT/bin-base" "$1"; } # ROUND

peer_flags=(--sizes "$SIZES" --iters "$ITERS_SMALL" --warmup "$WARMUP_SMALL"
	--large-iters "$ITERS_LARGE" --large-warmup "$WARMUP_LARGE")

run_gloo() { # ROUND
	local coll
	for coll in $COLLECTIVES; do
		local lg="$OUT/raw/gloo-$coll-w$NPROC-r$1.log"
		log "gloo $coll, $NPROC ranks, round $1"
		probe_c2c
		timeout "$RUN_TIMEOUT" "$PY" "$BENCH/gloo_allreduce.py" --nproc "$NPROC" --collective "$coll" \
			"${peer_flags[@]}" >"$lg" 2>&1 || true
		record gloo "tcp" "$1" "$coll" "$lg"
	done
}

run_openmpi() { # ROUND
	local bind coll
	for bind in $MPI_BINDS; do
		for coll in $COLLECTIVES; do
			local lg="$OUT/raw/openmpi-$bind-$coll-w$NPROC-r$1.log" flags=() label=${OMPI_MCA_btl:-shm}
			if [ "$bind" != default ]; then
				flags=(--bind-to "$bind")
				label="$label, --bind-to $bind"
			fi
			log "openmpi $coll ($label), $NPROC ranks, round $1"
			probe_c2c
			timeout "$RUN_TIMEOUT" mpirun --allow-run-as-root --oversubscribe -np "$NPROC" "${flags[@]}" \
				"$PY" "$BENCH/mpi_allreduce.py" --collective "$coll" "${peer_flags[@]}" >"$lg" 2>&1 || true
			record openmpi "$label" "$1" "$coll" "$lg"
		done
	done
}

# run_late ROUND: allreduce-bench's late-arrival mode, 2 ranks over shm:
# rank 1 launches every timed iteration LATE_US late; the records (waiting
# rank's CPU %, wake-up latency per size) go to raw/late.jsonl.
run_late() {
	local lg="$OUT/raw/late-r$1.log" NPROC=2
	log "late arrival: rank 1 ${LATE_US} us late, shm, 2 ranks, round $1"
	probe_c2c
	local bflag=()
	mapfile -t bflag < <(blocking_flag "$OUT/bin")
	local lflag=()
	if [ "$LATE_BUSY" = 1 ]; then
		lflag=(--late-busy)
	fi
	timeout "$RUN_TIMEOUT" "$OUT/bin/rankrunner" --nproc-per-node 2 "$OUT/bin/allreduce-bench" \
		--collective allreduce --op sum --dtype float32 --sizes "$LATE_SIZES" --iters "$LATE_ITERS" \
		--warmup "$LATE_WARMUP" --transport shm --late-rank 1 --late-us "$LATE_US" "${lflag[@]}" "${bflag[@]}" --json >"$lg" 2>&1 || true
	record ranktree shm "$1" allreduce "$lg" "$OUT/raw/late.jsonl"
	# Open MPI under the same pattern (mpi_allreduce.py --late-rank), beside
	# it in the table: the reference for the waiting rank's CPU and wake-up.
	if [[ " $PEERS " == *" openmpi "* ]] && command -v mpirun >/dev/null; then
		local ml="$OUT/raw/openmpi-late-r$1.log" mflag=()
		if [ "$LATE_BUSY" = 1 ]; then
			mflag=(--late-busy)
		fi
		log "late arrival: Open MPI, rank 1 ${LATE_US} us late, 2 ranks, round $1"
		probe_c2c
		timeout "$RUN_TIMEOUT" mpirun --allow-run-as-root --oversubscribe -np 2 "$PY" "$BENCH/mpi_allreduce.py" \
			--sizes "$LATE_SIZES" --iters "$LATE_ITERS" --warmup "$LATE_WARMUP" --late-rank 1 --late-us "$LATE_US" "${mflag[@]}" >"$ml" 2>&1 || true
		record openmpi shm "$1" allreduce "$ml" "$OUT/raw/late.jsonl"
	fi
}

run_baseline() { # WHEN
	log "baseline ($1): memcpy and loopback TCP of $LARGEST bytes"
	if ! "$PY" "$BENCH/baseline.py" --bytes "$LARGEST" 2>>"$OUT/raw/baseline.log" |
		"$PY" -c 'import json,sys; [print(json.dumps(dict(json.loads(l), when=sys.argv[1]))) for l in sys.stdin]' "$1" \
			>>"$OUT/raw/baseline.jsonl"; then
		log "baseline ($1) failed; see $OUT/raw/baseline.log"
	fi
}

# pyver MODULE: the module's version, or "missing".
pyver() { "$PY" -c "import $1; print($1.__version__)" 2>/dev/null || echo missing; }

# source_rev: the checkout's commit, +dirty if its tracked files differ.
source_rev() {
	echo "$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)$(git -C "$ROOT" diff --quiet 2>/dev/null || echo +dirty)"
}

write_meta() {
	UPTIME_BEFORE="$UPTIME_BEFORE" UPTIME_AFTER="$(uptime)" \
		GOVER="$(go version 2>/dev/null || echo missing)" \
		TORCHVER="$(pyver torch)" MPI4PYVER="$(pyver mpi4py)" NUMPYVER="$(pyver numpy)" \
		OMPIVER="$(mpirun --version 2>/dev/null | head -1 || echo missing)" \
		CPU="$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')" \
		GITREV="${BUILD_REV:-$(source_rev)}" \
		NOTES="${NOTES:-}" DATE="$START" NPROCS="$(nproc)" HOST="$(hostname)" OUTDIR="$OUT" \
		WORLD="${WORLDS%% *}" WORLDS="$WORLDS" SIZES="$SIZES" BASE_REV="$BASE_REV" BLOCKING="$BLOCKING" R="$ROUNDS" IS="$ITERS_SMALL" WS="$WARMUP_SMALL" IL="$ITERS_LARGE" WL="$WARMUP_LARGE" \
		COLLS="$COLLECTIVES" LATE="$LATE" LATE_SETTINGS="sizes $LATE_SIZES, $LATE_ITERS iters + $LATE_WARMUP warm-up, $LATE_US us, $LATE_ROUNDS rounds, late rank $([ "$LATE_BUSY" = 1 ] && echo busy || echo asleep)" \
		"$PY" - <<'PYEOF'
import json, os
e = os.environ
meta = {
    "date": e["DATE"], "host": e["HOST"], "nproc": int(e["NPROCS"]), "cpu": e["CPU"],
    "uptime_before": e["UPTIME_BEFORE"].strip(), "uptime_after": e["UPTIME_AFTER"].strip(),
    "go": e["GOVER"], "torch": e["TORCHVER"], "openmpi": e["OMPIVER"], "mpi4py": e["MPI4PYVER"],
    "numpy": e["NUMPYVER"], "git": e["GITREV"], "world_size": int(e["WORLD"]), "rounds": int(e["R"]),
    "worlds": e["WORLDS"], "sizes": e["SIZES"], "base_rev": e["BASE_REV"],
    "blocking": e["BLOCKING"] or "default",
    "iters_small": int(e["IS"]), "warmup_small": int(e["WS"]),
    "iters_large": int(e["IL"]), "warmup_large": int(e["WL"]), "notes": e["NOTES"],
    "collectives": e["COLLS"], "late": e["LATE_SETTINGS"] if e["LATE"] == "1" else "",
}
with open(os.path.join(e["OUTDIR"], "meta.json"), "w") as f:
    json.dump(meta, f, indent=2)
    f.write("\n")
PYEOF
}

mkdir -p "$OUT/raw" "$OUT/bin"
: >"$OUT/raw/records.jsonl"
: >"$OUT/raw/late.jsonl"
: >"$OUT/raw/baseline.jsonl"
START=$(date -u +%Y-%m-%dT%H:%M:%SZ)
UPTIME_BEFORE=$(uptime)
log "output in $OUT; load: $UPTIME_BEFORE"

# The sizes, split at 1 MiB (ITERS_SMALL below, ITERS_LARGE from there).
read -r SMALL_SIZES LARGE_SIZES LARGEST < <("$PY" -c '
import sys; sys.path.insert(0, sys.argv[1]); import common
s = common.parse_sizes(sys.argv[2]); a, b = common.split_sizes(s)
print(",".join(map(str, a)) or "-", ",".join(map(str, b)) or "-", max(s))' "$BENCH" "$SIZES")
[ "$SMALL_SIZES" = - ] && SMALL_SIZES=
[ "$LARGE_SIZES" = - ] && LARGE_SIZES=

for coll in $COLLECTIVES; do
	case $coll in
	allreduce | allgather | reducescatter | broadcast) ;;
	*)
		log "COLLECTIVES: unknown collective $coll (want allreduce, allgather, reducescatter or broadcast)"
		exit 2
		;;
	esac
done

case " $PEERS " in
*" gloo "* | *" openmpi "*)
	install_peers || {
		log "installing the peers failed; see $OUT/raw/apt.log"
		exit 1
	}
	;;
esac

if [[ " $PEERS " == *" ranktree "* ]]; then
	log "building rankrunner and allreduce-bench"
	BUILD_REV=$(source_rev) # what was built, not what the tree holds when the run ends
	if ! (cd "$ROOT" && go build -o "$OUT/bin/" ./cmd/rankrunner ./examples/allreduce-bench) >"$OUT/raw/build.log" 2>&1; then
		log "ranktree build failed (see $OUT/raw/build.log); measuring the peers only"
		PEERS=${PEERS//ranktree/}
	fi
	if [ -n "$BASE_REV" ]; then
		log "building ranktree-base from $BASE_REV"
		mkdir -p "$OUT/src-base" "$OUT/bin-base"
		if git -C "$ROOT" archive "$BASE_REV" | tar -x -C "$OUT/src-base" &&
			(cd "$OUT/src-base" && go build -o "$OUT/bin-base/" ./cmd/rankrunner ./examples/allreduce-bench) >"$OUT/raw/build-base.log" 2>&1; then
			PEERS="ranktree-base $PEERS"
		else
			log "building $BASE_REV failed (see $OUT/raw/build-base.log)"
		fi
	fi
fi

run_baseline before
for NPROC in $WORLDS; do
	for ((round = 1; round <= ROUNDS; round++)); do
		for peer in $PEERS; do
			"run_$peer" "$round"
		done
	done
done

if [ "$LATE" = 1 ]; then
	if [[ " $PEERS " == *" ranktree "* ]]; then
		for ((round = 1; round <= LATE_ROUNDS; round++)); do
			run_late "$round"
		done
	else
		log "LATE=1 needs the ranktree peer (its build failed or PEERS lacks it); no late pass"
	fi
fi

run_baseline after

if [ "$LAUNCH_BENCH" = 1 ]; then
	log "actor launch overhead: go test -run '^\$' -bench Launch -count $LAUNCH_COUNT ./actors/"
	(cd "$ROOT" && go test -run '^$' -bench Launch -count "$LAUNCH_COUNT" ./actors/) >"$OUT/raw/launch.txt" 2>&1 ||
		log "launch benchmark failed; see $OUT/raw/launch.txt"
fi

write_meta
"$PY" "$BENCH/summarize.py" "$OUT"
log "wrote $OUT/results.md and $OUT/results.json"
