// Command allreduce-bench measures ranktree's collectives in the style of
// nccl-tests (all_reduce_perf, all_gather_perf, ...). Run it as the ranks of
// a job under rankrunner, which sets the env contract ranktree.Init reads:
//
//	rankrunner --nproc-per-node 2 ./examples/allreduce-bench \
//	    --collective allreduce --op sum --dtype float32 \
//	    --sizes 4,4KiB,1MiB..64MiB --iters 20 --warmup 5 --transport shm
//
// Rank 0 prints one line per size: bytes, count, type, redop, time_us (the
// median over --iters of the slowest rank's time), algbw_GBps and
// busbw_GBps (nccl-tests' definitions; see package internal/bench), then
// mean_us, p90_us and p99_us of the same times (compare mean_us with Open MPI's
// mean of a timed loop: it counts the tails) and the CPU placement: the
// CPU each rank ran on most and how often two ranks shared one, sampled
// every --placement-every iterations. With --json it prints one JSON
// object per line with those keys (time_us and p50_us are both the
// median; placement is {"cpus": [...], "shared_frac": f, "samples": k}),
// plus collective and req_bytes (the size asked for; bytes is the size
// used, which the layout rounds for allgather, reducescatter and alltoall:
// see package internal/bench).
//
// Before the first size every rank runs one float32 sum allreduce of
// --warmup-bytes (default 8 MiB), one lap of the shm rings, so that no
// size is timed while it first touches ring pages; then, for --warmup-time
// (default 500 ms), 4-byte allreduces, because the first ~200 ms after
// ranktree.Init show millisecond stalls that a steady-state figure must not
// include.
//
// Flags:
//
//	--collective  allreduce | allgather | broadcast | reducescatter | alltoall (default allreduce)
//	--op          sum | avg | prod | min | max | band | bor | bxor (reducing collectives; default sum)
//	--dtype       float32 | float64 | float16 | bfloat16 | int8 | uint8 | int32 | int64 | bool (default float32)
//	--sizes       comma-separated sizes; "A..B" doubles from A to B (default 4..64MiB)
//	--iters       timed iterations per size (default 20)
//	--warmup      untimed iterations per size (default 5)
//	--warmup-bytes  size of the one ring-lap allreduce before the sweep (default 8MiB; 0: none)
//	--warmup-time   then 4-byte allreduces for this long, past the stalls of the first
//	                moments after Init (default 500ms; 0: none)
//	--root        broadcast root (default 0)
//	--transport   auto | shm | tcp: the CPU engine's transport, passed to
//	              ranktree.Init as RANKTREE_TRANSPORT (default: that variable, else auto)
//	--json        print JSON lines instead of the table
//	--blocking    issue every collective in its blocking form (comm.Blocking;
//	              default true): the call returns once the op has completed, as
//	              MPI_Allreduce and torch.distributed's default all_reduce
//	              (async_op=False) do, and a small op allocates nothing;
//	              --blocking=false times AllReduce(...).Wait, the async form.
//	              The JSON lines carry "blocking": true or false
//	--placement-every  sample each rank's CPU after every Nth timed iteration
//	              (default 64): the sample is a system call between two ops,
//	              which delays this rank's next launch and so its peers
//	--late-rank   late-arrival mode: this rank launches each timed iteration
//	              --late-us (default 5000) late; rank 0 prints, per size, the
//	              waiting ranks' process CPU while they wait (% of one core,
//	              median and max over iterations) and the time from the late
//	              rank's launch to the last waiting rank's return (wake_us,
//	              median, min, max): what waiting costs a training step
//	              whose ranks skew by milliseconds (issue 15); the warm-up
//	              before the first size is the same as without it
//	--late-skew   fixed | alternate | random: how the delay varies
//	--late-busy   the late rank spends its delay busy on its CPU, as a rank
//	              computing its step, instead of asleep: a sleeping rank's
//	              idle CPU (a halted vCPU on a VM) makes its own launch
//	              slower, which wake_us counts ("late_busy" in the JSON)
//	--c2c-probe   run outside any job: measure the round trip of a cache line
//	              between CPUs 0 and 1 (5 samples of 2000), print it as one JSON
//	              object ("c2c_ns", the median sample) and exit. On a VM the host
//	              may run the two vCPUs on cores that share a cache or on cores
//	              that do not (about 50-100 against 320-500 ns on the development VM),
//	              which moves every shared-memory time; scripts/bench-compare.sh
//	              records it before each run
//
// Exit status: 0 on success, 2 for bad flags, 1 for any failure (printed on
// stderr with the rank).
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/ranktree/ranktree"
	"github.com/ranktree/ranktree/examples/allreduce-bench/internal/bench"
)

func main() {
	o, err := bench.ParseArgs(os.Args[1:], os.Getenv(ranktree.EnvTransport), os.Stderr)
	if err != nil {
		if !errors.Is(err, flag.ErrHelp) {
			fmt.Fprintln(os.Stderr, "allreduce-bench:", err)
		}
		os.Exit(2)
	}
	if o.C2CProbe {
		r, err := bench.CoreToCore(0, 1, 2000, 5)
		if err != nil {
			fmt.Fprintln(os.Stderr, "allreduce-bench:", err)
			os.Exit(1)
		}
		b, _ := json.Marshal(r)
		fmt.Println(string(b))
		return
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, o, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "allreduce-bench:", err)
		stop()
		os.Exit(1)
	}
}

// run joins the job, measures and prints (rank 0), then leaves the job.
func run(ctx context.Context, o bench.Options, stdout io.Writer) (err error) {
	if err := os.Setenv(ranktree.EnvTransport, o.Transport); err != nil {
		return err
	}
	rt, err := ranktree.Init(ctx)
	if err != nil {
		return fmt.Errorf("joining the job: %w", err)
	}
	defer func() {
		if cerr := rt.Close(context.WithoutCancel(ctx)); cerr != nil && err == nil {
			err = fmt.Errorf("leaving the job: %w", cerr)
		}
	}()
	pg := rt.World()
	lead := pg.Rank() == 0
	if lead && !o.JSON {
		redop := "none"
		if o.Config.Collective.Reduces() {
			redop = o.Config.Op.String()
		}
		fmt.Fprintf(stdout, "# ranktree allreduce-bench: %v on %d ranks, dtype %v, redop %s, transport %s, iters %d, warmup %d, blocking %v\n",
			o.Config.Collective, pg.Size(), o.Config.DType, redop, o.Transport, o.Config.Iters, o.Config.Warmup, o.Config.Blocking)
		if o.Late == nil {
			fmt.Fprint(stdout, bench.FormatHeader())
		}
	}
	enc := json.NewEncoder(stdout)
	if o.Late != nil {
		if lead && !o.JSON {
			fmt.Fprint(stdout, bench.FormatLateHeader())
		}
		return bench.RunLate(ctx, pg, o.Config, *o.Late, func(r bench.LateResult) error {
			if !lead {
				return nil
			}
			if o.JSON {
				return enc.Encode(r)
			}
			_, err := fmt.Fprint(stdout, bench.FormatLateRow(r))
			return err
		})
	}
	return bench.Run(ctx, pg, o.Config, func(r bench.Result) error {
		if !lead {
			return nil
		}
		if o.JSON {
			return enc.Encode(r)
		}
		_, err := fmt.Fprint(stdout, bench.FormatRow(r))
		return err
	})
}
