package transport

import (
	"os"
	"sync/atomic"
	"unsafe"
)

// touchPages writes every page of mem, a shared mapping (page-aligned,
// as mmap returns it), once: an atomic add of 0 to its first word, which
// keeps whatever a peer has stored there (the add is one indivisible
// read-modify-write, so it loses no concurrent store either). It runs
// when a pair's rings are mapped (mapShm), so that no op pays the first
// access of a ring page.
//
// MAP_POPULATE already maps every page, so without a hypervisor in the
// way this only walks mapped pages (not measured here). But on a VM
// whose hypervisor keeps shadow page tables (the development VM's PVM),
// the first access of a page from a process still costs an exit to the
// hypervisor: writing one byte per 4 KiB page of a fresh 8 MiB /dev/shm
// mapping took 5.5-7 µs a page after MAP_POPULATE, and as long after
// MADV_POPULATE_WRITE (2026-12-06). The rings' offsets only move forward, so the first lap
// of a 4 MiB ring paid it on every page: a 256 KiB broadcast took
// 200-1000 µs on its first lap against 15 µs after, which also made the
// two-rank probe (tune.go) pick the single copy for rings it had timed
// cold.
//
// Only the rings are touched, not the group segment (shm_group.go): the
// one-step ops reuse its two slots every other op, so only a group's
// first two ops pay those first accesses. Touching it as well made the
// two-rank allreduce slower for good, for no reason found: in an A/B of
// one build whose touch of the group segment a variable turned off
// (2026-12-07, 236 runs each in the host's far state), 8 KiB took 4.24
// µs with the touch against 3.87 without, 4 KiB 2.98 against 2.81, and
// the build without won 176 of 243 rounds at 8 KiB; touching the rings
// alone was level with touching nothing (217 runs, 8 KiB 4.36 against
// 4.42 µs, rounds won 113 to 108).
func touchPages(mem []byte) {
	ps := os.Getpagesize()
	for i := 0; i+8 <= len(mem); i += ps {
		atomic.AddUint64((*uint64)(unsafe.Pointer(&mem[i])), 0)
	}
}
