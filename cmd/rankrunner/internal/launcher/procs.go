package launcher

import "runtime"

// RunnerProcs is the GOMAXPROCS rankrunner gives itself (and so its
// embedded NATS server) for localWorld ranks on numCPU CPUs: one rank's
// share, numCPU/localWorld, at least 1, as each rank gets (rankEnv).
//
// The ranks are bound to every CPU the runner may use (--cpu-bind core).
// A Go runtime with a P per CPU wakes an idle thread on another CPU
// whenever a goroutine becomes runnable (a NATS read, a timer), and on
// the 2-vCPU development VM each such wake-up preempts a rank. Measured
// there, 2026-12-06, 2 ranks, float32 sum allreduce over shm, 300000 ops
// per size, 4 alternating runs each (mean µs of the timed loop, runner
// GOMAXPROCS 1 against 2): 4 B 1.9–2.0 against 2.1–2.4, 1 KiB 2.4
// against 2.5–2.6, and the 99th percentile 3.9–4.5 against 5.7–11.2. In
// another state of the host, 109 alternating rounds of
// scripts/bench-ab.sh found the two level (4 B 1.35 against 1.35 µs,
// 1 KiB 1.97 against 1.99, the median over runs).
func RunnerProcs(localWorld, numCPU int) int {
	return max(1, numCPU/max(1, localWorld))
}

// LimitRunnerProcs sets this process's GOMAXPROCS to RunnerProcs unless
// the environment sets GOMAXPROCS, and returns the value in effect.
// rankrunner's command calls it before Run; Run itself leaves the
// calling process's scheduler alone (tests run it in-process).
func LimitRunnerProcs(localWorld int, getenv func(string) string) int {
	if getenv("GOMAXPROCS") != "" {
		return runtime.GOMAXPROCS(0)
	}
	n := RunnerProcs(localWorld, runtime.NumCPU())
	runtime.GOMAXPROCS(n)
	return n
}
