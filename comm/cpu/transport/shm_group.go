package transport

import (
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/ranktree/ranktree/comm"
)

// The group segment: one shared-memory file per group of 2..maxFlatRanks
// ranks that all live on one host (every link shm), created by group rank
// 0 at rendezvous, mapped by every member (MAP_POPULATE: pre-faulted) and
// unlinked once all did. It holds, per rank, the slots of the one-step
// ("flat") algorithms (comm/cpu/allreduce_flat.go) and the flag its waits
// sleep behind. Layout:
//
//	0     magic u64 | 8 ranks u64 | 16 slot bytes u64        (one page)
//	4096  rank 0's block, then rank 1's, ... (grpBlockBytes each)
//
// A rank's block (offsets within it; each word on its own 128-byte pair of
// cache lines, so that no two writers share a line):
//
//	0    box 0: the fast box of the rank's even-numbered flat ops (op k
//	     uses box k%2, as it uses slot k%2), one cache line:
//	     0 k u64 (the op's number: the rank published op k when box k%2
//	     holds k or more) | 8 fingerprint hash u64 | 16 seq u64 |
//	     24 payload length u64 | 32 payload, when it fits (at most
//	     boxPayload bytes; see Mesh.Publish)
//	128  box 1: the same for odd-numbered ops
//	256  (unused)
//	384  sleeping u32  set by the rank while it may block on its doorbell
//	512  slot 0: 64-byte header (the op's fingerprint) + slot bytes
//	     slot 1: the same; op k uses slot k%2 (double buffering)
//
// Beside the segment, each rank has a doorbell: a FIFO (named pipe)
// <segment>-bell<rank>, made by group rank 0 with the segment and opened
// by every rank (O_RDWR, non-blocking, so that opening never waits for
// the other end). A rank sleeps by reading its own through the Go
// netpoller; whoever wakes it writes one byte. See "The wait policy".
const (
	grpMagic     = 0x52544752_50330000 // "RTGRP3" (fast boxes)
	grpHeadBytes = 4096
	grpCtlBytes  = 512
	// maxFlatRanks bounds the groups that get a group segment: every rank
	// reads every other rank's slot, so the one-step algorithms cost
	// (n-1)·|slot| reads per rank and stop paying off beyond a few ranks.
	MaxFlatRanks = 8
)

// grpBlockBytes is one rank's block for slots of slot bytes (whole pages).
func grpBlockBytes(slot int) int { return (grpCtlBytes + 2*(HeaderSize+slot) + 4095) &^ 4095 }

// grpBytes is the size of the group segment of n ranks.
func grpBytes(n, slot int) int { return grpHeadBytes + n*grpBlockBytes(slot) }

// flatRank is one rank's block of the group segment.
type flatRank struct {
	pub      [2]*atomic.Uint64 // box k%2's op number (k)
	box      [2][]byte         // box k%2 after its op number (boxBytes)
	sleeping *atomic.Uint32
	slot     [2][]byte // header + payload
}

// published is the number of the last flat op rank r published.
func (r *flatRank) published() uint64 { return max(r.pub[0].Load(), r.pub[1].Load()) }

// ShmGroup is this rank's view of the group segment. Only the progress
// goroutine uses k and the slots; wake may be called from any goroutine.
type ShmGroup struct {
	Path       string // the segment's file ("" for Go memory)
	mem        []byte
	rank, size int
	slotBytes  int
	r          []flatRank
	// Spin is how long a wait spins before it sleeps on the rank's
	// doorbell (0: never; see pace).
	Spin time.Duration
	// Yield is how long a wait yields the CPU (sched_yield) before it
	// sleeps when it may not spin (oversubscribed; 0: never).
	Yield time.Duration
	// Doorbell is set when the waits of this rank follow the policy below
	// (the group spans processes, cpu.Engine.attachGroup); otherwise they
	// use link.go's backoff and wake through the pair links.
	Doorbell bool
	// bells are the doorbells (doorbell_linux.go) of a segment in a file;
	// nil for Go memory.
	bells *bells
	// k is the number of flat ops this rank has published.
	K uint64
	// fc is the forecast of this rank's waits (shm_forecast.go); op is
	// the key of the current op (Mesh.Begin) and waits how many of its
	// waits started (pace.key). Progress goroutine only.
	fc    forecast
	op    uint64
	waits int
	// release gives Go memory back to its InmemHub (inmem transport).
	Release func()

	// mu guards the mapping against wakeSelf from other goroutines (tcp
	// readers poking after a notice) once release unmaps it.
	mu       sync.RWMutex
	unmapped bool
}

// GroupOver lays the group segment of n ranks with slots of slot bytes
// over mem, as seen by rank.
func GroupOver(mem []byte, n, slot, rank int) *ShmGroup {
	g := &ShmGroup{mem: mem, rank: rank, size: n, slotBytes: slot, r: make([]flatRank, n)}
	bb := grpBlockBytes(slot)
	for p := range n {
		b := grpHeadBytes + p*bb
		u64 := func(off int) *atomic.Uint64 { return (*atomic.Uint64)(unsafe.Pointer(&mem[b+off])) }
		s0 := b + grpCtlBytes
		s1 := s0 + HeaderSize + slot
		box := func(off int) []byte { return mem[b+off+8 : b+off+8+boxBytes : b+off+8+boxBytes] }
		g.r[p] = flatRank{pub: [2]*atomic.Uint64{u64(0), u64(128)}, box: [2][]byte{box(0), box(128)},
			sleeping: (*atomic.Uint32)(unsafe.Pointer(&mem[b+384])),
			slot:     [2][]byte{mem[s0 : s0+HeaderSize+slot : s0+HeaderSize+slot], mem[s1 : s1+HeaderSize+slot : s1+HeaderSize+slot]}}
	}
	return g
}

// CreateGroupShm creates, maps and stamps the group segment and creates
// its doorbells (group rank 0).
func CreateGroupShm(dir string, n, slot int) (*ShmGroup, error) {
	path := filepath.Join(dir, fmt.Sprintf("ranktree-%d-%s-grp", os.Getpid(), randomName()))
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	size := grpBytes(n, slot)
	if err := f.Truncate(int64(size)); err != nil {
		_ = os.Remove(path)
		return nil, err
	}
	mem, err := syscall.Mmap(int(f.Fd()), 0, size, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED|syscall.MAP_POPULATE)
	if err != nil {
		_ = os.Remove(path)
		return nil, fmt.Errorf("mmap %s: %w", path, err)
	}
	if err := makeBells(path, n); err != nil {
		_ = syscall.Munmap(mem)
		_ = os.Remove(path)
		return nil, err
	}
	bs, err := openBells(path, n, 0)
	if err != nil {
		_ = syscall.Munmap(mem)
		_ = os.Remove(path)
		removeBells(path, n)
		return nil, err
	}
	le := binary.LittleEndian
	le.PutUint64(mem[8:], uint64(n))
	le.PutUint64(mem[16:], uint64(slot))
	(*atomic.Uint64)(unsafe.Pointer(&mem[0])).Store(grpMagic)
	g := GroupOver(mem, n, slot, 0)
	g.Path, g.bells = path, bs
	return g, nil
}

// OpenGroupShm maps the group segment rank 0 created, checks that it
// was made for n ranks and slots of slot bytes and opens its doorbells.
func OpenGroupShm(path string, n, slot, rank int) (*ShmGroup, error) {
	size := grpBytes(n, slot)
	f, err := openSegment(path, size, "group shm segment", "FlatThreshold or SlotBytes")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	mem, err := syscall.Mmap(int(f.Fd()), 0, size, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED|syscall.MAP_POPULATE)
	if err != nil {
		return nil, fmt.Errorf("mmap %s: %w", path, err)
	}
	le := binary.LittleEndian
	if (*atomic.Uint64)(unsafe.Pointer(&mem[0])).Load() != grpMagic || le.Uint64(mem[8:]) != uint64(n) || le.Uint64(mem[16:]) != uint64(slot) {
		_ = syscall.Munmap(mem)
		return nil, fmt.Errorf("group shm segment %s was made for %d ranks and %d-byte slots, want %d and %d",
			path, le.Uint64(mem[8:]), le.Uint64(mem[16:]), n, slot)
	}
	bs, err := openBells(path, n, rank)
	if err != nil {
		_ = syscall.Munmap(mem)
		return nil, err
	}
	g := GroupOver(mem, n, slot, rank)
	g.Path, g.bells = path, bs
	return g, nil
}

// Unlink removes the segment's file and its doorbells' (once every rank
// opened them).
func (g *ShmGroup) Unlink() {
	_ = os.Remove(g.Path)
	removeBells(g.Path, g.size)
}

// Unmap unmaps the segment (or gives Go memory back to its hub), once
// no goroutine uses it.
func (g *ShmGroup) Unmap() {
	if g.Path == "" {
		if g.Release != nil {
			g.Release() // Go memory (inmem transport)
		}
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.unmapped {
		g.unmapped = true
		_ = syscall.Munmap(g.mem)
		g.bells.close()
	}
}

// wakeSelf rings this rank's own bell if it sleeps (ctl.poke: a notice
// arrived, a connection broke, the engine stopped). Safe from any
// goroutine, also after unmap.
func (g *ShmGroup) wakeSelf() {
	g.mu.RLock()
	if !g.unmapped {
		g.wake(g.rank)
	}
	g.mu.RUnlock()
}

// wake rings rank p's doorbell if p sleeps on it (or is about to): after
// whatever p may wait for changed (a slot or ack published, a ring counter
// moved, a notice arrived, the engine stopped). A rank that does not
// sleep costs its peers one load per wake. Safe from any goroutine.
func (g *ShmGroup) wake(p int) {
	f := &g.r[p]
	if f.sleeping.Load() != 0 && f.sleeping.CompareAndSwap(1, 0) {
		g.bells.ring(p)
	}
}

// wakePeers rings the bell of every other rank that sleeps.
func (g *ShmGroup) wakePeers() {
	for p := range g.size {
		if p != g.rank {
			g.wake(p)
		}
	}
}

// The wait policy. A rank waiting for a peer (a slot, a ring counter)
// spins for at most SpinFor of wall-clock time, then sleeps on its
// doorbell until the peer that publishes what it waits for rings it, for
// at most a slice at a time. CPU time a waiting rank burns is taken from
// the training step's compute on that core (the data loader, the
// optimizer, the other framework threads), so the spin is short and
// bounded in time, not in iterations whose length depends on the machine:
// a rank that waits 5 ms for a late peer spins 50 µs of it and sleeps the
// rest. The sleep parks the goroutine in the Go scheduler
// (doorbell_linux.go), so the rank's other goroutines run meanwhile.
//
// It does not spin when the group's ranks outnumber the CPUs they may run
// on together (their affinity masks, published at rendezvous): a spinning
// rank would then hold the CPU the peer needs to arrive. It yields the
// CPU instead (sched_yield) for at most Yield, which runs the peer at once
// when it waits on the same CPU, as Open MPI's progress loop does when
// oversubscribed (mpi_yield_when_idle).
//
// A sleeper wakes up on its own after sleepSlice and re-checks that the
// engine was not aborted, that no peer died or sent a failure notice and
// that no peer launched another op; all but the last also ring the
// rank's own doorbell, so the slices only bound how late a mismatch
// between a one-step and a message-based op is noticed.
//
// Once a wait of the same loop ended in progress, the peer is known to be
// moving data (the next ring slot of a large message), not late: such a
// wait spins, or yields when oversubscribed, for up to spinFlowing before
// it sleeps, so that a transfer in flight does not pay a wake-up per slot.
//
// A sleeper wakes 25-70 µs after its doorbell rings on the development
// VM, so only a rank that spins when its peer arrives wakes at once. When
// the recent waits of the same op and wait position lasted alike and long
// (a rank late by the same time every step, shm_forecast.go), a wait that
// may spin, of an op under forecastMaxBytes, spins as above, then, instead
// of the slices, naps until shortly before the predicted arrival (a
// precise timer, with the doorbell armed, so an early peer still wakes
// it), spins through a window of at most a tenth of the wait around the
// arrival, and follows the policy above if the peer has not come by its
// end. A forecast that misses thus costs at most that window.
const (
	SpinFor     = 50 * time.Microsecond
	spinFlowing = 300 * time.Microsecond
	// firstSlice is a wait's first sleep; each next one doubles, up to
	// maxSlice.
	firstSlice = time.Millisecond
	maxSlice   = 8 * time.Millisecond
)

// sleepSlice is how long the n-th sleep (from 0) of one wait lasts at most.
func sleepSlice(n int) time.Duration {
	if n >= 4 {
		return maxSlice
	}
	return min(firstSlice<<n, maxSlice)
}

// pace is the state of the waits of one loop (the zero value starts one).
type pace struct {
	start time.Time
	armed *atomic.Uint32 // the sleeping flag raised, or nil
	// sleeps counts the sleeps of this wait (sleepSlice).
	sleeps int
	// flowing is set once a wait of this loop ended in progress: the
	// peer is moving data, so the next wait (for the next piece of a
	// message in flight) is short and may last up to spinFlowing before
	// the rank sleeps.
	flowing bool
	// key is the wait's key in the forecast fc (0 and nil: the wait is
	// neither forecast nor recorded); set by ShmGroup.startWait.
	key uint64
	fc  *forecast
	// napTo and spinTo are the forecast's plan for this wait, as ages
	// (forecast.plan; zeros: none).
	napTo, spinTo time.Duration
}

// step is what a wait does next (pace.next).
type step uint8

const (
	stepSpin  step = iota // re-check, letting this process's goroutines run in between (lowering the sleeping flag if up)
	stepYield             // give the CPU to other threads (sched_yield), then re-check
	stepArm               // raise the sleeping flag, then re-check once more
	stepSleep             // sleep on the doorbell for at most the returned time
	stepNap               // sleep on the doorbell for at most the returned time, woken by a precise timer
)

// next is the wait policy as a function of the wait's state and the time
// now. A forecast wait (p.key set, spin > 0, not flowing, and fc's plan
// for the key) spins as any other while it is younger than spin (so a
// peer that comes at once, against the forecast, is met as without one),
// then arms and naps until the plan's napTo (in naps of at most
// maxSlice), then spins until its spinTo. Otherwise, and after that: spin
// while the wait is younger than spin (> 0), else yield while it is
// younger than yield, then arm, then sleep slices that grow from
// firstSlice to maxSlice. A sleep or nap is always preceded by an arm
// (the caller re-checks in between), and the flag stays up until settle,
// the sleep's end or a spin.
func (p *pace) next(now time.Time, spin, yield time.Duration) (step, time.Duration) {
	if p.start.IsZero() {
		p.start = now
		p.napTo, p.spinTo = 0, 0
		if spin > 0 && !p.flowing && p.fc != nil {
			p.napTo, p.spinTo = p.fc.plan(p.key)
		}
	}
	age := now.Sub(p.start)
	if age < p.spinTo { // a forecast wait's nap and window
		switch {
		case age < spin || age >= p.napTo:
			return stepSpin, 0
		case p.armed == nil:
			return stepArm, 0
		}
		return stepNap, min(p.napTo-age, maxSlice)
	}
	if p.armed != nil {
		d := sleepSlice(p.sleeps)
		p.sleeps++
		return stepSleep, d
	}
	switch {
	case spin > 0:
		if age < p.budget(spin) {
			return stepSpin, 0
		}
	case yield > 0:
		if age < p.budget(yield) {
			return stepYield, 0
		}
	}
	return stepArm, 0
}

// startWait gives a wait that starts its key in the forecast: the n-th
// wait (from 0) of the current op, if it is one of the first
// forecastWaits, the rank may spin and the loop's data is not flowing.
func (g *ShmGroup) startWait(p *pace) {
	p.key, p.fc = 0, nil
	if p.flowing || g.Spin <= 0 || g.waits >= forecastWaits {
		return
	}
	p.key, p.fc = waitKey(g.op, g.waits), &g.fc
	g.waits++
}

// noteShortWait records in the forecast a wait that ended within its
// tight spin (Mesh.spinTight) as a zero wait, under the key startWait
// gives it, so that a repeating long wait that stopped repeating stops
// being forecast as it would had the wait gone through pause.
func (g *ShmGroup) noteShortWait() {
	var p pace
	g.startWait(&p)
	if p.fc != nil {
		p.fc.record(p.key, 0)
	}
}

// beginOp starts the waits of the op fp (Mesh.Begin). The waits of ops
// of forecastMaxBytes or more are not forecast (g.waits at its limit).
func (g *ShmGroup) beginOp(fp *comm.Fingerprint) {
	g.op, g.waits = opKey(fp), 0
	if fp.Count*int64(max(fp.DType.Size(), 1)) >= forecastMaxBytes {
		g.waits = forecastWaits
	}
}

// pause waits a little for a condition the caller re-checks after each
// call, as next decides: a spin or a yield returns at once; an arm raises
// the sleeping flag and returns, so the caller checks once more (a peer
// that published before it saw the flag is not missed); a sleep or nap
// parks until the doorbell rings or its time is up. It returns
// ErrStopped once c is stopped.
func (g *ShmGroup) pause(p *pace, c *Ctl) error {
	if c.Stopped.Load() {
		return ErrStopped
	}
	if p.start.IsZero() {
		g.startWait(p)
	}
	now := time.Now()
	st, d := p.next(now, g.Spin, g.Yield)
	switch st {
	case stepSpin:
		if p.armed != nil { // a forecast wait's window begins
			p.armed.Store(0)
			p.armed = nil
		}
		// Let this process's other goroutines run.
		runtime.Gosched()
	case stepYield:
		// Oversubscribed: hand the CPU to whoever waits for it
		// (likely the peer this rank waits for).
		runtime.Gosched()
		osYield()
	case stepArm:
		f := g.r[g.rank].sleeping
		f.Store(1)
		p.armed = f
	case stepSleep:
		g.bells.sleep(d)
		p.armed.Store(0)
		p.armed = nil
	case stepNap:
		g.bells.nap(d)
		p.armed.Store(0)
		p.armed = nil
		if late := time.Since(now) - d; late >= 0 {
			g.fc.noteLate(late) // the timer fired (or the peer came after it should have)
		}
	}
	return nil
}

// budget is how long this wait spins or yields before it sleeps: base,
// or spinFlowing once data is flowing.
func (p *pace) budget(base time.Duration) time.Duration {
	if p.flowing {
		return max(base, spinFlowing)
	}
	return base
}

// settle ends a wait after progress (backoff.reset): it lowers the
// sleeping flag if pause raised it, so that peers stop ringing, records
// how long the wait lasted in the forecast, and marks the loop's data as
// flowing.
func (p *pace) settle() {
	if p.fc != nil && !p.start.IsZero() {
		p.settleAt(time.Now())
		return
	}
	p.settleAt(time.Time{})
}

// settleAt is settle at time now (zero: nothing to record).
func (p *pace) settleAt(now time.Time) {
	if p.armed != nil {
		p.armed.Store(0)
		p.armed = nil
	}
	if !p.start.IsZero() {
		if p.fc != nil && !now.IsZero() {
			p.fc.record(p.key, now.Sub(p.start))
		}
		p.flowing = true
	}
	p.start = time.Time{}
	p.sleeps = 0
	p.key, p.fc = 0, nil
}

// AffinityCPUs lists the CPUs this thread may run on (sched_getaffinity),
// or nil if unknown.
func AffinityCPUs() []int {
	var set unix.CPUSet
	if err := unix.SchedGetaffinity(0, &set); err != nil {
		return nil
	}
	var cpus []int
	for i := range len(set) * 64 {
		if set.IsSet(i) {
			cpus = append(cpus, i)
		}
	}
	return cpus
}

// SpinBudget is how long a rank of a group of n spins before it sleeps,
// given the CPUs each rank may run on: 0 when the ranks outnumber the
// CPUs of the union of their affinity masks, or when a mask is unknown.
func SpinBudget(n int, masks [][]int) time.Duration {
	seen := map[int]bool{}
	for _, m := range masks {
		if len(m) == 0 {
			return 0
		}
		for _, c := range m {
			seen[c] = true
		}
	}
	if n > len(seen) || n > runtime.GOMAXPROCS(0)*len(masks) {
		return 0
	}
	return SpinFor
}

// UseDoorbell makes g the doorbell of every wait of c's links (the wait
// policy above: spin or yield a bounded time, then sleep on this rank's
// doorbell) and makes the shm links ring the peers' doorbells instead of
// writing to their control connections. Call it once the links are up
// (c.Pumps complete) and before the first op, when the group's ranks are
// in several processes; ranks that are goroutines of one process keep
// the backoff of link.go, which yields to the Go scheduler.
func (c *Ctl) UseDoorbell(g *ShmGroup) {
	if g.bells == nil {
		return // Go memory (one process): keep the backoff
	}
	g.Doorbell = true
	c.Grp.Store(g)
	for _, s := range c.Pumps {
		s.Grp = g
	}
}
