package cpu

import (
	"fmt"
	"net"
	"os"
	"strings"

	"github.com/ranktree/ranktree/comm"
	"github.com/ranktree/ranktree/comm/cpu/transport"
)

// Transport names accepted by Options.Transport.
const (
	TransportAuto = "auto" // shm between ranks on the same host, tcp otherwise
	TransportSHM  = "shm"  // shared memory only (every rank on one host)
	TransportTCP  = "tcp"  // TCP only
	// TransportInmem connects the engines of one process through an
	// InmemHub (Options.Hub): tests and single-process simulations.
	TransportInmem = "inmem"
)

// InmemHub connects the engines of one process through rings in Go memory
// (transport.InmemHub; hashicorp/raft's InmemTransport). Pass the same hub
// in Options.Hub, with Transport "inmem", to every engine of a job.
type InmemHub = transport.InmemHub

// NewInmemHub returns an empty hub for Options.Hub.
func NewInmemHub() *InmemHub { return transport.NewInmemHub() }

// Options configure the CPU engine. The zero value is valid: validate fills
// the defaults noted on each field (etcd's Config.validate style).
type Options struct {
	// Transport is "auto" (default), "shm", "tcp" or "inmem"
	// (TransportAuto, ...; inmem needs Hub).
	// Connections are always set up over TCP; with shm the data moves
	// through shared-memory rings and the TCP connection carries only
	// control messages and detects a dead peer.
	Transport string
	// ListenHost is the interface the engine's TCP listener binds
	// (default "127.0.0.1"; "0.0.0.0" or a host address for multi-host jobs).
	ListenHost string
	// ListenPort is the listener's port (default 0: any free port).
	ListenPort int
	// AdvertiseHost is the host peers dial (default ListenHost, or the
	// machine's hostname when ListenHost is a wildcard address).
	AdvertiseHost string
	// HostID identifies the machine for shm selection (default: the kernel
	// boot id plus the hostname). Ranks with equal HostIDs use shm in auto
	// mode.
	HostID string
	// ShmDir is where shared-memory segments are created (default
	// "/dev/shm"). Segments are unlinked as soon as both ranks mapped them.
	ShmDir string
	// ShmRingBytes is the size of each directed shm ring (default 4 MiB;
	// rounded up to a multiple of 4 KiB). One pair of ranks maps two rings.
	ShmRingBytes int
	// Hub connects engines of one process for Transport "inmem".
	Hub *InmemHub
	// RingThreshold is the size in bytes from which the ring algorithms
	// are used instead of the latency-optimal ones (default 256 KiB): the
	// allreduce buffer (below it: recursive doubling; among 3 or more
	// ranks on this host over shm the slots take the allreduces above
	// FlatThreshold up to SlotAllReduceMax first), the gathered total
	// of an allgather (below a sixteenth of it: Bruck's), the broadcast buffer (from it,
	// with more than two ranks: scatter then ring allgather). All ranks
	// must use the same value.
	RingThreshold int
	// FlatThreshold is the largest message in bytes that the one-step
	// shared-memory algorithms (allreduce_flat.go) move, when every rank
	// of a group of 2..8 is on this host over shm: an allreduce buffer up
	// to it, an allgather's gathered total, a reduce-scatter's input, a
	// broadcast buffer. Default (0): 64 KiB for 2 ranks, 128 KiB for 3
	// or more (flatDefault), chosen by measurement (docs/algorithms.md,
	// "Crossover points"); negative disables the flat algorithms and the
	// group segment (then waits fall back to the sched_yield and timer
	// backoff of transport/link.go). All ranks must use the same value.
	FlatThreshold int
	// SlotBytes is the size in bytes of each of a rank's two slots in the
	// group segment (the segment takes 2·SlotBytes + 4 KiB per rank). A
	// one-step op moves at most FlatThreshold bytes through them. Among 3
	// or more ranks larger ops go through them in rounds: a broadcast of
	// at least 512 KiB among 3 ranks, 256 KiB among 4 or more, in rounds
	// of SlotBytes (broadcastSlots, broadcast_flat.go); an allgather of
	// up to 64 MiB gathered (allgather_flat.go); an allreduce above
	// FlatThreshold up to SlotAllReduceMax, in rounds of SlotBytes of
	// two exchanges each (allreduce_slots.go).
	// Default (0): FlatThreshold for 2 ranks, max(FlatThreshold, 1 MiB)
	// for 3 or more (slotDefault); raised to FlatThreshold when smaller,
	// at most 16 MiB, rounded up to 64 bytes; unused when the flat
	// algorithms are disabled. All ranks must use the same value.
	// Under rankrunner: RANKTREE_SLOT_BYTES.
	SlotBytes int
	// SingleCopyMin is the smallest allgather, in bytes gathered, that a
	// group of two ranks on this host moves by cross-memory attach
	// (process_vm_readv; allgather_cma.go): each rank reads its peer's
	// block straight from the peer's memory, one copy instead of two
	// through a shared-memory ring, as Open MPI's shared-memory BTL does
	// with its CMA single-copy mechanism. Default (0): 2 MiB
	// (singleCopyDefault), except that a group of two ranks in two
	// processes first times both ways at its creation (tune.go) and, where
	// the single copy was faster, moves allgathers and broadcasts from 64
	// KiB by it; a value set here skips that probe. Negative disables it,
	// and with it the single-copy broadcast that three ranks on this host
	// use from 64 KiB to 1 MiB (broadcast_cma.go). It needs the group
	// segment (FlatThreshold not disabled, every rank over shm). If a
	// read fails on any rank (a kernel without CMA, ptrace restrictions
	// between the processes, processes in different pid namespaces),
	// every rank moves that op's data through the rings instead and the
	// group stops using CMA, with a warning in the log. All ranks must
	// use the same value. Under rankrunner: RANKTREE_SINGLE_COPY_MIN.
	SingleCopyMin int
	// SlotAllReduceMax is the largest allreduce, in bytes, that a group
	// of three or more ranks with a group segment (every rank on this
	// host over shm) moves through the slots in rounds of SlotBytes
	// (allreduce_slots.go) when it is above FlatThreshold; larger ones,
	// and every one when the slots do not take it, follow RingThreshold
	// (recursive doubling below it, the ring from it). Default (0): 1 MiB
	// for 3 ranks, 8 MiB for 4 or more (slotAllReduceDefault), chosen by
	// measurement with the ranks outnumbering the cores
	// (docs/algorithms.md, "Through the slots in rounds"); negative
	// disables it. All ranks must use the same value. Under rankrunner:
	// RANKTREE_SLOT_ALLREDUCE_MAX.
	SlotAllReduceMax int

	// singleCopyAuto is set by validate when SingleCopyMin took its
	// default, which the two-rank probe may lower (tune.go); probe makes
	// a group of ranks in one process probe too (tests).
	singleCopyAuto, probe bool
}

// validate fills defaults for a group of n ranks and rejects bad values
// (wrapping comm.ErrInvalidArgument).
func (o *Options) validate(n int) error {
	switch strings.ToLower(o.Transport) {
	case "", TransportAuto:
		o.Transport = TransportAuto
	case TransportSHM, TransportTCP, TransportInmem:
		o.Transport = strings.ToLower(o.Transport)
	default:
		return fmt.Errorf("%w: cpu: unknown transport %q (want auto, shm, tcp or inmem)", comm.ErrInvalidArgument, o.Transport)
	}
	if o.Transport == TransportInmem && o.Hub == nil {
		return fmt.Errorf("%w: cpu: transport inmem needs Options.Hub", comm.ErrInvalidArgument)
	}
	if o.ListenHost == "" {
		o.ListenHost = "127.0.0.1"
	}
	if o.ListenPort < 0 || o.ListenPort > 65535 {
		return fmt.Errorf("%w: cpu: listen port %d out of range", comm.ErrInvalidArgument, o.ListenPort)
	}
	if o.AdvertiseHost == "" {
		o.AdvertiseHost = o.ListenHost
		if ip := net.ParseIP(o.ListenHost); ip != nil && ip.IsUnspecified() {
			h, err := os.Hostname()
			if err != nil {
				return fmt.Errorf("%w: cpu: AdvertiseHost not set and no hostname: %v", comm.ErrInvalidArgument, err)
			}
			o.AdvertiseHost = h
		}
	}
	if o.HostID == "" {
		o.HostID = defaultHostID()
	}
	if o.ShmDir == "" {
		o.ShmDir = "/dev/shm"
	}
	if o.ShmRingBytes < 0 {
		return fmt.Errorf("%w: cpu: negative ShmRingBytes %d", comm.ErrInvalidArgument, o.ShmRingBytes)
	}
	if o.ShmRingBytes == 0 {
		o.ShmRingBytes = 4 << 20
	}
	o.ShmRingBytes = (o.ShmRingBytes + 4095) &^ 4095
	if o.RingThreshold < 0 {
		return fmt.Errorf("%w: cpu: negative RingThreshold %d", comm.ErrInvalidArgument, o.RingThreshold)
	}
	if o.RingThreshold == 0 {
		o.RingThreshold = 256 << 10
	}
	switch {
	case o.FlatThreshold == 0:
		o.FlatThreshold = flatDefault(n)
	case o.FlatThreshold < 0:
		o.FlatThreshold = 0
	case o.FlatThreshold > 16<<20:
		return fmt.Errorf("%w: cpu: FlatThreshold %d above 16 MiB", comm.ErrInvalidArgument, o.FlatThreshold)
	}
	o.FlatThreshold = (o.FlatThreshold + 63) &^ 63
	switch {
	case o.SlotBytes < 0:
		return fmt.Errorf("%w: cpu: negative SlotBytes %d", comm.ErrInvalidArgument, o.SlotBytes)
	case o.SlotBytes > 16<<20:
		return fmt.Errorf("%w: cpu: SlotBytes %d above 16 MiB", comm.ErrInvalidArgument, o.SlotBytes)
	case o.FlatThreshold == 0:
		o.SlotBytes = 0
	case o.SlotBytes == 0:
		o.SlotBytes = slotDefault(n, o.FlatThreshold)
	}
	o.SlotBytes = (max(o.SlotBytes, o.FlatThreshold) + 63) &^ 63
	if o.SingleCopyMin == 0 {
		o.SingleCopyMin = singleCopyDefault
		o.singleCopyAuto = true
	}
	if o.SlotAllReduceMax == 0 {
		o.SlotAllReduceMax = slotAllReduceDefault(n)
	}
	return nil
}

// singleCopyDefault is SingleCopyMin's default. On the 2-core VM,
// 2026-11-27, 2 ranks, 5 rounds × 40 ops interleaved with the ring and
// with Open MPI 4.1 (whose vader BTL uses CMA), mean µs (median over
// rounds), single copy / ring / Open MPI: 1 MiB gathered 48 / 47 / 63, 2
// MiB 133 / 146 / 108, 4 MiB 244 / 295 / 227, 8 MiB 480 / 523 / 637, 16
// MiB 1140 / 1183 / 1511, 64 MiB 5130 / 5866 / 7226; in an earlier run at
// 512 KiB the ring was faster (28 against 32). With three and four ranks
// (on two cores) the slots' rounds (allgatherFlat) beat it at every size
// from 128 KiB: at 4 ranks 2 MiB 321 against 463, 16 MiB 2878 against
// 5458.
const singleCopyDefault = 2 << 20

// slotAllReduceDefault is SlotAllReduceMax's default for a group of n
// ranks. Measured on the 2-core VM, 2026-11-27, two sets of 3 rounds
// interleaved, mean µs (median over rounds), slots (1 MiB rounds) against
// the algorithms before (recursive doubling up to 256 KiB, the ring
// above): 4 ranks 256 KiB 79 / 142, 512 KiB 138 / 259, 1 MiB 343 / 552,
// 2 MiB 720 / 767 and 1039 / 1352, 4 MiB 1678 / 2267 and 2122 / 2272,
// 8 MiB 4494 / 4423 and 4487 / 5248, 16 MiB 8723 / 9336 and 9346 / 9116;
// 3 ranks 256 KiB 75 / 148, 512 KiB 134 / 211, 1 MiB 337 / 415, 2 MiB
// 708 / 605 and 639 / 780, 4 MiB 1360 / 1441 and 1507 / 1357. So four
// ranks (two per core) take the slots up to 8 MiB, three (where the ring
// was already below Open MPI's time) up to 1 MiB, where they won in
// every round. More than 4 ranks were not measured (the machine has 2
// cores) and take 4 ranks' limit; 2 ranks never take the slots in rounds
// (the ring is one step).
func slotAllReduceDefault(n int) int {
	if n == 3 {
		return 1 << 20
	}
	return 8 << 20
}

// slotDefault is SlotBytes' default for a group of n ranks whose
// FlatThreshold is flat. With 3 or more ranks the slots also carry large
// broadcasts in rounds (broadcastSlots), which want rounds long enough
// that a round's hand-over is small against its copies: with 1 MiB
// slots, broadcasts of 2–64 MiB took 0.56–0.65× the time of the chain at
// 3 ranks and 0.32–0.49× the time of the algorithms before at 4
// (docs/algorithms.md, "Broadcast and Reduce"). Two ranks never use more
// than FlatThreshold.
func slotDefault(n, flat int) int {
	if n >= 3 {
		return max(flat, 1<<20)
	}
	return flat
}

// defaultHostID is the kernel's boot id (unique per boot of a machine)
// joined to the hostname.
func defaultHostID() string {
	h, _ := os.Hostname()
	b, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		return h
	}
	return strings.TrimSpace(string(b)) + "/" + h
}

// flatDefault is FlatThreshold's default for a group of n ranks. With 3
// and 4 ranks, which need 2-4 steps otherwise, the one-step algorithms
// were 1.2-3.5× faster at 64 and 128 KiB for every collective
// (docs/algorithms.md, "Crossover points"). With 2 ranks the
// message-based algorithms take one step too, and back to back they were
// faster at 64 KiB (allreduce 7.8 against 12.9 µs median in session 2;
// 9.5-10.5 against 11.3-11.9 on 2026-11-28, Open MPI 20.7-22.0), but a
// rank that waits for a late peer is woken by the peer's slot, published
// at its launch (Engine.publishEarly), only through the one-step
// algorithms: a 64 KiB allreduce 5 ms late woke the waiting rank 14.8-18.2
// µs after the late rank's launch against 24.6-26.7 through the rings (4
// rounds each; docs/algorithms.md, "Publishing at launch"). Training ranks
// are late by milliseconds, so 2 ranks take 64 KiB.
func flatDefault(n int) int {
	if n >= 3 {
		return 128 << 10
	}
	return 64 << 10
}
