package launcher

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/rs/zerolog"

	"github.com/ranktree/ranktree/store"
)

// runner is one rankrunner process's state for a job.
type runner struct {
	cfg        *Config
	log        zerolog.Logger
	path       string // the executable each rank runs
	url        string // NATS URL given to ranks
	st         store.Store
	id         string // runner id in abort/done keys
	numRunners int
	slots      []RankSlot
	world      int
	localWorld int
	stdout     *console
	stderr     *console
	cleanups   []func()
	lost       map[string]bool // runners whose heartbeat was lost (attempt loop only)
	errDir     string          // ranks' RANKTREE_ERROR_FILE directory ("" if none could be made)
	metrics    *runnerMetrics  // nil without --metrics-addr (metrics.go)
}

// ErrInterrupted is returned by Run when a signal stopped the runner
// before the ranks started.
var ErrInterrupted = errors.New("launcher: interrupted")

// Run launches and supervises this runner's ranks of a job until the job
// succeeds, fails past its restart budget, or the runner is signalled
// (torchrun's elastic agent run loop). It returns the code rankrunner
// should exit with: 0 on success, the failing rank's exit code (128+signal
// for a signal death), 128+signal when the runner itself was signalled, or
// 2 for a bad Config (err is then a *FlagError).
//
// Sequence: build or find PROGRAM; serve an embedded NATS server when this
// is the leader and no URL is given; connect the job's store; fix the
// job-wide restart budget (first runner wins); run attempts, each under
// restart/<n>/, until one succeeds or the budget is spent.
func Run(ctx context.Context, cfg Config) (int, error) {
	r, err := newRunner(cfg)
	if err != nil {
		return 2, err
	}

	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGQUIT)
	defer signal.Stop(sigs)
	setupCtx, cancelSetup := context.WithCancel(ctx)
	defer cancelSetup()
	// A signal during setup (building, connecting) cancels it.
	setupDone := make(chan struct{})
	setupSig := make(chan os.Signal, 1)
	var watcher sync.WaitGroup
	watcher.Add(1)
	go func() {
		defer watcher.Done()
		select {
		case s := <-sigs:
			setupSig <- s
			cancelSetup()
		case <-setupDone:
		}
	}()
	code, err := r.setup(setupCtx)
	close(setupDone)
	watcher.Wait()
	defer r.teardown()
	select {
	case s := <-setupSig:
		sig, _ := s.(syscall.Signal)
		r.log.Warn().Stringer("signal", s).Msg("interrupted during setup")
		return 128 + int(sig), fmt.Errorf("%w by %v during setup", ErrInterrupted, s)
	default:
	}
	if err != nil {
		return code, err
	}
	return r.loop(ctx, sigs)
}

// newRunner validates cfg and lays out this runner's ranks; the program,
// server and store are set up by setup.
func newRunner(cfg Config) (*runner, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	r := &runner{cfg: &cfg, stdout: &console{w: cfg.Stdout}, stderr: &console{w: cfg.Stderr}, lost: map[string]bool{}}
	r.id, r.numRunners = cfg.runnerID()
	r.slots, r.world, r.localWorld = cfg.slots()
	r.log = cfg.Log.With().Str("job", cfg.JobID).Str("runner", r.id).Logger()
	return r, nil
}

// errorFile is the RANKTREE_ERROR_FILE of rank in attempt n ("" when the
// runner has no error directory). A file left from before is removed.
func (r *runner) errorFile(n, rank int) string {
	if r.errDir == "" {
		return ""
	}
	path := filepath.Join(r.errDir, fmt.Sprintf("attempt%d-rank%d.txt", n, rank))
	_ = os.Remove(path)
	return path
}

// addCleanup registers f to run at teardown (last registered first).
func (r *runner) addCleanup(f func()) { r.cleanups = append(r.cleanups, f) }

// teardown closes the store, stops the embedded server and removes the
// built program.
func (r *runner) teardown() {
	for i := len(r.cleanups) - 1; i >= 0; i-- {
		r.cleanups[i]()
	}
	r.cleanups = nil
}

func (r *runner) setup(ctx context.Context) (int, error) {
	if err := r.startMetrics(); err != nil {
		return 2, err
	}
	path, cleanup, err := resolveProgram(ctx, r.cfg.Program, r.log)
	r.addCleanup(cleanup)
	if err != nil {
		return 1, err
	}
	r.path = path
	if dir, err := os.MkdirTemp("", "rankrunner-errors-"); err != nil {
		r.log.Warn().Err(err).Msg("no directory for the ranks' error files; the failure summary uses their stderr")
	} else {
		r.errDir = dir
		r.addCleanup(func() { _ = os.RemoveAll(dir) })
	}
	r.url = r.cfg.NATSURL
	if r.cfg.serves() {
		url, shutdown, err := startServer(r.cfg, r.log)
		if err != nil {
			return 1, err
		}
		r.addCleanup(shutdown)
		if r.url == "" {
			r.url = url
		}
	}
	st, err := connectStore(ctx, r.cfg, r.url, r.id, r.log)
	if err != nil {
		return 1, err
	}
	r.addCleanup(func() { _ = st.Close() })
	r.st = st
	if r.numRunners > 1 {
		hctx, stop := context.WithCancel(context.WithoutCancel(ctx))
		var beating sync.WaitGroup
		beating.Go(func() { r.heartbeat(hctx) })
		r.addCleanup(func() { stop(); beating.Wait() })
	}
	return 0, nil
}

// loop runs attempts until success, a final failure or the end of the budget.
func (r *runner) loop(ctx context.Context, sigs <-chan os.Signal) (int, error) {
	sctx, cancel := context.WithTimeout(ctx, r.cfg.StoreTimeout)
	if fin, err := r.st.Check(sctx, []string{keyFinished}); err != nil || fin {
		cancel()
		if err != nil {
			return 1, fmt.Errorf("launcher: read %q: %w", keyFinished, err)
		}
		v, _ := r.st.Get(ctx, keyFinished)
		return 2, &FlagError{Flag: "--job-id", Msg: fmt.Sprintf("job %q already finished on this NATS server (%s); use a new job id", r.cfg.JobID, v)}
	}
	budget, err := r.budget(sctx)
	if err != nil {
		cancel()
		return 1, err
	}
	n64, err := r.st.Add(sctx, keyRestarts, 0)
	cancel()
	if err != nil {
		return 1, fmt.Errorf("launcher: read %q: %w", keyRestarts, err)
	}
	n := int(n64)
	for {
		r.metrics.attempt(n, budget)
		out, err := r.runAttempt(ctx, n, sigs)
		if err != nil {
			return 1, err
		}
		r.metrics.ended(out.Kind)
		switch {
		case out.Kind == Succeeded:
			r.log.Info().Int("attempts", n+1).Msg("job succeeded")
			r.markFinished(ctx, n, out)
			return 0, nil
		case out.Final:
			r.markFinished(ctx, n, out)
			r.lingerForPeers(ctx, n, sigs)
			return out.ExitCode, nil
		case n >= budget:
			r.log.Error().Int("restarts", n).Int("max_restarts", budget).Int("exit_code", out.ExitCode).Str("reason", out.Reason).Msg("restart budget spent; job failed")
			r.markFinished(ctx, n, out)
			r.lingerForPeers(ctx, n, sigs)
			return out.ExitCode, nil
		}
		next, err := r.claimRestart(ctx, n)
		if err != nil {
			return out.ExitCode, err
		}
		r.log.Warn().Int("restart_count", next).Int("max_restarts", budget).Str("reason", out.Reason).Msg("restarting the job")
		n = next
	}
}

// lingerForPeers keeps the embedded NATS server of a failed multi-runner
// job up until every runner has seen the failure and stopped its ranks
// (its "restart/<n>/stopped/<id>" key), or FailureGrace+StopGrace+5s
// passed, so that no runner misses the abort because the server went away.
func (r *runner) lingerForPeers(ctx context.Context, n int, sigs <-chan os.Signal) {
	if !r.cfg.serves() || r.numRunners < 2 {
		return
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() { // another signal ends the wait
		select {
		case <-sigs:
			cancel()
		case <-ctx.Done():
		}
	}()
	var keys []string
	for _, id := range r.cfg.runnerIDs() {
		if !r.lost[id] { // a lost runner will not confirm
			keys = append(keys, stoppedKey(n, id))
		}
	}
	bound := max(0, r.cfg.FailureGrace) + r.cfg.StopGrace + 5*time.Second
	if err := r.st.Wait(ctx, keys, bound); err != nil {
		r.log.Warn().Err(err).Dur("waited", bound).Msg("not every runner confirmed it stopped; shutting the NATS server down anyway")
	}
}

// markFinished records at job level that the job is over, so a later
// runner reusing the job id on a persistent NATS server refuses to start
// instead of replaying this job's abort and done keys. Best effort.
func (r *runner) markFinished(ctx context.Context, n int, out Outcome) {
	v, _ := json.Marshal(struct {
		Outcome  string `json:"outcome"`
		Attempt  int    `json:"attempt"`
		ExitCode int    `json:"exit_code"`
		Reason   string `json:"reason,omitempty"`
	}{out.Kind.String(), n, out.ExitCode, out.Reason})
	fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if err := r.st.Set(fctx, keyFinished, v); err != nil {
		r.log.Debug().Err(err).Msg("could not mark the job finished")
	}
}

// budget fixes the job-wide restart budget: the first runner's
// --max-restarts is stored under max_restarts and every runner obeys it.
func (r *runner) budget(ctx context.Context) (int, error) {
	mine := []byte(strconv.Itoa(r.cfg.MaxRestarts))
	v, err := r.st.CompareAndSet(ctx, keyMaxRestarts, nil, mine)
	if err != nil {
		return 0, fmt.Errorf("launcher: store the restart budget: %w", err)
	}
	b, err := strconv.Atoi(string(v))
	if err != nil {
		return 0, fmt.Errorf("launcher: stored %s %q is not an integer", keyMaxRestarts, v)
	}
	if b != r.cfg.MaxRestarts {
		r.log.Warn().Int("mine", r.cfg.MaxRestarts).Int("job", b).Msg("--max-restarts differs from the job's; using the job's")
	}
	return b, nil
}

// claimRestart moves the job-wide restart counter from n to n+1 exactly
// once, whichever runner gets there first, and returns the new attempt.
func (r *runner) claimRestart(ctx context.Context, n int) (int, error) {
	cctx, cancel := context.WithTimeout(ctx, r.cfg.StoreTimeout)
	defer cancel()
	v, err := r.st.CompareAndSet(cctx, keyRestarts, []byte(strconv.Itoa(n)), []byte(strconv.Itoa(n+1)))
	if err == nil && len(v) == 0 && n == 0 {
		// The counter was never created: "absent" stands for 0.
		v, err = r.st.CompareAndSet(cctx, keyRestarts, nil, []byte("1"))
	}
	if err != nil {
		return 0, fmt.Errorf("launcher: claim restart %d: %w", n+1, err)
	}
	next, err := strconv.Atoi(string(v))
	if err != nil || next <= n {
		return 0, fmt.Errorf("launcher: restart counter %q did not advance past %d", v, n)
	}
	return next, nil
}
