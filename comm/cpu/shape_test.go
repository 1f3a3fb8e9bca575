package cpu

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/ranktree/ranktree/comm"
)

// shapedOp builds rank r's op of one kind over a buffer of 12 float64s
// with shape dims (the engine sees what ProcessGroup would hand it: the
// fingerprint's Shape is the counted buffer's shape key).
func shapedOp(kind comm.OpType, n, r int, dims []int, fp fpFunc) *comm.Op {
	const c = 12
	b := comm.NewHostBuffer(comm.Float64, c).WithShape(dims...)
	for i := range c {
		setF(b, i, float64(r*c+i))
	}
	op := &comm.Op{Type: kind}
	switch kind {
	case comm.OpAllReduce:
		op.FP, op.Reduce, op.In = fp(kind, comm.Float64, c, -1, comm.Sum), comm.Sum, []comm.Buffer{b}
	case comm.OpBroadcast:
		op.FP, op.Root, op.In = fp(kind, comm.Float64, c, 0, comm.ReduceOp{}), 0, []comm.Buffer{b}
	case comm.OpAllGather:
		op.FP, op.In, op.Out = fp(kind, comm.Float64, c, -1, comm.ReduceOp{}), []comm.Buffer{b}, []comm.Buffer{comm.NewHostBuffer(comm.Float64, n*c)}
	case comm.OpReduceScatter:
		op.FP, op.Reduce = fp(kind, comm.Float64, c, -1, comm.Sum), comm.Sum
		op.In, op.Out = []comm.Buffer{comm.NewHostBuffer(comm.Float64, n*c)}, []comm.Buffer{b}
	case comm.OpScatter:
		op.FP, op.Root, op.Out = fp(kind, comm.Float64, c, 0, comm.ReduceOp{}), 0, []comm.Buffer{b}
		if r == 0 {
			op.In = []comm.Buffer{comm.NewHostBuffer(comm.Float64, n*c)}
		}
	}
	op.FP.Shape = b.ShapeKey()
	return op
}

var shapedKinds = []comm.OpType{comm.OpAllReduce, comm.OpBroadcast, comm.OpAllGather, comm.OpReduceScatter, comm.OpScatter}

// TestShapeInFingerprint: on every transport and world size, ops over
// buffers of equal shapes succeed, and when rank 0's buffer is [3, 4]
// while the others' are [4, 3] (same count, same dtype) every rank fails
// with a *comm.MismatchError whose differing fields are exactly "shape"
// and whose text shows both shapes.
func TestShapeInFingerprint(t *testing.T) {
	for _, tr := range testTransports {
		for n := 1; n <= 4; n++ {
			t.Run(fmt.Sprintf("%s/n=%d", tr, n), func(t *testing.T) {
				g := newGroup(t, n, Options{Transport: tr})
				for _, kind := range shapedKinds {
					g.mustRun(kind.Title()+" with equal shapes", func(r int, fp fpFunc) *comm.Op {
						return shapedOp(kind, n, r, []int{3, 4}, fp)
					})
				}
				if n == 1 {
					return
				}
				for _, kind := range shapedKinds {
					g := newGroup(t, n, Options{Transport: tr})
					_, errs := g.run(func(r int, fp fpFunc) *comm.Op {
						dims := []int{4, 3}
						if r == 0 {
							dims = []int{3, 4}
						}
						return shapedOp(kind, n, r, dims, fp)
					})
					for r, err := range errs {
						var me *comm.MismatchError
						if !errors.As(err, &me) {
							t.Fatalf("%v rank %d: %v, want a *comm.MismatchError", kind, r, err)
						}
						if f := me.Fields(); !slices.Equal(f, []string{"shape"}) {
							t.Fatalf("%v rank %d: fields %v, want [shape]: %v", kind, r, f, err)
						}
						if s := err.Error(); !strings.Contains(s, "[3, 4]") || !strings.Contains(s, "[4, 3]") {
							t.Fatalf("%v rank %d: %q does not show both shapes", kind, r, s)
						}
					}
				}
			})
		}
	}
}

// TestShapedAllReduceAllocs: a shape in the fingerprint costs the engine's
// small-op path nothing (TestSmallAllReduceAllocs without shapes).
func TestShapedAllReduceAllocs(t *testing.T) {
	if testing.Short() {
		t.Skip("short")
	}
	for _, tr := range []string{TransportSHM, TransportInmem} {
		t.Run(tr, func(t *testing.T) {
			g := newGroup(t, 2, Options{Transport: tr})
			bufs := []comm.Buffer{comm.NewHostBuffer(comm.Float32, 16).WithShape(2, 8), comm.NewHostBuffer(comm.Float32, 16).WithShape(2, 8)}
			if a := allocsPerAllReduce(t, g, bufs, 30, 100); a != 0 {
				t.Errorf("%s: %v allocations per shaped 64 B allreduce, want 0", tr, a)
			}
		})
	}
}
