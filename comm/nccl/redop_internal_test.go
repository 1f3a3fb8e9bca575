package nccl

import (
	"errors"
	"testing"

	"github.com/ranktree/ranktree/comm"
)

// TestRedOpMapping checks c10d's reduction mapping without a library:
// bool Sum → ncclMax, bool Product → ncclMin, Avg needs NCCL 2.10, bitwise
// ops are unsupported.
func TestRedOpMapping(t *testing.T) {
	l := &enqueuer{e: &Engine{nc: &Lib{version: 22807}}}
	b := comm.NewHostBuffer(comm.Bool, 1)
	f := comm.NewHostBuffer(comm.Float32, 1)
	i := comm.NewHostBuffer(comm.Int32, 1)
	cases := []struct {
		ro   comm.ReduceOp
		buf  comm.Buffer
		want RedOp
	}{
		{comm.Sum, b, Max}, {comm.Product, b, Min}, {comm.Max, b, Max}, {comm.Min, b, Min},
		{comm.Sum, f, Sum}, {comm.Product, f, Prod}, {comm.Min, i, Min}, {comm.Max, i, Max}, {comm.Avg, f, Avg},
	}
	for _, c := range cases {
		got, err := l.redOp(&comm.Op{Reduce: c.ro, In: []comm.Buffer{c.buf}}, 0)
		if err != nil || got != c.want {
			t.Errorf("%v on %v → %v, %v; want %v", c.ro, c.buf.DType(), got, err, c.want)
		}
	}
	for _, ro := range []comm.ReduceOp{comm.BAnd, comm.BOr, comm.BXor} {
		if _, err := l.redOp(&comm.Op{Reduce: ro, In: []comm.Buffer{i}}, 0); !errors.Is(err, comm.ErrUnsupported) {
			t.Errorf("%v: %v; want ErrUnsupported", ro, err)
		}
	}
	old := &enqueuer{e: &Engine{nc: &Lib{version: 2908}}}
	if _, err := old.redOp(&comm.Op{Reduce: comm.Avg, In: []comm.Buffer{f}}, 0); !errors.Is(err, comm.ErrUnsupported) {
		t.Errorf("Avg on NCCL 2.9: %v", err)
	}
	if _, err := scalarBytes(comm.Int32, 2); !errors.Is(err, comm.ErrInvalidArgument) {
		t.Errorf("PreMulSum scalar for int32: %v", err)
	}
}
