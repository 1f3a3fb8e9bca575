package nccl_test

import (
	"bytes"
	"context"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/ranktree/ranktree/comm"
	"github.com/ranktree/ranktree/comm/nccl"
	"github.com/ranktree/ranktree/store"
)

// TestMultiRankOneGPU runs 2–4 ranks as engines in one process, all on
// device 0 (NCCL 2.30+ with NCCL_MULTI_RANK_GPU_ENABLE=1), exchanging the
// unique id through a shared store, and checks an allreduce and an
// allgather with per-rank values against the closed form. It needs a real
// GPU: the fake library cannot host several ranks. scripts/gpu-check.sh
// sets RANKTREE_MULTI_RANK=<ranks> when the NCCL version allows.
func TestMultiRankOneGPU(t *testing.T) {
	n, _ := strconv.Atoi(os.Getenv("RANKTREE_MULTI_RANK"))
	if !onGPU() || n < 2 {
		t.Skip("needs RANKTREE_GPU_TESTS=1 and RANKTREE_MULTI_RANK=<2..4> (NCCL 2.30+ with NCCL_MULTI_RANK_GPU_ENABLE=1)")
	}
	v := newEnv(t)
	if v.nc.Version() < 23000 {
		t.Skipf("NCCL %s < 2.30", nccl.VersionString(v.nc.Version()))
	}
	st := store.NewMemStore()
	engines := make([]*nccl.Engine, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for r := 0; r < n; r++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			engines[r], errs[r] = nccl.New(context.Background(), testConfig("multi", n, r, st), nccl.Options{EagerInit: true, InitTimeout: 2 * time.Minute})
		}()
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
		defer engines[r].Close()
	}
	const c = 1024
	sums := make([]comm.Buffer, n)
	outs := make([]comm.Buffer, n)
	ws := make([]*comm.Work, 0, 2*n)
	for r := 0; r < n; r++ {
		sums[r] = v.dev(comm.Float32, encode(comm.Float32, c, func(i int) float64 { return float64(r*1000 + i) }), 0)
		outs[r] = v.dev(comm.Float32, make([]byte, 4*c*n), 0)
		in := v.dev(comm.Float32, encode(comm.Float32, c, func(i int) float64 { return float64(r*1000 + i) }), 0)
		ws = append(ws, launch(engines[r], &comm.Op{Type: comm.OpAllReduce, Reduce: comm.Sum, In: []comm.Buffer{sums[r]}}))
		ws = append(ws, launch(engines[r], &comm.Op{Type: comm.OpAllGather, In: []comm.Buffer{in}, Out: []comm.Buffer{outs[r]}}))
	}
	for _, w := range ws {
		if err := wait(t, w, 2*time.Minute); err != nil {
			t.Fatal(err)
		}
	}
	wantSum := encode(comm.Float32, c, func(i int) float64 { return float64(1000*n*(n-1)/2 + n*i) })
	var wantAll []byte
	for r := 0; r < n; r++ {
		wantAll = append(wantAll, encode(comm.Float32, c, func(i int) float64 { return float64(r*1000 + i) })...)
	}
	for r := 0; r < n; r++ {
		if !bytes.Equal(v.host(sums[r]), wantSum) {
			t.Errorf("rank %d allreduce wrong", r)
		}
		if !bytes.Equal(v.host(outs[r]), wantAll) {
			t.Errorf("rank %d allgather wrong", r)
		}
	}
}
