#!/usr/bin/env bash
# reallib-check.sh: check ranktree's GPU bindings (comm/cuda, comm/nccl,
# comm/cuda/nvmlinfo) against NVIDIA's real libraries and headers on a
# machine with no GPU.
#
#   scripts/reallib-check.sh [CACHE]
#
# It downloads, once, Debian's packages of NCCL (libnccl2, libnccl-dev),
# the CUDA driver library and NVML (libcuda1, libnvidia-ml1), the CUDA
# toolkit headers (nvidia-cuda-dev, libcu++-dev) and a recent glibc (libc6,
# libstdc++6, libgcc-s1: Debian's libnccl2 needs glibc 2.38), unpacks them
# under CACHE (default ${XDG_CACHE_HOME:-$HOME/.cache}/ranktree-reallib) and
# runs the tests that read them:
#
#   RANKTREE_NCCL_INCLUDE, RANKTREE_CUDA_INCLUDE
#       header checks: ncclConfig_t's layout and NCCL_CONFIG_INITIALIZER, every
#       enum value and constant we mirror, and the C prototype of every entry
#       point we bind (gcc compiles our prototypes against nccl.h / cuda.h).
#   RANKTREE_REAL_NCCL_LIB, RANKTREE_REAL_CUDA_LIB, RANKTREE_REAL_NVML_LIB
#       real-library checks: every symbol resolves, ncclGetVersion,
#       ncclGetUniqueId, cuDriverGetVersion, and the no-GPU failures of
#       cuInit, ncclCommInitRankConfig, NVML and the NCCL engine come back as
#       typed errors carrying the libraries' own text.
#   GORGONIA_CU=1
#       compiles the gorgonia.org/cu adapter (-tags cuda) against cuda.h and
#       links its test binary against the real libcuda.
#
# The test binaries are built here with the system toolchain and run under
# the downloaded glibc's loader. Nothing here needs or finds a GPU; what it
# proves and what it cannot is in docs/gpu-verification.md.
#
# Debian's package servers must be reachable (apt-get download, as root or
# with a writable CACHE); no package is installed on the system.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
cache=${1:-${XDG_CACHE_HOME:-$HOME/.cache}/ranktree-reallib}
mkdir -p "$cache"
cache=$(cd "$cache" && pwd)
arch=amd64
[ "$(uname -m)" = x86_64 ] || { echo "reallib-check: x86-64 only (Debian $arch packages)" >&2; exit 2; }

# apt_dl SUITE COMPONENTS PKG...: download packages without touching the
# system's apt state.
apt_dl() {
	local suite=$1 comps=$2
	shift 2
	local d="$cache/apt-$suite"
	mkdir -p "$d/lists/partial" "$cache/debs"
	echo "deb http://deb.debian.org/debian $suite $comps" >"$d/sources.list"
	local o=(-o "Dir::Etc::SourceList=$d/sources.list" -o Dir::Etc::SourceParts=/dev/null
		-o "Dir::State::Lists=$d/lists" -o "APT::Architecture=$arch" -o "APT::Architectures=$arch"
		-o Debug::NoLocking=1)
	if [ ! -e "$d/updated" ]; then
		apt-get "${o[@]}" update >"$d/update.log" 2>&1 || { cat "$d/update.log" >&2; exit 1; }
		touch "$d/updated"
	fi
	(cd "$cache/debs" && apt-get "${o[@]}" download "$@" 2>&1 | grep -v '^W: Download is performed unsandboxed' || true)
	for p in "$@"; do
		ls "$cache/debs/${p}_"*.deb >/dev/null 2>&1 || { echo "reallib-check: could not download $p" >&2; exit 1; }
	done
}

if [ ! -e "$cache/ready" ]; then
	apt_dl sid "main contrib non-free" libnccl2 libnccl-dev libcuda1 libnvidia-ml1 nvidia-cuda-dev libcu++-dev \
		libc6 libstdc++6 libgcc-s1
	mkdir -p "$cache/root" "$cache/glibc"
	for f in "$cache"/debs/*.deb; do
		case $(basename "$f") in
		libc6_* | libstdc++6_* | libgcc-s1_*) dpkg-deb -x "$f" "$cache/glibc" ;;
		nvidia-cuda-dev_*) dpkg-deb --fsys-tarfile "$f" | tar -x -C "$cache/root" --wildcards './usr/include/*' ;;
		*) dpkg-deb -x "$f" "$cache/root" ;;
		esac
	done
	rm -f "$cache"/debs/nvidia-cuda-dev_*.deb # 900 MB; only its headers are kept
	touch "$cache/ready"
fi

inc="$cache/root/usr/include"
lib="$cache/root/usr/lib/x86_64-linux-gnu"
ld="$cache/glibc/usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2"
libpath="$cache/glibc/usr/lib/x86_64-linux-gnu:$lib/nvidia/current:$lib"
export RANKTREE_NCCL_INCLUDE="$inc" RANKTREE_CUDA_INCLUDE="$inc"
export RANKTREE_REAL_NCCL_LIB="$lib/libnccl.so.2"
export RANKTREE_REAL_CUDA_LIB="$lib/nvidia/current/libcuda.so.1"
export RANKTREE_REAL_NVML_LIB="$lib/nvidia/current/libnvidia-ml.so.1"

{
	echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
	echo "commit: $(git -C "$root" rev-parse HEAD 2>/dev/null || echo unknown)$(git -C "$root" diff --quiet 2>/dev/null || echo ' (dirty)')"
	echo "packages:"
	for f in "$cache"/debs/*.deb; do echo "  $(basename "$f")"; done
	grep -h '^#define NCCL_\(MAJOR\|MINOR\|PATCH\) ' "$inc/nccl.h" | sed 's/^/  nccl.h: /'
	grep -h '^#define CUDA_VERSION ' "$inc/cuda.h" | sed 's/^/  cuda.h: /'
} | tee "$cache/last-run.txt"

bin="$cache/bin"
mkdir -p "$bin"
cd "$root"
status=0
for pkg in comm/cuda comm/cuda/nvmlinfo comm/nccl; do
	name=$(echo "$pkg" | tr / _)
	CGO_ENABLED=1 go test -c -o "$bin/$name.test" "./$pkg"
	echo "== $pkg"
	# -test.run selects the real-library and header tests; each skips
	# without its variable, so a missing piece shows as SKIP, not PASS.
	if ! (cd "$pkg" && "$ld" --library-path "$libpath" "$bin/$name.test" -test.v -test.count=1 \
		-test.run 'Real|Header' 2>&1 | tee -a "$cache/last-run.txt" | grep -E '^(=== RUN|--- |\s+\S+_test.go|ok|FAIL|PASS)'); then
		status=1
	fi
done

if [ "${GORGONIA_CU:-1}" = 1 ]; then
	echo "== gorgonia.org/cu adapter (-tags cuda)"
	if CGO_CFLAGS="-I$inc" CGO_LDFLAGS="-L$lib/nvidia/current" go vet -tags cuda ./comm/nccl/ &&
		CGO_CFLAGS="-I$inc" CGO_LDFLAGS="-L$lib/nvidia/current" go test -tags cuda -c -o "$bin/nccl_cuda.test" ./comm/nccl; then
		echo "cu adapter: vet and test binary link OK (it runs only on a GPU: gorgonia.org/cu exits at init without one)" | tee -a "$cache/last-run.txt"
	else
		echo "cu adapter: FAILED" | tee -a "$cache/last-run.txt"
		status=1
	fi
fi
echo "log: $cache/last-run.txt"
exit $status
