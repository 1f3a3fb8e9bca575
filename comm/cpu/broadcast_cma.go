package cpu

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
	var desc [cmaDescBytes]byte
	if s.Rank() == root {
		desc = c.describe(buf)
	}
	if err := s.Publish(desc[:]); err != nil {
		return err
	}
	// Every rank's descriptor first: the slots check every fingerprint,
	// so none reads the root's buffer for an op another rank did not
	// launch.
	var d []byte
	for p := range s.Size() {
		sl, err := s.Slot(p, cmaDescBytes)
		if err != nil {
			return err
		}
		if p == root {
			d = sl
		}
	}
	var readErr error
	if s.Rank() != root {
		readErr = c.readDescribed(d, buf, root)
	}
	return cmaSettle(s, readErr)
}
