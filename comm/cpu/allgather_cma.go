package cpu

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/ranktree/ranktree/comm"
)

// allgatherCMA is the single-copy allgather among the processes of one
// host (Open MPI's vader BTL with its CMA single-copy mechanism; used for
// two ranks, Options.SingleCopyMin). Every rank publishes through the
// group segment's slots where its block lies (process id, address,
// length, and the address and value of its engine's token), copies its
// own block into its output, and reads every peer's block straight from
// the peer's memory into its output with process_vm_readv (cross-memory
// attach, Linux 3.2). It then publishes whether its reads succeeded and
// waits until every rank has, so that no rank returns, and lets its
// buffers be used, while a peer still reads them. Each byte crosses once,
// copied by the kernel, against twice through a shared-memory ring (into
// it, out of it). A rank only ever reads a peer's memory, never writes
// it, so a peer that gave up the op (an abort) and reuses its buffers
// cannot have them changed under it.
//
// Where its block lies: the input block, or, where only the output can
// have huge pages (blockFromOutput), the rank's own block of its output,
// copied there first. The kernel pins the remote side's pages, 4 KiB at
// a time unless they are huge pages, and that dominates on the 2-core VM
// (2026-12-07): a 1 MiB process_vm_readv from 4 KiB pages took 104.5 µs,
// one from huge pages 55.3 (one process, best of 5 × 400).
//
// All ranks learn every rank's status in the second step, so they agree:
// if any rank's reads failed, every rank returns a *cmaError (errCMAFailed)
// with its own block in place, and the engine moves the data another way.
func allgatherCMA(s Slots, blocks [][]byte, mine []byte, c *cmaSide) error {
	r, n := s.Rank(), s.Size()
	fromOut := blockFromOutput(len(mine), n)
	src := mine
	if fromOut {
		if &blocks[r][0] != &mine[0] {
			copy(blocks[r], mine) // non-temporal from 1 MiB: the peer reads it from memory
		}
		src = blocks[r]
	}
	desc := c.describe(src)
	if err := s.Publish(desc[:]); err != nil {
		return err
	}
	if !fromOut {
		copyOwnBlock(blocks[r], mine)
	}
	var readErr error
	for p := range n {
		if p == r || readErr != nil {
			continue
		}
		d, err := s.Slot(p, cmaDescBytes)
		if err != nil {
			return err
		}
		// The fingerprints matched (Slot checks them), so the blocks'
		// lengths do too; a different one is a bug.
		readErr = c.readDescribed(d, blocks[p], p)
	}
	return cmaSettle(s, readErr)
}

// blockFromOutput reports whether the ranks of an allgather of n blocks
// of blockBytes each publish their own block of the output rather than
// their input block (allgatherCMA): where the blocks are smaller than a
// huge page and the output is not, so that comm.NewHostBuffer gives the
// output huge pages and may give the input none. Copying the own block
// first then comes before the peer can read it, which costs more than it
// saves once the input blocks have huge pages too. 2 ranks, 2026-12-07,
// scripts/bench-ab.sh, 100 ops after 10, mean µs in the far state (155
// runs each), own output block against input block: 2 MiB gathered 77.1
// against 127.0 (155 of 160 rounds won), 4 MiB 157.8 against 142.6 (44
// of 160), 8 MiB 294.1 against 274.9 (47 of 160).
func blockFromOutput(blockBytes, n int) bool {
	return blockBytes > 0 && blockBytes < comm.HugePageBytes && blockBytes*n >= comm.HugePageBytes
}

// describe is the descriptor (cmaDescBytes) of buf that a rank publishes
// for its peers to read buf by cross-memory attach (readDescribed): this
// process's id, the address and value of its token, buf's address and
// length (uint64 each, little-endian).
func (c *cmaSide) describe(buf []byte) [cmaDescBytes]byte {
	var d [cmaDescBytes]byte
	binary.LittleEndian.PutUint64(d[0:], uint64(os.Getpid()))
	binary.LittleEndian.PutUint64(d[8:], uint64(uintptr(unsafe.Pointer(&c.token[0]))))
	binary.LittleEndian.PutUint64(d[16:], c.token[0])
	binary.LittleEndian.PutUint64(d[24:], uint64(uintptr(unsafe.Pointer(unsafe.SliceData(buf)))))
	binary.LittleEndian.PutUint64(d[32:], uint64(len(buf)))
	return d
}

// readDescribed reads into dst the buffer that rank p described in d
// (describe), whose length must be len(dst).
func (c *cmaSide) readDescribed(d, dst []byte, p int) error {
	if l := binary.LittleEndian.Uint64(d[32:]); l != uint64(len(dst)) {
		return fmt.Errorf("rank %d published a %d-byte buffer, this rank expects %d", p, l, len(dst))
	}
	return c.readBlock(int(binary.LittleEndian.Uint64(d[0:])), uintptr(binary.LittleEndian.Uint64(d[8:])),
		binary.LittleEndian.Uint64(d[16:]), uintptr(binary.LittleEndian.Uint64(d[24:])), dst)
}

// cmaSettle is a single-copy op's second step: every rank publishes
// whether its reads succeeded (readErr nil) and waits for every rank's
// word, so that no rank returns, and lets its buffer change, while a
// peer still reads it. All learn every rank's word, so they agree: if any
// rank's reads failed, every rank returns a *cmaError naming the first
// such rank (errCMAFailed), and the engine moves the data another way.
func cmaSettle(s Slots, readErr error) error {
	status := [1]byte{cmaOK}
	if readErr != nil {
		status[0] = cmaFailed
	}
	if err := s.Publish(status[:]); err != nil {
		return err
	}
	failed := -1
	for p := range s.Size() {
		st, err := s.Slot(p, 1)
		if err != nil {
			return err
		}
		if st[0] != cmaOK && failed < 0 {
			failed = p
		}
	}
	if failed >= 0 {
		return &cmaError{Rank: failed, Err: readErr}
	}
	return nil
}

const (
	// cmaDescBytes is a block's descriptor: pid, token address, token,
	// block address, block length (uint64 each, little-endian).
	cmaDescBytes = 40
	cmaOK        = 1
	cmaFailed    = 2
)

// copyOwnBlock copies a rank's own block into its output. Go's copy
// stores a copy of 1 MiB or more with non-temporal stores, past the
// caches; a block of up to cachedCopyMax goes in pieces below that, so
// that it stays in cache, where the rank reads it next: on the 2-core VM,
// 2026-11-27, 2 ranks, 2 MiB gathered (1 MiB blocks), 5 rounds, mean µs
// (median over rounds) 109 in pieces against 132 in one copy; from 2 MiB
// blocks, beyond the 2 MiB L2, one copy was faster (4 MiB gathered 282
// against 344). An in-place allgather, whose input is its output's block,
// copies nothing.
func copyOwnBlock(dst, src []byte) {
	if len(src) == 0 || &dst[0] == &src[0] {
		return // in place (the input is the output's block): nothing to move
	}
	if len(src) > cachedCopyMax {
		copy(dst, src)
		return
	}
	for off := 0; off < len(src); off += cachedCopyPiece {
		copy(dst[off:], src[off:min(off+cachedCopyPiece, len(src))])
	}
}

const (
	cachedCopyMax   = 1 << 20
	cachedCopyPiece = 512 << 10
)

// errCMAFailed: some rank could not read a peer's memory (cmaError).
var errCMAFailed = errors.New("cross-memory attach failed")

// cmaError says which rank's single-copy reads failed first, in rank
// order, and, on the rank that returns it, why its own failed.
type cmaError struct {
	Rank int
	Err  error // this rank's read error; nil if its reads succeeded
}

func (e *cmaError) Error() string {
	if e.Err != nil {
		return fmt.Sprintf("%v at rank %d: %v", errCMAFailed, e.Rank, e.Err)
	}
	return fmt.Sprintf("%v at rank %d", errCMAFailed, e.Rank)
}

func (e *cmaError) Unwrap() error { return errCMAFailed }

// cmaSide is an engine's part of the single-copy transfers; only the op
// that runs uses it.
type cmaSide struct {
	// token[0] is a random number, published with its address: a peer
	// that reads it back at that address in the published pid knows it
	// reads this process, not one with the same pid in another pid
	// namespace.
	token *[1]uint64
	// read is process_vm_readv; tests replace it.
	read func(pid int, local []unix.Iovec, remote []unix.RemoteIovec, flags uint) (int, error)
}

func newCMASide() cmaSide {
	return cmaSide{token: &[1]uint64{rand.Uint64() | 1}, read: unix.ProcessVMReadv}
}

// readBlock reads the peer's token at tokAddr and len(dst) bytes at addr
// of process pid into dst, and checks the token.
func (c *cmaSide) readBlock(pid int, tokAddr uintptr, token uint64, addr uintptr, dst []byte) error {
	if len(dst) == 0 {
		return nil
	}
	var got [1]uint64
	local := []unix.Iovec{{Base: (*byte)(unsafe.Pointer(&got[0])), Len: 8}, {Base: &dst[0], Len: uint64(len(dst))}}
	remote := []unix.RemoteIovec{{Base: tokAddr, Len: 8}, {Base: addr, Len: len(dst)}}
	k, err := c.read(pid, local, remote, 0)
	switch {
	case err != nil:
		return fmt.Errorf("process_vm_readv from pid %d: %w", pid, err)
	case k < 8:
		return fmt.Errorf("process_vm_readv from pid %d: read %d bytes", pid, k)
	case got[0] != token:
		return fmt.Errorf("pid %d is not the peer's process (another pid namespace?)", pid)
	}
	for done := k - 8; done < len(dst); {
		local := []unix.Iovec{{Base: &dst[done], Len: uint64(len(dst) - done)}}
		remote := []unix.RemoteIovec{{Base: addr + uintptr(done), Len: len(dst) - done}}
		k, err := c.read(pid, local, remote, 0)
		if err != nil {
			return fmt.Errorf("process_vm_readv from pid %d: %w", pid, err)
		}
		if k <= 0 {
			return fmt.Errorf("process_vm_readv from pid %d: no progress at byte %d of %d", pid, done, len(dst))
		}
		done += k
	}
	return nil
}
