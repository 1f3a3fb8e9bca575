package bench

import (
	"unsafe"

	"golang.org/x/sys/unix"
)

// Placement says where the ranks ran during one size's timed iterations,
// from a CPU sample each rank takes after every Config.PlacementEvery-th
// iteration (the first one included). Ranks that share a CPU take turns
// on it, which is what makes small-message times bimodal from run to run
// (issue 15), so a result carries its placement.
type Placement struct {
	// CPUs[r] is the CPU rank r was seen on most often (-1: unknown).
	CPUs []int `json:"cpus"`
	// SharedFrac is the fraction (0..1) of the samples at which at least
	// two ranks were seen on the same CPU.
	SharedFrac float64 `json:"shared_frac"`
	// Samples is the number of samples per rank.
	Samples int `json:"samples"`
}

// NewPlacement summarizes samples laid out as samples[r*iters+i] = 1 + the
// CPU rank r ran on at its sample i, 0 where unknown, for n ranks and
// iters samples per rank.
func NewPlacement(samples []int32, n, iters int) Placement {
	p := Placement{CPUs: make([]int, n)}
	if iters <= 0 || len(samples) < n*iters {
		for r := range p.CPUs {
			p.CPUs[r] = -1
		}
		return p
	}
	p.Samples = iters
	for r := 0; r < n; r++ {
		counts := map[int32]int{}
		best, bestN := int32(0), 0
		for _, c := range samples[r*iters : (r+1)*iters] {
			if c == 0 {
				continue
			}
			counts[c]++
			if counts[c] > bestN || (counts[c] == bestN && c < best) {
				best, bestN = c, counts[c]
			}
		}
		p.CPUs[r] = int(best) - 1
	}
	shared := 0
	seen := make(map[int32]bool, n)
	for i := 0; i < iters; i++ {
		clear(seen)
		for r := 0; r < n; r++ {
			c := samples[r*iters+i]
			if c == 0 {
				continue
			}
			if seen[c] {
				shared++
				break
			}
			seen[c] = true
		}
	}
	p.SharedFrac = float64(shared) / float64(iters)
	return p
}

// CurrentCPU returns the CPU the calling thread runs on (getcpu(2)), or -1
// if the kernel does not say. It is a system call (about 0.3 µs), which is
// why Run samples only every Config.PlacementEvery-th iteration: a sample
// taken between two ops delays this rank's next launch, and its peers wait
// for it.
func CurrentCPU() int {
	var cpu, node uint32
	_, _, errno := unix.RawSyscall(unix.SYS_GETCPU, uintptr(unsafe.Pointer(&cpu)), uintptr(unsafe.Pointer(&node)), 0)
	if errno != 0 {
		return -1
	}
	return int(cpu)
}
