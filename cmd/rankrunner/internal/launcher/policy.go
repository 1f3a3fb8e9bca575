package launcher

import (
	"fmt"
	"syscall"
	"time"

	"github.com/ranktree/ranktree"
)

// This file is the supervision core: a pure state machine of one attempt
// (torchrun's LocalElasticAgent._monitor_workers / _restart_workers
// decisions). It holds no goroutine, timer or process: the attempt loop in
// attempt.go feeds it inputs with the current time and carries out the
// actions it returns, so every decision is testable without processes.

// Abort is the JSON value of an abort key restart/<n>/abort/runner-<id>:
// which runner aborted the attempt, the failing rank (-1 for none), why, and
// the exit code the job should end with, and the error the failing rank
// reported (its error file or last error line of stderr; "" if none).
// Final aborts (a runner was interrupted) are never restarted.
type Abort struct {
	Runner   string `json:"runner"`
	Rank     int    `json:"rank"`
	Reason   string `json:"reason"`
	ExitCode int    `json:"exit_code"`
	Error    string `json:"error,omitempty"`
	Final    bool   `json:"final,omitempty"`
}

// OutcomeKind says how an attempt ended.
type OutcomeKind uint8

// Attempt outcomes.
const (
	Succeeded   OutcomeKind = iota + 1 // every rank of every runner exited 0
	Failed                             // a rank failed here or on another runner
	Interrupted                        // this runner got SIGINT/SIGTERM/SIGHUP/SIGQUIT
)

func (k OutcomeKind) String() string {
	switch k {
	case Succeeded:
		return "succeeded"
	case Failed:
		return "failed"
	case Interrupted:
		return "interrupted"
	}
	return fmt.Sprintf("OutcomeKind(%d)", uint8(k))
}

// Outcome is the result of one attempt.
type Outcome struct {
	Kind     OutcomeKind
	Rank     int    // failing global rank; -1 when none is known
	ExitCode int    // the code rankrunner exits with (0 on success)
	Reason   string // human-readable cause
	Error    string // the error the failing rank reported ("" if none or unknown)
	Remote   bool   // the failure was reported by another runner
	Final    bool   // never restart (interrupted here or on another runner)
	// Failures lists this runner's ranks that exited non-zero, in the
	// order they exited: with a local root cause, it is Failures[0]
	// (summary.go prints them as torchrun's ChildFailedError table).
	Failures []RankFailure
}

// RankFailure is one local rank that exited non-zero during an attempt.
type RankFailure struct {
	Rank   int            // global rank
	Local  int            // local index
	PID    int            // process id (0 if it never started)
	Code   int            // exit code; 128+signal for a signal death
	Signal syscall.Signal // the signal that killed it; 0 if it exited
	Error  string         // the error it reported ("" if none)
	At     time.Time      // when the runner saw the exit
	// Stopped: it exited after the runner signalled it, so it is a
	// consequence of the failure, not a cause.
	Stopped bool
}

// Status describes how the rank ended: "exit code 7" or
// "signal: killed (SIGKILL)", the wording of os/exec's ExitError.
func (f RankFailure) Status() string { return exitStatus(f.Code, f.Signal) }

// exitStatus is "exit code N", or "signal: NAME (SIGXXX)" for a signal death.
func exitStatus(code int, sig syscall.Signal) string {
	if sig != 0 {
		return fmt.Sprintf("signal: %v (%s)", sig, signalName(sig))
	}
	return fmt.Sprintf("exit code %d", code)
}

// signalName is the SIGXXX name of the common termination signals, else
// "signal N".
func signalName(sig syscall.Signal) string {
	names := map[syscall.Signal]string{
		syscall.SIGHUP: "SIGHUP", syscall.SIGINT: "SIGINT", syscall.SIGQUIT: "SIGQUIT",
		syscall.SIGILL: "SIGILL", syscall.SIGTRAP: "SIGTRAP", syscall.SIGABRT: "SIGABRT",
		syscall.SIGBUS: "SIGBUS", syscall.SIGFPE: "SIGFPE", syscall.SIGKILL: "SIGKILL",
		syscall.SIGUSR1: "SIGUSR1", syscall.SIGSEGV: "SIGSEGV", syscall.SIGUSR2: "SIGUSR2",
		syscall.SIGPIPE: "SIGPIPE", syscall.SIGALRM: "SIGALRM", syscall.SIGTERM: "SIGTERM",
		syscall.SIGXCPU: "SIGXCPU", syscall.SIGXFSZ: "SIGXFSZ", syscall.SIGSYS: "SIGSYS",
	}
	if n, ok := names[sig]; ok {
		return n
	}
	return fmt.Sprintf("signal %d", int(sig))
}

// Inputs of Policy.Step.
type (
	// RankExited: local rank index Local exited with Code (128+signal for
	// a signal death, Signal then set), having reported Err ("" if
	// nothing); PID is its process id (0 if it never started).
	RankExited struct {
		Local  int
		Code   int
		Signal syscall.Signal
		Err    string
		PID    int
	}
	// AbortSeen: an abort key of this attempt appeared in the store.
	AbortSeen struct{ Abort Abort }
	// RunnersDone: every runner of the job wrote its done key.
	RunnersDone struct{}
	// SignalReceived: the runner itself got a termination signal.
	SignalReceived struct{ Sig syscall.Signal }
	// Tick: the monitor interval passed.
	Tick struct{}
	// RunnerLost: another runner's heartbeat has been silent for Silent
	// (keepalive.go).
	RunnerLost struct {
		Runner string
		Silent time.Duration
	}
)

// Actions returned by Policy.Step, to be carried out in order.
type (
	// PublishAbort: write the abort key of this runner.
	PublishAbort struct{ Abort Abort }
	// SignalRanks: send Sig to the process group of every running local rank.
	SignalRanks struct{ Sig syscall.Signal }
	// PublishDone: write this runner's done key (all local ranks exited 0).
	PublishDone struct{}
	// PublishDead: write the dead key of a rank that exited non-zero, so
	// that ranks still waiting in ranktree.Init for it fail at once.
	PublishDead struct{ Dead ranktree.DeadRank }
	// Finish: the attempt is over.
	Finish struct{ Outcome Outcome }
)

type phase uint8

const (
	phaseRunning  phase = iota // ranks run
	phaseGrace                 // a rank failed; the others may still report and exit until deadline
	phaseStopping              // SIGTERM (or the forwarded signal) sent; SIGKILL at deadline
	phaseKilling               // SIGKILL sent; waiting for exits
	phaseBarrier               // local ranks all exited 0; waiting for the other runners
	phaseDone
)

// Policy is the supervision state of one attempt on one runner.
type Policy struct {
	self      string // this runner's id
	ranks     []int  // global rank of each local index
	running   []bool
	nRunning  int
	failGrace time.Duration // failure → SIGTERM
	grace     time.Duration // SIGTERM → SIGKILL
	phase     phase
	deadline  time.Time
	signalled bool // ranks were sent a signal
	failures  []RankFailure
	outcome   Outcome
}

// NewPolicy returns the state of an attempt whose local ranks (global rank
// of each local index) have all been started. failureGrace is how long the
// other ranks may go on after a failure (to report their own errors and
// exit) before they are sent SIGTERM (0: at once); stopGrace is the time
// between SIGTERM and SIGKILL.
func NewPolicy(self string, ranks []int, failureGrace, stopGrace time.Duration) *Policy {
	p := &Policy{self: self, ranks: ranks, running: make([]bool, len(ranks)), nRunning: len(ranks),
		failGrace: max(0, failureGrace), grace: stopGrace}
	for i := range p.running {
		p.running[i] = true
	}
	return p
}

// Done reports whether the attempt has finished.
func (p *Policy) Done() bool { return p.phase == phaseDone }

// Start returns the actions due right after NewPolicy (a runner with no
// local ranks goes straight to the exit barrier).
func (p *Policy) Start() []Action {
	if p.nRunning == 0 {
		p.phase = phaseBarrier
		return []Action{PublishDone{}}
	}
	return nil
}

// Step applies one input at time now and returns the actions to carry out.
func (p *Policy) Step(in Input, now time.Time) []Action {
	if p.phase == phaseDone {
		return nil
	}
	switch in := in.(type) {
	case RankExited:
		return p.exited(in, now)
	case AbortSeen:
		return p.abortSeen(in, now)
	case RunnersDone:
		if p.phase == phaseBarrier {
			p.outcome = Outcome{Kind: Succeeded, Rank: -1}
			return p.finish()
		}
	case SignalReceived:
		return p.signalReceived(in, now)
	case RunnerLost:
		return p.runnerLost(in, now)
	case Tick:
		switch {
		case p.phase == phaseGrace && !now.Before(p.deadline):
			return p.stop(syscall.SIGTERM, now)
		case p.phase == phaseStopping && !now.Before(p.deadline):
			p.phase = phaseKilling
			return []Action{SignalRanks{syscall.SIGKILL}}
		}
	}
	return nil
}

// abortSeen: another runner aborted the attempt.
func (p *Policy) abortSeen(in AbortSeen, now time.Time) []Action {
	if in.Abort.Runner == p.self {
		return nil
	}
	o := Outcome{Kind: Failed, Rank: in.Abort.Rank, ExitCode: in.Abort.ExitCode, Remote: true, Final: in.Abort.Final,
		Reason: fmt.Sprintf("runner %s aborted the attempt: %s", in.Abort.Runner, in.Abort.Reason)}
	o.Error = in.Abort.Error
	if o.ExitCode == 0 {
		o.ExitCode = 1
	}
	switch p.phase {
	case phaseRunning:
		p.outcome = o
		if o.Final {
			return p.stop(syscall.SIGTERM, now)
		}
		return p.fail(now)
	case phaseGrace, phaseStopping, phaseKilling:
		// Already failing; an interrupted runner still makes the
		// failure final, so no runner restarts without the others.
		p.outcome.Final = p.outcome.Final || o.Final
	case phaseBarrier:
		p.outcome = o
		return p.finish()
	}
	return nil
}

// signalReceived: this runner received a signal.
func (p *Policy) signalReceived(in SignalReceived, now time.Time) []Action {
	o := Outcome{Kind: Interrupted, Rank: -1, ExitCode: 128 + int(in.Sig), Final: true,
		Reason: fmt.Sprintf("runner %s received %v", p.self, in.Sig)}
	switch p.phase {
	case phaseRunning:
		p.outcome = o
		acts := []Action{PublishAbort{Abort{Runner: p.self, Rank: -1, Reason: o.Reason, ExitCode: o.ExitCode, Final: true}}}
		return append(acts, p.stop(in.Sig, now)...)
	case phaseGrace:
		// Interrupted while the others report a failure: forward the
		// signal now, keep the failure as the cause, never restart.
		p.outcome.Final = true
		a := Abort{Runner: p.self, Rank: p.outcome.Rank, Reason: p.outcome.Reason + "; then " + o.Reason,
			ExitCode: p.outcome.ExitCode, Error: p.outcome.Error, Final: true}
		return append([]Action{PublishAbort{a}}, p.stop(in.Sig, now)...)
	case phaseStopping:
		// A second signal: stop waiting for the grace period.
		p.phase = phaseKilling
		return []Action{SignalRanks{syscall.SIGKILL}}
	case phaseBarrier:
		p.outcome = o
		return p.finish()
	}
	return nil
}

// runnerLost: another runner's heartbeat went silent.
func (p *Policy) runnerLost(in RunnerLost, now time.Time) []Action {
	o := Outcome{Kind: Failed, Rank: -1, ExitCode: 1,
		Reason: fmt.Sprintf("runner %s sent no heartbeat for %v (its host or network is gone, or it hangs)", in.Runner, in.Silent.Round(time.Millisecond))}
	abort := PublishAbort{Abort{Runner: p.self, Rank: -1, Reason: o.Reason, ExitCode: 1}}
	switch p.phase {
	case phaseRunning:
		p.outcome = o
		return append([]Action{abort}, p.fail(now)...)
	case phaseBarrier:
		p.outcome = o
		return append([]Action{abort}, p.finish()...)
	}
	return nil
}

func (p *Policy) exited(in RankExited, now time.Time) []Action {
	if in.Local < 0 || in.Local >= len(p.running) || !p.running[in.Local] {
		return nil
	}
	p.running[in.Local] = false
	p.nRunning--
	rank := p.ranks[in.Local]
	var acts []Action
	if in.Code != 0 {
		p.failures = append(p.failures, RankFailure{Rank: rank, Local: in.Local, PID: in.PID, Code: in.Code,
			Signal: in.Signal, Error: in.Err, At: now, Stopped: p.signalled})
		if !p.signalled { // a rank we stopped is no news to anyone
			acts = append(acts, PublishDead{ranktree.DeadRank{Rank: rank, ExitCode: in.Code,
				Status: exitStatus(in.Code, in.Signal), Error: in.Err}})
		}
	}
	switch p.phase {
	case phaseRunning:
		if in.Code != 0 {
			reason := fmt.Sprintf("rank %d exited with code %d", rank, in.Code)
			if in.Signal != 0 {
				reason = fmt.Sprintf("rank %d died of %s (exit code %d)", rank, exitStatus(in.Code, in.Signal), in.Code)
			}
			p.outcome = Outcome{Kind: Failed, Rank: rank, ExitCode: in.Code, Reason: reason, Error: in.Err}
			acts = append(acts, PublishAbort{Abort{Runner: p.self, Rank: rank, Reason: reason, ExitCode: in.Code, Error: in.Err}})
			return append(acts, p.fail(now)...)
		}
		if p.nRunning == 0 {
			p.phase = phaseBarrier
			return append(acts, PublishDone{})
		}
	case phaseGrace, phaseStopping, phaseKilling:
		if p.nRunning == 0 {
			return append(acts, p.finish()...)
		}
	}
	return acts
}

// fail starts stopping the ranks after a failure: the failure grace
// period first (the others may report and exit by themselves), then
// SIGTERM.
func (p *Policy) fail(now time.Time) []Action {
	if p.failGrace <= 0 || p.nRunning == 0 {
		return p.stop(syscall.SIGTERM, now)
	}
	p.phase = phaseGrace
	p.deadline = now.Add(p.failGrace)
	return nil
}

// stop signals the running ranks and arms the SIGKILL deadline.
func (p *Policy) stop(sig syscall.Signal, now time.Time) []Action {
	if p.nRunning == 0 {
		return p.finish()
	}
	p.phase = phaseStopping
	p.signalled = true
	p.deadline = now.Add(p.grace)
	return []Action{SignalRanks{sig}}
}

func (p *Policy) finish() []Action {
	p.phase = phaseDone
	p.outcome.Failures = p.failures
	return []Action{Finish{p.outcome}}
}

// Deadline returns when the next timed step is due: the end of the
// failure grace period (SIGTERM), or SIGKILL while ranks are being
// stopped. The attempt loop feeds a Tick at that time.
func (p *Policy) Deadline() (time.Time, bool) {
	return p.deadline, p.phase == phaseGrace || p.phase == phaseStopping
}

// Running reports whether local index i is still running.
func (p *Policy) Running(i int) bool { return i >= 0 && i < len(p.running) && p.running[i] }

// Input is one of RankExited, AbortSeen, RunnersDone, SignalReceived,
// Tick, RunnerLost.
type Input interface{ input() }

func (RankExited) input()     {}
func (AbortSeen) input()      {}
func (RunnersDone) input()    {}
func (SignalReceived) input() {}
func (Tick) input()           {}
func (RunnerLost) input()     {}

// Action is one of PublishAbort, SignalRanks, PublishDone, PublishDead,
// Finish.
type Action interface{ action() }

func (PublishAbort) action() {}
func (PublishDead) action()  {}
func (SignalRanks) action()  {}
func (PublishDone) action()  {}
func (Finish) action()       {}
