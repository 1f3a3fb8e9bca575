package transport

import (
	"bytes"
	"os"
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
// op does) waits in Publish for the peers' sequence words, so that a peer
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
