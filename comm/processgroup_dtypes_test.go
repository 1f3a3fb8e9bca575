package comm_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/ranktree/ranktree/comm"
)

// cv is rank r's complex test value: real and imaginary parts differ, so a
// reduction that dropped or swapped a part would show.
func cv[C complex64 | complex128](r int) C { return C(complex(float64(r+1), -float64(2*r+1))) }

// checkComplexOf runs the collectives torch allows on complex tensors with
// element type C (complex64 or complex128), as distributed_test.py's
// *_complex tests: all_reduce with sum, avg and premul_sum (Σ(r+1) -
// Σ(2r+1)i = n(n+1)/2 - n²i), broadcast from every root, all_gather (list
// and flat), scatter, all_to_all (list form and all_to_all_single),
// gather, reduce (sum) and send/recv.
func checkComplexOf[C complex64 | complex128](ctx context.Context, pg *comm.ProcessGroup) error {
	n, r := pg.Size(), pg.Rank()
	dt := comm.DTypeOf[C]()
	nf := float64(n)
	sum := complex(nf*(nf+1)/2, -nf*nf)
	for _, c := range []struct {
		red  comm.ReduceOp
		want complex128
	}{{comm.Sum, sum}, {comm.Avg, sum / complex(nf, 0)}, {comm.PreMulSum(2), 2 * sum}} {
		buf := fill(5, cv[C](r))
		if err := pg.AllReduce(ctx, comm.HostBuffer(buf), c.red).Wait(ctx); err != nil {
			return fmt.Errorf("%v all_reduce %v: %w", dt, c.red, err)
		}
		if err := allEqual(buf, C(c.want)); err != nil {
			return fmt.Errorf("%v all_reduce %v: %w", dt, c.red, err)
		}
	}
	for root := range n {
		buf := make([]C, 3)
		if r == root {
			buf = fill(3, cv[C](root))
		}
		if err := pg.Broadcast(ctx, comm.HostBuffer(buf), root).Wait(ctx); err != nil {
			return err
		}
		if err := allEqual(buf, cv[C](root)); err != nil {
			return fmt.Errorf("%v broadcast from %d: %w", dt, root, err)
		}
	}
	outs, bufs := make([][]C, n), make([]comm.Buffer, n)
	for i := range outs {
		outs[i] = make([]C, 2)
		bufs[i] = comm.HostBuffer(outs[i])
	}
	if err := pg.AllGather(ctx, bufs, comm.HostBuffer(fill(2, cv[C](r)))).Wait(ctx); err != nil {
		return err
	}
	for i := range outs {
		if err := allEqual(outs[i], cv[C](i)); err != nil {
			return fmt.Errorf("%v all_gather part %d: %w", dt, i, err)
		}
	}
	flat := make([]C, 2*n)
	if err := pg.AllGatherInto(ctx, comm.HostBuffer(flat), comm.HostBuffer(fill(2, cv[C](r)))).Wait(ctx); err != nil {
		return err
	}
	for i := range n {
		if err := allEqual(flat[2*i:2*i+2], cv[C](i)); err != nil {
			return fmt.Errorf("%v all_gather_into_tensor part %d: %w", dt, i, err)
		}
	}
	var ins []comm.Buffer
	if r == 0 {
		for i := range n {
			ins = append(ins, comm.HostBuffer(fill(4, cv[C](10+i))))
		}
	}
	got := make([]C, 4)
	if err := pg.Scatter(ctx, comm.HostBuffer(got), ins, 0).Wait(ctx); err != nil {
		return err
	}
	if err := allEqual(got, cv[C](10+r)); err != nil {
		return fmt.Errorf("%v scatter: %w", dt, err)
	}
	// all_to_all: rank r sends cv(100r+j) to rank j.
	sendL, recvL := make([]comm.Buffer, n), make([]comm.Buffer, n)
	recv := make([][]C, n)
	for j := range n {
		sendL[j] = comm.HostBuffer(fill(j+1, cv[C](100*r+j)))
		recv[j] = make([]C, r+1)
		recvL[j] = comm.HostBuffer(recv[j])
	}
	if err := pg.AllToAll(ctx, recvL, sendL).Wait(ctx); err != nil {
		return err
	}
	for j := range n {
		if err := allEqual(recv[j], cv[C](100*j+r)); err != nil {
			return fmt.Errorf("%v all_to_all from %d: %w", dt, j, err)
		}
	}
	single := make([]C, n)
	src := make([]C, n)
	for j := range src {
		src[j] = cv[C](100*r + j)
	}
	if err := pg.AllToAllSingle(ctx, comm.HostBuffer(single), comm.HostBuffer(src), nil, nil).Wait(ctx); err != nil {
		return err
	}
	for j := range n {
		if single[j] != cv[C](100*j+r) {
			return fmt.Errorf("%v all_to_all_single from %d: %v", dt, j, single[j])
		}
	}
	// gather to the last rank, and reduce (sum) to rank 0.
	var gl []comm.Buffer
	gathered := make([][]C, n)
	if r == n-1 {
		for i := range n {
			gathered[i] = make([]C, 2)
			gl = append(gl, comm.HostBuffer(gathered[i]))
		}
	}
	if err := pg.Gather(ctx, gl, comm.HostBuffer(fill(2, cv[C](r))), n-1).Wait(ctx); err != nil {
		return err
	}
	for i := range gl {
		if err := allEqual(gathered[i], cv[C](i)); err != nil {
			return fmt.Errorf("%v gather part %d: %w", dt, i, err)
		}
	}
	red := fill(3, cv[C](r))
	if err := pg.Reduce(ctx, comm.HostBuffer(red), 0, comm.Sum).Wait(ctx); err != nil {
		return err
	}
	want := cv[C](r) // non-roots keep their buffer
	if r == 0 {
		want = C(sum)
	}
	if err := allEqual(red, want); err != nil {
		return fmt.Errorf("%v reduce: %w", dt, err)
	}
	// send/recv around the ring.
	if n > 1 {
		got := make([]C, 4)
		ws := pg.ISend(ctx, comm.HostBuffer(fill(4, cv[C](r))), (r+1)%n, 7)
		wr := pg.IRecv(ctx, comm.HostBuffer(got), (r+n-1)%n, 7)
		for _, w := range []*comm.Work{ws, wr} {
			if err := w.Wait(ctx); err != nil {
				return err
			}
		}
		if err := allEqual(got, cv[C]((r+n-1)%n)); err != nil {
			return fmt.Errorf("%v send/recv: %w", dt, err)
		}
	}
	return nil
}

// checkComplex: checkComplexOf for complex64 and complex128.
func checkComplex(ctx context.Context, pg *comm.ProcessGroup) error {
	if err := checkComplexOf[complex64](ctx, pg); err != nil {
		return err
	}
	return checkComplexOf[complex128](ctx, pg)
}

// TestComplexDType: torch's names, sizes and predicates for the complex
// dtypes, and fingerprints that print the dtype's name.
func TestComplexDType(t *testing.T) {
	for _, c := range []struct {
		dt         comm.DType
		name       string
		size       int
		real       comm.DType
		aliases    []string
		fromGoType comm.DType
	}{
		{comm.Complex64, "complex64", 8, comm.Float32, []string{"complex64", "cfloat"}, comm.DTypeOf[complex64]()},
		{comm.Complex128, "complex128", 16, comm.Float64, []string{"complex128", "cdouble"}, comm.DTypeOf[complex128]()},
	} {
		if !c.dt.Valid() || c.dt.String() != c.name || c.dt.Size() != c.size || c.dt.Real() != c.real ||
			!c.dt.IsComplex() || c.dt.IsFloating() || c.dt.IsIntegral() || c.fromGoType != c.dt {
			t.Errorf("%v: name %q size %d real %v complex %v floating %v", c.dt, c.dt.String(), c.dt.Size(), c.dt.Real(), c.dt.IsComplex(), c.dt.IsFloating())
		}
		for _, a := range c.aliases {
			if got, err := comm.ParseDType(a); err != nil || got != c.dt {
				t.Errorf("ParseDType(%q) = %v, %v", a, got, err)
			}
		}
		if !slices.Contains(comm.AllDTypes, c.dt) {
			t.Errorf("AllDTypes lacks %v", c.dt)
		}
		b := comm.NewHostBuffer(c.dt, 3)
		if b.NumBytes() != 3*c.size || b.String() != c.name+"×3" {
			t.Errorf("buffer %v: %d bytes", b, b.NumBytes())
		}
		fp := comm.Fingerprint{Seq: 4, Op: comm.OpAllReduce, DType: c.dt, RedOp: comm.RedAvg, Count: 3, Root: -1}
		if got, want := fp.String(), "seq 4 AllReduce("+c.name+"×3, avg)"; got != want {
			t.Errorf("fingerprint %q, want %q", got, want)
		}
		for _, op := range []comm.ReduceOp{comm.Sum, comm.Avg, comm.PreMulSum(-0.5)} {
			if err := op.Check(c.dt); err != nil {
				t.Errorf("%v on %v: %v", op, c.dt, err)
			}
		}
		for _, op := range []comm.ReduceOp{comm.Product, comm.Min, comm.Max, comm.BAnd, comm.BOr, comm.BXor} {
			err := op.Check(c.dt)
			if !errors.Is(err, comm.ErrInvalidArgument) || !strings.Contains(err.Error(), c.name) || !strings.Contains(err.Error(), op.Type().String()) {
				t.Errorf("%v on %v: %v, want ErrInvalidArgument naming both", op, c.dt, err)
			}
		}
	}
	if _, err := comm.ParseDType("complex32"); !errors.Is(err, comm.ErrInvalidArgument) {
		t.Errorf("complex32 (torch's chalf) accepted: %v", err)
	}
}

// checkShapes: collectives over shaped buffers whose shapes agree succeed
// with the values they would have without shapes, and a 1-D shape is the
// same op as none (one rank passes WithShape(n), the others nothing).
func checkShapes(ctx context.Context, pg *comm.ProcessGroup) error {
	n, r := pg.Size(), pg.Rank()
	a := fill(6, float32(r+1))
	if err := pg.AllReduce(ctx, comm.HostBuffer(a).WithShape(2, 3), comm.Sum).Wait(ctx); err != nil {
		return err
	}
	if err := allEqual(a, float32(n*(n+1)/2)); err != nil {
		return fmt.Errorf("shaped all_reduce: %w", err)
	}
	b := comm.HostBuffer(fill(4, int64(r)))
	if r == 0 {
		b = b.WithShape(4)
	}
	if err := pg.AllReduce(ctx, b, comm.Max).Wait(ctx); err != nil {
		return fmt.Errorf("1-D shape against none: %w", err)
	}
	c := fill(6, int32(r))
	if err := pg.Broadcast(ctx, comm.HostBuffer(c).WithShape(3, 1, 2), n-1).Wait(ctx); err != nil {
		return err
	}
	if err := allEqual(c, int32(n-1)); err != nil {
		return fmt.Errorf("shaped broadcast: %w", err)
	}
	flat := make([]float64, 4*n)
	if err := pg.AllGatherInto(ctx, comm.HostBuffer(flat).WithShape(n, 2, 2), comm.HostBuffer(fill(4, float64(r))).WithShape(2, 2)).Wait(ctx); err != nil {
		return err
	}
	for i := range n {
		if err := allEqual(flat[4*i:4*i+4], float64(i)); err != nil {
			return fmt.Errorf("shaped all_gather part %d: %w", i, err)
		}
	}
	scalar := []float64{float64(r)}
	if err := pg.AllReduce(ctx, comm.HostBuffer(scalar).WithShape(), comm.Sum).Wait(ctx); err != nil {
		return err
	}
	if scalar[0] != float64(n*(n-1)/2) {
		return fmt.Errorf("0-dim all_reduce: %v", scalar[0])
	}
	return nil
}

// unevenOf runs the uneven list forms for element type T (conv makes a T
// from a small integer, exactly): all_gather with out[i] of i+1 elements,
// rank i's input being i+1 copies of conv(10i+1) (torch all_gather with
// tensors of different sizes per rank), and reduce_scatter whose input
// list has in[i] of 2i+1 elements, rank r's in[i][k] = conv(r+k+1), so
// rank i receives Σ_r (r+k+1) = n(n+1)/2 + n·k at element k (torch
// reduce_scatter with a list of different-size inputs).
func unevenOf[T comm.Elem](ctx context.Context, pg *comm.ProcessGroup, conv func(int) T) error {
	n, r := pg.Size(), pg.Rank()
	dt := comm.DTypeOf[T]()
	outs, bufs := make([][]T, n), make([]comm.Buffer, n)
	for i := range n {
		outs[i] = make([]T, i+1)
		bufs[i] = comm.HostBuffer(outs[i])
	}
	if err := pg.AllGather(ctx, bufs, comm.HostBuffer(fill(r+1, conv(10*r+1)))).Wait(ctx); err != nil {
		return fmt.Errorf("%v uneven all_gather: %w", dt, err)
	}
	for i := range n {
		if err := allEqual(outs[i], conv(10*i+1)); err != nil {
			return fmt.Errorf("%v uneven all_gather part %d: %w", dt, i, err)
		}
	}
	if dt == comm.Bool {
		return nil // sums of bools are logical or: the all_gather is the check
	}
	in := make([]comm.Buffer, n)
	for i := range n {
		s := make([]T, 2*i+1)
		for k := range s {
			s[k] = conv(r + k + 1)
		}
		in[i] = comm.HostBuffer(s)
	}
	out := make([]T, 2*r+1)
	if err := pg.ReduceScatter(ctx, comm.HostBuffer(out), in, comm.Sum).Wait(ctx); err != nil {
		return fmt.Errorf("%v uneven reduce_scatter: %w", dt, err)
	}
	for k := range out {
		if want := conv(n*(n+1)/2 + n*k); out[k] != want {
			return fmt.Errorf("%v uneven reduce_scatter element %d: %v, want %v", dt, k, out[k], want)
		}
	}
	return nil
}

// checkUnevenLists: the uneven list forms over float32, bfloat16, int8,
// int64, bool and complex128.
func checkUnevenLists(ctx context.Context, pg *comm.ProcessGroup) error {
	for _, f := range []func() error{
		func() error { return unevenOf(ctx, pg, func(v int) float32 { return float32(v) }) },
		func() error {
			return unevenOf(ctx, pg, func(v int) comm.BFloat16Value { return comm.BFloat16FromFloat32(float32(v)) })
		},
		func() error { return unevenOf(ctx, pg, func(v int) int8 { return int8(v) }) },
		func() error { return unevenOf(ctx, pg, func(v int) int64 { return int64(-v) }) },
		func() error { return unevenOf(ctx, pg, func(v int) bool { return v%2 == 1 }) },
		func() error {
			return unevenOf(ctx, pg, func(v int) complex128 { return complex(float64(v), -0.5*float64(v)) })
		},
	} {
		if err := f(); err != nil {
			return err
		}
	}
	return nil
}
