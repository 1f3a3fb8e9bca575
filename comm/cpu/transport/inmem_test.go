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
