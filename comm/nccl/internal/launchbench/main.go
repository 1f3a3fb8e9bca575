// Command launchbench measures the host time per op of a 4-byte float32
// allreduce at world size 1 on CUDA device 0: through the ranktree NCCL
// engine, and through raw NCCL calls made by this program (ncclAllReduce
// plus an end event, the least a caller can do). scripts/gpu-check.sh runs
// it next to PyTorch's ProcessGroupNCCL and records the figures in
// docs/gpu-verification.md.
//
// Two modes per path: "sync" (launch one op, wait for it, repeat: the
// latency a training step sees for a small blocking allreduce) and
// "pipelined" (launch -n ops back to back, then wait for the last: the
// launch cost). Output: one JSON object per line.
//
// Usage: launchbench [-n 2000] [-warmup 200] [-spin-idle 20us]
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

	"github.com/ranktree/ranktree/comm"
	"github.com/ranktree/ranktree/comm/cuda"
	"github.com/ranktree/ranktree/comm/nccl"
)

var spinIdle time.Duration

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
	flag.DurationVar(&spinIdle, "spin-idle", 0, "nccl.Options.SpinIdle for the ranktree engine")
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
	path0 := "ranktree"
	if spinIdle > 0 {
		path0 = "ranktree-spin" + spinIdle.String()
	}
	emit := func(path, mode string, ops int, d time.Duration) {
		if path == "ranktree" {
			path = path0
		}
		_ = json.NewEncoder(os.Stdout).Encode(result{path, mode, ops, float64(d.Nanoseconds()) / float64(ops), ver})
	}

	// ranktree engine
	e, err := nccl.New(context.Background(), comm.BackendConfig{Group: "bench", Size: 1, Device: 0, Timeout: time.Minute, Log: zerolog.Nop()},
		nccl.Options{EagerInit: true, SpinIdle: spinIdle})
	if err != nil {
		return err
	}
	b := comm.DeviceBuffer(uintptr(buf), 1, comm.Float32, 0, 0)
	op := &comm.Op{Type: comm.OpAllReduce, Reduce: comm.Sum, In: []comm.Buffer{b}}
	bg := context.Background()
	one := func() error {
		w := comm.NewWork(comm.OpAllReduce)
		e.Launch(op, w)
		return w.Wait(bg)
	}
	for i := 0; i < warm; i++ {
		if err := one(); err != nil {
			return err
		}
	}
	t0 := time.Now()
	for i := 0; i < n; i++ {
		if err := one(); err != nil {
			return err
		}
	}
	emit("ranktree", "sync", n, time.Since(t0))
	t0 = time.Now()
	ws := make([]*comm.Work, n)
	for i := range ws {
		ws[i] = comm.NewWork(comm.OpAllReduce)
		e.Launch(op, ws[i])
	}
	for _, w := range ws {
		if err := w.Wait(bg); err != nil {
			return err
		}
	}
	emit("ranktree", "pipelined", n, time.Since(t0))
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
	t0 = time.Now()
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
