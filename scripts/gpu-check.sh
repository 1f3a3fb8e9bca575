#!/usr/bin/env bash
# gpu-check.sh: verify ranktree's GPU engine (comm/cuda, comm/nccl) on a
# GPU machine that has no Go toolchain.
#
#   scripts/gpu-check.sh build [DIR]   # on a CPU machine with Go and gcc:
#                                      # builds test binaries + launchbench
#                                      # into DIR (default gpu-check-bundle)
#   DIR/gpu-check.sh run [DIR]         # on the GPU machine: runs every check,
#                                      # logs under DIR/results/, prints a summary
#   GPU_CHECK_FAKE=1 DIR/gpu-check.sh run [DIR]
#                                      # rehearsal on a CPU machine: the same
#                                      # steps against the fake libcuda/libnccl
#                                      # (DIR/libfakegpu.so); proves nothing
#                                      # about hardware
#
# Run-mode checks (see docs/gpu-verification.md):
#   1. world-size-1 collectives for every op and dtype, data checked on the host
#   2. several independent communicators in one process
#   3. hung stream (cuStreamWaitValue32): watchdog timeout -> ncclCommAbort ->
#      ErrTimeout, the process survives (CleanupOnly); on a GPU the abort
#      blocks behind the hung stream and the engine stops waiting for it
#      after Options.AbortTimeout
#   4. nonblocking init with a missing peer times out
#   5. launch overhead of a 4-byte allreduce: ranktree vs raw NCCL vs PyTorch
#   6. NCCL >= 2.30: 2-4 ranks on the one GPU (NCCL_MULTI_RANK_GPU_ENABLE=1)
set -u
mode=${1:-}
here=$(cd "$(dirname "$0")" && pwd)

build() {
	local out=${1:-gpu-check-bundle}
	local root
	root=$(cd "$here/.." && pwd)
	mkdir -p "$out"
	out=$(cd "$out" && pwd)
	cd "$root" || exit 1
	export CGO_ENABLED=1 GOOS=linux GOARCH=amd64
	set -e
	go test -c -o "$out/cuda.test" ./comm/cuda
	go test -c -o "$out/nvmlinfo.test" ./comm/cuda/nvmlinfo
	go test -c -o "$out/nccl.test" ./comm/nccl
	go test -c -o "$out/watchdogtest.test" ./comm/nccl/watchdogtest
	go build -o "$out/launchbench" ./comm/nccl/internal/launchbench
	# The gorgonia.org/cu adapter (-tags cuda) needs cuda.h and libcuda.so
	# to build: CUDA_INCLUDE and CUDA_LIBDIR name them, or the cache that
	# scripts/reallib-check.sh filled is used. Without them it is skipped.
	local cache=${REALLIB_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/ranktree-reallib}
	local cuinc=${CUDA_INCLUDE:-$cache/root/usr/include} culib=${CUDA_LIBDIR:-$cache/root/usr/lib/x86_64-linux-gnu/nvidia/current}
	if [ -f "$cuinc/cuda.h" ] && [ -e "$culib/libcuda.so" ]; then
		CGO_CFLAGS="-I$cuinc" CGO_LDFLAGS="-L$culib" go test -tags cuda -c -o "$out/nccl_cuda.test" ./comm/nccl
	else
		echo "no cuda.h/libcuda.so (CUDA_INCLUDE, CUDA_LIBDIR or scripts/reallib-check.sh): nccl_cuda.test not built"
	fi
	gcc -shared -fPIC -O1 -o "$out/libfakegpu.so" internal/fakegpu/testdata/fakegpu_cuda.c internal/fakegpu/testdata/fakegpu_nccl.c -lm -lpthread
	cp "$here/gpu-check.sh" "$out/gpu-check.sh"
	chmod +x "$out/gpu-check.sh"
	{
		echo "built: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
		echo "commit: $(git rev-parse HEAD 2>/dev/null || echo unknown)$(git diff --quiet 2>/dev/null || echo ' (dirty)')"
		echo "go: $(go version)"
		echo "glibc (build host): $(ldd --version 2>/dev/null | head -1)"
	} >"$out/BUILD_INFO"
	set +e
	echo "bundle ready in $out; copy it to the GPU machine and run: $out/gpu-check.sh run"
}

# pytorch_bench prints JSON lines for PyTorch ProcessGroupNCCL, same modes
# as launchbench (sync: allreduce + synchronize per op; pipelined: N async
# allreduces, then synchronize).
pytorch_bench() {
	python3 - "$@" <<'PY'
import json, os, sys, time, tempfile
try:
    import torch, torch.distributed as dist
except Exception as e:  # noqa
    print(json.dumps({"path": "pytorch", "error": "torch unavailable: %s" % e})); sys.exit(0)
n, warm = 2000, 200
torch.cuda.set_device(0)
store = dist.FileStore(tempfile.mktemp(), 1)
dist.init_process_group("nccl", store=store, rank=0, world_size=1, device_id=torch.device("cuda:0"))
x = torch.ones(1, device="cuda:0", dtype=torch.float32)
for _ in range(warm):
    dist.all_reduce(x); torch.cuda.synchronize()
t = time.perf_counter()
for _ in range(n):
    dist.all_reduce(x); torch.cuda.synchronize()
sync = (time.perf_counter() - t) / n * 1e9
t = time.perf_counter()
for _ in range(n):
    dist.all_reduce(x, async_op=True)
torch.cuda.synchronize()
pipe = (time.perf_counter() - t) / n * 1e9
v = ".".join(map(str, torch.cuda.nccl.version()))
print(json.dumps({"path": "pytorch", "mode": "sync", "ops": n, "ns_per_op": sync, "nccl": v, "torch": torch.__version__}))
print(json.dumps({"path": "pytorch", "mode": "pipelined", "ops": n, "ns_per_op": pipe, "nccl": v, "torch": torch.__version__}))
dist.destroy_process_group()
PY
}

run() {
	local dir=${1:-$here}
	dir=$(cd "$dir" && pwd) || { echo "gpu-check: no bundle folder $1" >&2; return 2; }
	local res="$dir/results"
	mkdir -p "$res"
	if [ "${GPU_CHECK_FAKE:-0}" = 1 ]; then
		echo "REHEARSAL against the fake library: no GPU involved"
		export RANKTREE_FAKEGPU_LIB="$dir/libfakegpu.so" RANKTREE_CUDA_LIB="$dir/libfakegpu.so" RANKTREE_NCCL_LIB="$dir/libfakegpu.so"
		unset RANKTREE_GPU_TESTS
	else
		export RANKTREE_GPU_TESTS=1
		unset RANKTREE_CUDA_LIB RANKTREE_NCCL_LIB RANKTREE_FAKEGPU_LIB
	fi
	declare -A status
	# Each step is bounded by GPU_CHECK_STEP_TIMEOUT seconds (default 120):
	# past it the step gets SIGQUIT, on which a Go test binary prints every
	# goroutine's stack into the step's log, then SIGKILL 10 s later. One
	# hung step (the first real run's step 3 blocked for minutes) no longer
	# takes the time of the steps after it.
	local steplimit=${GPU_CHECK_STEP_TIMEOUT:-120}
	step() { # name, then command
		local name=$1
		shift
		echo "=== $name: $*"
		local rc=0
		timeout -s QUIT -k 10 "$steplimit" "$@" >"$res/$name.log" 2>&1 || rc=$?
		case $rc in
		0) status[$name]=PASS ;;
		124 | 137) status[$name]="FAIL (timed out after ${steplimit}s; stacks in the log)" ;;
		*) status[$name]="FAIL (rc $rc)" ;;
		esac
		tail -n 5 "$res/$name.log"
	}
	{
		echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
		nvidia-smi --query-gpu=name,driver_version,pci.bus_id,uuid,memory.total --format=csv,noheader 2>&1
		cat "$dir/BUILD_INFO" 2>/dev/null
		echo "glibc (GPU host): $(ldd --version 2>/dev/null | head -1)"
	} | tee "$res/machine.txt"

	step 0-bindings-cuda "$dir/cuda.test" -test.v -test.count=1
	step 0-nvml "$dir/nvmlinfo.test" -test.v -test.count=1
	step 0-bindings-nccl "$dir/nccl.test" -test.v -test.count=1 -test.run 'TestBindingSmoke|TestDataTypeOfCoversEveryDType|TestConfigLayout'
	if [ "${GPU_CHECK_FAKE:-0}" != 1 ]; then
		# The same real-library and header checks scripts/reallib-check.sh
		# runs on a CPU machine, here against this machine's driver, the
		# NCCL that python's nvidia-nccl wheel ships and its headers.
		local ncclso ncclinc cudainc
		ncclso=$(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib", "libnccl.so.2"))' 2>/dev/null || echo libnccl.so.2)
		ncclinc=$(dirname "$(dirname "$ncclso")")/include
		cudainc=$(ls -d /usr/local/cuda/include /usr/local/cuda-*/include 2>/dev/null | head -1)
		step 0-real-libs env RANKTREE_REAL_CUDA_LIB=libcuda.so.1 RANKTREE_REAL_NVML_LIB=libnvidia-ml.so.1 RANKTREE_REAL_NCCL_LIB="$ncclso" \
			RANKTREE_NCCL_INCLUDE="$ncclinc:$cudainc:$cudainc/cccl" RANKTREE_CUDA_INCLUDE="$cudainc" \
			sh -c "cd '$dir' && ./cuda.test -test.v -test.count=1 -test.run 'Real|Header' && ./nvmlinfo.test -test.v -test.count=1 -test.run Real && ./nccl.test -test.v -test.count=1 -test.run 'Real|Header'"
		if [ -x "$dir/nccl_cuda.test" ]; then
			step 0-cu-adapter "$dir/nccl_cuda.test" -test.v -test.count=1 -test.run TestCuBuffer
		fi
	fi
	step 1-every-op-dtype "$dir/nccl.test" -test.v -test.count=1 -test.run 'TestEveryOpEveryDType|TestSelfP2POutsideGroup|TestUnsupportedInputs|TestCallerStreamOrdering|TestUIDThroughStore'
	step 2-several-comms "$dir/nccl.test" -test.v -test.count=1 -test.run 'TestSeveralCommunicators'
	step 3-hung-stream "$dir/watchdogtest.test" -test.v -test.count=1 -test.run 'TestWatchdogTimesOutHungStream'
	# Alone: on a GPU its blocked ncclCommAbort leaves CUDA calls of the
	# whole process blocked, which would hang the tests after it.
	step 3b-abort "$dir/nccl.test" -test.v -test.count=1 -test.run 'TestHungStreamAbort'
	step 3c-close-faults "$dir/nccl.test" -test.v -test.count=1 -test.run 'TestCloseFailsInFlight|TestInjectedFaults'
	step 4-init-timeout "$dir/nccl.test" -test.v -test.count=1 -test.run 'TestInitTimeout|TestAbortDuringInit'
	step 5-launchbench "$dir/launchbench" -n 2000
	step 5-launchbench-nospin "$dir/launchbench" -n 2000 -spin-idle -1ns -spin-wait -1ns
	export -f pytorch_bench
	step 5-pytorch bash -c pytorch_bench
	grep -q '"error"' "$res/5-pytorch.log" && status[5-pytorch]="SKIP (no torch)"
	step 5-gobench "$dir/nccl.test" -test.run XXX -test.bench 'AllReduce4B' -test.benchtime 5000x
	local ver
	ver=$(grep -o '"nccl":"[0-9.]*"' "$res/5-launchbench.log" | head -1 | grep -o '[0-9.]*[0-9]')
	local major minor
	major=$(echo "${ver:-0.0}" | cut -d. -f1)
	minor=$(echo "${ver:-0.0}" | cut -d. -f2)
	if [ "${major:-0}" -gt 2 ] || { [ "${major:-0}" -eq 2 ] && [ "${minor:-0}" -ge 30 ]; }; then
		for n in 2 4; do
			step "6-multirank-$n" env NCCL_MULTI_RANK_GPU_ENABLE=1 RANKTREE_MULTI_RANK=$n "$dir/nccl.test" -test.v -test.count=1 -test.run TestMultiRankOneGPU
		done
	else
		echo "=== 6-multirank: skipped (NCCL ${ver:-unknown} < 2.30)"
		status[6-multirank]="SKIP (NCCL ${ver:-unknown} < 2.30)"
	fi
	echo
	echo "=== summary (logs in $res)"
	local fail=0
	for k in $(printf '%s\n' "${!status[@]}" | sort); do
		printf '%-22s %s\n' "$k" "${status[$k]}"
		case ${status[$k]} in FAIL*) fail=1 ;; esac
	done | tee "$res/summary.txt"
	grep -h '"ns_per_op"' "$res/5-launchbench.log" "$res/5-launchbench-nospin.log" "$res/5-pytorch.log" 2>/dev/null | tee "$res/overhead.jsonl"
	grep -q FAIL "$res/summary.txt" && return 1
	return 0
}

case $mode in
build) build "${2:-}" ;;
run) run "${2:-}" ;;
*)
	sed -n '2,20p' "$0"
	exit 2
	;;
esac
