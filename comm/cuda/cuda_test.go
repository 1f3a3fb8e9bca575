package cuda_test

import (
	"bytes"
	"errors"
	"runtime"
	"testing"
	"time"

	"github.com/ranktree/ranktree/comm"
	"github.com/ranktree/ranktree/comm/cuda"
	"github.com/ranktree/ranktree/internal/fakegpu"
)

func TestMain(m *testing.M) { fakegpu.Main(m) }

// onGPU: see fakegpu.OnGPU.
func onGPU() bool { return fakegpu.OnGPU() }

// setup loads the driver (the fake in CI), locks the goroutine's thread
// and makes device 0's primary context current on it.
func setup(t *testing.T) *cuda.Lib {
	t.Helper()
	if !onGPU() {
		fakegpu.Build(t)
		fakegpu.Reset()
	}
	l, err := cuda.Load()
	if err != nil {
		t.Fatalf("cuda.Load: %v", err)
	}
	if err := l.Init(); err != nil {
		t.Fatal(err)
	}
	runtime.LockOSThread()
	t.Cleanup(runtime.UnlockOSThread)
	d, err := l.DeviceGet(0)
	if err != nil {
		t.Fatal(err)
	}
	ctx, err := l.PrimaryCtxRetain(d)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.PrimaryCtxRelease(d) })
	if err := l.CtxSetCurrent(ctx); err != nil {
		t.Fatal(err)
	}
	return l
}

func TestOpenMissingLibrary(t *testing.T) {
	_, err := cuda.Open("/nonexistent/libcuda.so.1")
	if !errors.Is(err, cuda.ErrNoLibrary) || !errors.Is(err, comm.ErrUnsupported) {
		t.Fatalf("Open(missing) = %v; want ErrNoLibrary wrapping comm.ErrUnsupported", err)
	}
	var le *cuda.LoadError
	if !errors.As(err, &le) || len(le.Tried) != 1 || len(le.Errs) != 1 {
		t.Fatalf("want a *LoadError naming the path tried, got %#v", err)
	}
}

func TestDeviceQueries(t *testing.T) {
	l := setup(t)
	v, err := l.DriverVersion()
	if err != nil || v < 11000 {
		t.Fatalf("DriverVersion = %d, %v; want >= 11000", v, err)
	}
	n, err := l.DeviceCount()
	if err != nil || n < 1 {
		t.Fatalf("DeviceCount = %d, %v", n, err)
	}
	d, _ := l.DeviceGet(0)
	name, err := l.DeviceName(d)
	if err != nil || name == "" {
		t.Fatalf("DeviceName = %q, %v", name, err)
	}
	bus, err := l.DevicePCIBusID(d)
	if err != nil || len(bus) < 7 {
		t.Fatalf("DevicePCIBusID = %q, %v", bus, err)
	}
	u, err := l.DeviceUUID(d)
	if err != nil || u == [16]byte{} {
		t.Fatalf("DeviceUUID = %x, %v", u, err)
	}
	if s := cuda.FormatUUID(u); len(s) != 40 || s[:4] != "GPU-" {
		t.Fatalf("FormatUUID = %q", s)
	}
	if _, err := l.DeviceGet(n + 7); err == nil {
		t.Fatal("DeviceGet(out of range) succeeded")
	} else {
		var ce *cuda.Error
		if !errors.As(err, &ce) || !errors.Is(err, comm.ErrEngine) || ce.Name == "" || ce.Call != "cuDeviceGet" {
			t.Fatalf("DeviceGet(out of range) error = %#v; want *cuda.Error wrapping ErrEngine", err)
		}
	}
	least, greatest, err := l.StreamPriorityRange()
	if err != nil || greatest > least {
		t.Fatalf("StreamPriorityRange = %d, %d, %v", least, greatest, err)
	}
	c, err := l.CtxGetCurrent()
	if err != nil || c == 0 {
		t.Fatalf("CtxGetCurrent = %v, %v", c, err)
	}
	t.Logf("driver %d, %d device(s), %q %s %s", v, n, name, bus, cuda.FormatUUID(u))
}

// TestMemoryRoundTrip: host→device, device→device, memset and device→host
// on a stream, checked byte for byte; plus the synchronous copies.
func TestMemoryRoundTrip(t *testing.T) {
	l := setup(t)
	const n = 4099
	s, err := l.StreamCreate(cuda.StreamNonBlocking, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer l.StreamDestroy(s)
	a, err := l.MemAlloc(n)
	if err != nil {
		t.Fatal(err)
	}
	defer l.MemFree(a)
	b, _ := l.MemAlloc(n)
	defer l.MemFree(b)
	src := make([]byte, n)
	for i := range src {
		src[i] = byte(i*7 + 3)
	}
	dst := make([]byte, n)
	must(t, l.MemcpyHtoDAsync(a, src, s))
	must(t, l.MemcpyDtoDAsync(b, a, n, s))
	must(t, l.MemsetD8Async(b, 0x5a, 10, s))
	must(t, l.MemcpyDtoHAsync(dst, b, s))
	must(t, l.StreamSynchronize(s))
	want := append(bytes.Repeat([]byte{0x5a}, 10), src[10:]...)
	if !bytes.Equal(dst, want) {
		t.Fatalf("round trip mismatch at first %d bytes: got %v want %v", 16, dst[:16], want[:16])
	}
	must(t, l.MemcpyHtoD(a, bytes.Repeat([]byte{9}, n)))
	must(t, l.MemcpyDtoH(dst, a))
	if !bytes.Equal(dst, bytes.Repeat([]byte{9}, n)) {
		t.Fatal("synchronous copies mismatch")
	}
	must(t, l.MemsetD32Async(a, 0x01020304, 4, s))
	must(t, l.MemcpyDtoHAsync(dst[:16], a, s))
	must(t, l.StreamSynchronize(s))
	if !bytes.Equal(dst[:4], []byte{4, 3, 2, 1}) || !bytes.Equal(dst[12:16], []byte{4, 3, 2, 1}) {
		t.Fatalf("MemsetD32Async wrote %v", dst[:16])
	}
}

// TestWaitValueHangsStream: a stream waiting on a flag never reaches a
// later event until another stream writes the flag, and StreamWaitEvent
// orders a second stream after the first.
func TestWaitValueHangsStream(t *testing.T) {
	l := setup(t)
	hung, _ := l.StreamCreate(cuda.StreamNonBlocking, 0)
	other, _ := l.StreamCreate(cuda.StreamNonBlocking, 0)
	follower, _ := l.StreamCreate(cuda.StreamNonBlocking, 0)
	defer l.StreamDestroy(hung)
	defer l.StreamDestroy(other)
	defer l.StreamDestroy(follower)
	flag, _ := l.MemAlloc(4)
	defer l.MemFree(flag)
	must(t, l.MemsetD32Async(flag, 0, 1, other))
	must(t, l.StreamSynchronize(other))
	ev, err := l.EventCreate(cuda.EventDisableTiming)
	if err != nil {
		t.Fatal(err)
	}
	defer l.EventDestroy(ev)
	ev2, _ := l.EventCreate(cuda.EventDisableTiming)
	defer l.EventDestroy(ev2)
	if done, err := l.EventQuery(ev); !done || err != nil {
		t.Fatalf("unrecorded event: query = %v, %v; want done", done, err)
	}
	must(t, l.StreamWaitValue32(hung, flag, 1, cuda.StreamWaitValueGEQ))
	must(t, l.EventRecord(ev, hung))
	must(t, l.StreamWaitEvent(follower, ev))
	must(t, l.EventRecord(ev2, follower))
	time.Sleep(20 * time.Millisecond)
	for _, e := range []cuda.Event{ev, ev2} {
		if done, err := l.EventQuery(e); done || err != nil {
			t.Fatalf("event behind a wait-value: query = %v, %v; want not ready", done, err)
		}
	}
	if idle, err := l.StreamQuery(hung); idle || err != nil {
		t.Fatalf("hung stream query = %v, %v", idle, err)
	}
	must(t, l.MemsetD32Async(flag, 1, 1, other))
	deadline := time.Now().Add(10 * time.Second)
	for {
		d1, _ := l.EventQuery(ev)
		d2, _ := l.EventQuery(ev2)
		if d1 && d2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("events did not complete after the flag was written")
		}
		time.Sleep(time.Millisecond)
	}
	must(t, l.EventSynchronize(ev2))
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
