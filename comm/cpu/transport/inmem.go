package transport

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/ranktree/ranktree/comm"
)

// InmemHub connects the engines of one process through rings in Go memory:
// no sockets, files or store keys (the counterpart of hashicorp/raft's
// inmem_transport.go). Pass the same hub in Options.Hub, with Transport
// "inmem", to every engine of a job; it is meant for tests and
// single-process simulations. The rings and their protocol are the shm
// transport's. Safe for concurrent use.
type InmemHub struct {
	Mu      sync.Mutex
	pairs   map[inmemKey]*inmemPair
	groups  map[inmemKey]*inmemGroup // group segments (lo, hi: 0 and the size)
	Changed chan struct{}            // closed and replaced when an end attaches
}

// NewInmemHub returns an empty hub.
func NewInmemHub() *InmemHub {
	return &InmemHub{pairs: make(map[inmemKey]*inmemPair), groups: make(map[inmemKey]*inmemGroup), Changed: make(chan struct{})}
}

type inmemKey struct {
	group  string
	epoch  uint32
	lo, hi int
}

type inmemPair struct {
	Mem  []byte
	Ends [2]*InmemEnd // [0] the lower rank, [1] the higher
}

// inmemEnd is one engine's side of a pair.
type InmemEnd struct {
	Rank     int
	OnNotice func(peer int, payload []byte, ack func())
	OnAck    func(peer int)
	Poke     func()
	closed   atomic.Bool
}

var errPeerClosed = errors.New("peer closed its end of the in-memory link")

// inmemCtrl is the control side of an inmem link: notices are calls into
// the peer engine, and a closed peer end reads as a dead connection.
type InmemCtrl struct {
	Hub  *InmemHub
	Key  inmemKey
	Pair *inmemPair
	Side int
}

func (c *InmemCtrl) readErr() error {
	if c.Pair.Ends[1-c.Side].closed.Load() {
		return errPeerClosed
	}
	return nil
}

// closedChan is a channel that is already closed.
var closedChan = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

func (c *InmemCtrl) Notice(payload []byte) <-chan struct{} {
	me, peer := c.Pair.Ends[c.Side], c.Pair.Ends[1-c.Side]
	if peer.closed.Load() || me.closed.Load() {
		return nil
	}
	peer.OnNotice(me.Rank, payload, func() {
		if !me.closed.Load() {
			me.OnAck(peer.Rank)
		}
	})
	peer.Poke()
	return closedChan
}

func (c *InmemCtrl) ack() {
	me, peer := c.Pair.Ends[c.Side], c.Pair.Ends[1-c.Side]
	if !peer.closed.Load() {
		peer.OnAck(me.Rank)
	}
}

func (c *InmemCtrl) Up() bool {
	return !c.Pair.Ends[0].closed.Load() && !c.Pair.Ends[1].closed.Load()
}

func (c *InmemCtrl) wakePeer() { c.Pair.Ends[1-c.Side].Poke() }

func (c *InmemCtrl) Close() {
	if c.Pair.Ends[c.Side].closed.Swap(true) {
		return
	}
	c.Pair.Ends[1-c.Side].Poke()
	c.Hub.Mu.Lock()
	if c.Pair.Ends[1-c.Side].closed.Load() && c.Hub.pairs[c.Key] == c.Pair {
		delete(c.Hub.pairs, c.Key)
	}
	c.Hub.Mu.Unlock()
}

// attach registers end as rank's side of its pair with peer and returns the
// pair, creating its memory if this end is first.
func (h *InmemHub) Attach(group string, epoch uint32, rank, peer, ringBytes int, end *InmemEnd) (*inmemPair, inmemKey, int, error) {
	k := inmemKey{group: group, epoch: epoch, lo: min(rank, peer), hi: max(rank, peer)}
	side := 0
	if rank == k.hi {
		side = 1
	}
	h.Mu.Lock()
	defer h.Mu.Unlock()
	p := h.pairs[k]
	if p == nil {
		words := make([]uint64, (shmDataOff+2*ringBytes)/8)
		p = &inmemPair{Mem: unsafeBytes(words)}
		h.pairs[k] = p
	}
	if len(p.Mem) != shmDataOff+2*ringBytes {
		return nil, k, 0, fmt.Errorf("%w: cpu: ranks %d and %d disagree on ShmRingBytes", comm.ErrInvalidArgument, rank, peer)
	}
	if p.Ends[side] != nil {
		return nil, k, 0, fmt.Errorf("%w: cpu: rank %d of group %q epoch %d is already attached to the hub", comm.ErrInvalidArgument, rank, group, epoch)
	}
	p.Ends[side] = end
	close(h.Changed)
	h.Changed = make(chan struct{})
	return p, k, side, nil
}

// group returns the group segment's memory for a group of n ranks with
// slots of slot bytes, creating it for the first rank that asks.
// The engine gives it back with release once closed; the last one
// frees it, so that a group re-created under the same name and epoch
// starts from zeroed counters.
func (h *InmemHub) Group(group string, epoch uint32, n, slot int) ([]byte, func(), error) {
	k := inmemKey{group: group, epoch: epoch, lo: 0, hi: n}
	h.Mu.Lock()
	defer h.Mu.Unlock()
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
			h.Mu.Lock()
			defer h.Mu.Unlock()
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

// unsafeBytes views words as bytes (8-byte aligned, as the rings need).
func unsafeBytes(w []uint64) []byte {
	return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(w))), len(w)*8)
}
