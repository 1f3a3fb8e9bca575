package comm_test

import (
	"errors"
	"math"
	"slices"
	"strings"
	"testing"
	"testing/quick"

	"github.com/ranktree/ranktree/comm"
)

// TestWithShape: WithShape copies the dims, Shape returns a copy, Slice
// drops the shape, and CheckShape reports negative dims, overflow and a
// product that is not the length (torch's "shape '[2, 5]' is invalid for
// input of size 12") with ErrInvalidArgument.
func TestWithShape(t *testing.T) {
	dims := []int{3, 4}
	b := comm.HostBuffer(make([]float32, 12)).WithShape(dims...)
	dims[0] = 99
	if got := b.Shape(); !slices.Equal(got, []int{3, 4}) || !b.HasShape() || b.CheckShape() != nil {
		t.Fatalf("shape %v (has %v, check %v)", got, b.HasShape(), b.CheckShape())
	}
	b.Shape()[0] = 7
	if got := b.Shape(); got[0] != 3 {
		t.Fatal("Shape does not return a copy")
	}
	if b.String() != "float32×12 [3, 4]" {
		t.Fatalf("String = %q", b.String())
	}
	if s := b.Slice(0, 6); s.HasShape() || s.Shape() != nil || s.ShapeKey() != 0 {
		t.Fatalf("Slice kept the shape: %v", s)
	}
	flat := comm.HostBuffer(make([]float32, 12))
	if flat.HasShape() || flat.Shape() != nil || flat.ShapeKey() != 0 || flat.CheckShape() != nil {
		t.Fatal("a buffer without a shape")
	}
	if k := flat.WithShape(12).ShapeKey(); k != 0 {
		t.Fatalf("a 1-D shape is the same op as none: key %#x", k)
	}
	scalar := comm.HostBuffer([]float64{2}).WithShape()
	if got := scalar.Shape(); got == nil || len(got) != 0 || scalar.CheckShape() != nil || scalar.ShapeKey() == 0 {
		t.Fatalf("0-dim shape: %v, key %#x, %v", got, scalar.ShapeKey(), scalar.CheckShape())
	}
	for _, c := range []struct {
		dims []int
		want string
	}{
		{[]int{2, 5}, "shape [2, 5] holds 10 elements but the buffer has 12"},
		{[]int{-3, -4}, "negative dimension -3"},
		{[]int{math.MaxInt / 2, 4}, "more elements than an int holds"},
		{[]int{}, "shape [] holds 1 elements"},
	} {
		err := comm.HostBuffer(make([]float32, 12)).WithShape(c.dims...).CheckShape()
		if !errors.Is(err, comm.ErrInvalidArgument) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: %v, want ErrInvalidArgument with %q", c.dims, err, c.want)
		}
	}
	if err := comm.NewHostBuffer(comm.Int8, 0).WithShape(0, 7).CheckShape(); err != nil {
		t.Errorf("[0, 7] of an empty buffer: %v", err)
	}
}

// TestShapeKeyQuick: shapes of one element count have equal keys only if
// they are equal, and packed keys give the shape back (testing/quick over
// random 2- to 6-dim shapes, plus zero dims and large ones that hash).
func TestShapeKeyQuick(t *testing.T) {
	prop := func(raw []uint16, k uint8, zeroAt uint8, big bool) bool {
		nd := int(k%5) + 2
		dims := make([]int, nd)
		count := int64(1)
		for i := range dims {
			d := 1
			if i < len(raw) {
				d = int(raw[i]%9) + 1
			}
			if big && i == 0 {
				d = 1 << 40
			}
			if int(zeroAt)%8 == i {
				d = 0
			}
			dims[i] = d
			count *= int64(d)
		}
		key := comm.ShapeKeyOf(dims)
		if key == 0 {
			return false
		}
		if got, ok := key.Dims(count); ok && !slices.Equal(got, dims) {
			t.Logf("%v → %v", dims, got)
			return false
		}
		// A permutation with the same product differs unless it is equal.
		perm := slices.Clone(dims)
		slices.Reverse(perm)
		return slices.Equal(perm, dims) == (comm.ShapeKeyOf(perm) == key)
	}
	if err := quick.Check(prop, &quick.Config{MaxCount: 2000}); err != nil {
		t.Fatal(err)
	}
	if comm.ShapeKeyOf([]int{0, 5}) == comm.ShapeKeyOf([]int{0, 7}) || comm.ShapeKeyOf([]int{2, 3, 4}) == comm.ShapeKeyOf([]int{2, 12}) {
		t.Fatal("distinct shapes of one count share a key")
	}
}

// TestShapeInMismatchText: fingerprints print their shape after the count,
// and a MismatchError names "shape" as the differing field.
func TestShapeInMismatchText(t *testing.T) {
	a := comm.Fingerprint{Seq: 3, Op: comm.OpAllReduce, DType: comm.Float32, RedOp: comm.RedSum, Count: 12, Root: -1, Shape: comm.ShapeKeyOf([]int{3, 4})}
	c := a
	c.Shape = comm.ShapeKeyOf([]int{2, 2, 3})
	if got, want := a.String(), "seq 3 AllReduce(float32×12 [3, 4], sum)"; got != want {
		t.Fatalf("fingerprint %q, want %q", got, want)
	}
	me := &comm.MismatchError{LocalRank: 0, RemoteRank: 1, Local: a, Remote: c}
	if !slices.Equal(me.Fields(), []string{"shape"}) || !strings.Contains(me.Error(), "[2, 2, 3]") || !strings.Contains(me.Error(), "(shape differ)") {
		t.Fatalf("%v: fields %v", me, me.Fields())
	}
	h := a
	h.Shape = comm.ShapeKeyOf([]int{1 << 40, 1 << 40, 1})
	if s := h.String(); !strings.Contains(s, "float32×12 [#") {
		t.Fatalf("hashed shape prints %q", s)
	}
}
