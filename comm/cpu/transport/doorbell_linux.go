package transport

import (
	"fmt"
	"os"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// A rank's doorbell is a FIFO beside the group segment (see the layout in
// shm_group.go). The rank sleeps by reading it through the Go netpoller:
// the goroutine parks and its thread gives the P back at once, so the
// rank's other goroutines (training compute, the reducer, the watchdog)
// run while it sleeps, which a FUTEX_WAIT, a blocking system call, did
// not allow until sysmon took the P back (20 µs to 10 ms later, with
// GOMAXPROCS=1 as rankrunner sets it). A peer wakes it by writing one
// byte; the write wakes the thread that waits in epoll for the process,
// which runs the goroutine.
//
// A nap (a forecast wait, shm_group.go) must end at a precise time, which
// a read deadline does not give: the Go netpoller sleeps in whole
// milliseconds, so a deadline fires 0.3-0.4 ms late on the development
// VM. A nap reads, through the netpoller, an epoll set of the rank's own
// doorbell and a timerfd (CLOCK_MONOTONIC) armed for its end, so that
// either the doorbell or the timer wakes it (25-170 µs late, the VM's
// wake-up, against 80-200 µs for FUTEX_WAIT with a timeout, which also
// adds the default 50 µs timer slack).

// bellPath is the FIFO of rank r's doorbell beside the group segment seg.
func bellPath(seg string, r int) string { return fmt.Sprintf("%s-bell%d", seg, r) }

// makeBells creates the doorbell FIFOs of n ranks beside seg (group rank 0).
func makeBells(seg string, n int) error {
	for r := range n {
		if err := syscall.Mkfifo(bellPath(seg, r), 0o600); err != nil {
			removeBells(seg, r)
			return fmt.Errorf("doorbell %s: %w", bellPath(seg, r), err)
		}
	}
	return nil
}

// removeBells removes the doorbell FIFOs of ranks 0..n-1 beside seg.
func removeBells(seg string, n int) {
	for r := range n {
		_ = os.Remove(bellPath(seg, r))
	}
}

// bells is one rank's ends of its group's doorbells.
type bells struct {
	own   *os.File              // this rank's FIFO, read through the netpoller
	rc    syscall.RawConn       // own's
	drain func(fd uintptr) bool // drainFD, bound once (no allocation per sleep)
	fds   []int                 // every rank's FIFO (this rank's too), written by ring
	me    int                   // this rank (fds[me] is its own FIFO)
	buf   [64]byte              // what drain reads
	// The nap's epoll set (own FIFO and tmr), read through the
	// netpoller; woke is napWoke, bound once.
	ep   *os.File
	eprc syscall.RawConn
	tmr  int // timerfd, -1 until opened
	woke func(fd uintptr) bool
	its  unix.ItimerSpec
	evs  [2]unix.EpollEvent
}

// openBells opens the doorbells of n ranks beside seg as rank sees them.
// Every end is opened O_RDWR and non-blocking: on Linux that never waits
// for the other end, and a write never fails for want of a reader.
func openBells(seg string, n, rank int) (*bells, error) {
	b := &bells{fds: make([]int, n), me: rank, tmr: -1}
	for r := range b.fds {
		b.fds[r] = -1
	}
	for r := range n {
		p := bellPath(seg, r)
		fd, err := syscall.Open(p, syscall.O_RDWR|syscall.O_NONBLOCK|syscall.O_CLOEXEC, 0)
		if err != nil {
			b.close()
			return nil, fmt.Errorf("doorbell %s: %w", p, err)
		}
		b.fds[r] = fd
		var st syscall.Stat_t
		if err := syscall.Fstat(fd, &st); err != nil || st.Mode&syscall.S_IFMT != syscall.S_IFIFO {
			b.close()
			return nil, fmt.Errorf("doorbell %s is not a FIFO", p)
		}
	}
	f, err := os.OpenFile(bellPath(seg, rank), os.O_RDWR|syscall.O_NONBLOCK, 0)
	if err != nil {
		b.close()
		return nil, fmt.Errorf("doorbell: %w", err)
	}
	b.own = f
	if b.rc, err = f.SyscallConn(); err != nil {
		b.close()
		return nil, fmt.Errorf("doorbell: %w", err)
	}
	b.drain = b.drainFD
	if err := b.openNap(); err != nil {
		b.close()
		return nil, fmt.Errorf("doorbell: %w", err)
	}
	return b, nil
}

// openNap makes the nap's timerfd and epoll set (see nap).
func (b *bells) openNap() error {
	tmr, err := unix.TimerfdCreate(unix.CLOCK_MONOTONIC, unix.TFD_NONBLOCK|unix.TFD_CLOEXEC)
	if err != nil {
		return fmt.Errorf("timerfd: %w", err)
	}
	b.tmr = tmr
	ep, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return fmt.Errorf("epoll: %w", err)
	}
	for _, fd := range []int{b.fds[b.me], tmr} {
		if err := unix.EpollCtl(ep, unix.EPOLL_CTL_ADD, fd, &unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(fd)}); err != nil {
			_ = unix.Close(ep)
			return fmt.Errorf("epoll: %w", err)
		}
	}
	// Non-blocking, so that os.NewFile hands it to the netpoller (an
	// epoll set is readable while one of its fds is).
	if err := unix.SetNonblock(ep, true); err != nil {
		_ = unix.Close(ep)
		return fmt.Errorf("epoll: %w", err)
	}
	b.ep = os.NewFile(uintptr(ep), "doorbell-nap")
	if b.eprc, err = b.ep.SyscallConn(); err != nil {
		return err
	}
	b.woke = b.napWoke
	return nil
}

// napWoke reports whether the doorbell rang or the nap's timer fired
// (false: wait), and drains both. Raw system calls, as drainFD.
func (b *bells) napWoke(fd uintptr) bool {
	for {
		n, _, e := syscall.RawSyscall6(syscall.SYS_EPOLL_PWAIT, fd, uintptr(unsafe.Pointer(&b.evs[0])), uintptr(len(b.evs)), 0, 0, 0)
		if e == syscall.EINTR {
			continue
		}
		if e != 0 || n == 0 {
			return false
		}
		b.drainFD(uintptr(b.fds[b.me]))
		b.drainFD(uintptr(b.tmr))
		return true
	}
}

// nap parks the calling goroutine until a byte arrives at this rank's
// doorbell or d (> 0) has passed, by a precise timer, and drains what
// arrived. Whatever happened, the caller re-checks its condition.
func (b *bells) nap(d time.Duration) {
	if d <= 0 {
		return
	}
	b.setTimer(d)
	_ = b.eprc.Read(b.woke)
	b.setTimer(0) // disarm, so that a nap the doorbell ended leaves no expiry behind
	b.drainFD(uintptr(b.tmr))
}

// setTimer arms the nap's timer to fire d from now (0: disarm).
func (b *bells) setTimer(d time.Duration) {
	b.its.Value = unix.NsecToTimespec(int64(d))
	_, _, _ = syscall.RawSyscall6(unix.SYS_TIMERFD_SETTIME, uintptr(b.tmr), 0, uintptr(unsafe.Pointer(&b.its)), 0, 0, 0)
}

// drainFD reads what arrived at the doorbell fd; false: nothing (EAGAIN),
// wait. It reads with RawSyscall: a system call through syscall.Syscall
// would wake the runtime's sysmon thread from its deep sleep (all Ps
// idle) and set it polling every 20 µs for a millisecond, CPU that a
// sleeping rank would burn at every slice.
func (b *bells) drainFD(fd uintptr) bool {
	for {
		_, _, e := syscall.RawSyscall(syscall.SYS_READ, fd, uintptr(unsafe.Pointer(&b.buf[0])), uintptr(len(b.buf)))
		switch e {
		case syscall.EINTR:
			continue
		case syscall.EAGAIN:
			return false
		}
		return true
	}
}

// close closes every end (none for nil).
func (b *bells) close() {
	if b == nil {
		return
	}
	if b.own != nil {
		_ = b.own.Close()
	}
	if b.ep != nil {
		_ = b.ep.Close()
	}
	if b.tmr >= 0 {
		_ = syscall.Close(b.tmr)
	}
	for _, fd := range b.fds {
		if fd >= 0 {
			_ = syscall.Close(fd)
		}
	}
}

// bellByte is what ring writes.
var bellByte = [1]byte{1}

// ring writes one byte to rank p's doorbell (nothing for nil: a group in
// Go memory). A full pipe (EAGAIN) has bytes its reader has not drained,
// which wake it all the same.
func (b *bells) ring(p int) {
	if b == nil {
		return
	}
	_, _, _ = syscall.RawSyscall(syscall.SYS_WRITE, uintptr(b.fds[p]), uintptr(unsafe.Pointer(&bellByte[0])), 1)
}

// sleep parks the calling goroutine until a byte arrives at this rank's
// doorbell or d has passed, and drains what arrived. Whatever happened,
// the caller re-checks its condition.
func (b *bells) sleep(d time.Duration) {
	_ = b.own.SetReadDeadline(time.Now().Add(d))
	_ = b.rc.Read(b.drain)
}
