package nccl_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/rs/zerolog"
	"github.com/x448/float16"

	"github.com/ranktree/ranktree/comm"
	"github.com/ranktree/ranktree/comm/cuda"
	"github.com/ranktree/ranktree/comm/nccl"
	"github.com/ranktree/ranktree/store"
)

// cudaWedged is set once a hung stream could not be released (on a GPU,
// CUDA calls block while an ncclCommAbort waits behind it): cleanups then
// leave device memory and the context alone rather than block the test
// binary, which gpu-check runs such tests alone in.
var cudaWedged atomic.Bool

// env is a test's CUDA context plus helpers to move typed data to and from
// device memory.
type env struct {
	t  testing.TB
	cu *cuda.Lib
	nc *nccl.Lib
}

func newEnv(t testing.TB) *env {
	cu, nc := libs(t)
	lockCtx(t, cu)
	return &env{t: t, cu: cu, nc: nc}
}

func testConfig(group string, size, rank int, st store.Store) comm.BackendConfig {
	return comm.BackendConfig{Group: group, Epoch: 1, Rank: rank, Size: size, Store: st, Device: 0,
		Timeout: 30 * time.Second, Log: zerolog.Nop()}
}

func (v *env) engine(group string, opts nccl.Options) *nccl.Engine {
	v.t.Helper()
	e, err := nccl.New(context.Background(), testConfig(group, 1, 0, store.NewMemStore()), opts)
	if err != nil {
		v.t.Fatalf("nccl.New: %v", err)
	}
	v.t.Cleanup(func() { _ = e.Close() })
	return e
}

// dev copies host bytes into fresh device memory (freed at cleanup) and
// returns it as a device buffer of dt ordered on stream s.
func (v *env) dev(dt comm.DType, host []byte, s cuda.Stream) comm.Buffer {
	v.t.Helper()
	p, err := v.cu.MemAlloc(max(len(host), 1))
	if err != nil {
		v.t.Fatal(err)
	}
	v.t.Cleanup(func() {
		if !cudaWedged.Load() {
			_ = v.cu.MemFree(p)
		}
	})
	if len(host) > 0 {
		if err := v.cu.MemcpyHtoD(p, host); err != nil {
			v.t.Fatal(err)
		}
	}
	return comm.DeviceBuffer(uintptr(p), len(host)/dt.Size(), dt, 0, uintptr(s))
}

// host copies a device buffer back.
func (v *env) host(b comm.Buffer) []byte {
	v.t.Helper()
	out := make([]byte, b.NumBytes())
	if err := v.cu.MemcpyDtoH(out, cuda.DevicePtr(b.DevicePtr())); err != nil {
		v.t.Fatal(err)
	}
	return out
}

// encode returns count elements of dt with element i = f(i), as bytes.
func encode(dt comm.DType, count int, f func(i int) float64) []byte {
	b := make([]byte, count*dt.Size())
	for i := 0; i < count; i++ {
		x := f(i)
		p := unsafe.Pointer(&b[i*dt.Size()])
		switch dt {
		case comm.Float32:
			*(*float32)(p) = float32(x)
		case comm.Float64:
			*(*float64)(p) = x
		case comm.Float16:
			*(*uint16)(p) = float16.Fromfloat32(float32(x)).Bits()
		case comm.BFloat16:
			*(*uint16)(p) = uint16(comm.BFloat16FromFloat32(float32(x)))
		case comm.Int8:
			*(*int8)(p) = int8(x)
		case comm.Uint8:
			*(*uint8)(p) = uint8(x)
		case comm.Int32:
			*(*int32)(p) = int32(x)
		case comm.Int64:
			*(*int64)(p) = int64(x)
		case comm.Bool:
			if x != 0 {
				*(*uint8)(p) = 1
			}
		case comm.Complex64: // imaginary part -2× the real part
			*(*complex64)(p) = complex(float32(x), float32(-2*x))
		case comm.Complex128:
			*(*complex128)(p) = complex(x, -2*x)
		}
	}
	return b
}

// value is the i-th test value of dt: distinct, exact in every dtype.
func value(dt comm.DType, i int) float64 {
	if dt == comm.Bool {
		return float64(i % 2)
	}
	return float64(i%50 + 1)
}

func wait(t testing.TB, w *comm.Work, d time.Duration) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	return w.Wait(ctx)
}

func launch(e *nccl.Engine, op *comm.Op) *comm.Work {
	p := comm.NewPromise(op.Type)
	e.Launch(op, p)
	return p.Work()
}

func fp(t comm.OpType, dt comm.DType, n int, seq uint64) comm.Fingerprint {
	return comm.Fingerprint{Group: comm.GroupHash("g"), Epoch: 1, Seq: seq, Op: t, DType: dt, Count: int64(n), Root: -1}
}

// engineFor makes a one-rank engine (eager init) and an in-place 4-byte
// float32 allreduce op for benchmarks.
func engineFor(b *testing.B, opts nccl.Options) (*nccl.Engine, *comm.Op) {
	v := newEnv(b)
	e := v.engine("bench", opts)
	buf := v.dev(comm.Float32, make([]byte, 4), 0)
	return e, &comm.Op{Type: comm.OpAllReduce, Reduce: comm.Sum, In: []comm.Buffer{buf}}
}

func fakeOnly(t *testing.T) {
	t.Helper()
	if onGPU() {
		t.Skip("fault injection of the fake library; on a GPU see the *GPU tests")
	}
}
