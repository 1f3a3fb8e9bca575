package transport

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/ranktree/ranktree/comm"
)

// InmemHub connects the engines of one process through rings in Go memory:
// no sockets, files or store keys (the counterpart of hashicorp/raft's
// inmem_transport.go). Pass the same hub in cpu.Options.Hub, with Transport
// "inmem", to every engine of a job; it is meant for tests and
// single-process simulations. The rings and their protocol are the shm
// transport's. Safe for concurrent use.
type InmemHub struct {
	mu      sync.Mutex
	pairs   map[inmemKey]*inmemPair
	groups  map[inmemKey]*inmemGroup // group segments (lo, hi: 0 and the size)
	changed chan struct{}            // closed and replaced when an end attaches
}

// NewInmemHub returns an empty hub.
func NewInmemHub() *InmemHub {
	return &InmemHub{pairs: make(map[inmemKey]*inmemPair), groups: make(map[inmemKey]*inmemGroup), changed: make(chan struct{})}
}

type inmemKey struct {
	group  string
	epoch  uint32
	lo, hi int
}

type inmemPair struct {
	mem  []byte
	ends [2]*inmemEnd // [0] the lower rank, [1] the higher
}

// inmemEnd is one engine's side of a pair.
type inmemEnd struct {
	rank     int
	onNotice func(peer int, payload []byte, ack func())
	onAck    func(peer int)
	poke     func()
	closed   atomic.Bool
}

var errPeerClosed = errors.New("peer closed its end of the in-memory link")

// inmemCtrl is the control side of an inmem link: notices are calls into
// the peer engine, and a closed peer end reads as a dead connection.
type inmemCtrl struct {
	hub  *InmemHub
	key  inmemKey
	pair *inmemPair
	side int
}

func (c *inmemCtrl) readErr() error {
	if c.pair.ends[1-c.side].closed.Load() {
		return errPeerClosed
	}
	return nil
}

// closedChan is a channel that is already closed.
var closedChan = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

func (c *inmemCtrl) Notice(payload []byte) <-chan struct{} {
	me, peer := c.pair.ends[c.side], c.pair.ends[1-c.side]
	if peer.closed.Load() || me.closed.Load() {
		return nil
	}
	peer.onNotice(me.rank, payload, func() {
		if !me.closed.Load() {
			me.onAck(peer.rank)
		}
	})
	peer.poke()
	return closedChan
}

func (c *inmemCtrl) ack() {
	me, peer := c.pair.ends[c.side], c.pair.ends[1-c.side]
	if !peer.closed.Load() {
		peer.onAck(me.rank)
	}
}

func (c *inmemCtrl) Up() bool {
	return !c.pair.ends[0].closed.Load() && !c.pair.ends[1].closed.Load()
}

func (c *inmemCtrl) wakePeer() { c.pair.ends[1-c.side].poke() }

// Close closes this end and wakes the peer; the hub forgets the pair once
// no end is live (both closed, or the peer never attached: a member that
// gave up waiting for it).
func (c *inmemCtrl) Close() {
	if c.pair.ends[c.side].closed.Swap(true) {
		return
	}
	c.hub.mu.Lock()
	peer := c.pair.ends[1-c.side]
	if (peer == nil || peer.closed.Load()) && c.hub.pairs[c.key] == c.pair {
		delete(c.hub.pairs, c.key)
	}
	c.hub.mu.Unlock()
	if peer != nil {
		peer.poke()
	}
}

// attach registers end as rank's side of its pair with peer and returns the
// pair, creating its memory if this end is first.
func (h *InmemHub) attach(group string, epoch uint32, rank, peer, ringBytes int, end *inmemEnd) (*inmemPair, inmemKey, int, error) {
	k := inmemKey{group: group, epoch: epoch, lo: min(rank, peer), hi: max(rank, peer)}
	side := 0
	if rank == k.hi {
		side = 1
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	p := h.pairs[k]
	if p == nil {
		words := make([]uint64, (shmDataOff+2*ringBytes)/8)
		p = &inmemPair{mem: unsafeBytes(words)}
		h.pairs[k] = p
	}
	if len(p.mem) != shmDataOff+2*ringBytes {
		return nil, k, 0, fmt.Errorf("%w: cpu: ranks %d and %d disagree on ShmRingBytes", comm.ErrInvalidArgument, rank, peer)
	}
	if p.ends[side] != nil {
		return nil, k, 0, fmt.Errorf("%w: cpu: rank %d of group %q epoch %d is already attached to the hub", comm.ErrInvalidArgument, rank, group, epoch)
	}
	p.ends[side] = end
	close(h.changed)
	h.changed = make(chan struct{})
	return p, k, side, nil
}

// group returns the group segment's memory for a group of n ranks with
// slots of slot bytes, creating it for the first rank that asks.
// The engine gives it back with release once closed; the last one
// frees it, so that a group re-created under the same name and epoch
// starts from zeroed counters.
func (h *InmemHub) group(group string, epoch uint32, n, slot int) ([]byte, func(), error) {
	k := inmemKey{group: group, epoch: epoch, lo: 0, hi: n}
	h.mu.Lock()
	defer h.mu.Unlock()
	g := h.groups[k]
	if g == nil {
		g = &inmemGroup{mem: unsafeBytes(make([]uint64, grpBytes(n, slot)/8))}
		h.groups[k] = g
	}
	if len(g.mem) != grpBytes(n, slot) {
		return nil, nil, fmt.Errorf("%w: cpu: ranks of group %q disagree on FlatThreshold", comm.ErrInvalidArgument, group)
	}
	g.refs++
	var once sync.Once
	release := func() {
		once.Do(func() {
			h.mu.Lock()
			defer h.mu.Unlock()
			if g.refs--; g.refs == 0 && h.groups[k] == g {
				delete(h.groups, k)
			}
		})
	}
	return g.mem, release, nil
}

// inmemGroup is a group segment in Go memory and its users.
type inmemGroup struct {
	mem  []byte
	refs int
}

// InmemConfig names one member of a group that connects through an
// InmemHub, and the sizes every member must agree on.
type InmemConfig struct {
	Group string // process group name
	Epoch uint32 // the group's epoch: a restarted group gets new rings
	Rank  int    // this member's group rank, 0 <= Rank < Size
	Size  int    // group size
	// RingBytes is the size of each ring direction of a pair (the shm
	// transport's ShmRingBytes), a positive multiple of 16.
	RingBytes int
	// SlotBytes is the size of each group-segment slot (cpu.Options.SlotBytes);
	// 0, or a group above MaxFlatRanks, gets no group segment.
	SlotBytes int
}

// Connect attaches cfg.Rank to the hub and returns one ring link per peer
// (nil at cfg.Rank), driven by c, and the group segment (nil if the group
// gets none). It waits until every peer attached, or returns a
// *comm.TransportError naming the first missing one once ctx ends; a
// member attached twice, or members disagreeing on RingBytes or SlotBytes,
// give an error wrapping comm.ErrInvalidArgument. The caller closes the
// links (and Unmaps the group segment) when done.
func (h *InmemHub) Connect(ctx context.Context, cfg InmemConfig, c *Ctl) ([]Link, *ShmGroup, error) {
	ctrls, err := h.attachAll(cfg, c)
	if err != nil {
		return nil, nil, err
	}
	if err := h.await(ctx, cfg.Rank, ctrls); err != nil {
		return nil, nil, err
	}
	links := h.ringLinks(cfg, c, ctrls)
	if cfg.SlotBytes <= 0 || cfg.Size < 2 || cfg.Size > MaxFlatRanks {
		return links, nil, nil
	}
	mem, release, err := h.group(cfg.Group, cfg.Epoch, cfg.Size, cfg.SlotBytes)
	if err != nil {
		closeCtrls(ctrls)
		return nil, nil, err
	}
	g := GroupOver(mem, cfg.Size, cfg.SlotBytes, cfg.Rank)
	g.Release = release
	// Every rank is a goroutine of this process: waits keep the backoff
	// of link.go, not the group's doorbell policy (see ShmGroup.Doorbell).
	return links, g, nil
}

// attachAll registers cfg.Rank's end with every peer's pair.
func (h *InmemHub) attachAll(cfg InmemConfig, c *Ctl) ([]*inmemCtrl, error) {
	end := &inmemEnd{rank: cfg.Rank, onNotice: c.OnNotice, onAck: c.OnAck, poke: c.Poke}
	if end.onNotice == nil {
		end.onNotice = func(int, []byte, func()) {}
	}
	if end.onAck == nil {
		end.onAck = func(int) {}
	}
	ctrls := make([]*inmemCtrl, cfg.Size)
	for p := range cfg.Size {
		if p == cfg.Rank {
			continue
		}
		pair, k, side, err := h.attach(cfg.Group, cfg.Epoch, cfg.Rank, p, cfg.RingBytes, end)
		if err != nil {
			closeCtrls(ctrls)
			return nil, err
		}
		ctrls[p] = &inmemCtrl{hub: h, key: k, pair: pair, side: side}
	}
	return ctrls, nil
}

// await waits until every peer of rank attached its end.
func (h *InmemHub) await(ctx context.Context, rank int, ctrls []*inmemCtrl) error {
	for p, c := range ctrls {
		for c != nil {
			h.mu.Lock()
			ok := c.pair.ends[1-c.side] != nil
			ch := h.changed
			h.mu.Unlock()
			if ok {
				break
			}
			select {
			case <-ch:
			case <-ctx.Done():
				closeCtrls(ctrls)
				return &comm.TransportError{Rank: rank, Peer: p, Err: fmt.Errorf("rendezvous: rank %d did not attach to the hub: %w", p, ctx.Err())}
			}
		}
	}
	return nil
}

// ringLinks lays the rings of each attached pair out as a link.
func (h *InmemHub) ringLinks(cfg InmemConfig, c *Ctl, ctrls []*inmemCtrl) []Link {
	links := make([]Link, cfg.Size)
	for p, ct := range ctrls {
		if ct == nil {
			continue
		}
		s := RingsOver(ct.pair.mem, cfg.RingBytes, ct.side == 0)
		s.Start(p, c, ct)
		links[p] = s
		c.Pumps = append(c.Pumps, s)
	}
	return links
}

func closeCtrls(ctrls []*inmemCtrl) {
	for _, c := range ctrls {
		if c != nil {
			c.Close()
		}
	}
}

// unsafeBytes views words as bytes (8-byte aligned, as the rings need).
func unsafeBytes(w []uint64) []byte {
	return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(w))), len(w)*8)
}
