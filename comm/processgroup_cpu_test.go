package comm_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ranktree/ranktree/comm"
	"github.com/ranktree/ranktree/comm/cpu"
	"github.com/ranktree/ranktree/internal/testrank"
)

// End-to-end tests of ProcessGroup → communicator actor → CPU engine, with
// every rank a goroutine of this process (in-memory transport). Expected
// values are c10d's (torch/testing/_internal/distributed/distributed_test.py).

var worldSizes = []int{1, 2, 3, 4}

func cpuWorld(t testing.TB, n int) []*comm.ProcessGroup {
	t.Helper()
	hub := cpu.NewInmemHub()
	pgs, _ := testrank.LocalWorld(t, n, "cpu", cpu.Factory(cpu.Options{Transport: cpu.TransportInmem, Hub: hub}))
	return pgs
}

// onRanks runs fn on every rank of pgs and fails t with the ranks' errors.
func onRanks(t testing.TB, pgs []*comm.ProcessGroup, fn func(ctx context.Context, pg *comm.ProcessGroup) error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := testrank.Ranks(len(pgs), 90*time.Second, func(r int) error { return fn(ctx, pgs[r]) }); err != nil {
		t.Fatal(err)
	}
}

func fill[T comm.Elem](n int, v T) []T {
	s := make([]T, n)
	for i := range s {
		s[i] = v
	}
	return s
}

func allEqual[T comparable](s []T, v T) error {
	for i, x := range s {
		if x != v {
			return fmt.Errorf("element %d is %v, want %v (all: %v)", i, x, v, s)
		}
	}
	return nil
}

func checkAllReduce(ctx context.Context, pg *comm.ProcessGroup) error {
	n := pg.Size()
	nf := float64(n)
	want := map[string]float64{
		"sum": 2 + 10*(nf-1), "product": 2 * math.Pow(10, nf-1), "min": 2, "max": 10, "avg": (2 + 10*(nf-1)) / nf,
	}
	if n == 1 {
		want["max"] = 2
	}
	ops := map[string]comm.ReduceOp{"sum": comm.Sum, "product": comm.Product, "min": comm.Min, "max": comm.Max, "avg": comm.Avg}
	for _, name := range []string{"sum", "product", "min", "max", "avg"} {
		v := 10.0
		if pg.Rank() == 0 { // the source rank holds 2, the others 10
			v = 2
		}
		f := fill(7, v)
		i := fill(5, int64(v))
		if err := pg.AllReduce(ctx, comm.HostBuffer(f), ops[name]).Wait(ctx); err != nil {
			return err
		}
		if err := allEqual(f, want[name]); err != nil {
			return fmt.Errorf("float64 %s: %w", name, err)
		}
		if name == "avg" {
			continue
		}
		if err := pg.AllReduce(ctx, comm.HostBuffer(i), ops[name]).Wait(ctx); err != nil {
			return err
		}
		if err := allEqual(i, int64(want[name])); err != nil {
			return fmt.Errorf("int64 %s: %w", name, err)
		}
	}
	s := fill(3, float32(pg.Rank()+1))
	if err := pg.AllReduce(ctx, comm.HostBuffer(s), comm.Sum).Wait(ctx); err != nil {
		return err
	}
	if err := allEqual(s, float32(n*(n+1)/2)); err != nil {
		return err
	}
	// Zero elements is a valid (empty) collective, as in c10d.
	return pg.AllReduce(ctx, comm.HostBuffer([]float32{}), comm.Sum).Wait(ctx)
}

// pattern returns count elements of dt as bytes, with the sign bit of every
// element set (negative values for signed types), distinct per root.
func pattern(dt comm.DType, count, root int) []byte {
	b := comm.NewHostBuffer(dt, count)
	raw := b.Bytes()
	for i := range raw {
		raw[i] = byte(0x80 | (i*7+root*13)&0x7f)
	}
	if dt == comm.Bool {
		for i := range raw {
			raw[i] = byte((i + root) % 2)
		}
	}
	if dt == comm.Float16 || dt == comm.BFloat16 {
		for i := 0; i < len(raw); i += 2 {
			raw[i] = byte(i + root)
			raw[i+1] = 0xC0 | byte(i%16) // negative, finite
		}
	}
	return raw
}

func checkBroadcast(ctx context.Context, pg *comm.ProcessGroup) error {
	n := pg.Size()
	for _, dt := range comm.AllDTypes {
		for root := 0; root < n; root++ {
			buf := comm.NewHostBuffer(dt, 33)
			want := pattern(dt, 33, root)
			if pg.Rank() == root {
				copy(buf.Bytes(), want)
			}
			if err := pg.Broadcast(ctx, buf, root).Wait(ctx); err != nil {
				return err
			}
			if !bytes.Equal(buf.Bytes(), want) {
				return fmt.Errorf("%v from root %d: got % x, want % x", dt, root, buf.Bytes(), want)
			}
		}
	}
	return nil
}

func checkAllGather(ctx context.Context, pg *comm.ProcessGroup) error {
	n := pg.Size()
	in := fill(3, float32(pg.Rank()))
	list := make([][]float32, n)
	outs := make([]comm.Buffer, n)
	for i := range list {
		list[i] = make([]float32, 3)
		outs[i] = comm.HostBuffer(list[i])
	}
	if err := pg.AllGather(ctx, outs, comm.HostBuffer(in)).Wait(ctx); err != nil {
		return err
	}
	for i := range list {
		if err := allEqual(list[i], float32(i)); err != nil {
			return fmt.Errorf("list out[%d]: %w", i, err)
		}
	}
	flat := make([]float32, 3*n)
	if err := pg.AllGatherInto(ctx, comm.HostBuffer(flat), comm.HostBuffer(in)).Wait(ctx); err != nil {
		return err
	}
	for i := 0; i < n; i++ {
		if err := allEqual(flat[3*i:3*i+3], float32(i)); err != nil {
			return fmt.Errorf("flat part %d: %w", i, err)
		}
	}
	// Uneven: rank i contributes i+1 elements of value i.
	counts := make([]int, n)
	var want []int32
	for i := range counts {
		counts[i] = i + 1
		want = append(want, fill(i+1, int32(i))...)
	}
	v := make([]int32, len(want))
	if err := pg.AllGatherV(ctx, comm.HostBuffer(v), comm.HostBuffer(fill(pg.Rank()+1, int32(pg.Rank()))), counts).Wait(ctx); err != nil {
		return err
	}
	if !slices.Equal(v, want) {
		return fmt.Errorf("AllGatherV: %v, want %v", v, want)
	}
	return nil
}

func arange(lo, hi int64) []int64 {
	s := make([]int64, 0, hi-lo)
	for i := lo; i < hi; i++ {
		s = append(s, i)
	}
	return s
}

func scale(s []int64, k int64) []int64 {
	out := make([]int64, len(s))
	for i, v := range s {
		out[i] = v * k
	}
	return out
}

func checkReduceScatter(ctx context.Context, pg *comm.ProcessGroup) error {
	n := pg.Size()
	N := int64(n)
	r := int64(pg.Rank())
	want := scale(arange(2*r, 2*r+2), N)
	out := make([]int64, 2)
	if err := pg.ReduceScatterTensor(ctx, comm.HostBuffer(out), comm.HostBuffer(arange(0, 2*N)), comm.Sum).Wait(ctx); err != nil {
		return err
	}
	if !slices.Equal(out, want) {
		return fmt.Errorf("flat: %v, want %v", out, want)
	}
	in := make([]comm.Buffer, n)
	for i := range in {
		in[i] = comm.HostBuffer(arange(2*int64(i), 2*int64(i)+2))
	}
	out = make([]int64, 2)
	if err := pg.ReduceScatter(ctx, comm.HostBuffer(out), in, comm.Sum).Wait(ctx); err != nil {
		return err
	}
	if !slices.Equal(out, want) {
		return fmt.Errorf("list: %v, want %v", out, want)
	}
	// Uneven: rank i gets counts[i] = i+1 elements.
	counts := make([]int, n)
	total, off := 0, 0
	for i := range counts {
		counts[i] = i + 1
		if i < pg.Rank() {
			off += i + 1
		}
		total += i + 1
	}
	out = make([]int64, pg.Rank()+1)
	if err := pg.ReduceScatterV(ctx, comm.HostBuffer(out), comm.HostBuffer(arange(0, int64(total))), counts, comm.Sum).Wait(ctx); err != nil {
		return err
	}
	if w := scale(arange(int64(off), int64(off+pg.Rank()+1)), N); !slices.Equal(out, w) {
		return fmt.Errorf("V: %v, want %v", out, w)
	}
	return nil
}

func checkAllToAll(ctx context.Context, pg *comm.ProcessGroup) error {
	n := pg.Size()
	r := pg.Rank()
	// Equal splits: out row i is filled with i.
	in := fill(2*n, float32(r))
	out := make([]float32, 2*n)
	if err := pg.AllToAllSingle(ctx, comm.HostBuffer(out), comm.HostBuffer(in), nil, nil).Wait(ctx); err != nil {
		return err
	}
	for i := 0; i < n; i++ {
		if err := allEqual(out[2*i:2*i+2], float32(i)); err != nil {
			return fmt.Errorf("equal splits row %d: %w", i, err)
		}
	}
	// Unequal: rank r sends r+j+1 elements of value 100r+j to rank j.
	inSplits, outSplits := make([]int, n), make([]int, n)
	var src, want []int64
	for j := 0; j < n; j++ {
		inSplits[j] = r + j + 1
		outSplits[j] = j + r + 1
		src = append(src, fill(r+j+1, int64(100*r+j))...)
		want = append(want, fill(j+r+1, int64(100*j+r))...)
	}
	got := make([]int64, len(want))
	if err := pg.AllToAllSingle(ctx, comm.HostBuffer(got), comm.HostBuffer(src), outSplits, inSplits).Wait(ctx); err != nil {
		return err
	}
	if !slices.Equal(got, want) {
		return fmt.Errorf("unequal splits: %v, want %v", got, want)
	}
	// List form with the same sizes.
	ins, outs := make([]comm.Buffer, n), make([][]int64, n)
	outBufs := make([]comm.Buffer, n)
	for j := 0; j < n; j++ {
		ins[j] = comm.HostBuffer(fill(r+j+1, int64(100*r+j)))
		outs[j] = make([]int64, j+r+1)
		outBufs[j] = comm.HostBuffer(outs[j])
	}
	if err := pg.AllToAll(ctx, outBufs, ins).Wait(ctx); err != nil {
		return err
	}
	for j := range outs {
		if err := allEqual(outs[j], int64(100*j+r)); err != nil {
			return fmt.Errorf("list form from rank %d: %w", j, err)
		}
	}
	return nil
}

func checkGatherScatter(ctx context.Context, pg *comm.ProcessGroup) error {
	n := pg.Size()
	r := pg.Rank()
	for root := 0; root < n; root++ {
		var outs []comm.Buffer
		var got [][]int32
		if r == root {
			got = make([][]int32, n)
			for i := range got {
				got[i] = make([]int32, 4)
				outs = append(outs, comm.HostBuffer(got[i]))
			}
		}
		if err := pg.Gather(ctx, outs, comm.HostBuffer(fill(4, int32(r+1))), root).Wait(ctx); err != nil {
			return err
		}
		for i := range got {
			if err := allEqual(got[i], int32(i+1)); err != nil {
				return fmt.Errorf("gather to root %d, part %d: %w", root, i, err)
			}
		}
		var ins []comm.Buffer
		if r == root {
			for i := 0; i < n; i++ {
				ins = append(ins, comm.HostBuffer(fill(3, int32(10*root+i))))
			}
		}
		out := make([]int32, 3)
		if err := pg.Scatter(ctx, comm.HostBuffer(out), ins, root).Wait(ctx); err != nil {
			return err
		}
		if err := allEqual(out, int32(10*root+r)); err != nil {
			return fmt.Errorf("scatter from root %d: %w", root, err)
		}
	}
	return nil
}

// checkBarrier: the last rank sleeps 400 ms before entering; no rank may
// leave before it arrives (its arrival time is broadcast afterwards; the
// ranks share one clock).
func checkBarrier(ctx context.Context, pg *comm.ProcessGroup) error {
	n := pg.Size()
	if err := pg.Barrier(ctx).Wait(ctx); err != nil { // warm up
		return err
	}
	arrived := []int64{0}
	if pg.Rank() == n-1 {
		time.Sleep(400 * time.Millisecond)
		arrived[0] = time.Now().UnixNano()
	}
	if err := pg.Barrier(ctx).Wait(ctx); err != nil {
		return err
	}
	left := time.Now().UnixNano()
	if err := pg.Broadcast(ctx, comm.HostBuffer(arrived), n-1).Wait(ctx); err != nil {
		return err
	}
	if left < arrived[0] {
		return fmt.Errorf("left the barrier %v before the sleeping rank arrived", time.Duration(arrived[0]-left))
	}
	return nil
}

// checkSendRecv: tags select messages (two sends from rank 0 to rank 1 are
// received in the other order); any-source receives report the sender.
func checkSendRecv(ctx context.Context, pg *comm.ProcessGroup) error {
	n := pg.Size()
	if n < 2 {
		return nil
	}
	switch pg.Rank() {
	case 0:
		w1 := pg.ISend(ctx, comm.HostBuffer(fill(2, int64(1))), 1, 1)
		w2 := pg.ISend(ctx, comm.HostBuffer(fill(2, int64(2))), 1, 2)
		if err := errors.Join(w1.Wait(ctx), w2.Wait(ctx)); err != nil {
			return err
		}
		seen := map[int]bool{}
		for k := 1; k < n; k++ {
			v := make([]int64, 1)
			src, err := pg.Recv(ctx, comm.HostBuffer(v), comm.AnySource, 7)
			if err != nil {
				return err
			}
			if int64(src) != v[0] || seen[src] || src < 1 || src >= n {
				return fmt.Errorf("any-source recv: source %d, value %d (seen %v)", src, v[0], seen)
			}
			seen[src] = true
		}
		return nil
	case 1:
		a, b := make([]int64, 2), make([]int64, 2)
		if src, err := pg.Recv(ctx, comm.HostBuffer(b), 0, 2); err != nil || src != 0 {
			return fmt.Errorf("recv tag 2: src %d err %v", src, err)
		}
		if _, err := pg.Recv(ctx, comm.HostBuffer(a), 0, 1); err != nil {
			return err
		}
		if err := errors.Join(allEqual(a, int64(1)), allEqual(b, int64(2))); err != nil {
			return fmt.Errorf("tag matching: %w", err)
		}
	}
	return pg.Send(ctx, comm.HostBuffer([]int64{int64(pg.Rank())}), 0, 7)
}

func checkBatchCoalesce(ctx context.Context, pg *comm.ProcessGroup) error {
	n := pg.Size()
	if n < 2 {
		return nil
	}
	r := pg.Rank()
	next, prev := (r+1)%n, (r-1+n)%n
	got := make([]float64, 4)
	// Receive listed first on every rank: deadlock-free only as a batch.
	works, err := pg.BatchP2P(ctx, []comm.P2POp{
		{Op: comm.OpRecv, Buf: comm.HostBuffer(got), Peer: prev, Tag: 3},
		{Op: comm.OpSend, Buf: comm.HostBuffer(fill(4, float64(r))), Peer: next, Tag: 3},
	})
	if err != nil {
		return err
	}
	if err := comm.WaitAll(ctx, works); err != nil {
		return err
	}
	if err := allEqual(got, float64(prev)); err != nil {
		return fmt.Errorf("ring exchange: %w", err)
	}
	a, b := fill(3, int32(r)), fill(2, float32(1))
	ag := make([]int32, 3*n)
	w := pg.Coalesce(ctx, func(c *comm.Coalescer) error {
		return errors.Join(c.AllReduce(comm.HostBuffer(a), comm.Max), c.AllReduce(comm.HostBuffer(b), comm.Sum),
			c.AllGatherInto(comm.HostBuffer(ag), comm.HostBuffer(fill(3, int32(r)))))
	})
	if err := w.Wait(ctx); err != nil {
		return err
	}
	if err := errors.Join(allEqual(a, int32(n-1)), allEqual(b, float32(n))); err != nil {
		return fmt.Errorf("coalesced: %w", err)
	}
	for i := 0; i < n; i++ {
		if err := allEqual(ag[3*i:3*i+3], int32(i)); err != nil {
			return fmt.Errorf("coalesced allgather: %w", err)
		}
	}
	bufs := []comm.Buffer{comm.HostBuffer(fill(2, int64(r))), comm.HostBuffer(fill(5, int64(1)))}
	if err := pg.AllReduceCoalesced(ctx, bufs, comm.Sum).Wait(ctx); err != nil {
		return err
	}
	s0, _ := comm.AsSlice[int64](bufs[0])
	s1, _ := comm.AsSlice[int64](bufs[1])
	return errors.Join(allEqual(s0, int64(n*(n-1)/2)), allEqual(s1, int64(n)))
}

func blob(r int) []byte { return []byte(strings.Repeat(fmt.Sprint(r), r)) } // rank 0: empty

func checkObjects(ctx context.Context, pg *comm.ProcessGroup) error {
	n := pg.Size()
	r := pg.Rank()
	all, err := pg.AllGatherBytes(ctx, blob(r))
	if err != nil {
		return err
	}
	for i, b := range all {
		if !bytes.Equal(b, blob(i)) {
			return fmt.Errorf("AllGatherBytes[%d] = %q", i, b)
		}
	}
	root := n - 1
	got, err := pg.BroadcastBytes(ctx, []byte(fmt.Sprintf("from %d", r)), root)
	if err != nil || string(got) != fmt.Sprintf("from %d", root) {
		return fmt.Errorf("BroadcastBytes: %q, %v", got, err)
	}
	g, err := pg.GatherBytes(ctx, blob(r+1), 0)
	if err != nil {
		return err
	}
	if r == 0 {
		for i := range g {
			if !bytes.Equal(g[i], blob(i+1)) {
				return fmt.Errorf("GatherBytes[%d] = %q", i, g[i])
			}
		}
	} else if g != nil {
		return fmt.Errorf("GatherBytes on a non-root returned %q", g)
	}
	var parts [][]byte
	if r == root {
		for i := 0; i < n; i++ {
			parts = append(parts, blob(n-i))
		}
	}
	part, err := pg.ScatterBytes(ctx, parts, root)
	if err != nil || !bytes.Equal(part, blob(n-r)) {
		return fmt.Errorf("ScatterBytes: %q, %v", part, err)
	}
	return nil
}

// checkObjectList: SendObjectList/RecvObjectList around the ring (rank r
// sends r+1 blobs, one of them empty, to r+1), then an empty list, then
// every rank to rank 0 with AnySource.
func checkObjectList(ctx context.Context, pg *comm.ProcessGroup) error {
	n, r := pg.Size(), pg.Rank()
	if n < 2 {
		return nil
	}
	list := func(r int) [][]byte {
		objs := [][]byte{{}}
		for i := 1; i <= r; i++ {
			objs = append(objs, blob(i+r))
		}
		return objs
	}
	next, prev := (r+1)%n, (r+n-1)%n
	recv := func(count, src int) error {
		got, from, err := pg.RecvObjectList(ctx, count, src)
		if err != nil {
			return fmt.Errorf("RecvObjectList(%d, %d): %w", count, src, err)
		}
		if src != comm.AnySource && from != src {
			return fmt.Errorf("RecvObjectList from %d reports sender %d", src, from)
		}
		want := list(from)
		if count == 0 {
			want = [][]byte{}
		}
		if len(got) != len(want) {
			return fmt.Errorf("RecvObjectList from %d: %d objects, want %d", from, len(got), len(want))
		}
		for i := range want {
			if !bytes.Equal(got[i], want[i]) {
				return fmt.Errorf("RecvObjectList from %d: object %d is %q, want %q", from, i, got[i], want[i])
			}
		}
		return nil
	}
	send := func(objs [][]byte, dst int) error {
		if err := pg.SendObjectList(ctx, objs, dst); err != nil {
			return fmt.Errorf("SendObjectList to %d: %w", dst, err)
		}
		return nil
	}
	// Even ranks send first, odd ranks receive first.
	for _, count := range []int{-1, 0} { // -1: the ranks' own lists
		objs, want := list(r), len(list(prev))
		if count == 0 {
			objs, want = nil, 0
		}
		steps := []func() error{func() error { return send(objs, next) }, func() error { return recv(want, prev) }}
		if r%2 == 1 {
			steps[0], steps[1] = steps[1], steps[0]
		}
		for _, step := range steps {
			if err := step(); err != nil {
				return err
			}
		}
	}
	// AnySource: every other rank sends rank 0 a list of two blobs; rank 0
	// takes them in arrival order and learns each sender.
	pair := func(r int) [][]byte { return [][]byte{blob(r), []byte(fmt.Sprint("from ", r))} }
	if r != 0 {
		return send(pair(r), 0)
	}
	seen := map[int]bool{}
	for i := 1; i < n; i++ {
		got, from, err := pg.RecvObjectList(ctx, 2, comm.AnySource)
		if err != nil {
			return fmt.Errorf("RecvObjectList(AnySource): %w", err)
		}
		if from < 1 || from >= n || seen[from] {
			return fmt.Errorf("RecvObjectList(AnySource): sender %d (seen %v)", from, seen)
		}
		seen[from] = true
		if want := pair(from); len(got) != 2 || !bytes.Equal(got[0], want[0]) || !bytes.Equal(got[1], want[1]) {
			return fmt.Errorf("RecvObjectList(AnySource) from %d: %q, want %q", from, got, want)
		}
	}
	return nil
}

// checkSubgroups: NewGroup of the odd ranks (the others get rank -1) and
// Split by parity ordered by descending rank, each running collectives,
// and the world group still working afterwards.
func checkSubgroups(ctx context.Context, pg *comm.ProcessGroup) error {
	n := pg.Size()
	if n < 2 {
		return nil
	}
	g := pg.Ranks()[pg.Rank()]
	var odd []int
	oddSum := int64(0)
	for i := n - 1; i >= 0; i-- {
		if i%2 == 1 {
			odd = append(odd, i)
			oddSum += int64(i)
		}
	}
	og, err := pg.NewGroup(ctx, odd)
	if err != nil {
		return err
	}
	defer og.Destroy(ctx)
	if g%2 == 0 {
		if og.Rank() != -1 || og.AllReduce(ctx, comm.HostBuffer([]int64{1}), comm.Sum).Err() != nil {
			return fmt.Errorf("non-member got rank %d", og.Rank())
		}
	} else {
		s := []int64{int64(g)}
		if err := og.AllReduce(ctx, comm.HostBuffer(s), comm.Sum).Wait(ctx); err != nil {
			return err
		}
		if s[0] != oddSum || og.Rank() != g/2 {
			return fmt.Errorf("odd group: sum %d rank %d, want %d and %d", s[0], og.Rank(), oddSum, g/2)
		}
	}
	sp, err := pg.Split(ctx, g%2, -g)
	if err != nil {
		return err
	}
	defer sp.Destroy(ctx)
	order := make([]int64, sp.Size())
	if err := sp.AllGatherInto(ctx, comm.HostBuffer(order), comm.HostBuffer([]int64{int64(g)})).Wait(ctx); err != nil {
		return err
	}
	var want []int64
	var wantRanks []int
	for i := n - 1; i >= 0; i-- {
		if i%2 == g%2 {
			want = append(want, int64(i))
			wantRanks = append(wantRanks, i)
		}
	}
	if !slices.Equal(order, want) || !slices.Equal(sp.Ranks(), wantRanks) {
		return fmt.Errorf("split group order %v ranks %v, want %v", order, sp.Ranks(), want)
	}
	return pg.Barrier(ctx).Wait(ctx)
}

// checkMismatch: ranks launching different collectives at one seq fail
// with ErrMismatch describing both sides, promptly. It runs on a fresh
// subgroup (a mismatch breaks that communicator, not the world).
func checkMismatch(ctx context.Context, pg *comm.ProcessGroup) error {
	n := pg.Size()
	if n < 2 {
		return nil
	}
	sub, err := pg.NewGroup(ctx, pg.Ranks(), comm.WithGroupName(pg.Name()+".mismatch"))
	if err != nil {
		return err
	}
	defer sub.Destroy(ctx)
	buf := comm.HostBuffer(make([]float32, 1024))
	var w *comm.Work
	if sub.Rank() == 0 {
		w = sub.AllReduce(ctx, buf, comm.Sum)
	} else {
		w = sub.Broadcast(ctx, buf, 0)
	}
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second) // generous on a loaded machine; the goal is < 1 s
	defer cancel()
	start := time.Now()
	err = w.Wait(wctx)
	d := time.Since(start)
	// Keep every rank's broken communicator open until all have seen
	// their error (a closed peer would otherwise read as a transport error).
	if berr := pg.Barrier(ctx).Wait(ctx); berr != nil {
		return berr
	}
	if !errors.Is(err, comm.ErrMismatch) {
		return fmt.Errorf("got %v, want ErrMismatch", err)
	}
	if sub.Rank() <= 1 && (!strings.Contains(err.Error(), "AllReduce(float32×1024") || !strings.Contains(err.Error(), "Broadcast(float32×1024, root 0)")) {
		return fmt.Errorf("mismatch error does not describe both sides: %v", err)
	}
	if d > time.Second {
		fmt.Printf("rank %d: mismatch detected after %v (goal 1 s; machine loaded?)\n", pg.Rank(), d)
	}
	return nil
}

// checkBatchP2PSelf: BatchP2P returns one Work per op, all sharing the
// batch's P2P seq, receives reporting their peer; sends to self pair with
// receives from self by tag in list order (NCCL allows self send/recv in a
// group). With one rank the ring exchange is itself a self pair.
func checkBatchP2PSelf(ctx context.Context, pg *comm.ProcessGroup) error {
	n, r := pg.Size(), pg.Rank()
	next, prev := (r+1)%n, (r-1+n)%n
	ring, s1, s2a, s2b := make([]int64, 9), make([]float32, 4), make([]int64, 9), make([]int64, 9)
	ops := []comm.P2POp{
		{Op: comm.OpRecv, Buf: comm.HostBuffer(s1), Peer: r, Tag: 1},
		{Op: comm.OpRecv, Buf: comm.HostBuffer(ring), Peer: prev, Tag: 0},
		{Op: comm.OpSend, Buf: comm.HostBuffer(fill(9, int64(100+r))), Peer: r, Tag: 2},
		{Op: comm.OpSend, Buf: comm.HostBuffer(fill(4, float32(10+r))), Peer: r, Tag: 1},
		{Op: comm.OpSend, Buf: comm.HostBuffer(fill(9, int64(r))), Peer: next, Tag: 0},
		{Op: comm.OpSend, Buf: comm.HostBuffer(fill(9, int64(200+r))), Peer: r, Tag: 2},
		{Op: comm.OpRecv, Buf: comm.HostBuffer(s2a), Peer: r, Tag: 2},
		{Op: comm.OpRecv, Buf: comm.HostBuffer(s2b), Peer: r, Tag: 2},
	}
	works, err := pg.BatchP2P(ctx, ops)
	if err != nil {
		return err
	}
	if len(works) != len(ops) {
		return fmt.Errorf("BatchP2P returned %d Works for %d ops", len(works), len(ops))
	}
	if err := comm.WaitAll(ctx, works); err != nil {
		return err
	}
	for i, w := range works {
		src := -1
		if ops[i].Op == comm.OpRecv {
			src = ops[i].Peer
		}
		if w.OpType() != ops[i].Op || w.Seq() == 0 || w.Seq() != works[0].Seq() || w.Source() != src {
			return fmt.Errorf("works[%d]: type %v seq %d (works[0] seq %d) source %d; want %v, one shared seq, source %d",
				i, w.OpType(), w.Seq(), works[0].Seq(), w.Source(), ops[i].Op, src)
		}
	}
	if err := errors.Join(allEqual(ring, int64(prev)), allEqual(s1, float32(10+r)), allEqual(s2a, int64(100+r)), allEqual(s2b, int64(200+r))); err != nil {
		return fmt.Errorf("batch with self sends: %w", err)
	}
	// The group still runs collectives and P2P afterwards (nothing stray
	// was left in a transport by the self pairs).
	return checkBarrier(ctx, pg)
}

// rankChecks run on every rank, in this order, in-process (TestCPU) and as
// separate processes (TestMultiProcess).
var rankChecks = []struct {
	name string
	fn   func(ctx context.Context, pg *comm.ProcessGroup) error
}{
	{"AllReduce", checkAllReduce},
	{"Broadcast", checkBroadcast},
	{"AllGather", checkAllGather},
	{"ReduceScatter", checkReduceScatter},
	{"AllToAll", checkAllToAll},
	{"GatherScatter", checkGatherScatter},
	{"Barrier", checkBarrier},
	{"SendRecv", checkSendRecv},
	{"BatchCoalesce", checkBatchCoalesce},
	{"BatchP2PSelf", checkBatchP2PSelf},
	{"MonitoredBarrier", checkMonitoredBarrier},
	{"Objects", checkObjects},
	{"ObjectList", checkObjectList},
	{"Subgroups", checkSubgroups},
	{"LocalGroups", checkLocalGroups},
	{"NewSubgroups", checkNewSubgroups},
	{"Mismatch", checkMismatch},
}

// TestCPU runs every check for world sizes 1 to 4 with ranks as goroutines
// of this process (in-memory transport).
func TestCPU(t *testing.T) {
	for _, n := range worldSizes {
		t.Run(fmt.Sprint("n=", n), func(t *testing.T) {
			pgs := cpuWorld(t, n)
			for _, c := range rankChecks {
				t.Run(c.name, func(t *testing.T) { onRanks(t, pgs, c.fn) })
			}
		})
	}
}

// TestCPUAbort: a collective stuck waiting for a peer that never launches
// it fails with ErrAborted soon after ProcessGroup.Abort, which reaches the
// engine without queueing behind the mailbox.
func TestCPUAbort(t *testing.T) {
	pgs := cpuWorld(t, 2)
	ctx := context.Background()
	w := pgs[0].AllReduce(ctx, comm.HostBuffer(make([]float32, 1<<20)), comm.Sum)
	time.Sleep(50 * time.Millisecond)
	if w.IsCompleted() {
		t.Fatalf("allreduce completed without its peer: %v", w.Err())
	}
	start := time.Now()
	pgs[0].Abort(errors.New("test abort"))
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	err := w.Wait(wctx)
	if !errors.Is(err, comm.ErrAborted) || !strings.Contains(err.Error(), "test abort") {
		t.Fatalf("aborted allreduce: %v", err)
	}
	t.Logf("aborted after %v", time.Since(start))
	if err := pgs[0].Barrier(ctx).Wait(wctx); !errors.Is(err, comm.ErrAborted) {
		t.Fatalf("op after Abort: %v, want ErrAborted", err)
	}
}

// TestObjectListCountMismatch: a receiver asking for fewer objects than
// the sender sent fails with ErrMismatch (the sizes message differs in
// length) rather than hanging or misreading the payload. The sender's
// SendObjectList, like any Send, may complete once its data has left
// (docs/semantics.md), but the mismatch breaks the communicator, so its
// next op fails.
func TestObjectListCountMismatch(t *testing.T) {
	pgs := cpuWorld(t, 2)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	errs := make([]error, 2)
	err := testrank.Ranks(2, 30*time.Second, func(r int) error {
		if r == 0 {
			if errs[0] = pgs[0].SendObjectList(ctx, [][]byte{[]byte("a"), []byte("bc"), []byte("def")}, 1); errs[0] == nil {
				errs[0] = pgs[0].Barrier(ctx).Wait(ctx)
			}
		} else {
			_, _, errs[1] = pgs[1].RecvObjectList(ctx, 2, 0)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if !errors.Is(errs[1], comm.ErrMismatch) || !strings.Contains(errs[1].Error(), "Send(int64×3, peer 1)") {
		t.Errorf("receiver asking for 2 of 3 objects: %v, want ErrMismatch naming the sender's 3 sizes", errs[1])
	}
	if !errors.Is(errs[0], comm.ErrMismatch) && !errors.Is(errs[0], comm.ErrRemoteAbort) {
		t.Errorf("sender of 3 objects to a receiver of 2: %v, want the send or its next op to fail with ErrMismatch or ErrRemoteAbort", errs[0])
	}
}
