// Command faults shows what ranktree does when a collective goes wrong:
// a rank that hangs, a rank that crashes, or ranks that disagree on the
// collective. The fault is injected into the job's first attempt only; the
// ranks see a typed error that names the rank and sequence number (never a
// silent hang), exit, and rankrunner restarts the job, whose second attempt
// runs clean.
//
//	rankrunner --nproc-per-node 2 --max-restarts 1 ./examples/faults --fault hang
//	rankrunner --nproc-per-node 2 --max-restarts 1 ./examples/faults --fault crash
//	rankrunner --nproc-per-node 2 --max-restarts 1 ./examples/faults --fault mismatch
//
// Every rank runs --ops all-reduces of [rank+1] on the world group and
// checks the sum. In attempt 0, rank --rank at sequence number --seq:
//
//   - hang: blocks inside the engine (RANKTREE_FAULT=hang@...). The
//     watchdog fails the op on every rank after --timeout with
//     comm.ErrTimeout and aborts the communicator; a rank whose peer's
//     watchdog fired first gets comm.ErrRemoteAbort, or a transport error
//     if the aborted peer's closed connection reaches it first.
//   - crash: the process exits with code 3 (RANKTREE_FAULT=crash@...);
//     rankrunner sees the exit and stops the other ranks at once (were they
//     left running, they would fail with a transport error within
//     milliseconds).
//   - mismatch: issues a Broadcast where the others issue an AllReduce;
//     both sides fail with comm.ErrMismatch describing both ops.
//
// Unless set, the program sets RANKTREE_TIMEOUT to --timeout and
// RANKTREE_ASYNC_ERROR_HANDLING to CleanupOnly, so that the error comes
// back to the program (with the default TearDown the watchdog would end the
// process itself after its flight-recorder dump). A rank that saw an error
// exits 1. With --json-out, each rank writes a report per attempt to the
// path with {rank} and {attempt} replaced.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/rs/zerolog"

	"github.com/ranktree/ranktree"
	"github.com/ranktree/ranktree/comm"
	"github.com/ranktree/ranktree/supervisor"
)

// Report is one rank's account of one attempt (--json-out).
type Report struct {
	Rank      int      `json:"rank"`
	Attempt   int      `json:"attempt"`
	Fault     string   `json:"fault"`      // injected in this attempt ("" for none)
	OpsOK     int      `json:"ops_ok"`     // all-reduces that succeeded
	FailedSeq uint64   `json:"failed_seq"` // seq of the failed op (0: none)
	Err       string   `json:"err"`        // its error
	Is        []string `json:"is"`         // sentinels it matches: timeout, remote_abort, transport, mismatch, aborted
	ElapsedMS float64  `json:"elapsed_ms"` // from the failed op's launch to its error
}

func main() {
	fault := flag.String("fault", "hang", "fault injected into attempt 0: hang, crash, mismatch or none")
	faultRank := flag.Int("rank", 1, "the rank the fault hits")
	faultSeq := flag.Uint64("seq", 5, "the collective sequence number it hits (the first is 1)")
	ops := flag.Int("ops", 20, "all-reduces per attempt")
	timeout := flag.Duration("timeout", 3*time.Second, "collective timeout (RANKTREE_TIMEOUT), unless already set")
	jsonOut := flag.String("json-out", "", "write a report to this path ({rank} and {attempt} replaced)")
	flag.Parse()
	switch *fault {
	case "hang", "crash", "mismatch", "none":
	default:
		fmt.Fprintf(os.Stderr, "faults: --fault %q: want hang, crash, mismatch or none\n", *fault)
		os.Exit(2)
	}
	if *faultSeq < 1 || *ops < 1 {
		fmt.Fprintln(os.Stderr, "faults: --seq and --ops must be at least 1")
		os.Exit(2)
	}

	attempt, _ := strconv.Atoi(os.Getenv(ranktree.EnvRestartCount))
	if attempt > 0 {
		*fault = "none"
	}
	if *fault == "hang" || *fault == "crash" {
		setDefault(ranktree.EnvFault, fmt.Sprintf("%s@rank=%d,seq=%d", *fault, *faultRank, *faultSeq))
	}
	setDefault(supervisor.EnvTimeout, timeout.String())
	setDefault(supervisor.EnvAsyncErrorHandling, "CleanupOnly")

	ctx := context.Background()
	// rankrunner pipes the output: no colours.
	log := zerolog.New(zerolog.ConsoleWriter{Out: os.Stderr, TimeFormat: "15:04:05", NoColor: true}).Level(zerolog.WarnLevel).With().Timestamp().Logger()
	rt, err := ranktree.Init(ctx, ranktree.WithLogger(log))
	if err != nil {
		fmt.Fprintf(os.Stderr, "faults: %v\n", err)
		os.Exit(1)
	}
	rank := rt.Rank()
	rep := Report{Rank: rank, Attempt: attempt}
	if *fault != "none" {
		rep.Fault = *fault
	}
	code := runOps(ctx, rt, *ops, *fault, *faultRank, *faultSeq, &rep)
	if code == 0 {
		fmt.Printf("attempt %d: rank %d: %d all-reduces OK\n", attempt, rank, rep.OpsOK)
	}
	writeReport(*jsonOut, rep)
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := rt.Close(cctx); err != nil {
		fmt.Fprintf(os.Stderr, "faults: close: %v\n", err)
	}
	os.Exit(code)
}

// runOps runs ops all-reduces on the world group, replacing collective
// faultSeq of rank faultRank by a broadcast for the "mismatch" fault, and
// checks each sum. The first failure is recorded in rep; it returns the
// exit code (0, or 1 after a failure).
func runOps(ctx context.Context, rt *ranktree.Runtime, ops int, fault string, faultRank int, faultSeq uint64, rep *Report) int {
	rank, attempt, pg := rt.Rank(), rep.Attempt, rt.World()
	want := float64(rt.WorldSize() * (rt.WorldSize() + 1) / 2)
	for i := 1; i <= ops; i++ {
		x := []float64{float64(rank + 1)}
		start := time.Now()
		var w *comm.Work
		if fault == "mismatch" && rank == faultRank && uint64(i) == faultSeq {
			w = pg.Broadcast(ctx, comm.HostBuffer(x), 0)
		} else {
			w = pg.AllReduce(ctx, comm.HostBuffer(x), comm.Sum)
		}
		err := w.Wait(ctx)
		if err == nil && x[0] != want {
			err = fmt.Errorf("all-reduce gave %v, want %v", x[0], want)
		}
		if err != nil {
			rep.FailedSeq, rep.Err, rep.Is = w.Seq(), err.Error(), classify(err)
			rep.ElapsedMS = float64(time.Since(start).Microseconds()) / 1000
			fmt.Printf("attempt %d: rank %d: collective %d failed after %v [%s]: %v\n", attempt, rank, w.Seq(),
				time.Since(start).Round(time.Millisecond), strings.Join(rep.Is, ","), err)
			return 1
		}
		rep.OpsOK++
	}
	return 0
}

// writeReport writes rep as JSON to path ({rank} and {attempt} replaced);
// an empty path writes nothing.
func writeReport(path string, rep Report) {
	if path == "" {
		return
	}
	path = strings.NewReplacer("{rank}", strconv.Itoa(rep.Rank), "{attempt}", strconv.Itoa(rep.Attempt)).Replace(path)
	b, _ := json.Marshal(rep)
	if err := os.WriteFile(path, b, 0o644); err != nil {
		fmt.Fprintf(os.Stderr, "faults: %v\n", err)
	}
}

// setDefault sets an environment variable that the user did not set.
func setDefault(k, v string) {
	if _, ok := os.LookupEnv(k); !ok {
		_ = os.Setenv(k, v)
	}
}

func classify(err error) []string {
	var out []string
	for _, s := range []struct {
		name string
		err  error
	}{{"timeout", comm.ErrTimeout}, {"remote_abort", comm.ErrRemoteAbort}, {"transport", comm.ErrTransport},
		{"mismatch", comm.ErrMismatch}, {"aborted", comm.ErrAborted}, {"engine", comm.ErrEngine}} {
		if errors.Is(err, s.err) {
			out = append(out, s.name)
		}
	}
	return out
}
