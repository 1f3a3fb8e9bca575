package launcher

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/rs/zerolog"

	"github.com/ranktree/ranktree"
	"github.com/ranktree/ranktree/store"
)

// Store keys of the launcher. Per-attempt keys live under
// restartPrefix(n); the budget keys are job-wide.
const (
	keyRestarts    = "restarts"     // restarts performed so far (decimal counter)
	keyMaxRestarts = "max_restarts" // the job-wide budget, fixed by the first runner
	keyFinished    = "finished"     // set when the job is over (JSON outcome)
)

// restartPrefix is the store prefix of attempt n's state.
func restartPrefix(n int) string { return fmt.Sprintf("restart/%d/", n) }

// abortKey is runner id's abort key of attempt n.
func abortKey(n int, id string) string { return restartPrefix(n) + "abort/runner-" + id }

// stoppedKey says runner id stopped its ranks after attempt n failed.
func stoppedKey(n int, id string) string { return restartPrefix(n) + "stopped/" + id }

// doneKey is runner id's exit-barrier key of attempt n.
func doneKey(n int, id string) string { return restartPrefix(n) + "done/" + id }

// deadKey records that global rank failed in attempt n (ranktree.Init
// watches it; see ranktree.DeadRank).
func deadKey(n, rank int) string { return restartPrefix(n) + ranktree.DeadRankKey(rank) }

// pumpDrain bounds how long a finished rank's output is drained (a
// grandchild may hold the pipe open).
const pumpDrain = time.Second

// runAttempt runs attempt n: it watches the attempt's abort and done keys,
// starts every local rank and drives a Policy until the attempt finishes.
// The steps, in order:
//
//  1. openAttempt: the store watches (runner aborts, done keys, the other
//     runners' heartbeats);
//  2. startRanks: one process per local rank, each with a goroutine that
//     reports its exit;
//  3. the loop: next turns whatever happens first (a rank exit, a store
//     key, a signal, a tick, the kill deadline) into a policy Input, and
//     apply carries out the Policy's actions (publish, signal, finish);
//  4. report: the outcome goes to the log, the store and the failure
//     summary.
func (r *runner) runAttempt(ctx context.Context, n int, sigs <-chan os.Signal) (Outcome, error) {
	a, err := r.openAttempt(ctx, n)
	if err != nil {
		return Outcome{}, err
	}
	defer a.close()
	a.startRanks()
	tick := time.NewTicker(r.cfg.MonitorInterval)
	defer tick.Stop()
	a.apply(a.pol.Start())
	for !a.finished {
		if in := a.next(tick.C, sigs); in != nil {
			a.apply(a.pol.Step(in, time.Now()))
		}
	}
	a.report()
	return a.outcome, nil
}

// attempt is the state of one runAttempt; its goroutine owns it (rank
// exits arrive on exits, store writes run in goroutines counted by pubs).
type attempt struct {
	r      *runner
	n      int
	ctx    context.Context
	log    zerolog.Logger
	prefix string // restartPrefix(n)

	cancelWatch          context.CancelFunc
	aborts, dones, alive <-chan store.Event // nil once ended (alive: nil with one runner)
	live                 *liveness

	ranks []int // the local ranks' global ranks, by local index
	pol   *Policy
	procs []*proc // nil where a rank did not start
	exits chan RankExited
	done  map[string]bool // runners whose done key was seen
	pubs  sync.WaitGroup

	outcome  Outcome
	finished bool
}

// openAttempt sets up attempt n's store watches.
func (r *runner) openAttempt(ctx context.Context, n int) (*attempt, error) {
	a := &attempt{r: r, n: n, ctx: ctx, log: r.log.With().Int("attempt", n).Logger(), prefix: restartPrefix(n),
		live: newLiveness(r.id, r.cfg.RunnerTimeout, time.Now()), done: map[string]bool{},
		procs: make([]*proc, len(r.slots)), exits: make(chan RankExited, len(r.slots))}
	wctx, cancel := context.WithCancel(ctx)
	a.cancelWatch = cancel
	// Two narrow watches rather than one on prefix: ranks keep their own
	// (possibly busy) keys under the same attempt prefix.
	var err error
	if a.aborts, err = r.st.Watch(wctx, a.prefix+"abort/runner-", true); err != nil {
		cancel()
		return nil, fmt.Errorf("launcher: watch %sabort/: %w", a.prefix, err)
	}
	if a.dones, err = r.st.Watch(wctx, a.prefix+"done/", true); err != nil {
		cancel()
		return nil, fmt.Errorf("launcher: watch %sdone/: %w", a.prefix, err)
	}
	// The other runners' heartbeats (keepalive.go), with several runners.
	if r.numRunners > 1 {
		if a.alive, err = r.st.Watch(wctx, alivePrefix, true); err != nil {
			cancel()
			return nil, fmt.Errorf("launcher: watch %s: %w", alivePrefix, err)
		}
	}
	a.ranks = make([]int, len(r.slots))
	for i, s := range r.slots {
		a.ranks[i] = s.Rank
	}
	a.pol = NewPolicy(r.id, a.ranks, r.cfg.FailureGrace, r.cfg.StopGrace)
	return a, nil
}

// close closes the ranks' outputs, waits for the store writes and ends
// the watches.
func (a *attempt) close() {
	for _, p := range a.procs {
		if p != nil {
			p.out.close()
		}
	}
	a.pubs.Wait()
	a.cancelWatch()
}

// startRanks starts every local rank. A rank that cannot start is
// reported at once as exited with code 127.
func (a *attempt) startRanks() {
	binds := a.r.cpuBinding(a.log)
	for i, slot := range a.r.slots {
		var cpus []int
		if binds != nil {
			cpus = binds[i]
		}
		if err := a.startRank(i, slot, cpus); err != nil {
			a.log.Error().Err(err).Int("rank", slot.Rank).Msg("rank did not start")
			a.exits <- RankExited{Local: i, Code: 127, Err: err.Error()}
		}
	}
	a.log.Info().Ints("ranks", a.ranks).Int("world_size", a.r.world).Msg("attempt started")
}

// startRank starts local rank i with its environment, output and CPU
// binding, and a goroutine that reports its exit on a.exits.
func (a *attempt) startRank(i int, slot RankSlot, cpus []int) error {
	r := a.r
	out, err := openRankOutput(r.cfg, a.n, slot, r.stdout, r.stderr)
	if err != nil {
		return err
	}
	errFile := r.errorFile(a.n, slot.Rank)
	env := append(rankEnv(r.cfg, r.url, slot, r.world, r.localWorld, a.n, errFile), r.metrics.rankEnv(a.n, slot.Rank)...)
	p, err := startRank(r.path, r.cfg.Args, env, i, slot, out, cpus)
	if err != nil {
		out.close()
		return err
	}
	a.procs[i] = p
	r.metrics.rankStarted()
	a.log.Debug().Int("rank", slot.Rank).Int("local_rank", slot.LocalRank).Int("pid", p.pid).Msg("rank started")
	go a.awaitExit(i, p, errFile)
	return nil
}

// awaitExit waits for local rank i's process, drains its output (bounded
// by pumpDrain) and reports its exit, with its error file's text or the
// tail of its stderr when it failed.
func (a *attempt) awaitExit(i int, p *proc, errFile string) {
	code, sig := p.wait()
	a.r.metrics.rankExited()
	drained := make(chan struct{})
	go func() { p.pumps.Wait(); close(drained) }()
	select {
	case <-drained:
	case <-time.After(pumpDrain):
	}
	e := RankExited{Local: i, Code: code, Signal: sig, PID: p.pid}
	if code != 0 {
		e.Err = rankError(errFile, p.out.stderr.tail)
	}
	a.exits <- e
}

// publish writes key in the background (bounded to 10 s, even after ctx
// ends); close waits for it.
func (a *attempt) publish(key string, v []byte) {
	a.pubs.Add(1)
	go func() {
		defer a.pubs.Done()
		pctx, cancel := context.WithTimeout(context.WithoutCancel(a.ctx), 10*time.Second)
		defer cancel()
		if err := a.r.st.Set(pctx, key, v); err != nil {
			a.log.Error().Err(err).Str("key", key).Msg("store write failed")
		}
	}()
}

// apply carries out the Policy's actions.
func (a *attempt) apply(acts []Action) {
	for _, act := range acts {
		switch act := act.(type) {
		case PublishAbort:
			b, _ := json.Marshal(act.Abort)
			a.log.Warn().Int("rank", act.Abort.Rank).Int("exit_code", act.Abort.ExitCode).Str("reason", act.Abort.Reason).Msg("aborting attempt")
			a.publish(abortKey(a.n, a.r.id), b)
		case PublishDone:
			a.log.Info().Msg("local ranks succeeded; waiting for the other runners")
			a.publish(doneKey(a.n, a.r.id), []byte("1"))
		case PublishDead:
			b, _ := json.Marshal(act.Dead)
			a.publish(deadKey(a.n, act.Dead.Rank), b)
		case SignalRanks:
			a.signalRanks(act.Sig)
		case Finish:
			a.outcome, a.finished = act.Outcome, true
		}
	}
}

// signalRanks sends sig to every local rank the Policy still sees running.
func (a *attempt) signalRanks(sig syscall.Signal) {
	for i, p := range a.procs {
		if p != nil && a.pol.Running(i) {
			if err := p.signal(sig); err != nil {
				a.log.Error().Err(err).Msg("signal failed")
			}
		}
	}
	a.log.Info().Stringer("signal", sig).Msg("signalled local ranks")
}

// next waits for the first thing that happens and returns it as a policy
// Input, or nil when it is none (a heartbeat, an ended watch).
func (a *attempt) next(tick <-chan time.Time, sigs <-chan os.Signal) Input {
	if a.dones == nil && a.pol.phase == phaseBarrier {
		// No done keys can arrive any more (store gone): local ranks
		// succeeded, which is all this runner can still know.
		return RunnersDone{}
	}
	var kill <-chan time.Time // the SIGKILL deadline, independent of the tick
	if d, ok := a.pol.Deadline(); ok {
		kill = time.After(time.Until(d))
	}
	select {
	case e := <-a.exits:
		a.logExit(e)
		return e
	case ev, ok := <-a.aborts:
		if !ok {
			a.aborts = nil
			a.log.Warn().Msg("store watch ended; aborts of other runners can no longer be seen")
			return nil
		}
		return a.r.watchInput(ev, a.prefix, a.done)
	case ev, ok := <-a.dones:
		if !ok {
			a.dones = nil
			a.log.Warn().Msg("store watch ended; the exit barrier will not wait for the other runners")
			return nil
		}
		return a.r.watchInput(ev, a.prefix, a.done)
	case s := <-sigs:
		sig, _ := s.(syscall.Signal)
		if sig == 0 {
			sig = syscall.SIGTERM
		}
		a.log.Warn().Stringer("signal", sig).Msg("signal received; forwarding to ranks")
		return SignalReceived{Sig: sig}
	case ev, ok := <-a.alive:
		if !ok {
			a.alive = nil
		} else if ev.Type == store.EventPut {
			a.live.beat(strings.TrimPrefix(ev.Key, alivePrefix), time.Now())
		}
		return nil
	case <-tick:
		return a.tickInput()
	case <-kill:
		return Tick{}
	}
}

// tickInput is the input of a monitor tick: a lost runner when one's
// heartbeat went silent, else Tick.
func (a *attempt) tickInput() Input {
	if a.alive != nil {
		if id, silent, lost := a.live.check(time.Now(), func(id string) bool { return a.done[id] }); lost {
			a.log.Error().Str("lost_runner", id).Dur("silent", silent).Msg("runner heartbeat lost")
			a.r.lost[id] = true
			return RunnerLost{Runner: id, Silent: silent}
		}
	}
	return Tick{}
}

// logExit logs a rank's exit (a warning when it failed).
func (a *attempt) logExit(e RankExited) {
	lg := a.log.Info()
	if e.Code != 0 {
		lg = a.log.Warn()
	}
	lg = lg.Int("rank", a.r.slots[e.Local].Rank).Int("exit_code", e.Code)
	if e.Signal != 0 {
		lg = lg.Stringer("signal", e.Signal)
	}
	if e.Err != "" {
		lg = lg.Str("rank_error", e.Err)
	}
	lg.Msg("rank exited")
}

// report logs the outcome; a failed attempt also writes its stopped key
// and the failure summary.
func (a *attempt) report() {
	o := a.outcome
	a.log.Info().Stringer("outcome", o.Kind).Int("exit_code", o.ExitCode).Str("reason", o.Reason).Msg("attempt finished")
	if o.Kind != Succeeded {
		a.publish(stoppedKey(a.n, a.r.id), []byte("1"))
		a.r.stderr.writeBlock(failureSummary(a.r.cfg.JobID, a.n, o))
	}
}

// watchInput turns a store event under prefix into a policy input (nil if
// it is not one): runner abort keys, and the done key that completes the set.
func (r *runner) watchInput(ev store.Event, prefix string, done map[string]bool) Input {
	if ev.Type != store.EventPut {
		return nil
	}
	rest := strings.TrimPrefix(ev.Key, prefix)
	switch {
	case strings.HasPrefix(rest, "abort/runner-"):
		var a Abort
		if err := json.Unmarshal(ev.Value, &a); err != nil {
			a = Abort{Runner: strings.TrimPrefix(rest, "abort/runner-"), Rank: -1, Reason: string(ev.Value), ExitCode: 1}
		}
		if a.Runner == "" {
			a.Runner = strings.TrimPrefix(rest, "abort/runner-")
		}
		return AbortSeen{Abort: a}
	case strings.HasPrefix(rest, "done/"):
		done[strings.TrimPrefix(rest, "done/")] = true
		if len(done) >= r.numRunners {
			return RunnersDone{}
		}
	}
	return nil
}
