// Command metricsprog is a rank program of the metrics end-to-end test:
//
//	metricsprog DIR N [hang|failfirst]
//
// joins the job (ranktree.Init), runs N allreduces of 4 float32 on the
// world group, checks their sums, writes DIR/ready-<rank> and waits (up to
// 60 s) for DIR/go before closing, so the test can scrape the metrics of a
// running job. With "hang", rank 0 then launches one more allreduce that
// rank 1 never joins and expects it to fail with comm.ErrTimeout (run it
// with a short RANKTREE_TIMEOUT and RANKTREE_ASYNC_ERROR_HANDLING=CleanupOnly
// so the processes survive the abort) before writing its ready file.
// With "failfirst", rank 1 of the job's first attempt (RANKTREE_RESTART_COUNT
// 0) exits 1 at once, so that rankrunner restarts the job.
// Errors print "metricsprog: <error>" and exit 1.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/ranktree/ranktree"
	"github.com/ranktree/ranktree/comm"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "metricsprog:", err)
		os.Exit(1)
	}
}

func run() error {
	if len(os.Args) != 3 && (len(os.Args) != 4 || (os.Args[3] != "hang" && os.Args[3] != "failfirst")) {
		return fmt.Errorf("usage: metricsprog DIR N [hang|failfirst]")
	}
	failFirst := len(os.Args) == 4 && os.Args[3] == "failfirst"
	if failFirst && os.Getenv(ranktree.EnvRestartCount) == "0" && os.Getenv("RANK") == "1" {
		return errors.New("failing the first attempt on purpose")
	}
	dir := os.Args[1]
	n, err := strconv.Atoi(os.Args[2])
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	rt, err := ranktree.Init(ctx)
	if err != nil {
		return err
	}
	defer rt.Close(context.Background())
	pg := rt.World()
	for i := 0; i < n; i++ {
		x := []float32{1, 2, 3, float32(rt.Rank())}
		if err := pg.AllReduce(ctx, comm.HostBuffer(x), comm.Sum).Wait(ctx); err != nil {
			return fmt.Errorf("allreduce %d: %w", i, err)
		}
		if w := float32(rt.WorldSize()); x[0] != w || x[1] != 2*w {
			return fmt.Errorf("allreduce %d: got %v", i, x)
		}
	}
	if len(os.Args) == 4 && os.Args[3] == "hang" && rt.Rank() == 0 {
		err := pg.AllReduce(ctx, comm.HostBuffer([]float32{1}), comm.Sum).Wait(ctx)
		if !errors.Is(err, comm.ErrTimeout) {
			return fmt.Errorf("the allreduce rank 1 never joined: %v, want comm.ErrTimeout", err)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "ready-"+strconv.Itoa(rt.Rank())), nil, 0o644); err != nil {
		return err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go")); err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}
