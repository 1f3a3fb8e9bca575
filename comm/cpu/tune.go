package cpu

import (
	"errors"
	"math"
	"time"

	"github.com/ranktree/ranktree/comm"
	"github.com/ranktree/ranktree/comm/cpu/transport"
)

// Whether two ranks on one host move a broadcast or an allgather from
// 64 KiB up by cross-memory attach (one copy, by the reader) or through
// their shared-memory rings (two copies, pipelined over both CPUs)
// depends on the host, and by a factor of two either way:
//
//   - On the development VM of 2026-11-27 and -28 (its two vCPUs on
//     cores that shared a cache: a cache-line round trip of 49 ns), the
//     rings won: broadcast 256 KiB 13.9 against 18.2 µs, 1 MiB 42.7
//     against 79.1, 64 MiB 3598 against 7217 (3 rounds each).
//   - On the VM of 2026-11-28 from 03:00 UTC (a round trip of 107-155
//     ns: the vCPUs' cores share no cache), cross-memory attach won at
//     every size from 64 KiB: broadcast 64 KiB 4.2 against 9.5-11.8 µs,
//     1 MiB 33.9-35.4 against 88-94, 64 MiB 5400-5619 against 6250-6592;
//     allgather 64 KiB 4.6-5.7 against 6.6-7.3, 1 MiB 44.8-46.4 against
//     79-92 (two rounds each, Open MPI alongside).
//
// So a group of two ranks in two processes on one host measures both at
// its creation (probeSingleCopy) and takes the faster: the verdict
// widens the single copy to broadcasts from probeMin up and lowers the
// allgather's threshold (Options.SingleCopyMin, unless set) to probeMin.

const (
	// probeBytes is the broadcast size the probe times, and probeOps how
	// many of each kind it runs per round (three rounds of each: about
	// 1 ms in all on the VMs above).
	probeBytes = 256 << 10
	probeOps   = 8
	// probeMin is the smallest broadcast and allgather that take the
	// single copy when the probe finds it faster. At 32 KiB, on the VM
	// where it won, the one-step broadcast was level with it (3.6-4.1 µs
	// against 3.0-4.0) but the one-step allgather was not (4.0-4.7
	// against 3.4-3.5); the one threshold of both stays at the size
	// where the broadcast gains, and the allgather below it is not tuned.
	probeMin = 64 << 10
)

// probeWanted reports whether the group probes (tuneSingleCopy): two
// ranks in two processes with a group segment, a CPU each (waits spin),
// cross-memory attach not turned off and SingleCopyMin left to its
// default. Every input is the same on both ranks, so both probe or
// neither does.
func (e *Engine) probeWanted() bool {
	if e.opts.probe {
		return e.cfg.Size == 2 && e.grp != nil // tests: in one process
	}
	return e.cfg.Size == 2 && e.grp != nil && e.ctl.YieldOS && e.grp.Spin > 0 &&
		e.opts.SingleCopyMin > 0 && e.opts.singleCopyAuto
}

// tuneSingleCopy runs the probe when probeWanted and applies its
// verdict: on a host where the single copy was faster, broadcasts from
// probeMin up (e.bcastCMA) and allgathers from probeMin up
// (SingleCopyMin) take it. Run by New on both ranks before any op, on
// the mesh the progress goroutine will own. A failed read of the probe's
// single copy turns it off for the group (noCMA), as in an op; any
// other error fails the engine's creation.
func (e *Engine) tuneSingleCopy() error {
	if !e.probeWanted() {
		return nil
	}
	single, err := probeSingleCopy(e.mesh, &e.cma, e.probeFP)
	var ce *cmaError
	if errors.As(err, &ce) {
		e.noCMA(err)
		return nil
	}
	if err != nil {
		return err
	}
	e.applyProbe(single)
	e.log.Debug().Bool("single_copy", single).Msg("cpu engine: two-rank transfer probe")
	return nil
}

// applyProbe applies the probe's verdict: single, the single copy was
// faster.
func (e *Engine) applyProbe(single bool) {
	if single {
		e.bcastCMA = [2]int{probeMin, math.MaxInt}
		e.opts.SingleCopyMin = min(e.opts.SingleCopyMin, probeMin)
	}
}

// probeFP is the fingerprint of the probe's k-th op (from 1): seq k, so
// that the probe's ops are ordered as a group's ops are. The root of a
// ring broadcast runs ahead of its reader to the next barrier, whose slot
// the reader, still waiting for a ring message, sees: a slot of a later
// seq is a peer ahead, one of the same or an earlier seq a mismatch
// (transport.Mesh.checkPeerSlots). The group's own ops start again from
// seq 1 after the probe, which every rank has finished by then.
func (e *Engine) probeFP(k int, op comm.OpType, n, root int) comm.Fingerprint {
	return comm.Fingerprint{Group: comm.GroupHash(e.cfg.Group), Epoch: e.cfg.Epoch, Seq: uint64(k), Op: op,
		DType: comm.Uint8, Count: int64(n), Root: int32(root)}
}

// probeSingleCopy times, on rank 1 of a two-rank mesh, probeOps
// broadcasts of probeBytes from rank 0 through the rings (broadcastTree)
// and as many by cross-memory attach (broadcastCMA), each batch between
// two one-step barriers, in two timed rounds of each after an untimed
// one, and reports whether the single copy took less time in all. Rank 1
// decides and sends its verdict in a one-step broadcast, so both ranks
// return the same. fp names the probe's k-th op.
func probeSingleCopy(m *transport.Mesh, c *cmaSide, fp func(k int, op comm.OpType, n, root int) comm.Fingerprint) (bool, error) {
	buf := make([]byte, probeBytes)
	if m.Rank() == 0 {
		for i := range buf {
			buf[i] = byte(i)
		}
	}
	k := 0
	begin := func(op comm.OpType, n, root int) {
		k++
		m.Begin(transport.OpCtx{FP: fp(k, op, n, root)})
	}
	barrier := func() error {
		begin(comm.OpBroadcast, 0, 0)
		return broadcastFlat(m, nil, 0)
	}
	var took [2]time.Duration // rings (even rounds), single copy (odd)
	// Rounds 0 and 1 warm up (the pages of buf and of the rings);
	// rounds 2-5 are timed.
	for round := range 6 {
		single := round%2 == 1
		if err := barrier(); err != nil {
			return false, err
		}
		t0 := time.Now()
		for range probeOps {
			var err error
			begin(comm.OpBroadcast, probeBytes, 0)
			if single {
				err = broadcastCMA(m, buf, 0, c)
			} else {
				err = broadcastTree(m, buf, 0)
				if err == nil {
					err = m.Flush()
				}
			}
			if err != nil {
				return false, err
			}
		}
		if round >= 2 {
			took[round%2] += time.Since(t0)
		}
	}
	verdict := []byte{0}
	if m.Rank() == 1 && took[1] < took[0] {
		verdict[0] = 1
	}
	begin(comm.OpBroadcast, 1, 1)
	if err := broadcastFlat(m, verdict, 1); err != nil {
		return false, err
	}
	return verdict[0] == 1, nil
}
