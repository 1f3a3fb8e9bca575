// Command superprog is a rank program of the supervision end-to-end tests
// (test/supervision_*_test.go). It joins the job from the env contract with
// ranktree.Init (store timeout 30 s; RANKTREE_TIMEOUT then only sets the
// collective timeout), runs one scenario and prints one line per step on
// stdout, "RESULT " followed by a JSON Result, which the tests parse.
//
//	superprog ops N        N sequential world all-reduces of [rank+1] (checked
//	                       against n(n+1)/2); stops at the first error; with
//	                       SUPERPROG_THEN=restart it then restarts the world
//	                       group (Runtime.RestartGroup), all-reduces on it and
//	                       on a new group; with SUPERPROG_READY=K it prints a
//	                       "ready" step after K ops and sleeps 20 ms between ops
//	                       With SUPERPROG_SELF=R:S:kill or R:S:stop rank R
//	                       sends itself SIGKILL or SIGSTOP instead of
//	                       launching op S (the random fault test); with
//	                       SUPERPROG_FAILEXIT=1 a rank whose op fails exits 1
//	                       after its "op" line. A failed "op" line carries
//	                       blame/blame_seq: comm.Blame's rank and seq.
//	superprog closehung    one all-reduce, a second one left in flight (a
//	                       hang fault holds it), then Runtime.Close, timed
//	superprog panic        with SUPERPROG_PANIC=R:S, the first world-group
//	                       engine of rank R panics in Launch at seq S (a bug
//	                       in the communicator actor's path): all-reduces 1..S
//	                       ("op" steps; the one at S is expected to fail), then
//	                       Runtime.Restarted waits for the automatic restart
//	                       of RANKTREE_ACTOR_PANIC=restart ("restarted", with
//	                       the new epoch) and 3 all-reduces on the new world
//	                       group ("restart_op")
//
// Every scenario ends with a timed Runtime.Close and exit 0; a failed Init
// prints an "init" step and exits 2.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/rs/zerolog"

	"github.com/ranktree/ranktree"
	"github.com/ranktree/ranktree/comm"
	"github.com/ranktree/ranktree/comm/cpu"
	"github.com/ranktree/ranktree/internal/testrank"
)

// Result is one step's outcome.
type Result struct {
	Rank  int      `json:"rank"`
	Step  string   `json:"step"` // init, ready, op, restart, restart_op, newgroup_op, close
	Seq   uint64   `json:"seq,omitempty"`
	Epoch uint32   `json:"epoch,omitempty"`
	OK    bool     `json:"ok"`
	Err   string   `json:"err,omitempty"`
	Is    []string `json:"is,omitempty"` // sentinels err matches: timeout, remote_abort, transport, engine, aborted, closed, timeout_error
	MS    float64  `json:"ms"`           // how long the step took
	// Blame and BlameSeq: where a failed op's failure started (comm.Blame).
	Blame    *int   `json:"blame,omitempty"`
	BlameSeq uint64 `json:"blame_seq,omitempty"`
	At       int64  `json:"at"` // when it ended (Unix ns)
}

var rank int

func emit(r Result) {
	r.Rank, r.At = rank, time.Now().UnixNano()
	b, _ := json.Marshal(r)
	fmt.Printf("RESULT %s\n", b)
}

func classify(err error) []string {
	var out []string
	var te *comm.TimeoutError
	if errors.As(err, &te) {
		out = append(out, "timeout_error")
	}
	for _, s := range []struct {
		name string
		err  error
	}{{"timeout", comm.ErrTimeout}, {"remote_abort", comm.ErrRemoteAbort}, {"transport", comm.ErrTransport},
		{"engine", comm.ErrEngine}, {"aborted", comm.ErrAborted}, {"closed", comm.ErrClosed}} {
		if errors.Is(err, s.err) {
			out = append(out, s.name)
		}
	}
	return out
}

func step(name string, seq uint64, start time.Time, err error) Result {
	r := Result{Step: name, Seq: seq, OK: err == nil, MS: float64(time.Since(start).Microseconds()) / 1000}
	if err != nil {
		r.Err, r.Is = err.Error(), classify(err)
	}
	return r
}

// sum all-reduces [rank+1] on pg and checks the closed form.
func sum(ctx context.Context, pg *comm.ProcessGroup) error {
	x := []float64{float64(rank + 1)}
	// The op gets the long-lived ctx: cancelling its ctx would abandon it
	// and abort the communicator. wctx bounds only this wait.
	wctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	if err := pg.AllReduce(ctx, comm.HostBuffer(x), comm.Sum).Wait(wctx); err != nil {
		return err
	}
	want := 0.0
	for _, r := range pg.Ranks() {
		want += float64(r + 1)
	}
	if x[0] != want {
		return fmt.Errorf("superprog: all-reduce over %d ranks gave %v, want %v", pg.Size(), x[0], want)
	}
	return nil
}

func main() {
	rank, _ = strconv.Atoi(os.Getenv("RANK"))
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: superprog ops N | closehung")
		os.Exit(64)
	}
	ctx := context.Background()
	log := zerolog.New(os.Stderr).Level(zerolog.WarnLevel).With().Timestamp().Logger()
	start := time.Now()
	opts := []ranktree.Option{ranktree.WithTimeout(30 * time.Second), ranktree.WithLogger(log)}
	if spec := os.Getenv("SUPERPROG_PANIC"); spec != "" {
		opts = append(opts, panicAt(spec))
	}
	rt, err := ranktree.Init(ctx, opts...)
	if err != nil {
		emit(step("init", 0, start, err))
		os.Exit(2)
	}
	switch os.Args[1] {
	case "ops":
		n, _ := strconv.Atoi(os.Args[2])
		ops(ctx, rt, n)
	case "closehung":
		closeHung(ctx, rt)
		return
	case "panic":
		panicScenario(ctx, rt)
	default:
		fmt.Fprintf(os.Stderr, "superprog: unknown scenario %q\n", os.Args[1])
		os.Exit(64)
	}
	closeTimed(rt)
}

func closeTimed(rt *ranktree.Runtime) {
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	emit(step("close", 0, start, rt.Close(ctx)))
}

func ops(ctx context.Context, rt *ranktree.Runtime, n int) {
	ready, _ := strconv.Atoi(os.Getenv("SUPERPROG_READY"))
	pg := rt.World()
	failed := false
	selfSeq, selfSig := selfFault()
	for i := 1; i <= n; i++ {
		start := time.Now()
		if i == selfSeq {
			_ = syscall.Kill(os.Getpid(), selfSig)
			time.Sleep(time.Hour) // SIGSTOP: whoever ends the job kills us
		}
		if err := sum(ctx, pg); err != nil {
			r := step("op", uint64(i), start, err)
			b, bs := comm.Blame(err, rank, pg.Ranks())
			r.Blame, r.BlameSeq = &b, bs
			emit(r)
			failed = true
			if os.Getenv("SUPERPROG_FAILEXIT") == "1" {
				os.Exit(1)
			}
			break
		}
		if i == ready {
			emit(Result{Step: "ready", Seq: uint64(i), OK: true})
		}
		if ready > 0 {
			time.Sleep(20 * time.Millisecond)
		}
	}
	if !failed {
		emit(Result{Step: "op", Seq: uint64(n), OK: true})
	}
	if os.Getenv("SUPERPROG_THEN") != "restart" {
		return
	}
	start := time.Now()
	npg, err := rt.RestartGroup(ctx, pg)
	r := step("restart", 0, start, err)
	if err != nil {
		emit(r)
		return
	}
	r.Epoch = npg.Epoch()
	emit(r)
	start = time.Now()
	r = step("restart_op", 1, start, sum(ctx, rt.World()))
	r.Epoch = rt.World().Epoch()
	emit(r)
	start = time.Now()
	sub, err := rt.NewGroup(ctx, rt.World().Ranks(), comm.WithGroupName("after_restart"))
	if err == nil {
		err = sum(ctx, sub)
	}
	emit(step("newgroup_op", 1, start, err))
}

func closeHung(ctx context.Context, rt *ranktree.Runtime) {
	pg := rt.World()
	start := time.Now()
	if err := sum(ctx, pg); err != nil {
		emit(step("op", 1, start, err))
	}
	w := pg.AllReduce(ctx, comm.HostBuffer([]float64{1}), comm.Sum)
	time.Sleep(300 * time.Millisecond)
	closeTimed(rt)
	select {
	case <-w.Done():
		emit(step("op", 2, start, w.Err()))
	case <-time.After(5 * time.Second):
		emit(Result{Step: "op", Seq: 2, Err: "still in flight 5 s after Close"})
	}
}

// panicAt parses "R:S" and returns the option that makes rank R's first
// world-group engine a panicky one (later epochs get a plain engine).
func panicAt(spec string) ranktree.Option {
	rs, ss, _ := strings.Cut(spec, ":")
	r, err1 := strconv.Atoi(rs)
	s, err2 := strconv.ParseUint(ss, 10, 64)
	if err1 != nil || err2 != nil {
		fmt.Fprintf(os.Stderr, "superprog: bad SUPERPROG_PANIC %q (want R:S)\n", spec)
		os.Exit(64)
	}
	inner := cpu.Factory(cpu.Options{Transport: os.Getenv(ranktree.EnvTransport)})
	var armed atomic.Bool
	armed.Store(true)
	return ranktree.WithBackend(func(ctx context.Context, cfg comm.BackendConfig) (comm.Backend, error) {
		be, err := inner(ctx, cfg)
		if err != nil || cfg.Group != ranktree.WorldGroupName || rank != r || !armed.CompareAndSwap(true, false) {
			return be, err
		}
		return testrank.PanicAtSeq(be, s), nil
	})
}

func panicScenario(ctx context.Context, rt *ranktree.Runtime) {
	_, ss, _ := strings.Cut(os.Getenv("SUPERPROG_PANIC"), ":")
	last, _ := strconv.ParseUint(ss, 10, 64)
	old := rt.World()
	for i := uint64(1); i <= last; i++ {
		start := time.Now()
		err := sum(ctx, old)
		emit(step("op", i, start, err))
		if err != nil {
			break
		}
	}
	start := time.Now()
	rctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	npg, err := rt.Restarted(rctx, old)
	r := step("restarted", 0, start, err)
	if err != nil {
		emit(r)
		return
	}
	r.Epoch = npg.Epoch()
	emit(r)
	for i := uint64(1); i <= 3; i++ {
		start := time.Now()
		r := step("restart_op", i, start, sum(ctx, rt.World()))
		r.Epoch = rt.World().Epoch()
		emit(r)
	}
}

// selfFault parses SUPERPROG_SELF ("R:S:kill" or "R:S:stop"): the op at
// which this rank, if it is R, signals itself, and the signal (0, 0 when
// unset or another rank's).
func selfFault() (int, syscall.Signal) {
	spec := os.Getenv("SUPERPROG_SELF")
	if spec == "" {
		return 0, 0
	}
	parts := strings.Split(spec, ":")
	if len(parts) != 3 {
		parts = []string{"", "", ""}
	}
	r, err1 := strconv.Atoi(parts[0])
	seq, err2 := strconv.Atoi(parts[1])
	sig := map[string]syscall.Signal{"kill": syscall.SIGKILL, "stop": syscall.SIGSTOP}[parts[2]]
	if err1 != nil || err2 != nil || seq < 1 || sig == 0 {
		fmt.Fprintf(os.Stderr, "superprog: bad SUPERPROG_SELF %q (want R:S:kill or R:S:stop)\n", spec)
		os.Exit(64)
	}
	if r != rank {
		return 0, 0
	}
	return seq, sig
}
