// Command launchbench measures the host time per op of a 4-byte float32
// allreduce at world size 1 on CUDA device 0: through a ranktree
// ProcessGroup (ranktree.Init, the communicator actor, the NCCL engine:
// what a program calls), through the NCCL engine alone, and through raw
// NCCL calls made by this program (ncclAllReduce plus an end event, the
// least a caller can do). scripts/gpu-check.sh runs it next to PyTorch's
// ProcessGroupNCCL and records the figures in docs/gpu-verification.md.
//
// Two modes per path: "sync" (launch one op, wait for it, repeat: the
// latency a training step sees for a small blocking allreduce) and
// "pipelined" (launch -n ops back to back, then wait for them: the launch
// cost). Output: one JSON object per line.
//
// -spin-idle and -spin-wait set nccl.Options.SpinIdle and SpinWait (0: the
// engine's automatic choice; a negative value: never spin); the path names
// carry the values given.
//
// Usage: launchbench [-n 2000] [-warmup 200] [-spin-idle 20us] [-spin-wait 200us]
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"runtime"
	"time"

	"github.com/rs/zerolog"

	"github.com/ranktree/ranktree"
	"github.com/ranktree/ranktree/comm"
	"github.com/ranktree/ranktree/comm/cuda"
	"github.com/ranktree/ranktree/comm/nccl"
	"github.com/ranktree/ranktree/store"
)

var spinIdle, spinWait time.Duration

type result struct {
	Path    string  `json:"path"`
	Mode    string  `json:"mode"`
	Ops     int     `json:"ops"`
	NsPerOp float64 `json:"ns_per_op"`
	NCCL    string  `json:"nccl"`
}

func main() {
	n := flag.Int("n", 2000, "timed ops per measurement")
	warm := flag.Int("warmup", 200, "untimed ops first")
	flag.DurationVar(&spinIdle, "spin-idle", 0, "nccl.Options.SpinIdle for the ranktree engine (0: auto, <0: never)")
	flag.DurationVar(&spinWait, "spin-wait", 0, "nccl.Options.SpinWait for the ranktree engine (0: auto, <0: never)")
	flag.Parse()
	if err := run(*n, *warm); err != nil {
		fmt.Fprintln(os.Stderr, "launchbench:", err)
		os.Exit(1)
	}
}

func run(n, warm int) error {
	runtime.LockOSThread()
	cu, err := cuda.Load()
	if err != nil {
		return err
	}
	nc, err := nccl.Load()
	if err != nil {
		return err
	}
	if err := cu.Init(); err != nil {
		return err
	}
	d, err := cu.DeviceGet(0)
	if err != nil {
		return err
	}
	ctx, err := cu.PrimaryCtxRetain(d)
	if err != nil {
		return err
	}
	defer cu.PrimaryCtxRelease(d)
	if err := cu.CtxSetCurrent(ctx); err != nil {
		return err
	}
	buf, err := cu.MemAlloc(4)
	if err != nil {
		return err
	}
	defer cu.MemFree(buf)
	ver := nccl.VersionString(nc.Version())
	suffix := ""
	if spinIdle != 0 {
		suffix += "-spinidle" + spinIdle.String()
	}
	if spinWait != 0 {
		suffix += "-spinwait" + spinWait.String()
	}
	emit := func(path, mode string, ops int, d time.Duration) {
		if path != "raw-nccl" {
			path += suffix
		}
		_ = json.NewEncoder(os.Stdout).Encode(result{path, mode, ops, float64(d.Nanoseconds()) / float64(ops), ver})
	}
	opts := nccl.Options{EagerInit: true, SpinIdle: spinIdle, SpinWait: spinWait}
	b := comm.DeviceBuffer(uintptr(buf), 1, comm.Float32, 0, 0)
	bg := context.Background()

	// ranktree: the ProcessGroup a program uses
	rt, err := ranktree.Init(bg, ranktree.WithStore(store.NewMemStore()), ranktree.WithRank(0), ranktree.WithWorldSize(1), ranktree.WithLocalRank(0), ranktree.WithLocalWorldSize(1), ranktree.WithNodeRank(0),
		ranktree.WithJob("launchbench"), ranktree.WithLogger(zerolog.Nop()),
		ranktree.WithBackend(nccl.Factory(opts)), ranktree.WithDevice(0))
	if err != nil {
		return err
	}
	pg := rt.World()
	if err := measure(n, warm, emit, "ranktree-pg", func() *comm.Work { return pg.AllReduce(bg, b, comm.Sum) }); err != nil {
		return err
	}
	if err := rt.Close(bg); err != nil {
		return err
	}

	// ranktree: the NCCL engine alone
	e, err := nccl.New(bg, comm.BackendConfig{Group: "bench", Size: 1, Device: 0, Timeout: time.Minute, Log: zerolog.Nop()}, opts)
	if err != nil {
		return err
	}
	op := &comm.Op{Type: comm.OpAllReduce, Reduce: comm.Sum, In: []comm.Buffer{b}}
	if err := measure(n, warm, emit, "ranktree-engine", func() *comm.Work {
		p := comm.NewPromise(comm.OpAllReduce)
		e.Launch(op, p)
		return p.Work()
	}); err != nil {
		return err
	}
	if err := e.Close(); err != nil {
		return err
	}

	// raw NCCL on this thread
	id, err := nc.GetUniqueID()
	if err != nil {
		return err
	}
	cfg := nccl.NewConfig(nc.Version())
	h, r, err := nc.CommInitRankConfig(1, id, 0, cfg)
	if err != nil {
		return err
	}
	for r == nccl.InProgress {
		time.Sleep(time.Millisecond)
		r, _ = nc.CommGetAsyncError(h)
	}
	defer nc.CommDestroy(h)
	s, err := cu.StreamCreate(cuda.StreamNonBlocking, 0)
	if err != nil {
		return err
	}
	defer cu.StreamDestroy(s)
	ev, _ := cu.EventCreate(cuda.EventDisableTiming)
	defer cu.EventDestroy(ev)
	raw := func(wait bool) error {
		if _, err := nc.AllReduce(buf, buf, 1, nccl.Float32, nccl.Sum, h, s); err != nil {
			return err
		}
		if err := cu.EventRecord(ev, s); err != nil {
			return err
		}
		for wait {
			done, err := cu.EventQuery(ev)
			if err != nil {
				return err
			}
			if done {
				break
			}
		}
		return nil
	}
	for i := 0; i < warm; i++ {
		if err := raw(true); err != nil {
			return err
		}
	}
	t0 := time.Now()
	for i := 0; i < n; i++ {
		if err := raw(true); err != nil {
			return err
		}
	}
	emit("raw-nccl", "sync", n, time.Since(t0))
	t0 = time.Now()
	for i := 0; i < n; i++ {
		if err := raw(false); err != nil {
			return err
		}
	}
	if err := cu.EventSynchronize(ev); err != nil {
		return err
	}
	emit("raw-nccl", "pipelined", n, time.Since(t0))
	return nil
}

// measure times n ops of launch, each waited for before the next ("sync"),
// then n launched back to back and waited for ("pipelined"), after warm
// untimed ops.
func measure(n, warm int, emit func(path, mode string, ops int, d time.Duration), path string, launch func() *comm.Work) error {
	bg := context.Background()
	for i := 0; i < warm; i++ {
		if err := launch().Wait(bg); err != nil {
			return err
		}
	}
	t0 := time.Now()
	for i := 0; i < n; i++ {
		if err := launch().Wait(bg); err != nil {
			return err
		}
	}
	emit(path, "sync", n, time.Since(t0))
	ws := make([]*comm.Work, n)
	t0 = time.Now()
	for i := range ws {
		ws[i] = launch()
	}
	for _, w := range ws {
		if err := w.Wait(bg); err != nil {
			return err
		}
	}
	emit(path, "pipelined", n, time.Since(t0))
	return nil
}
