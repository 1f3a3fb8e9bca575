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
func (r *runner) runAttempt(ctx context.Context, n int, sigs <-chan os.Signal) (Outcome, error) {
	log := r.log.With().Int("attempt", n).Logger()
	prefix := restartPrefix(n)
	wctx, cancelWatch := context.WithCancel(ctx)
	defer cancelWatch()
	// Two narrow watches rather than one on prefix: ranks keep their own
	// (possibly busy) keys under the same attempt prefix.
	aborts, err := r.st.Watch(wctx, prefix+"abort/runner-", true)
	if err != nil {
		return Outcome{}, fmt.Errorf("launcher: watch %sabort/: %w", prefix, err)
	}
	dones, err := r.st.Watch(wctx, prefix+"done/", true)
	if err != nil {
		return Outcome{}, fmt.Errorf("launcher: watch %sdone/: %w", prefix, err)
	}
	// The other runners' heartbeats (keepalive.go), with several runners.
	live := newLiveness(r.id, r.cfg.RunnerTimeout, time.Now())
	var alive <-chan store.Event
	if r.numRunners > 1 {
		if alive, err = r.st.Watch(wctx, alivePrefix, true); err != nil {
			return Outcome{}, fmt.Errorf("launcher: watch %s: %w", alivePrefix, err)
		}
	}

	ranks := make([]int, len(r.slots))
	for i, s := range r.slots {
		ranks[i] = s.Rank
	}
	pol := NewPolicy(r.id, ranks, r.cfg.FailureGrace, r.cfg.StopGrace)
	procs := make([]*proc, len(r.slots))
	exits := make(chan RankExited, len(r.slots))
	binds := r.cpuBinding(log)
	for i, slot := range r.slots {
		out, err := openRankOutput(r.cfg, n, slot, r.stdout, r.stderr)
		errFile := r.errorFile(n, slot.Rank)
		var p *proc
		if err == nil {
			env := append(rankEnv(r.cfg, r.url, slot, r.world, r.localWorld, n, errFile), r.metrics.rankEnv(n, slot.Rank)...)
			var cpus []int
			if binds != nil {
				cpus = binds[i]
			}
			p, err = startRank(r.path, r.cfg.Args, env, i, slot, out, cpus)
			if err != nil {
				out.close()
			}
		}
		if err != nil {
			log.Error().Err(err).Int("rank", slot.Rank).Msg("rank did not start")
			exits <- RankExited{Local: i, Code: 127, Err: err.Error()}
			continue
		}
		procs[i] = p
		r.metrics.rankStarted()
		log.Debug().Int("rank", slot.Rank).Int("local_rank", slot.LocalRank).Int("pid", p.pid).Msg("rank started")
		go func() {
			code, sig := p.wait()
			r.metrics.rankExited()
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
			exits <- e
		}()
	}
	log.Info().Ints("ranks", ranks).Int("world_size", r.world).Msg("attempt started")

	var pubs sync.WaitGroup
	defer pubs.Wait()
	publish := func(key string, v []byte) {
		pubs.Add(1)
		go func() {
			defer pubs.Done()
			pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
			defer cancel()
			if err := r.st.Set(pctx, key, v); err != nil {
				log.Error().Err(err).Str("key", key).Msg("store write failed")
			}
		}()
	}
	defer func() {
		for _, p := range procs {
			if p != nil {
				p.out.close()
			}
		}
	}()

	tick := time.NewTicker(r.cfg.MonitorInterval)
	defer tick.Stop()
	done := map[string]bool{}
	var outcome Outcome
	finished := false
	apply := func(acts []Action) {
		for _, a := range acts {
			switch a := a.(type) {
			case PublishAbort:
				b, _ := json.Marshal(a.Abort)
				log.Warn().Int("rank", a.Abort.Rank).Int("exit_code", a.Abort.ExitCode).Str("reason", a.Abort.Reason).Msg("aborting attempt")
				publish(abortKey(n, r.id), b)
			case PublishDone:
				log.Info().Msg("local ranks succeeded; waiting for the other runners")
				publish(doneKey(n, r.id), []byte("1"))
			case PublishDead:
				b, _ := json.Marshal(a.Dead)
				publish(deadKey(n, a.Dead.Rank), b)
			case SignalRanks:
				for i, p := range procs {
					if p != nil && pol.Running(i) {
						if err := p.signal(a.Sig); err != nil {
							log.Error().Err(err).Msg("signal failed")
						}
					}
				}
				log.Info().Stringer("signal", a.Sig).Msg("signalled local ranks")
			case Finish:
				outcome, finished = a.Outcome, true
			}
		}
	}
	apply(pol.Start())
	for !finished {
		if dones == nil && pol.phase == phaseBarrier {
			// No done keys can arrive any more (store gone): local ranks
			// succeeded, which is all this runner can still know.
			apply(pol.Step(RunnersDone{}, time.Now()))
			continue
		}
		var kill <-chan time.Time // the SIGKILL deadline, independent of the tick
		if d, ok := pol.Deadline(); ok {
			kill = time.After(time.Until(d))
		}
		var in Input
		select {
		case e := <-exits:
			lg := log.Info()
			if e.Code != 0 {
				lg = log.Warn()
			}
			lg = lg.Int("rank", r.slots[e.Local].Rank).Int("exit_code", e.Code)
			if e.Signal != 0 {
				lg = lg.Stringer("signal", e.Signal)
			}
			if e.Err != "" {
				lg = lg.Str("rank_error", e.Err)
			}
			lg.Msg("rank exited")
			in = e
		case ev, ok := <-aborts:
			if !ok {
				aborts = nil
				log.Warn().Msg("store watch ended; aborts of other runners can no longer be seen")
				break
			}
			in = r.watchInput(ev, prefix, done)
		case ev, ok := <-dones:
			if !ok {
				dones = nil
				log.Warn().Msg("store watch ended; the exit barrier will not wait for the other runners")
				break
			}
			in = r.watchInput(ev, prefix, done)
		case s := <-sigs:
			sig, _ := s.(syscall.Signal)
			if sig == 0 {
				sig = syscall.SIGTERM
			}
			log.Warn().Stringer("signal", sig).Msg("signal received; forwarding to ranks")
			in = SignalReceived{Sig: sig}
		case ev, ok := <-alive:
			if !ok {
				alive = nil
				break
			}
			if ev.Type == store.EventPut {
				live.beat(strings.TrimPrefix(ev.Key, alivePrefix), time.Now())
			}
		case <-tick.C:
			in = Tick{}
			if alive != nil {
				if id, silent, lost := live.check(time.Now(), func(id string) bool { return done[id] }); lost {
					log.Error().Str("lost_runner", id).Dur("silent", silent).Msg("runner heartbeat lost")
					r.lost[id] = true
					in = RunnerLost{Runner: id, Silent: silent}
				}
			}
		case <-kill:
			in = Tick{}
		}
		if in != nil {
			apply(pol.Step(in, time.Now()))
		}
	}
	log.Info().Stringer("outcome", outcome.Kind).Int("exit_code", outcome.ExitCode).Str("reason", outcome.Reason).Msg("attempt finished")
	if outcome.Kind != Succeeded {
		publish(stoppedKey(n, r.id), []byte("1"))
		r.stderr.writeBlock(failureSummary(r.cfg.JobID, n, outcome))
	}
	return outcome, nil
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
