package transport

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/ranktree/ranktree/comm"
)

// TestInmemConnect: members that attach to one hub get a ring link per
// peer (none to themselves) and, with SlotBytes, a group segment; a
// message sent on one end arrives on the other with its header intact.
func TestInmemConnect(t *testing.T) {
	h := NewInmemHub()
	const n = 3
	links := make([][]Link, n)
	grps := make([]*ShmGroup, n)
	ctls := make([]*Ctl, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for r := range n {
		ctls[r] = NewCtl()
		wg.Go(func() {
			links[r], grps[r], errs[r] = h.Connect(context.Background(),
				InmemConfig{Group: "g", Rank: r, Size: n, RingBytes: 4096, SlotBytes: 256}, ctls[r])
		})
	}
	wg.Wait()
	for r := range n {
		if errs[r] != nil {
			t.Fatalf("rank %d: %v", r, errs[r])
		}
		if links[r][r] != nil || grps[r] == nil || len(ctls[r].Pumps) != n-1 {
			t.Fatalf("rank %d: self link %v, group %v, %d pumps", r, links[r][r], grps[r], len(ctls[r].Pumps))
		}
	}
	hdr := Header{Kind: kindColl, Sender: 2, FP: comm.Fingerprint{Seq: 5, Op: comm.OpAllReduce}, Step: 3, Len: 5}
	if err := links[2][0].send(&hdr, []byte("hello")); err != nil {
		t.Fatal(err)
	}
	if err := links[2][0].flush(); err != nil {
		t.Fatal(err)
	}
	got, ok, err := links[0][2].poll()
	if err != nil || !ok || got != hdr {
		t.Fatalf("poll: %+v %v %v, want %+v", got, ok, err, hdr)
	}
	buf := make([]byte, 5)
	if err := links[0][2].read(&got, sink{dst: buf}); err != nil || string(buf) != "hello" {
		t.Fatalf("read: %q %v", buf, err)
	}
	for r := range n {
		for _, l := range links[r] {
			if l != nil {
				l.Close()
			}
		}
		grps[r].Unmap()
	}
}

// TestInmemConnectErrors: a member attached twice and members that
// disagree on the ring size get ErrInvalidArgument; a peer that never
// attaches gives a *comm.TransportError naming it once ctx ends.
func TestInmemConnectErrors(t *testing.T) {
	h := NewInmemHub()
	cfg := InmemConfig{Group: "g", Rank: 0, Size: 2, RingBytes: 4096}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	_, _, err := h.Connect(ctx, cfg, NewCtl())
	var te *comm.TransportError
	if !errors.As(err, &te) || te.Rank != 0 || te.Peer != 1 {
		t.Fatalf("missing peer: %v, want a TransportError from rank 0 naming peer 1", err)
	}

	h = NewInmemHub()
	if _, err := h.attachAll(cfg, NewCtl()); err != nil {
		t.Fatal(err)
	}
	if _, err := h.attachAll(cfg, NewCtl()); !errors.Is(err, comm.ErrInvalidArgument) {
		t.Fatalf("attached twice: %v, want ErrInvalidArgument", err)
	}
	other := InmemConfig{Group: "g", Rank: 1, Size: 2, RingBytes: 8192}
	if _, err := h.attachAll(other, NewCtl()); !errors.Is(err, comm.ErrInvalidArgument) {
		t.Fatalf("ring sizes differ: %v, want ErrInvalidArgument", err)
	}
}

// departCtrl is a link's control side whose peer departs at the first
// readErr: before (the peer's last message) runs first, then the peer is
// gone for good.
type departCtrl struct {
	control
	before func()
	gone   bool
}

func (c *departCtrl) readErr() error {
	if !c.gone {
		c.gone = true
		c.before()
	}
	return errPeerClosed
}

// TestShmLinkDataBeforeDeparture: a peer that writes its last message and
// leaves (it finished the op and destroyed the group) between a reader's
// look at the ring and its check of the peer has that message delivered,
// whole, as a socket delivers what was sent before an EOF; only then does
// the reader see the departure. The same holds for the rest of a payload
// that arrives in that window while read waits for it.
func TestShmLinkDataBeforeDeparture(t *testing.T) {
	h := NewInmemHub()
	links := make([][]Link, 2)
	errs := make([]error, 2)
	var wg sync.WaitGroup
	for r := range 2 {
		wg.Go(func() {
			links[r], _, errs[r] = h.Connect(context.Background(), InmemConfig{Group: "g", Rank: r, Size: 2, RingBytes: 4096}, NewCtl())
		})
	}
	wg.Wait()
	if errs[0] != nil || errs[1] != nil {
		t.Fatal(errs)
	}
	rx, tx := links[0][1].(*ShmLink), links[1][0].(*ShmLink)
	hdr := Header{Kind: kindColl, Sender: 1, FP: comm.Fingerprint{Seq: 1, Op: comm.OpAllReduce}, Step: 0, Len: 5}
	send := func() {
		if err := tx.send(&hdr, []byte("hello")); err != nil {
			t.Error(err)
		}
		if err := tx.flush(); err != nil {
			t.Error(err)
		}
	}
	rx.ctrl = &departCtrl{control: rx.ctrl, before: send}
	got, ok, err := rx.poll()
	if err != nil || !ok || got != hdr {
		t.Fatalf("poll: %+v %v %v, want the message sent before the peer left", got, ok, err)
	}
	buf := make([]byte, 5)
	if err := rx.read(&got, sink{dst: buf}); err != nil || string(buf) != "hello" {
		t.Fatalf("read: %q %v", buf, err)
	}
	if _, ok, err := rx.poll(); ok || !errors.Is(err, errPeerClosed) {
		t.Fatalf("poll after the last message: ok %v, %v; want the departure", ok, err)
	}

	// The payload's tail arrives while read waits, just before the peer
	// leaves. Write the header and the first 16-byte unit directly, hold
	// the rest back until readErr.
	rx.ctrl = &departCtrl{control: rx.ctrl.(*departCtrl).control}
	long := make([]byte, 64)
	for i := range long {
		long[i] = byte(i + 1)
	}
	h2 := Header{Kind: kindColl, Sender: 1, FP: comm.Fingerprint{Seq: 2, Op: comm.OpAllReduce}, Len: uint64(len(long))}
	if err := tx.send(&h2, long); err != nil {
		t.Fatal(err)
	}
	if err := tx.flush(); err != nil {
		t.Fatal(err)
	}
	// Hide all but 16 payload bytes from the reader until the peer departs.
	full := rx.rx.tail.Load()
	rx.rx.tail.Store(full - 48)
	rx.ctrl.(*departCtrl).before = func() { rx.rx.tail.Store(full) }
	got, ok, err = rx.poll()
	if err != nil || !ok || got != h2 {
		t.Fatalf("poll: %+v %v %v", got, ok, err)
	}
	buf = make([]byte, len(long))
	if err := rx.read(&got, sink{dst: buf}); err != nil || string(buf) != string(long) {
		t.Fatalf("read of a payload completed before the departure: %v %v", buf, err)
	}
}
