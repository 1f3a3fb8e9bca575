package cpu

import (
	"encoding/binary"
	"fmt"
	"os"
	"unsafe"
)

// broadcastCMA is the single-copy broadcast among the processes of one
// host. The root publishes where buf lies (as allgatherCMA does), every
// other rank an empty descriptor; once every descriptor is checked, each
// non-root reads the root's buf straight into its own with
// process_vm_readv, then every rank publishes whether its read succeeded
// and waits for all, so that the root returns, and lets buf change, only
// after every reader is done. The root copies nothing; each other rank
// copies |buf| bytes once, (n−1)·|buf| in all, against n·|buf| through
// the slots and 2(n−1)·|buf| through the chain.
//
// If any rank's read failed, every rank returns a *cmaError (errCMAFailed)
// and the root's buf is unchanged; a non-root's buf may hold part of the
// root's data.
func broadcastCMA(s Slots, buf []byte, root int, c *cmaSide) error {
	r, n := s.Rank(), s.Size()
	var desc [cmaDescBytes]byte
	if r == root {
		binary.LittleEndian.PutUint64(desc[0:], uint64(os.Getpid()))
		binary.LittleEndian.PutUint64(desc[8:], uint64(uintptr(unsafe.Pointer(&c.token[0]))))
		binary.LittleEndian.PutUint64(desc[16:], c.token[0])
		binary.LittleEndian.PutUint64(desc[24:], uint64(uintptr(unsafe.Pointer(unsafe.SliceData(buf)))))
		binary.LittleEndian.PutUint64(desc[32:], uint64(len(buf)))
	}
	if err := s.Publish(desc[:]); err != nil {
		return err
	}
	var d []byte
	for p := range n {
		sl, err := s.Slot(p, cmaDescBytes)
		if err != nil {
			return err
		}
		if p == root {
			d = sl
		}
	}
	status := [1]byte{cmaOK}
	var readErr error
	if r != root {
		pid := int(binary.LittleEndian.Uint64(d[0:]))
		tokAddr := uintptr(binary.LittleEndian.Uint64(d[8:]))
		token := binary.LittleEndian.Uint64(d[16:])
		addr := uintptr(binary.LittleEndian.Uint64(d[24:]))
		if l := binary.LittleEndian.Uint64(d[32:]); l != uint64(len(buf)) {
			readErr = fmt.Errorf("root %d published a %d-byte buffer, this rank expects %d", root, l, len(buf))
		} else {
			readErr = c.readBlock(pid, tokAddr, token, addr, buf)
		}
		if readErr != nil {
			status[0] = cmaFailed
		}
	}
	if err := s.Publish(status[:]); err != nil {
		return err
	}
	failed := -1
	for p := range n {
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
