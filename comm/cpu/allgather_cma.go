package cpu

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"unsafe"

	"golang.org/x/sys/unix"
)

// allgatherCMA is the single-copy allgather of the two processes of a
// group on one host (Open MPI's vader BTL with its CMA single-copy
// mechanism; Options.SingleCopyMin). Each rank publishes through the
// group segment's slots where, in its output, the peer's block goes
// (process id, address, length, and the address and value of its
// engine's token), copies its own block into place, and, once it has
// checked the peer's slot (the same op: the slots compare fingerprints),
// writes its input straight into the peer's output with
// process_vm_writev (cross-memory attach, Linux 3.2). It then publishes
// whether its write succeeded and waits for the peer's word, so that no
// rank returns, and lets its output be used, while the peer still writes
// into it, or its input change while it is being copied. Each byte
// crosses once, copied by the kernel, against twice through a
// shared-memory ring (into it, out of it).
//
// Why a write and not a read: the kernel pins the remote side's pages
// one 4 KiB page at a time, and the output of a gather of 2 MiB or more
// from comm.NewHostBuffer lies on huge pages while its input blocks,
// half as large, may not. On the 2-core VM (2026-12-07) a 1 MiB
// process_vm_readv from 4 KiB pages took 104.5 µs where the write of the
// same bytes into a huge page took 56.1 (best of 5 × 400); the allgather
// read its peer's 1 MiB input block so. Where both sides have the same
// pages the two cost the same. The write goes to the peer only after
// this rank read back the peer's token (cmaSide.verify), so it never
// writes into another process that happens to have the peer's pid.
//
// mine is this rank's input block: it stays unchanged until both ranks
// published their status. blocks[Rank()] receives a copy of it.
//
// Both ranks learn both statuses in the second step, so they agree: if
// either rank's write failed, both return a *cmaError (errCMAFailed)
// with their own block in place, and the engine moves the data another
// way (the peer's block of the output may then hold part of the data).
func allgatherCMA(s Slots, blocks [][]byte, mine []byte, c *cmaSide) error {
	r := s.Rank()
	if s.Size() != 2 || len(blocks) != 2 {
		return fmt.Errorf("cpu engine: the single-copy allgather is for two ranks, not %d", s.Size())
	}
	peer := 1 - r
	desc := c.describe(blocks[peer])
	if err := s.Publish(desc[:]); err != nil {
		return err
	}
	copyOwnBlock(blocks[r], mine)
	d, err := s.Slot(peer, cmaDescBytes)
	if err != nil {
		return err
	}
	// The fingerprints matched (Slot checks them), so the blocks' lengths
	// do too; writeDescribed checks it anyway before it writes.
	return cmaSettle(s, c.writeDescribed(d, mine, peer))
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

// writeDescribed writes src into the buffer that rank p described in d
// (describe), whose length must be len(src), once the token d names
// proved that the pid is the peer's process (verify).
func (c *cmaSide) writeDescribed(d, src []byte, p int) error {
	if l := binary.LittleEndian.Uint64(d[32:]); l != uint64(len(src)) {
		return fmt.Errorf("rank %d published a %d-byte buffer, this rank sends %d", p, l, len(src))
	}
	if len(src) == 0 {
		return nil
	}
	pid := int(binary.LittleEndian.Uint64(d[0:]))
	if err := c.verify(pid, uintptr(binary.LittleEndian.Uint64(d[8:])), binary.LittleEndian.Uint64(d[16:])); err != nil {
		return err
	}
	return moveRest(c.write, "process_vm_writev to", pid, uintptr(binary.LittleEndian.Uint64(d[24:])), src, 0)
}

// cmaCall is process_vm_readv or process_vm_writev (or a test's stand-in).
type cmaCall = func(pid int, local []unix.Iovec, remote []unix.RemoteIovec, flags uint) (int, error)

// moveRest moves buf from byte done on to or from the bytes at addr+done
// in process pid with call, as often as it takes (a call may move less
// than asked); what names the call in errors ("process_vm_readv from").
func moveRest(call cmaCall, what string, pid int, addr uintptr, buf []byte, done int) error {
	for done < len(buf) {
		local := []unix.Iovec{{Base: &buf[done], Len: uint64(len(buf) - done)}}
		remote := []unix.RemoteIovec{{Base: addr + uintptr(done), Len: len(buf) - done}}
		k, err := call(pid, local, remote, 0)
		if err != nil {
			return fmt.Errorf("%s pid %d: %w", what, pid, err)
		}
		if k <= 0 {
			return fmt.Errorf("%s pid %d: no progress at byte %d of %d", what, pid, done, len(buf))
		}
		done += k
	}
	return nil
}

// tokenRead checks a process_vm_readv from pid whose first 8 bytes were
// the peer's token (got, against token): it returned k bytes or err.
func tokenRead(pid, k int, err error, got, token uint64) error {
	switch {
	case err != nil:
		return fmt.Errorf("process_vm_readv from pid %d: %w", pid, err)
	case k < 8:
		return fmt.Errorf("process_vm_readv from pid %d: read %d bytes", pid, k)
	case got != token:
		return fmt.Errorf("pid %d is not the peer's process (another pid namespace?)", pid)
	}
	return nil
}

// verify reads the token at tokAddr of process pid and checks that it is
// token, the value the peer published: then pid is the peer's process,
// not one with the same pid in another pid namespace, and it may be
// written to. A process that passed is remembered (its token stays at
// that address for the engine's life), so a group's later ops verify
// nothing.
func (c *cmaSide) verify(pid int, tokAddr uintptr, token uint64) error {
	if v := c.verified; v.pid == pid && v.tokAddr == tokAddr && v.token == token {
		return nil
	}
	var got [1]uint64
	local := []unix.Iovec{{Base: (*byte)(unsafe.Pointer(&got[0])), Len: 8}}
	remote := []unix.RemoteIovec{{Base: tokAddr, Len: 8}}
	k, err := c.read(pid, local, remote, 0)
	if err := tokenRead(pid, k, err, got[0], token); err != nil {
		return err
	}
	c.verified = verifiedPeer{pid: pid, tokAddr: tokAddr, token: token}
	return nil
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
// whether its copy by cross-memory attach succeeded (copyErr nil) and
// waits for every rank's word, so that no rank returns, and lets its
// buffers be used, while a peer still reads from or writes into them.
// All learn every rank's word, so they agree: if any rank's copy failed,
// every rank returns a *cmaError naming the first such rank
// (errCMAFailed), and the engine moves the data another way.
func cmaSettle(s Slots, copyErr error) error {
	status := [1]byte{cmaOK}
	if copyErr != nil {
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
		return &cmaError{Rank: failed, Err: copyErr}
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

// cmaError says which rank's single copy failed first, in rank order,
// and, on the rank that returns it, why its own failed.
type cmaError struct {
	Rank int
	Err  error // this rank's error; nil if its copy succeeded
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
	// read is process_vm_readv and write process_vm_writev; tests
	// replace them.
	read, write cmaCall
	// verified is the peer process whose token verify last found.
	verified verifiedPeer
}

// verifiedPeer is a process whose token was read back (cmaSide.verify).
type verifiedPeer struct {
	pid     int
	tokAddr uintptr
	token   uint64
}

func newCMASide() cmaSide {
	return cmaSide{token: &[1]uint64{rand.Uint64() | 1}, read: unix.ProcessVMReadv, write: unix.ProcessVMWritev}
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
	if err := tokenRead(pid, k, err, got[0], token); err != nil {
		return err
	}
	return moveRest(c.read, "process_vm_readv from", pid, addr, dst, k-8)
}
