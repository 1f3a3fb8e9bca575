package cpu

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/ranktree/ranktree/comm"
	"github.com/ranktree/ranktree/store"
)

// flatOps is how many one-step ops rank r of g has run.
func flatOps(g *group, r int) uint64 {
	if g.engines[r].grp == nil {
		return 0
	}
	return g.engines[r].grp.K
}

// TestAllReduceFlatMatrix: transport × world size 1..4 × count around
// FlatThreshold (0, 1, just below, at, just above) × every dtype and op,
// against the closed form, with bit-identical results on every rank.
// Over shm and inmem the counts up to the threshold take the one-step
// algorithm, and just above it 3 or 4 ranks take the slots (one round of
// two exchanges, allreduce_slots.go), 2 ranks recursive doubling; tcp
// groups have no group segment.
func TestAllReduceFlatMatrix(t *testing.T) {
	const thr = 256
	for _, tr := range testTransports {
		for n := 1; n <= 4; n++ {
			t.Run(fmt.Sprintf("%s/n=%d", tr, n), func(t *testing.T) {
				g := newGroup(t, n, Options{Transport: tr, FlatThreshold: thr})
				if hasGrp := g.engines[0].grp != nil; hasGrp != (tr != TransportTCP && n > 1) {
					t.Fatalf("group segment present = %v", hasGrp)
				}
				for _, dt := range comm.AllDTypes {
					at := thr / dt.Size()
					for _, count := range []int{0, 1, at - 1, at, at + 1} {
						for _, red := range opsFor(dt) {
							before := flatOps(g, 0)
							checkAllReduce(t, g, dt, red, count)
							flat := flatOps(g, 0) - before
							want := uint64(0)
							if g.engines[0].grp != nil && count*dt.Size() <= thr {
								want = 1
							} else if g.engines[0].grp != nil && n > 2 {
								want = 2
							}
							if flat != want {
								t.Fatalf("%v %v count %d: %d one-step ops, want %d", dt, red, count, flat, want)
							}
						}
					}
				}
			})
		}
	}
}

// TestAllReduceFlatSequence runs many allreduces back to back, one-step
// and not interleaved (among 3 or 4 ranks: in two rounds through the
// slots, allreduce_slots.go), with values that change every op: the
// double-buffered slots must never hand a rank the previous or next op's
// data.
func TestAllReduceFlatSequence(t *testing.T) {
	for _, tr := range []string{TransportSHM, TransportInmem} {
		for _, n := range []int{2, 3, 4} {
			t.Run(fmt.Sprintf("%s/n=%d", tr, n), func(t *testing.T) {
				g := newGroup(t, n, Options{Transport: tr, FlatThreshold: 1 << 10, SlotBytes: 1 << 10})
				counts := []int{1, 128, 129, 3, 17, 200}
				want := uint64(40) // one-step exchanges: 40 ops of at most 1 KiB
				if n > 2 {
					want += 20 * 4 // 20 ops of 2 rounds of 1 KiB, 2 exchanges each
				}
				for it := range 60 {
					count := counts[it%len(counts)]
					bufs := make([]comm.Buffer, n)
					for r := range n {
						bufs[r] = comm.NewHostBuffer(comm.Int64, count)
						for i := range count {
							setF(bufs[r], i, float64(it*1000+r*10+i))
						}
					}
					g.mustRun("sequence", func(r int, fp fpFunc) *comm.Op {
						return &comm.Op{FP: fp(comm.OpAllReduce, comm.Int64, count, -1, comm.Sum), Type: comm.OpAllReduce, Reduce: comm.Sum, In: []comm.Buffer{bufs[r]}}
					})
					for r := range n {
						for i := range count {
							want := float64(n*(it*1000+i) + 10*n*(n-1)/2)
							if got := getF(bufs[r], i); got != want {
								t.Fatalf("op %d count %d rank %d elem %d: %v, want %v", it, count, r, i, got, want)
							}
						}
					}
				}
				if k := flatOps(g, 0); k != want {
					t.Fatalf("%d one-step exchanges, want %d", k, want)
				}
			})
		}
	}
}

// TestFlatMismatch: ranks that launch different ops at one seq, where at
// least one takes the one-step algorithm, all fail with ErrMismatch within
// a second (no hang, no wrong data): different counts (both flat, or one
// flat and one recursive doubling), dtypes, reduce ops and seqs, and a
// flat allreduce against a broadcast.
func TestFlatMismatch(t *testing.T) {
	type side struct {
		typ   comm.OpType
		dt    comm.DType
		count int
		red   comm.ReduceOp
		seq   uint64
	}
	ar := func(dt comm.DType, count int, red comm.ReduceOp) side {
		return side{comm.OpAllReduce, dt, count, red, 5}
	}
	cases := []struct {
		name  string
		a, b  side
		odd   bool // only the last rank takes b, else every odd rank
		nOnly int
	}{
		{name: "count-flat-flat", a: ar(comm.Float32, 16, comm.Sum), b: ar(comm.Float32, 17, comm.Sum)},
		// 16 KiB: recursive doubling with 2 ranks, the slots with more.
		{name: "count-flat-larger", a: ar(comm.Float32, 16, comm.Sum), b: ar(comm.Float32, 4096, comm.Sum)},
		{name: "count-slots-slots", a: ar(comm.Float32, 4096, comm.Sum), b: ar(comm.Float32, 4097, comm.Sum)},
		// 10 MB: the ring, against the slots (or recursive doubling).
		{name: "count-slots-ring", a: ar(comm.Float32, 4096, comm.Sum), b: ar(comm.Float32, 2_500_000, comm.Sum)},
		{name: "dtype", a: ar(comm.Float32, 16, comm.Sum), b: ar(comm.Int32, 16, comm.Sum)},
		{name: "redop", a: ar(comm.Float32, 16, comm.Sum), b: ar(comm.Float32, 16, comm.Max)},
		{name: "seq", a: ar(comm.Float32, 16, comm.Sum), b: side{comm.OpAllReduce, comm.Float32, 16, comm.Sum, 6}},
		{name: "broadcast", a: ar(comm.Float32, 16, comm.Sum), b: side{comm.OpBroadcast, comm.Float32, 16, comm.ReduceOp{}, 5}},
		{name: "last-rank-larger", a: ar(comm.Float32, 16, comm.Sum), b: ar(comm.Float32, 4096, comm.Sum), odd: true},
		{name: "last-rank-slots-redop", a: ar(comm.Float32, 4096, comm.Sum), b: ar(comm.Float32, 4096, comm.Max), odd: true},
	}
	for _, tr := range []string{TransportSHM, TransportInmem} {
		for _, n := range []int{2, 3, 4} {
			for _, c := range cases {
				t.Run(fmt.Sprintf("%s/n=%d/%s", tr, n, c.name), func(t *testing.T) {
					g := newGroup(t, n, Options{Transport: tr, FlatThreshold: 1 << 10})
					works := make([]*comm.Work, n)
					bufs := make([]comm.Buffer, n)
					start := time.Now()
					for r, e := range g.engines {
						s := c.a
						if (c.odd && r == n-1) || (!c.odd && r%2 == 1) {
							s = c.b
						}
						bufs[r] = comm.NewHostBuffer(s.dt, s.count)
						for i := range s.count {
							setF(bufs[r], i, float64(r+1))
						}
						fp := comm.Fingerprint{Group: comm.GroupHash(g.name), Seq: s.seq, Op: s.typ, DType: s.dt, Count: int64(s.count), Root: -1, RedOp: s.red.Type()}
						op := &comm.Op{FP: fp, Type: s.typ, Reduce: s.red, In: []comm.Buffer{bufs[r]}}
						if s.typ == comm.OpBroadcast {
							op.FP.Root, op.Root = 0, 0
						}
						works[r] = launch(e, op)
					}
					expectMismatch(t, works, start)
				})
			}
		}
	}
}

// TestAllReduceSlotsRounds: allreduces above FlatThreshold among 3 and 4
// ranks go through the slots in rounds of SlotBytes (allreduce_slots.go):
// every dtype and reduce op, counts of one round, of several with a
// short last round, and blocks that do not split evenly, against the
// closed form, with bit-identical results on every rank and the number
// of exchanges the rounds take (two per round); just above
// SlotAllReduceMax the ring takes over (no exchange through the slots).
func TestAllReduceSlotsRounds(t *testing.T) {
	const thr, slot = 256, 512
	for _, tr := range []string{TransportSHM, TransportInmem} {
		for _, n := range []int{3, 4} {
			t.Run(fmt.Sprintf("%s/n=%d", tr, n), func(t *testing.T) {
				g := newGroup(t, n, Options{Transport: tr, FlatThreshold: thr, SlotBytes: slot})
				if g.engines[0].grp == nil {
					t.Fatal("no group segment")
				}
				for _, dt := range comm.AllDTypes {
					piece := slot - slot%dt.Size()
					at := thr / dt.Size()
					for _, count := range []int{at + 1, 2*piece/dt.Size() + 1, 3*piece/dt.Size() + n + 2} {
						for _, red := range opsFor(dt) {
							before := flatOps(g, 0)
							checkAllReduce(t, g, dt, red, count)
							nbytes := count * dt.Size()
							want := uint64(2 * ((nbytes + piece - 1) / piece))
							if got := flatOps(g, 0) - before; got != want {
								t.Fatalf("%v %v count %d (%d bytes): %d exchanges through the slots, want %d", dt, red, count, nbytes, got, want)
							}
						}
					}
				}
				count := slotAllReduceDefault(n)/4 + 1
				before := flatOps(g, 0)
				checkAllReduce(t, g, comm.Float32, comm.Sum, count)
				if got := flatOps(g, 0) - before; got != 0 {
					t.Fatalf("float32 count %d (above SlotAllReduceMax): %d exchanges through the slots, want 0 (the ring)", count, got)
				}
			})
		}
	}
	// SlotAllReduceMax < 0: no allreduce above FlatThreshold takes the slots.
	g := newGroup(t, 3, Options{Transport: TransportSHM, FlatThreshold: thr, SlotBytes: slot, SlotAllReduceMax: -1})
	before := flatOps(g, 0)
	checkAllReduce(t, g, comm.Float32, comm.Sum, 1000)
	if got := flatOps(g, 0) - before; got != 0 {
		t.Fatalf("SlotAllReduceMax -1: %d exchanges through the slots, want 0", got)
	}
}

// TestFlatMixedTransportFallsBack: a group where one rank is on another
// "host" (a different HostID: its links are tcp, the rest shm) has no
// group segment and runs the message-based algorithms, with right results.
func TestFlatMixedTransportFallsBack(t *testing.T) {
	const n = 3
	st := store.NewMemStore(store.WithMemTimeout(30 * time.Second))
	g := &group{t: t, name: "mixed", engines: make([]*Engine, n)}
	errs := make([]error, n)
	var wg sync.WaitGroup
	for r := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			host := "hostA"
			if r == 2 {
				host = "hostB"
			}
			cfg := comm.BackendConfig{Group: g.name, Rank: r, Size: n, Store: st, Device: -1, Timeout: 30 * time.Second, Log: zerolog.Nop()}
			g.engines[r], errs[r] = New(context.Background(), cfg, Options{Transport: TransportAuto, HostID: host})
		}()
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			t.Fatalf("New rank %d: %v", r, err)
		}
	}
	t.Cleanup(func() {
		for _, e := range g.engines {
			_ = e.Close()
		}
	})
	for r, e := range g.engines {
		if e.grp != nil {
			t.Fatalf("rank %d has a group segment in a mixed shm+tcp group (%s)", r, e.Transport())
		}
	}
	for _, count := range []int{1, 7, 1001} {
		checkAllReduce(t, g, comm.Float32, comm.Sum, count)
	}
}

// TestFlatLatePeer: a rank that arrives 30 ms late finds its peers asleep
// on their bells (past the spin), and wakes them; every rank gets the
// right result. Then Abort of a rank asleep in a one-step op fails it
// promptly, and its peer learns of it.
func TestFlatLatePeer(t *testing.T) {
	for _, tr := range []string{TransportSHM, TransportInmem} {
		t.Run(tr, func(t *testing.T) {
			const n = 3
			g := newGroup(t, n, Options{Transport: tr})
			bufs := make([]comm.Buffer, n)
			works := make([]*comm.Work, n)
			for r, e := range g.engines {
				bufs[r] = comm.NewHostBuffer(comm.Float64, 8)
				for i := range 8 {
					setF(bufs[r], i, float64(r*100+i))
				}
				fp := comm.Fingerprint{Group: comm.GroupHash(g.name), Seq: 1, Op: comm.OpAllReduce, DType: comm.Float64, Count: 8, Root: -1, RedOp: comm.RedSum}
				if r == n-1 {
					time.Sleep(30 * time.Millisecond)
				}
				works[r] = launch(e, &comm.Op{FP: fp, Type: comm.OpAllReduce, Reduce: comm.Sum, In: []comm.Buffer{bufs[r]}})
			}
			for r, w := range works {
				if err := waitT(t, w, 5*time.Second); err != nil {
					t.Fatalf("rank %d: %v", r, err)
				}
				for i := range 8 {
					if got, want := getF(bufs[r], i), float64(300+3*i); got != want {
						t.Fatalf("rank %d elem %d: %v, want %v", r, i, got, want)
					}
				}
			}
			// Ranks 0 and 1 launch seq 2, rank 2 never does; rank 0 is
			// aborted while it sleeps.
			for r := range 2 {
				fp := comm.Fingerprint{Group: comm.GroupHash(g.name), Seq: 2, Op: comm.OpAllReduce, DType: comm.Float64, Count: 8, Root: -1, RedOp: comm.RedSum}
				works[r] = launch(g.engines[r], &comm.Op{FP: fp, Type: comm.OpAllReduce, Reduce: comm.Sum, In: []comm.Buffer{bufs[r]}})
			}
			time.Sleep(20 * time.Millisecond)
			start := time.Now()
			reason := errors.New("test abort")
			g.engines[0].Abort(reason)
			if err := waitT(t, works[0], 5*time.Second); !errors.Is(err, comm.ErrAborted) {
				t.Fatalf("rank 0: %v, want ErrAborted", err)
			}
			if err := waitT(t, works[1], 5*time.Second); !errors.Is(err, comm.ErrRemoteAbort) {
				t.Fatalf("rank 1: %v, want ErrRemoteAbort", err)
			}
			if el := time.Since(start); el > 500*time.Millisecond {
				t.Fatalf("abort took %v to reach the sleeping ranks", el)
			}
		})
	}
}

// expectMismatch checks that every rank's Work of ops launched at start
// fails with ErrMismatch, all within a second.
func expectMismatch(t *testing.T, works []*comm.Work, start time.Time) {
	t.Helper()
	for r, w := range works {
		if err := waitT(t, w, 5*time.Second); !errors.Is(err, comm.ErrMismatch) {
			t.Fatalf("rank %d: got %v, want ErrMismatch", r, err)
		}
	}
	if el := time.Since(start); el > time.Second {
		t.Fatalf("mismatch took %v to detect, want < 1s", el)
	}
}
