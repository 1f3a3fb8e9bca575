package transport

import (
	"fmt"

	"github.com/ranktree/ranktree/comm"
)

// InmemMesh is the members of one group connected in memory, each with the
// Mesh (and, with slots, the one-step Slots) an algorithm runs over: no
// engine, store, sockets or rendezvous. It is the counterpart of
// hashicorp/raft's InmemTransport and is meant for deterministic algorithm
// tests and simulations: the links are the in-memory transport's (the shm
// rings and their protocol in Go memory), and every message carries and
// checks the op's fingerprint as in the engine.
//
// Rank r's Mesh is used by one goroutine at a time (the algorithm of rank
// r); an algorithm that receives needs its peers to run concurrently, one
// goroutine per rank.
type InmemMesh struct {
	meshes []*Mesh
	ctls   []*Ctl
	links  [][]Link
	grps   []*ShmGroup
}

// InmemMeshOptions size the in-memory rings and slots.
type InmemMeshOptions struct {
	// RingBytes is each ring direction's size, a positive multiple of 16
	// (default 64 KiB). Small rings make large messages wrap and wait for
	// room, as the shm transport's do.
	RingBytes int
	// SlotBytes, if positive, gives a group of 2..MaxFlatRanks ranks a
	// group segment with slots of SlotBytes bytes: every Mesh then also
	// implements the one-step Slots (Publish, Slot, Done).
	SlotBytes int
}

// NewInmemMesh connects size ranks in memory. It returns an error wrapping
// comm.ErrInvalidArgument for a size below 1 or a RingBytes that is
// negative or not a multiple of 16.
func NewInmemMesh(size int, opts InmemMeshOptions) (*InmemMesh, error) {
	if size < 1 {
		return nil, fmt.Errorf("%w: transport: in-memory mesh of %d ranks", comm.ErrInvalidArgument, size)
	}
	if opts.RingBytes == 0 {
		opts.RingBytes = 64 << 10
	}
	if opts.RingBytes < 0 || opts.RingBytes%16 != 0 {
		return nil, fmt.Errorf("%w: transport: RingBytes %d is not a positive multiple of 16", comm.ErrInvalidArgument, opts.RingBytes)
	}
	h := NewInmemHub()
	im := &InmemMesh{meshes: make([]*Mesh, size), ctls: make([]*Ctl, size), links: make([][]Link, size), grps: make([]*ShmGroup, size)}
	ctrls := make([][]*inmemCtrl, size)
	for r := range size {
		im.ctls[r] = NewCtl()
		var err error
		if ctrls[r], err = h.attachAll(InmemConfig{Group: "inmem", Rank: r, Size: size, RingBytes: opts.RingBytes}, im.ctls[r]); err != nil {
			im.Close()
			return nil, err
		}
	}
	flat := opts.SlotBytes > 0 && size >= 2 && size <= MaxFlatRanks
	for r := range size {
		cfg := InmemConfig{Group: "inmem", Rank: r, Size: size, RingBytes: opts.RingBytes}
		im.links[r] = h.ringLinks(cfg, im.ctls[r], ctrls[r])
		im.meshes[r] = NewMesh(r, size, im.links[r], im.ctls[r])
		if flat {
			mem, release, err := h.group(cfg.Group, 0, size, opts.SlotBytes)
			if err != nil {
				im.Close()
				return nil, err
			}
			im.grps[r] = GroupOver(mem, size, opts.SlotBytes, r)
			im.grps[r].Release = release
			im.meshes[r].Grp = im.grps[r]
		}
	}
	return im, nil
}

// Size is the number of ranks.
func (im *InmemMesh) Size() int { return len(im.meshes) }

// Rank returns rank r's Mesh.
func (im *InmemMesh) Rank(r int) *Mesh { return im.meshes[r] }

// Begin makes op the current op of every rank's Mesh (Mesh.Begin): the
// fingerprint every message carries and the reduction Reduce and
// RecvReduce apply. Call it between ops, while no rank runs one.
func (im *InmemMesh) Begin(op OpCtx) {
	for _, m := range im.meshes {
		m.Begin(op)
	}
}

// Close stops every rank (a blocked Recv returns an error) and releases
// the links. Idempotent.
func (im *InmemMesh) Close() {
	for r, c := range im.ctls {
		if c == nil || !c.Halt() {
			continue
		}
		for _, l := range im.links[r] {
			if l != nil {
				l.Close()
			}
		}
		if g := im.grps[r]; g != nil {
			g.Unmap()
		}
	}
}
