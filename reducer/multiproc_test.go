package reducer

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"reflect"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/ranktree/ranktree/comm"
	"github.com/ranktree/ranktree/comm/cpu"
	"github.com/ranktree/ranktree/internal/testrank"
	"github.com/ranktree/ranktree/store/natsstore"
)

// Environment of a child rank process of TestMultiProcess.
const (
	mpRankEnv  = "RANKTREE_REDUCER_TEST_RANK"
	mpSizeEnv  = "RANKTREE_REDUCER_TEST_SIZE"
	mpURLEnv   = "RANKTREE_REDUCER_TEST_NATS"
	mpJobEnv   = "RANKTREE_REDUCER_TEST_JOB"
	mpChildRun = "^TestMultiProcessChild$"
)

// TestMultiProcess runs the reducer on 2 and 3 separate OS processes
// (this test binary re-executed as TestMultiProcessChild), connected by the
// CPU engine over TCP/shm with rendezvous through an embedded NATS server
// and the JetStream KV store: the deployment shape of a real job.
func TestMultiProcess(t *testing.T) {
	if testing.Short() {
		t.Skip("spawns processes")
	}
	url, shutdown, err := natsstore.StartEmbedded(natsstore.EmbeddedOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer shutdown()
	for _, n := range []int{2, 3} {
		t.Run(fmt.Sprintf("n=%d", n), func(t *testing.T) {
			job := fmt.Sprintf("reducer-test-%d-%d-%d", os.Getpid(), n, time.Now().UnixNano())
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			outs := make([]bytes.Buffer, n)
			errs := make([]error, n)
			var wg sync.WaitGroup
			for r := range n {
				cmd := exec.CommandContext(ctx, os.Args[0], "-test.run="+mpChildRun, "-test.count=1", "-test.v")
				cmd.Env = append(os.Environ(), mpRankEnv+"="+strconv.Itoa(r), mpSizeEnv+"="+strconv.Itoa(n), mpURLEnv+"="+url, mpJobEnv+"="+job)
				cmd.Stdout, cmd.Stderr = &outs[r], &outs[r]
				wg.Add(1)
				go func() { defer wg.Done(); errs[r] = cmd.Run() }()
			}
			wg.Wait()
			for r, err := range errs {
				out := outs[r].String()
				switch {
				case err != nil:
					t.Errorf("rank %d process: %v\n%s", r, err, out)
				case !bytes.Contains(outs[r].Bytes(), []byte("--- PASS: TestMultiProcessChild")):
					t.Errorf("rank %d process did not run the child test:\n%s", r, out)
				}
			}
		})
	}
}

// TestMultiProcessChild is one rank of TestMultiProcess; it does nothing
// unless started by it.
func TestMultiProcessChild(t *testing.T) {
	rs := os.Getenv(mpRankEnv)
	if rs == "" {
		t.Skip("runs only as a child process of TestMultiProcess")
	}
	rank, _ := strconv.Atoi(rs)
	n, _ := strconv.Atoi(os.Getenv(mpSizeEnv))
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	st, err := natsstore.Connect(ctx, natsstore.Options{URL: os.Getenv(mpURLEnv), Job: os.Getenv(mpJobEnv), Timeout: 60 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	sys := testrank.QuietSystem()
	defer sys.Shutdown()
	f := testrank.BackendFactoryFactory(sys, "cpu", cpu.Factory(cpu.Options{}), st, zerolog.Nop())
	pg, err := f.World(ctx, rank, n)
	if err != nil {
		t.Fatal(err)
	}
	defer pg.Destroy(context.Background())
	if err := mpScenario(ctx, rank, n, pg); err != nil {
		t.Fatalf("rank %d: %v", rank, err)
	}
}

// mpScenario is what every child rank runs: averaging, a parameter used
// twice, per-rank gradient orders, unused parameters, the rebuild, the
// fp16 guard and Join, each checked against its closed form.
func mpScenario(ctx context.Context, rank, n int, g Group) error {
	// Averaging of a linear model (dL/dw = rank, dL/db = 1) and a
	// parameter used twice with scale rank+1; gradients marked in a
	// different order on every rank.
	m := newModel(1, 1, 5, 7, 3)
	red, err := New(ctx, g, m.params, Config{FirstBucketBytes: 8, BucketCapBytes: 24})
	if err != nil {
		return err
	}
	orders := [][]int{{4, 3, 2, 1, 0}, {0, 2, 4, 1, 3}, {3, 1, 4, 0, 2}}
	for it := range 3 {
		grad := func(p int) float32 {
			switch p {
			case 0:
				return float32(rank)
			case 1:
				return 1
			case 2:
				return 2 * float32(rank+1)
			}
			return float32(10*rank + p)
		}
		if err := stepGrads(red, m, false, orders[rank], grad); err != nil {
			return err
		}
		wants := []float64{float64(n-1) / 2, 1, float64(n + 1)}
		for p, want := range wants {
			if err := checkAll(fmt.Sprintf("iteration %d p%d", it, p), m.grads[p], want); err != nil {
				return err
			}
		}
		for p := 3; p < 5; p++ {
			if err := checkAll(fmt.Sprintf("iteration %d p%d", it, p), m.grads[p], 5*float64(n-1)+float64(p)); err != nil {
				return err
			}
		}
	}
	if s := red.Stats(); !reflect.DeepEqual(s.RebuiltOrder, orders[0]) {
		return fmt.Errorf("rebuilt order %v, want rank 0's %v", s.RebuiltOrder, orders[0])
	}

	// Unused parameters: p1 unused on rank 0 only, p2 on every rank.
	mu := newModel(2, 2, 2)
	ru, err := New(ctx, g, mu.params, Config{FindUnusedParameters: true})
	if err != nil {
		return err
	}
	fill(mu.grads[2], 42)
	order := []int{1, 0}
	if rank == 0 {
		order = []int{0}
	}
	if err := stepGrads(ru, mu, false, order, func(p int) float32 { return float32(rank + 1) }); err != nil {
		return err
	}
	if err := checkAll("unused p2", mu.grads[2], 42); err != nil {
		return err
	}
	if rank != 0 {
		sum := 0.0
		for r := 1; r < n; r++ {
			sum += float64(r + 1)
		}
		if err := checkAll("partly used p1", mu.grads[1], sum/float64(n)); err != nil {
			return err
		}
	}

	// The fp16 guard through the compression hook.
	mh := newModel(4)
	rh, err := New(ctx, g, mh.params, Config{})
	if err != nil {
		return err
	}
	if err := rh.RegisterCommHook(FP16CompressHook()); err != nil {
		return err
	}
	if err := stepGrads(rh, mh, false, []int{0}, func(int) float32 { return 32768 }); err != nil {
		return err
	}
	if err := checkAll("fp16 guard", mh.grads[0], 32768); err != nil {
		return err
	}

	// Uneven inputs: rank r has r iterations, then joins.
	mj := newModel(3)
	rj, err := New(ctx, g, mj.params, Config{UnevenInputs: true})
	if err != nil {
		return err
	}
	for range rank {
		if err := stepGrads(rj, mj, false, []int{0}, func(int) float32 { return 1 }); err != nil {
			return err
		}
		for i := range mj.data[0] {
			mj.data[0][i] -= mj.grads[0][i]
		}
	}
	if err := rj.Join(ctx); err != nil {
		return err
	}
	// The last joiner, rank n-1, took n-1 steps; at step k (0-based)
	// ranks k+1..n-1 were active: gradient (n-1-k)/n.
	want := 0.0
	for k := range n - 1 {
		want -= float64(n-1-k) / float64(n)
	}
	if err := checkAll("joined model", mj.data[0], want); err != nil {
		return err
	}
	if err := rj.GradReady(0, comm.HostBuffer(mj.grads[0])); !errors.Is(err, ErrBadState) {
		return fmt.Errorf("GradReady after Join: %v", err)
	}
	return nil
}
