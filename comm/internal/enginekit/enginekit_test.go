package enginekit

import (
	"context"
	"errors"
	"os"
	"testing"

	"github.com/rs/zerolog"

	"github.com/ranktree/ranktree/comm"
)

func TestGlobalRank(t *testing.T) {
	sub := comm.BackendConfig{Size: 3, GlobalRanks: []int{4, 7, 9}}
	for r, want := range []int{4, 7, 9} {
		if got := GlobalRank(&sub, r); got != want {
			t.Errorf("GlobalRank(sub, %d) = %d, want %d", r, got, want)
		}
	}
	if got := GlobalRank(&comm.BackendConfig{Size: 4}, 2); got != 2 {
		t.Errorf("world GlobalRank(2) = %d", got)
	}
}

// TestInjectFault: each kind strikes only its rank, group and seq; p2p
// ops never match; a crash exits with CrashExitCode.
func TestInjectFault(t *testing.T) {
	faults, err := comm.ParseFaults("hang@rank=7,seq=2;error@rank=7,seq=3;crash@rank=7,seq=4")
	if err != nil {
		t.Fatal(err)
	}
	cfg := comm.BackendConfig{Group: "g", Rank: 1, Size: 2, GlobalRanks: []int{4, 7}, Faults: faults}
	op := func(typ comm.OpType, seq uint64) *comm.Op {
		return &comm.Op{Type: typ, FP: comm.Fingerprint{Seq: seq}}
	}
	code := -1
	exit = func(c int) { code = c }
	defer func() { exit = os.Exit }()
	nop := zerolog.Nop()
	if hang, err := InjectFault(&cfg, "cpu", op(comm.OpAllReduce, 1), &nop); hang || err != nil {
		t.Errorf("seq 1: hang=%v err=%v, want nothing", hang, err)
	}
	if hang, err := InjectFault(&cfg, "cpu", op(comm.OpAllReduce, 2), &nop); !hang || err != nil {
		t.Errorf("seq 2: hang=%v err=%v, want hang", hang, err)
	}
	_, err = InjectFault(&cfg, "nccl", op(comm.OpAllReduce, 3), &nop)
	var ee *comm.EngineError
	if !errors.As(err, &ee) || ee.Engine != "nccl" || ee.Rank != 1 || ee.FP.Seq != 3 {
		t.Errorf("seq 3: %v, want an *EngineError from nccl at seq 3", err)
	}
	if _, err := InjectFault(&cfg, "cpu", op(comm.OpAllReduce, 4), &nop); code != CrashExitCode || err != nil {
		t.Errorf("seq 4: exit code %d, err %v", code, err)
	}
	if hang, err := InjectFault(&cfg, "cpu", op(comm.OpSend, 2), &nop); hang || err != nil {
		t.Errorf("send at seq 2: hang=%v err=%v, want no fault (p2p seq)", hang, err)
	}
	other := cfg
	other.Rank = 0
	if hang, err := InjectFault(&other, "cpu", op(comm.OpAllReduce, 2), &nop); hang || err != nil {
		t.Errorf("rank 4 at seq 2: hang=%v err=%v, want nothing", hang, err)
	}
}

type fakeBackend struct{ comm.Backend }

func TestFactoryNeverTypedNil(t *testing.T) {
	fail := errors.New("no")
	f := Factory(func(context.Context, comm.BackendConfig, int) (*fakeBackend, error) { return nil, fail }, 1)
	b, err := f(context.Background(), comm.BackendConfig{})
	if b != nil || !errors.Is(err, fail) {
		t.Fatalf("got (%v, %v), want (nil, %v)", b, err, fail)
	}
	var got int
	f = Factory(func(_ context.Context, _ comm.BackendConfig, o int) (*fakeBackend, error) {
		got = o
		return &fakeBackend{}, nil
	}, 5)
	if b, err := f(context.Background(), comm.BackendConfig{}); b == nil || err != nil || got != 5 {
		t.Fatalf("got (%v, %v) opts %d", b, err, got)
	}
}

func TestTotalLen(t *testing.T) {
	bufs := []comm.Buffer{comm.HostBuffer(make([]float32, 3)), comm.HostBuffer(make([]float32, 0)), comm.HostBuffer(make([]int64, 5))}
	if n := TotalLen(bufs); n != 8 {
		t.Fatalf("TotalLen = %d, want 8", n)
	}
}
