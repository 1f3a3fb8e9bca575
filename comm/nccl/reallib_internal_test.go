package nccl

import (
	"context"
	"errors"
	"os"
	"reflect"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/ranktree/ranktree/comm"
	"github.com/ranktree/ranktree/comm/cuda"
)

// The real-library tests load NVIDIA's own libnccl (and libcuda) instead of
// the fake. scripts/reallib-check.sh sets these variables to Debian's
// packages on a machine without a GPU; on a GPU machine they may name the
// installed libraries. Unset (CI), the tests skip.
const (
	envRealNCCL = "RANKTREE_REAL_NCCL_LIB"
	envRealCUDA = "RANKTREE_REAL_CUDA_LIB"
)

func realLib(t *testing.T, env string) string {
	t.Helper()
	p := os.Getenv(env)
	if p == "" {
		t.Skipf("%s unset: no real library to check (scripts/reallib-check.sh sets it)", env)
	}
	return p
}

// TestRealLibrary opens the real libnccl and checks that every entry point
// we bind resolves (the optional ones too, from NCCL 2.19 on), that the
// version, error strings and unique ids answer, and that a nonblocking
// ncclCommInitRankConfig given our Config either completes (on a GPU) or
// fails with a typed *Error carrying ncclGetLastError's text (no GPU).
func TestRealLibrary(t *testing.T) {
	l, err := Open(realLib(t, envRealNCCL))
	if err != nil {
		t.Fatal(err)
	}
	fv := reflect.ValueOf(l.fn)
	for i := range fv.NumField() {
		if fv.Field(i).Uint() == 0 && l.version >= 21900 {
			t.Errorf("entry point %s not resolved in NCCL %s", fv.Type().Field(i).Name, VersionString(l.version))
		}
	}
	if l.commInitRankConfig == nil {
		t.Fatal("ncclCommInitRankConfig not bound")
	}
	if l.version < 21400 {
		t.Fatalf("NCCL %s: nonblocking init needs 2.14+", VersionString(l.version))
	}
	t.Logf("%s: NCCL %s", l.path, VersionString(l.version))
	if s := l.ErrorString(SystemError); s == "" {
		t.Error("ncclGetErrorString(ncclSystemError) is empty")
	}
	a, err := l.GetUniqueID()
	if err != nil {
		t.Fatalf("GetUniqueID: %v", err)
	}
	b, err := l.GetUniqueID()
	if err != nil || a == b || a == (UniqueID{}) {
		t.Fatalf("GetUniqueID gave %x then %x (%v); want two distinct non-zero ids", a.Internal[:16], b.Internal[:16], err)
	}

	cfg := NewConfig(l.version)
	cfg.Blocking = 0
	c, r, err := l.CommInitRankConfig(1, a, 0, cfg)
	for err == nil && r == InProgress {
		time.Sleep(5 * time.Millisecond)
		r, err = l.CommGetAsyncError(c)
	}
	if err == nil && r == Success {
		n, _ := l.CommCount(c)
		rank, _ := l.CommUserRank(c)
		if n != 1 || rank != 0 {
			t.Errorf("one-rank communicator: count %d, rank %d", n, rank)
		}
		if err := l.CommDestroy(c); err != nil {
			t.Error(err)
		}
		t.Log("ncclCommInitRankConfig: one-rank communicator created")
		return
	}
	if err == nil {
		err = l.check("ncclCommGetAsyncError", r, c)
	}
	var ne *Error
	if !errors.As(err, &ne) || !errors.Is(err, comm.ErrEngine) || ne.Code == Success || ne.Msg == "" {
		t.Fatalf("init failure %v (%T) is not a typed *Error with NCCL's text", err, err)
	}
	if ne.Last == "" {
		t.Errorf("init failure %v lacks ncclGetLastError's text", err)
	}
	t.Logf("ncclCommInitRankConfig without a GPU: %v", err)
}

// TestRealEngine starts the NCCL engine over the real libraries. Without a
// GPU, New must return cuInit's typed error promptly and not panic; with
// one, the engine starts, creates its one-rank communicator (EagerInit) and
// closes.
func TestRealEngine(t *testing.T) {
	nl, cl := realLib(t, envRealNCCL), realLib(t, envRealCUDA)
	t.Setenv(LibEnv, nl)
	t.Setenv(cuda.LibEnv, cl)
	if l, err := cuda.Load(); err != nil || l.Path() != cl {
		t.Skipf("this process already loaded another libcuda (%v, %v)", l, err)
	}
	if l, err := Load(); err != nil || l.Path() != nl {
		t.Skipf("this process already loaded another libnccl (%v, %v)", l, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	start := time.Now()
	e, err := New(ctx, comm.BackendConfig{Group: "real", Rank: 0, Size: 1, Device: 0, Timeout: 10 * time.Second,
		Log: zerolog.New(zerolog.NewTestWriter(t))}, Options{EagerInit: true, InitTimeout: 10 * time.Second})
	if err == nil {
		t.Logf("engine started on %+v", e.DeviceInfo())
		if err := e.Close(); err != nil {
			t.Fatal(err)
		}
		return
	}
	var ce *cuda.Error
	if !errors.As(err, &ce) || ce.Call != "cuInit" {
		t.Fatalf("New without a GPU: %v (%T); want cuInit's *cuda.Error", err, err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("New took %v to fail", d)
	}
	t.Logf("New without a GPU, after %v: %v", time.Since(start).Round(time.Microsecond), err)
}
