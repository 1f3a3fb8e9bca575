package kernel

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"testing"
	"testing/quick"

	"github.com/ranktree/ranktree/comm"
)

// checkAgainstRef runs fn (Reduce or ReduceParallel) on copies of dst/src
// and compares with the naive reference.
func checkAgainstRef(t *testing.T, fn func(d, s []byte, dt comm.DType, op comm.ReduceOp) error,
	dst, src []byte, dt comm.DType, op comm.ReduceOp) {
	t.Helper()
	want := refReduce(dst, src, dt, op)
	srcBefore := string(src)
	if err := fn(dst, src, dt, op); err != nil {
		t.Fatalf("%v %v len %d: %v", dt, op, len(dst), err)
	}
	if i := firstDiff(dst, want, dt); i >= 0 {
		sz := dt.Size()
		t.Fatalf("%v %v len %d: element %d = % x, want % x", dt, op, len(dst)/sz, i/sz, dst[i:i+sz], want[i:i+sz])
	}
	if string(src) != srcBefore {
		t.Fatalf("%v %v: src was modified", dt, op)
	}
}

// TestReduceQuick checks every valid dtype × op against the reference on
// random inputs of random (small) lengths, with testing/quick.
func TestReduceQuick(t *testing.T) {
	dts, ops := validPairs()
	for k := range dts {
		dt, op := dts[k], ops[k]
		t.Run(fmt.Sprintf("%v/%v", dt, op), func(t *testing.T) {
			sz := dt.Size()
			prop := func(a, b []byte, seed uint64) bool {
				n := min(len(a), len(b)) / sz * sz
				dst, src := alignedBytes(n, 0), alignedBytes(n, 0)
				copy(dst, a)
				copy(src, b)
				randomSpecials(seed, dst, dt)
				want := refReduce(dst, src, dt, op)
				if err := Reduce(dst, src, dt, op); err != nil {
					t.Log(err)
					return false
				}
				return firstDiff(dst, want, dt) < 0
			}
			if err := quick.Check(prop, &quick.Config{MaxCount: 200}); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// randomSpecials sprinkles special float values into b when dt is floating
// or complex.
func randomSpecials(seed uint64, b []byte, dt comm.DType) {
	r := rand.New(rand.NewPCG(seed, 1))
	dt = dt.Real() // complex: each part on its own
	sz := dt.Size()
	if !dt.IsFloating() {
		return
	}
	for i := 0; i+sz <= len(b); i += sz {
		if r.IntN(3) == 0 {
			v := []float64{math.NaN(), math.Inf(1), math.Inf(-1), 0, math.Copysign(0, -1), 1, -7}[r.IntN(7)]
			putFloat(b[i:i+sz], dt, v)
		}
	}
}

// TestReduceLengths covers lengths 0, 1, odd, and around the block sizes,
// for aligned, misaligned and aliased buffers, with Reduce and ReduceParallel.
func TestReduceLengths(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 7))
	dts, ops := validPairs()
	lengths := []int{0, 1, 3, 31, 33, blockElems - 1, blockElems, blockElems + 1, 5001}
	fns := map[string]func(d, s []byte, dt comm.DType, op comm.ReduceOp) error{"Reduce": Reduce, "ReduceParallel": ReduceParallel}
	for k := range dts {
		dt, op := dts[k], ops[k]
		for name, fn := range fns {
			for _, n := range lengths {
				for _, mis := range []int{0, 1, 3} {
					nb := n * dt.Size()
					dst, src := alignedBytes(nb, mis), alignedBytes(nb, (mis*2)%8)
					randomElems(r, dst, dt)
					randomElems(r, src, dt)
					checkAgainstRef(t, fn, dst, src, dt, op)
				}
				// Exact alias: dst[i] = op(dst[i], dst[i]).
				nb := n * dt.Size()
				buf := alignedBytes(nb, 0)
				randomElems(r, buf, dt)
				want := refReduce(buf, buf, dt, op)
				if err := fn(buf, buf, dt, op); err != nil {
					t.Fatalf("%s alias %v %v: %v", name, dt, op, err)
				}
				if i := firstDiff(buf, want, dt); i >= 0 {
					t.Fatalf("%s alias %v %v n=%d: differs at byte %d", name, dt, op, n, i)
				}
			}
		}
	}
}

// TestReduceParallelLarge compares ReduceParallel with the reference on
// buffers above ParallelThreshold, with several goroutines forced.
func TestReduceParallelLarge(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(4))
	r := rand.New(rand.NewPCG(3, 9))
	for _, dt := range []comm.DType{comm.Float32, comm.Float16, comm.Int64, comm.Bool} {
		for _, op := range []comm.ReduceOp{comm.Sum, comm.Max} {
			n := (ParallelThreshold*3)/dt.Size() + 5 // not a multiple of the split
			dst, src := alignedBytes(n*dt.Size(), 0), alignedBytes(n*dt.Size(), 0)
			randomElems(r, dst, dt)
			randomElems(r, src, dt)
			checkAgainstRef(t, ReduceParallel, dst, src, dt, op)
		}
	}
}

// TestReduceSpecialValues pins IEEE and wrapping results that must hold
// regardless of the reference: NaN propagation both ways in Min/Max, ±Inf,
// negative zero, half-precision overflow, integer wrap-around.
func TestReduceSpecialValues(t *testing.T) {
	forEachSIMDPath(t, testReduceSpecialValues)
}

func testReduceSpecialValues(t *testing.T) {
	nan, inf := math.NaN(), math.Inf(1)
	negz := math.Copysign(0, -1)
	type fcase struct {
		op         comm.ReduceOp
		a, b, want float64
	}
	fcases := []fcase{
		{comm.Min, nan, 1, nan}, {comm.Min, 1, nan, nan}, {comm.Max, nan, 1, nan}, {comm.Max, 1, nan, nan},
		{comm.Min, -inf, 1, -inf}, {comm.Max, inf, -inf, inf}, {comm.Min, 2, 1, 1}, {comm.Max, 2, 1, 2},
		{comm.Sum, inf, -inf, nan}, {comm.Sum, inf, 1, inf}, {comm.Sum, negz, negz, negz}, {comm.Sum, negz, 0, 0},
		{comm.Product, negz, 5, negz}, {comm.Product, 0, inf, nan}, {comm.Sum, 1, 2, 3},
		{comm.Min, 0, negz, negz}, {comm.Min, negz, 0, negz}, {comm.Max, negz, 0, 0}, {comm.Max, 0, negz, 0},
		{comm.Avg, 1, 2, 3}, {comm.PreMulSum(4), 1, 2, 3}, // the factor is the engine's job
	}
	for _, dt := range []comm.DType{comm.Float32, comm.Float64, comm.Float16, comm.BFloat16} {
		for _, c := range fcases {
			// Put the special element in the middle of a long buffer, so the
			// SIMD body (not only the scalar tail) handles it.
			const n, at = 100, 37
			dst, src := alignedBytes(n*dt.Size(), 0), alignedBytes(n*dt.Size(), 0)
			for i := 0; i < n; i++ {
				putFloat(dst[i*dt.Size():], dt, 1)
				putFloat(src[i*dt.Size():], dt, 1)
			}
			o := at * dt.Size()
			putFloat(dst[o:], dt, c.a)
			putFloat(src[o:], dt, c.b)
			if err := Reduce(dst, src, dt, c.op); err != nil {
				t.Fatal(err)
			}
			got := getFloat(dst[o:], dt)
			ok := got == c.want && math.Signbit(got) == math.Signbit(c.want) || math.IsNaN(got) && math.IsNaN(c.want)
			if !ok {
				t.Errorf("%v %v(%v, %v) = %v, want %v", dt, c.op, c.a, c.b, got, c.want)
			}
		}
	}
	// float16 overflows to +Inf; bfloat16 keeps float32's range.
	h := alignedBytes(4, 0)
	putFloat(h[0:], comm.Float16, 65504)
	putFloat(h[2:], comm.Float16, 65504)
	if err := Reduce(h[0:2], h[2:4], comm.Float16, comm.Sum); err != nil {
		t.Fatal(err)
	}
	if got := getFloat(h, comm.Float16); !math.IsInf(got, 1) {
		t.Errorf("float16 65504+65504 = %v, want +Inf", got)
	}
	// Integer wrap-around, as torch's integer tensors.
	i8 := []int8{127, -128, -128, 100}
	i8s := []int8{1, -1, -1, 100}
	mustReduce(t, comm.HostBuffer(i8).Bytes()[:2], comm.HostBuffer(i8s).Bytes()[:2], comm.Int8, comm.Sum)
	mustReduce(t, comm.HostBuffer(i8).Bytes()[2:], comm.HostBuffer(i8s).Bytes()[2:], comm.Int8, comm.Product)
	if want := []int8{-128, 127, -128, 16}; fmt.Sprint(i8) != fmt.Sprint(want) {
		t.Errorf("int8 wrap: got %v, want %v", i8, want)
	}
	u8 := []uint8{255, 0}
	mustReduce(t, comm.HostBuffer(u8).Bytes(), comm.HostBuffer([]uint8{1, 1}).Bytes(), comm.Uint8, comm.Sum)
	if u8[0] != 0 || u8[1] != 1 {
		t.Errorf("uint8 wrap: got %v, want [0 1]", u8)
	}
	i32 := []int32{math.MaxInt32, math.MinInt32}
	mustReduce(t, comm.HostBuffer(i32).Bytes(), comm.HostBuffer([]int32{1, -1}).Bytes(), comm.Int32, comm.Sum)
	if i32[0] != math.MinInt32 || i32[1] != math.MaxInt32 {
		t.Errorf("int32 wrap: got %v", i32)
	}
	i64 := []int64{1 << 62, math.MinInt64, -5}
	mustReduce(t, comm.HostBuffer(i64).Bytes(), comm.HostBuffer([]int64{4, -1, 3}).Bytes(), comm.Int64, comm.Product)
	if i64[0] != 0 || i64[1] != math.MinInt64 || i64[2] != -15 {
		t.Errorf("int64 product wrap: got %v", i64)
	}
	// Bool: any non-zero byte is true; results are 0 or 1; c10d's mapping.
	for _, c := range []struct {
		op   comm.ReduceOp
		want []byte
	}{
		{comm.Sum, []byte{0, 1, 1, 1}}, {comm.Max, []byte{0, 1, 1, 1}}, {comm.BOr, []byte{0, 1, 1, 1}},
		{comm.Product, []byte{0, 0, 0, 1}}, {comm.Min, []byte{0, 0, 0, 1}}, {comm.BAnd, []byte{0, 0, 0, 1}},
		{comm.BXor, []byte{0, 1, 1, 0}},
	} {
		d := []byte{0, 0, 2, 7}
		mustReduce(t, d, []byte{0, 1, 0, 1}, comm.Bool, c.op)
		if string(d) != string(c.want) {
			t.Errorf("bool %v: got %v, want %v", c.op, d, c.want)
		}
	}
}

func mustReduce(t *testing.T, dst, src []byte, dt comm.DType, op comm.ReduceOp) {
	t.Helper()
	if err := Reduce(dst, src, dt, op); err != nil {
		t.Fatal(err)
	}
}

// TestReduceErrors checks each rejected call: a typed *Error that unwraps to
// comm.ErrInvalidArgument, names the sizes, and leaves dst untouched.
func TestReduceErrors(t *testing.T) {
	buf := alignedBytes(64, 0)
	for i := range buf {
		buf[i] = byte(i)
	}
	cases := []struct {
		name     string
		dst, src []byte
		dt       comm.DType
		op       comm.ReduceOp
		msg      string
	}{
		{"length mismatch", buf[:16], buf[32:40], comm.Float32, comm.Sum, "lengths differ"},
		{"partial element", buf[:6], buf[32:38], comm.Float32, comm.Sum, "whole number"},
		{"avg on int", buf[:8], buf[32:40], comm.Int32, comm.Avg, "floating dtype"},
		{"premul on bool", buf[:8], buf[32:40], comm.Bool, comm.PreMulSum(2), "floating dtype"},
		{"band on float", buf[:8], buf[32:40], comm.Float64, comm.BAnd, "bitwise"},
		{"bad premul factor", buf[:8], buf[32:40], comm.Float32, comm.PreMulSum(math.Inf(1)), "not finite"},
		{"invalid dtype", buf[:8], buf[32:40], comm.DType(0), comm.Sum, "invalid dtype"},
		{"partial overlap", buf[:16], buf[8:24], comm.Float32, comm.Sum, "overlap"},
	}
	for _, c := range cases {
		for name, fn := range map[string]func(d, s []byte, dt comm.DType, op comm.ReduceOp) error{"Reduce": Reduce, "ReduceParallel": ReduceParallel} {
			before := string(buf)
			err := fn(c.dst, c.src, c.dt, c.op)
			if !errors.Is(err, comm.ErrInvalidArgument) {
				t.Fatalf("%s %s: err = %v, want ErrInvalidArgument", name, c.name, err)
			}
			var ke *Error
			if !errors.As(err, &ke) || ke.Func != name || ke.DstBytes != len(c.dst) || ke.SrcBytes != len(c.src) {
				t.Fatalf("%s %s: err = %#v, want *Error naming %s and the sizes", name, c.name, err, name)
			}
			if !containsFold(err.Error(), c.msg) {
				t.Errorf("%s %s: %q does not say %q", name, c.name, err, c.msg)
			}
			if string(buf) != before {
				t.Errorf("%s %s: buffer modified by a rejected call", name, c.name)
			}
		}
	}
}

func containsFold(s, sub string) bool {
	return len(sub) == 0 || len(s) >= len(sub) && (func() bool {
		for i := 0; i+len(sub) <= len(s); i++ {
			if equalFold(s[i:i+len(sub)], sub) {
				return true
			}
		}
		return false
	})()
}

func equalFold(a, b string) bool {
	for i := range len(a) {
		x, y := a[i]|0x20, b[i]|0x20
		if x != y {
			return false
		}
	}
	return true
}

// FuzzReduce checks Reduce against the reference for fuzzer-chosen bytes,
// dtype, op, misalignment and aliasing. Invalid dtype/op pairs must be
// rejected without touching dst.
//
//	go test -run '^$' -fuzz FuzzReduce -fuzztime 30s ./comm/cpu/kernel/
func FuzzReduce(f *testing.F) {
	f.Add([]byte{1, 2, 3, 4, 5, 6, 7, 8}, []byte{8, 7, 6, 5, 4, 3, 2, 1}, uint8(0), uint8(0), uint8(0), false)
	f.Add([]byte{0, 0, 0xc0, 0x7f, 0, 0, 0x80, 0xff}, []byte{0, 0, 0x80, 0x3f, 0, 0, 0, 0x80}, uint8(0), uint8(3), uint8(1), false)
	f.Add([]byte{0xff, 0x7b, 0x01, 0x80}, []byte{0xff, 0x7b, 0x00, 0x7c}, uint8(2), uint8(4), uint8(0), true)
	f.Add([]byte{127, 255, 0, 2}, []byte{1, 1, 0, 3}, uint8(4), uint8(8), uint8(3), false)
	f.Fuzz(func(t *testing.T, a, b []byte, dtIdx, opIdx, mis uint8, alias bool) {
		dt := comm.AllDTypes[int(dtIdx)%len(comm.AllDTypes)]
		op := allOps[int(opIdx)%len(allOps)]
		n := min(len(a), len(b)) / dt.Size() * dt.Size()
		dst := alignedBytes(n, int(mis%8))
		copy(dst, a)
		src := alignedBytes(n, int(mis/8%8))
		copy(src, b)
		if alias {
			src = dst
		}
		before := string(dst)
		if op.Check(dt) != nil {
			err := Reduce(dst, src, dt, op)
			if !errors.Is(err, comm.ErrInvalidArgument) || string(dst) != before {
				t.Fatalf("%v %v: err %v, dst changed %v", dt, op, err, string(dst) != before)
			}
			return
		}
		want := refReduce(dst, src, dt, op)
		if err := Reduce(dst, src, dt, op); err != nil {
			t.Fatalf("%v %v: %v", dt, op, err)
		}
		if i := firstDiff(dst, want, dt); i >= 0 {
			t.Fatalf("%v %v n=%d: differs at byte %d: % x vs % x", dt, op, n, i, dst, want)
		}
	})
}
