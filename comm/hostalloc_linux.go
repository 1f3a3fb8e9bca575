package comm

import (
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"
)

// hugePages backs the n bytes at p (both multiples of HugePageBytes, Go
// memory of one live allocation, whose contents it keeps) with transparent huge pages, where the
// kernel allows:
//
//  1. madvise MADV_HUGEPAGE marks the range, so that the first write to
//     each of its 2 MiB pages faults in a huge page (one fault, where 4
//     KiB pages take 512);
//  2. one write per 2 MiB page faults them in;
//  3. madvise MADV_COLLAPSE (Linux 6.1) copies into huge pages the 2 MiB
//     pages that had 4 KiB pages already (memory the Go runtime reused,
//     which it zeroed before), and does nothing where step 2 succeeded;
//  4. madvise MADV_NOHUGEPAGE takes the mark off again: the huge pages
//     stay, but once the buffer is freed the Go runtime's reuse of the
//     range gets 4 KiB pages, and khugepaged leaves it alone, as the
//     runtime left it (on the VM of 2026-12-06, Go 1.26, its heap's
//     mapping carried no huge-page mark and no huge pages).
//
// On the 2-core VM of 2026-12-06 steps 1-2 took about 100 ms for 64 MiB
// (the host backing the VM's memory on its first use), against 170 ms
// for the first touch of the same memory in 4 KiB pages, which a buffer
// without huge pages pays on its first use instead. It returns the first
// error: the kernel's EINVAL where huge pages are turned off or, from
// step 3, before 6.1; the buffer is valid either way.
func hugePages(p unsafe.Pointer, n int) error {
	if n == 0 {
		return nil
	}
	b := unsafe.Slice((*byte)(p), n)
	if err := unix.Madvise(b, unix.MADV_HUGEPAGE); err != nil {
		return err
	}
	for i := 0; i < n; i += HugePageBytes {
		// A write faults the page in (a read would map the zero page);
		// adding 0 keeps what is there.
		atomic.AddUint64((*uint64)(unsafe.Pointer(&b[i])), 0)
	}
	err := unix.Madvise(b, unix.MADV_COLLAPSE)
	if e := unix.Madvise(b, unix.MADV_NOHUGEPAGE); err == nil {
		err = e
	}
	return err
}
