package cpu

import (
	"errors"
	"math"
	"slices"
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
//   - On the VM of 2026-12-06 (a round trip of 420-490 ns) it changed
//     with the host's state at 64-256 KiB; the rings won at 1 MiB in both
//     states seen and were faster or level at 512 KiB (probeMidBytes).
//
//   - On the same VM on 2026-12-07 (a round trip of 430-520 ns), the
//     broadcast's single copy won below 256 KiB and was level there in
//     loops of 100 ops (30 and 20 rounds, the window forced; paired
//     ratio of the means against the rings): 0.84 at 64 KiB, 0.58-0.61
//     at 128 KiB, 0.83 at 192 KiB, 0.96-1.00 at 256 KiB, 1.08 at 512
//     KiB. In loops of 1000 ops the rings caught up from 128 KiB: 0.84
//     at 64 KiB, 0.98 at 128 KiB, 1.07 at 256 KiB, 1.03 at 512 KiB. The
//     allgather's single copy, decided by its own probe at 256 KiB, won
//     at 128-256 KiB in loops of 30-100 ops (0.82-0.95) but not in loops
//     of 1000 (1.00-1.04 at 128 KiB, 1.08-1.12 at 256 KiB), and lost at
//     64 KiB (1.14-1.19 in loops of 30). Before each probed op had a
//     barrier after it (probeTimes), the probe found the rings faster at
//     128 KiB in 6 of 8 starts; since, in 1 of 24.
//
// So a group of two ranks in two processes on one host measures both
// ways of a broadcast at its creation (probeSingleCopy), at 128 KiB and
// at 1 MiB, and takes the faster at each (applyProbe): a verdict for the
// single copy widens it to broadcasts of those sizes, and the 1 MiB
// verdict lowers the allgather's threshold (Options.SingleCopyMin, unless
// set) to probeMidMin. Below that the allgather keeps the rings.

const (
	// probeBcastBytes is the first broadcast size the probe times; its
	// verdict decides from probeMin to probeMidMin. Until session 23 it
	// was 256 KiB, where the two ways were level on the VM of 2026-12-07
	// (paired ratio 0.96-1.00) and the verdict went either way. probeOps
	// is how many ops of each way the probe runs per round (three rounds
	// of each way, at each size). On the VM of 2026-12-07 the whole probe
	// took 15.3-18.8 ms (6 starts).
	probeBcastBytes = 128 << 10
	probeOps        = 8
	// probeMin is the smallest broadcast that takes the single copy when
	// the probe finds it faster. At 32 KiB, on the VM where it won, the
	// one-step broadcast was level with it (3.6-4.1 µs against 3.0-4.0).
	probeMin = 64 << 10
	// probeMidBytes is the second broadcast size the probe times, and
	// probeMidMin the smallest broadcast and allgather that its verdict
	// decides for, up to comm.HugePageBytes (2 MiB), where the buffers
	// of comm.NewHostBuffer have 4 KiB pages, as the probe's have, and
	// the single copy's kernel pins every one of them. On the
	// development VM on 2026-12-06 the single copy lost at 1 MiB in both
	// of its states while it won or lost below (broadcast 1 MiB 99 and
	// 123 µs against 55 and 47 through the rings; 256 KiB 19.6 against
	// 22.6 in one state, 27.6 against 14.9 in the other). From 2 MiB, on
	// huge pages, it won in one state (81 against 99) and lost or was
	// level in the other (2 MiB 100 against 80, 4 MiB 154 against 148);
	// broadcasts take it there after either verdict for it (applyProbe),
	// as session 18's sweeps favoured it from 4 MiB. On the VM of
	// 2026-11-28 it won at 1 MiB too (34 against 88). So the probe times
	// both sizes.
	probeMidBytes = 1 << 20
	probeMidMin   = 512 << 10
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
// verdicts (applyProbe). Run by New on both ranks before any op, on the
// mesh the progress goroutine will own. A failed read of the probe's
// single copy turns it off for the group (noCMA), as in an op; any
// other error fails the engine's creation.
func (e *Engine) tuneSingleCopy() error {
	if !e.probeWanted() {
		return nil
	}
	v, err := probeSingleCopy(e.mesh, &e.cma, e.probeFP)
	var ce *cmaError
	if errors.As(err, &ce) {
		e.noCMA(err)
		return nil
	}
	if err != nil {
		return err
	}
	e.applyProbe(v)
	e.log.Debug().Bool("single_copy_128k", v.low).Bool("single_copy_1m", v.mid).Msg("cpu engine: two-rank transfer probe")
	return nil
}

// probeVerdicts are the two-rank probe's verdicts (probeSingleCopy),
// each whether the single copy was the faster: low, broadcasts of
// probeBcastBytes; mid, broadcasts of probeMidBytes.
type probeVerdicts struct {
	low, mid bool
}

// applyProbe applies the probe's verdicts v. Broadcasts: low decides
// from probeMin to probeMidMin, mid from probeMidMin to
// comm.HugePageBytes, and from comm.HugePageBytes up broadcasts take the
// single copy if either was for it (their buffers then have huge pages,
// the single copy's best case). Allgathers: mid decides from
// probeMidMin to comm.HugePageBytes; from Options.SingleCopyMin (2 MiB)
// up they take it as without a probe, and below probeMidMin they keep
// the rings. Where low was for the single copy and mid against it, the
// broadcasts from probeMidMin to comm.HugePageBytes use the rings
// (cmaGap). Neither: nothing changes.
func (e *Engine) applyProbe(v probeVerdicts) {
	switch {
	case v.low:
		e.bcastCMA = [2]int{probeMin, math.MaxInt}
	case v.mid:
		e.bcastCMA = [2]int{probeMidMin, math.MaxInt}
	}
	if v.mid {
		e.opts.SingleCopyMin = min(e.opts.SingleCopyMin, probeMidMin)
	}
	if v.low && !v.mid {
		e.cmaGap = [2]int{probeMidMin, comm.HugePageBytes}
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
// broadcasts of probeBcastBytes from rank 0 through the rings
// (broadcastTree) and as many by cross-memory attach (broadcastCMA), in
// two timed rounds of each after an untimed one (probeTimes); then the
// same at probeMidBytes. For each size it reports whether the single
// copy's median op was the faster (probeVerdict). Rank 1 decides and
// sends its verdicts in a one-step broadcast, so both ranks return the
// same. fp names the probe's k-th op.
func probeSingleCopy(m *transport.Mesh, c *cmaSide, fp func(k int, op comm.OpType, n, root int) comm.Fingerprint) (probeVerdicts, error) {
	k := 0
	begin := func(op comm.OpType, n, root int) {
		k++
		m.Begin(transport.OpCtx{FP: fp(k, op, n, root)})
	}
	verdicts := []byte{0, 0}
	for i, size := range []int{probeBcastBytes, probeMidBytes} {
		rings, singles, err := probeTimes(m, c, begin, size)
		if err != nil {
			return probeVerdicts{}, err
		}
		if m.Rank() == 1 && probeVerdict(rings, singles) {
			verdicts[i] = 1
		}
	}
	begin(comm.OpBroadcast, len(verdicts), 1)
	if err := broadcastFlat(m, verdicts, 1); err != nil {
		return probeVerdicts{}, err
	}
	return probeVerdicts{low: verdicts[0] == 1, mid: verdicts[1] == 1}, nil
}

// probeTimes runs the probe's rounds at one size (probeSingleCopy):
// each round a one-step barrier, then probeOps broadcasts of size bytes
// from rank 0 one way, each timed on this rank with a one-step barrier
// after it. It returns the timed ops' times, through the rings and by
// the single copy.
func probeTimes(m *transport.Mesh, c *cmaSide, begin func(op comm.OpType, n, root int), size int) (rings, singles []time.Duration, err error) {
	buf := make([]byte, size)
	if m.Rank() == 0 {
		for i := range buf {
			buf[i] = byte(i)
		}
	}
	barrier := func() error {
		begin(comm.OpBroadcast, 0, 0)
		return broadcastFlat(m, nil, 0)
	}
	// Rounds 0 and 1 warm up (the pages of buf and of the rings);
	// rounds 2-5 are timed.
	for round := range 6 {
		cma := round%2 == 1
		if err := barrier(); err != nil {
			return nil, nil, err
		}
		for range probeOps {
			t0 := time.Now()
			begin(comm.OpBroadcast, size, 0)
			if cma {
				err = broadcastCMA(m, buf, 0, c)
			} else if err = broadcastTree(m, buf, 0); err == nil {
				err = m.Flush()
			}
			if err != nil {
				return nil, nil, err
			}
			// A barrier after each op, in its time: otherwise the root
			// of a ring broadcast runs ahead, and rank 1 timed only its
			// reads of what was already in its ring, while a single
			// copy's op (and an op of the engine, in a loop of them)
			// waits for both sides.
			if err := barrier(); err != nil {
				return nil, nil, err
			}
			switch {
			case round < 2:
			case cma:
				singles = append(singles, time.Since(t0))
			default:
				rings = append(rings, time.Since(t0))
			}
		}
	}
	return rings, singles, nil
}

// probeVerdict reports whether the single copy was faster: whether the
// median of its ops' times (single) is below the rings' (rings). The
// medians, not the sums: the probe runs while the ranks start, when one
// op in a round may stall for a millisecond (a collection, the host),
// and on the development VM the first single-copy op of each round took
// 0.1-1 ms after a ring round, against 15-20 µs for the next ones, so
// that the sums split their verdicts 2-2 over 4 starts on 2026-12-06
// while per op the rings were faster (11-16 µs against 15-19). (Before
// touchPages, the ring rounds also paid their pages' first accesses,
// 200-1000 µs an op, and the sums picked the single copy in 6 of 6
// starts.)
func probeVerdict(rings, single []time.Duration) bool {
	if len(rings) == 0 || len(single) == 0 {
		return false
	}
	return median(single) < median(rings)
}

// median is the median of d (the upper one for an even count); d is
// sorted in place.
func median(d []time.Duration) time.Duration {
	slices.Sort(d)
	return d[len(d)/2]
}
