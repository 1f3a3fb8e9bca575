package transport

import (
	"bytes"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/ranktree/ranktree/comm"
)

// flatPair is two ranks' meshes over one group segment in this process.
func flatPair(t *testing.T) [2]*Mesh {
	t.Helper()
	if _, err := os.Stat("/dev/shm"); err != nil {
		t.Skip("no /dev/shm")
	}
	g0, g1 := twoRankGroup(t, t.TempDir())
	var ms [2]*Mesh
	for r, g := range []*ShmGroup{g0, g1} {
		ms[r] = NewMesh(r, 2, make([]Link, 2), NewCtl())
		ms[r].Grp = g
	}
	return ms
}

// flatOp runs Begin for one-step op seq (a 1-element allreduce).
func flatOp(m *Mesh, seq uint64) {
	m.Begin(OpCtx{FP: comm.Fingerprint{Op: comm.OpAllReduce, DType: comm.Uint8, Count: 8, Seq: seq, Root: -1}})
}

// TestFlatSlotReuse: a rank reuses its slot of op k for op k+2 only once
// every peer has published op k+1, which a peer does after reading op k.
// A rank that completed op k+1 has seen that and publishes op k+2 at
// once; one that did not (its op k+1 ended before its wait, as a failed
// op does) waits in Publish for the peers' boxes, so that a peer
// still reading op k's slot reads it intact.
func TestFlatSlotReuse(t *testing.T) {
	ms := flatPair(t)
	payload := func(r int, seq uint64) []byte { return bytes.Repeat([]byte{byte(10*seq) + byte(r)}, 8) }
	publish := func(r int, seq uint64) error {
		flatOp(ms[r], seq)
		return ms[r].Publish(payload(r, seq))
	}
	read := func(r int, seq uint64) {
		t.Helper()
		got, err := ms[r].Slot(1-r, 8)
		if err != nil || !bytes.Equal(got, payload(1-r, seq)) {
			t.Fatalf("op %d: rank %d read %v (%v), want %v", seq, r, got, err, payload(1-r, seq))
		}
	}
	// Op 1 in lockstep; op 2 published by both, read by rank 0 only.
	for r := range 2 {
		if err := publish(r, 1); err != nil {
			t.Fatal(err)
		}
	}
	read(0, 1)
	read(1, 1)
	for r := range 2 {
		if err := publish(r, 2); err != nil {
			t.Fatal(err)
		}
	}
	read(0, 2)
	// Rank 0 completed op 2: op 3 (slot 1, op 1's) goes out at once.
	if err := publish(0, 3); err != nil {
		t.Fatal(err)
	}
	// Rank 0 runs op 4 (slot 0, op 2's) without having waited for op 3:
	// it must wait until rank 1 published op 3, since rank 1 has not read
	// op 2 yet.
	done := make(chan error, 1)
	go func() { done <- publish(0, 4) }()
	select {
	case err := <-done:
		t.Fatalf("rank 0 published op 4 (%v) before rank 1 read op 2's slot", err)
	case <-time.After(50 * time.Millisecond):
	}
	read(1, 2) // intact
	if err := publish(1, 3); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("op 4: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("rank 0's op 4 still waits after rank 1 published op 3")
	}
	read(1, 3)
}

// TestFlatBox: a payload of at most boxPayload bytes travels in the
// rank's fast box (the cache line its op number is in), a larger one in
// its slot, and a peer reads either intact. A peer's op that differs in
// any field of the fingerprint, or in its payload's length, is told by
// the box and named by the slot's full header (a *comm.MismatchError);
// a box that disagrees with a matching header is a protocol error.
func TestFlatBox(t *testing.T) {
	ms := flatPair(t)
	g := ms[0].Grp
	payload := func(r, n int) []byte {
		b := make([]byte, n)
		for i := range b {
			b[i] = byte(r*100 + i + 1)
		}
		return b
	}
	op := func(seq uint64, count int64) comm.Fingerprint {
		return comm.Fingerprint{Op: comm.OpAllReduce, DType: comm.Uint8, Count: count, Seq: seq, Root: -1}
	}
	seq := uint64(0)
	for _, n := range []int{1, 8, boxPayload - 1, boxPayload, boxPayload + 1, 64} {
		seq++
		k := seq % 2
		clear(g.r[1].box[k][boxHead:]) // what op seq-2 left
		clear(g.r[1].slot[k][HeaderSize:])
		for r := range 2 {
			ms[r].Begin(OpCtx{FP: op(seq, int64(n))})
			if err := ms[r].Publish(payload(r, n)); err != nil {
				t.Fatal(err)
			}
		}
		inBox := bytes.Equal(g.r[1].box[k][boxHead:boxHead+min(n, boxPayload)], payload(1, n)[:min(n, boxPayload)])
		inSlot := bytes.Equal(g.r[1].slot[k][HeaderSize:HeaderSize+n], payload(1, n))
		if n <= boxPayload && (!inBox || inSlot) || n > boxPayload && (!inSlot || inBox) {
			t.Errorf("%d bytes: in the box %v, in the slot %v; want the box only up to %d bytes", n, inBox, inSlot, boxPayload)
		}
		for r := range 2 {
			for p := range 2 {
				got, err := ms[r].Slot(p, n)
				if err != nil || !bytes.Equal(got, payload(p, n)) {
					t.Fatalf("%d bytes: rank %d read rank %d's %v (%v)", n, r, p, got, err)
				}
			}
		}
	}
	// Mismatches, each in a fresh pair: rank 1's op differs from rank
	// 0's in one field, or in its payload's length.
	for _, c := range []struct {
		name string
		fp   func(fp comm.Fingerprint) comm.Fingerprint
		n    int
		want string
	}{
		{"count", func(fp comm.Fingerprint) comm.Fingerprint { fp.Count = 9; return fp }, 8, "×9"},
		{"seq", func(fp comm.Fingerprint) comm.Fingerprint { fp.Seq = 2; return fp }, 8, "seq 2"},
		{"dtype", func(fp comm.Fingerprint) comm.Fingerprint { fp.DType = comm.Int8; return fp }, 8, "int8"},
		{"root", func(fp comm.Fingerprint) comm.Fingerprint { fp.Root = 1; return fp }, 8, ""},
		{"length", func(fp comm.Fingerprint) comm.Fingerprint { return fp }, 4, "of 4 bytes"},
		{"length in the slot", func(fp comm.Fingerprint) comm.Fingerprint { return fp }, 40, "of 40 bytes"},
	} {
		ms := flatPair(t)
		want := op(1, 8)
		n := 8
		if c.name == "length in the slot" {
			n = 48
		}
		ms[0].Begin(OpCtx{FP: want})
		ms[1].Begin(OpCtx{FP: c.fp(want)})
		if err := ms[0].Publish(payload(0, n)); err != nil {
			t.Fatal(err)
		}
		pn := n
		if c.name == "length" || c.name == "length in the slot" {
			pn = c.n
		}
		if err := ms[1].Publish(payload(1, pn)); err != nil {
			t.Fatal(err)
		}
		_, err := ms[0].Slot(1, n)
		var me *comm.MismatchError
		if !errors.As(err, &me) || me.RemoteRank != 1 || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: rank 0 read %v, want a mismatch with rank 1 naming %q", c.name, err, c.want)
		}
	}
	// A box that disagrees with its slot's (matching) header.
	ms = flatPair(t)
	for r := range 2 {
		ms[r].Begin(OpCtx{FP: op(1, 8)})
		if err := ms[r].Publish(payload(r, 8)); err != nil {
			t.Fatal(err)
		}
	}
	ms[1].Grp.r[1].box[1][0] ^= 1 // the hash
	var ee *comm.EngineError
	if _, err := ms[0].Slot(1, 8); !errors.As(err, &ee) || !strings.Contains(err.Error(), "disagrees") {
		t.Errorf("corrupt box: %v, want a protocol error", err)
	}
}

// TestFPHash: the box's hash of a fingerprint changes with every field
// it covers (all but seq, which the box carries itself).
func TestFPHash(t *testing.T) {
	base := comm.Fingerprint{Group: 7, Epoch: 1, Op: comm.OpAllReduce, DType: comm.Float32, RedOp: comm.RedSum, Count: 3, Root: -1, Shape: 5}
	seen := map[uint64]string{fpHash(&base): "base"}
	for name, f := range map[string]func(*comm.Fingerprint){
		"group": func(fp *comm.Fingerprint) { fp.Group++ }, "epoch": func(fp *comm.Fingerprint) { fp.Epoch++ },
		"op": func(fp *comm.Fingerprint) { fp.Op = comm.OpBroadcast }, "dtype": func(fp *comm.Fingerprint) { fp.DType = comm.Float64 },
		"redop": func(fp *comm.Fingerprint) { fp.RedOp = comm.RedMax }, "count": func(fp *comm.Fingerprint) { fp.Count++ },
		"root": func(fp *comm.Fingerprint) { fp.Root = 0 }, "shape": func(fp *comm.Fingerprint) { fp.Shape++ },
	} {
		fp := base
		f(&fp)
		h := fpHash(&fp)
		if prev, ok := seen[h]; ok {
			t.Errorf("changing the %s gives the hash of %s", name, prev)
		}
		seen[h] = name
	}
	fp := base
	fp.Seq = 99
	if fpHash(&fp) != fpHash(&base) {
		t.Error("the hash depends on the seq, which the box carries apart")
	}
}

// TestPublishEarly: a slot published ahead of its op's run (PublishEarly)
// is what the peer reads; the run's own Publish of the same bytes takes
// it without publishing again; one of other bytes is an internal error;
// and an early slot whose op never ran is dropped by the next op's Begin,
// which publishes in the next slot.
func TestPublishEarly(t *testing.T) {
	ms := flatPair(t)
	fp := func(seq uint64) OpCtx {
		return OpCtx{FP: comm.Fingerprint{Op: comm.OpAllReduce, DType: comm.Uint8, Count: 8, Seq: seq, Root: -1}}
	}
	p0, p1 := bytes.Repeat([]byte{1}, 8), bytes.Repeat([]byte{2}, 8)
	if !ms[0].PublishEarly(fp(1), p0) {
		t.Fatal("PublishEarly refused the first op")
	}
	if k := ms[0].Grp.K; k != 1 {
		t.Fatalf("op number %d after PublishEarly, want 1", k)
	}
	flatOp(ms[1], 1)
	if err := ms[1].Publish(p1); err != nil {
		t.Fatal(err)
	}
	if got, err := ms[1].Slot(0, 8); err != nil || !bytes.Equal(got, p0) {
		t.Fatalf("rank 1 read %v (%v) of the early slot, want %v", got, err, p0)
	}
	ms[0].Begin(fp(1)) // the op's run
	if err := ms[0].Publish(p0); err != nil {
		t.Fatalf("the run's Publish of the early bytes: %v", err)
	}
	if k := ms[0].Grp.K; k != 1 {
		t.Fatalf("op number %d after the run's Publish, want 1 (published once)", k)
	}
	if got, err := ms[0].Slot(1, 8); err != nil || !bytes.Equal(got, p1) {
		t.Fatalf("rank 0 read %v (%v), want %v", got, err, p1)
	}

	// Other bytes than the early ones: an internal error naming both sizes.
	if !ms[0].PublishEarly(fp(2), p0) {
		t.Fatal("PublishEarly refused op 2")
	}
	ms[0].Begin(fp(2))
	var ee *comm.EngineError
	if err := ms[0].Publish(p0[:4]); !errors.As(err, &ee) || !strings.Contains(err.Error(), "published early with 8 bytes") {
		t.Fatalf("Publish of other bytes after PublishEarly: %v, want an internal *EngineError", err)
	}

	// An early slot whose op never ran (rank 1's op 2): the next op's
	// Begin drops it, so that op's Publish publishes anew.
	if !ms[1].PublishEarly(fp(2), p1) {
		t.Fatal("PublishEarly refused rank 1's op 2")
	}
	flatOp(ms[1], 3)
	if ms[1].early != 0 || ms[1].earlyData != nil {
		t.Fatalf("early op %d still pending after another op's Begin", ms[1].early)
	}
}
