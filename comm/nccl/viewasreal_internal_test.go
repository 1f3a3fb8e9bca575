package nccl

import (
	"slices"
	"testing"

	"github.com/ranktree/ranktree/comm"
)

// TestViewAsReal: a complex op is launched as its real view (c10d's
// torch.view_as_real): every complex buffer becomes 2× as many elements
// of the real type at the same device address and stream, split and V
// counts double, real buffers and the op's other fields are kept, and the
// caller's op is not modified.
func TestViewAsReal(t *testing.T) {
	dev := func(ptr uintptr, n int, dt comm.DType) comm.Buffer { return comm.DeviceBuffer(ptr, n, dt, 1, 0x77) }
	op := &comm.Op{Type: comm.OpAllToAll, FP: comm.Fingerprint{Seq: 9, Op: comm.OpAllToAll, DType: comm.Complex128},
		In:         []comm.Buffer{dev(0x1000, 3, comm.Complex128), dev(0x2000, 0, comm.Complex128)},
		Out:        []comm.Buffer{dev(0x3000, 5, comm.Complex128).WithShape(5, 1)},
		SendCounts: []int{3, 0}, RecvCounts: []int{1, 4}}
	v := viewAsReal(op)
	for i, want := range []struct {
		ptr uintptr
		n   int
	}{{0x1000, 6}, {0x2000, 0}} {
		if b := v.In[i]; b.DevicePtr() != want.ptr || b.Len() != want.n || b.DType() != comm.Float64 || b.Device() != 1 || b.Stream() != 0x77 {
			t.Errorf("In[%d] = %v ptr %#x stream %#x", i, b, b.DevicePtr(), b.Stream())
		}
	}
	if b := v.Out[0]; b.DevicePtr() != 0x3000 || b.Len() != 10 || b.DType() != comm.Float64 || b.HasShape() {
		t.Errorf("Out[0] = %v", b)
	}
	if !slices.Equal(v.SendCounts, []int{6, 0}) || !slices.Equal(v.RecvCounts, []int{2, 8}) || v.FP != op.FP || v.Type != op.Type {
		t.Errorf("view %+v", v)
	}
	if op.In[0].DType() != comm.Complex128 || op.In[0].Len() != 3 || !slices.Equal(op.SendCounts, []int{3, 0}) {
		t.Error("viewAsReal changed the caller's op")
	}
	c64 := viewAsReal(&comm.Op{Type: comm.OpAllReduce, Reduce: comm.PreMulSum(0.5), In: []comm.Buffer{dev(0x10, 4, comm.Complex64)}})
	if b := c64.In[0]; b.DType() != comm.Float32 || b.Len() != 8 || c64.Reduce != comm.PreMulSum(0.5) || c64.SendCounts != nil {
		t.Errorf("complex64 all-reduce view: %v, %v", b, c64.Reduce)
	}
}
