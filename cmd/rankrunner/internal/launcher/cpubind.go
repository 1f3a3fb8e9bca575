package launcher

import (
	"fmt"
	"slices"

	"github.com/rs/zerolog"
	"golang.org/x/sys/unix"
)

// CPU binding of local ranks (Config.CPUBind, --cpu-bind), as mpirun binds
// each rank to its own core by default and torchrun's --numa-binding binds
// ranks to their node's CPUs. Two ranks left to share one CPU take turns
// on it, which made small-message collectives bimodal from run to run (3 µs
// or 20 µs by luck of placement, issue 15).
const (
	// CPUBindCore splits the CPUs the runner may use into one contiguous
	// block per local rank, local rank i taking the i-th block (the first
	// len%n blocks one CPU larger). When there are more local ranks than
	// CPUs it binds nothing (as mpirun does when oversubscribed): pinning
	// several spinning ranks to one CPU would stop the kernel from
	// balancing them. The default.
	CPUBindCore = "core"
	// CPUBindNone leaves placement to the kernel.
	CPUBindNone = "none"
)

// cpuPlan returns the CPUs each of n local ranks is bound to under mode,
// given allowed (the CPUs the runner may run on, ascending), or nil and
// the reason when no rank is bound.
func cpuPlan(mode string, allowed []int, n int) ([][]int, string) {
	switch {
	case mode == CPUBindNone:
		return nil, "--cpu-bind none"
	case n <= 0 || len(allowed) == 0:
		return nil, "no CPUs known"
	case n > len(allowed):
		return nil, fmt.Sprintf("%d local ranks on %d CPUs (oversubscribed)", n, len(allowed))
	}
	plan := make([][]int, n)
	base, extra := len(allowed)/n, len(allowed)%n
	at := 0
	for i := range plan {
		k := base
		if i < extra {
			k++
		}
		plan[i] = slices.Clone(allowed[at : at+k])
		at += k
	}
	return plan, ""
}

// allowedCPUs returns the CPUs the calling thread may run on, ascending.
func allowedCPUs() ([]int, error) {
	var set unix.CPUSet
	if err := unix.SchedGetaffinity(0, &set); err != nil {
		return nil, fmt.Errorf("launcher: sched_getaffinity: %w", err)
	}
	var cpus []int
	for c := 0; c < len(set)*64 && len(cpus) < set.Count(); c++ {
		if set.IsSet(c) {
			cpus = append(cpus, c)
		}
	}
	return cpus, nil
}

// withAffinity runs start with the calling OS thread bound to cpus (the
// spawner's thread: a forked child inherits its affinity, and so every
// thread the rank's runtime later creates), then restores the thread's
// previous affinity. cpus nil: start runs as is.
func withAffinity(cpus []int, start func() error) error {
	if cpus == nil {
		return start()
	}
	var old, set unix.CPUSet
	if err := unix.SchedGetaffinity(0, &old); err != nil {
		return fmt.Errorf("launcher: sched_getaffinity: %w", err)
	}
	for _, c := range cpus {
		set.Set(c)
	}
	if err := unix.SchedSetaffinity(0, &set); err != nil {
		return fmt.Errorf("launcher: binding to CPUs %v: %w", cpus, err)
	}
	defer func() { _ = unix.SchedSetaffinity(0, &old) }()
	return start()
}

// cpuBinding returns the CPUs of each of the attempt's local ranks (nil:
// none bound) and logs the binding or why there is none.
func (r *runner) cpuBinding(log zerolog.Logger) [][]int {
	allowed, err := allowedCPUs()
	if err != nil {
		log.Warn().Err(err).Msg("ranks not bound to CPUs")
		return nil
	}
	plan, why := cpuPlan(r.cfg.CPUBind, allowed, len(r.slots))
	if plan == nil {
		log.Info().Str("cpu_bind", r.cfg.CPUBind).Ints("cpus", allowed).Str("reason", why).Msg("ranks not bound to CPUs")
		return nil
	}
	for i, slot := range r.slots {
		log.Info().Str("cpu_bind", r.cfg.CPUBind).Int("rank", slot.Rank).Int("local_rank", slot.LocalRank).Ints("cpus", plan[i]).Msg("rank bound to CPUs")
	}
	return plan
}
