package transport

import (
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"
)

// Linux futex(2) operations, without FUTEX_PRIVATE_FLAG: the futex words
// live in a MAP_SHARED segment that other processes (the peer ranks) map,
// so waits and wakes must be keyed by the page, not by this process.
const (
	futexWaitOp = 0 // FUTEX_WAIT
	futexWakeOp = 1 // FUTEX_WAKE
)

// futexWait blocks the calling thread while *addr == val, for at most d
// (a relative timeout), or until futexWake on addr. It returns early,
// without error, on a wake, a timeout, a signal or when *addr != val
// (EAGAIN): callers re-check their condition whatever happened. It goes
// through syscall.Syscall6, so the Go runtime hands this thread's P to
// other goroutines while it blocks.
func futexWait(addr *atomic.Uint32, val uint32, d time.Duration) {
	ts := syscall.NsecToTimespec(int64(d))
	syscall.Syscall6(syscall.SYS_FUTEX, uintptr(unsafe.Pointer(addr)), futexWaitOp, uintptr(val),
		uintptr(unsafe.Pointer(&ts)), 0, 0)
}

// futexWake wakes every thread blocked in futexWait on addr.
func futexWake(addr *atomic.Uint32) {
	syscall.RawSyscall6(syscall.SYS_FUTEX, uintptr(unsafe.Pointer(addr)), futexWakeOp, uintptr(1<<30), 0, 0, 0)
}
