package launcher

import (
	"fmt"
	"syscall"
	"time"
)

// This file is the supervision core: a pure state machine of one attempt
// (torchrun's LocalElasticAgent._monitor_workers / _restart_workers
// decisions). It holds no goroutine, timer or process: the attempt loop in
// attempt.go feeds it inputs with the current time and carries out the
// actions it returns, so every decision is testable without processes.

// Abort is the JSON value of an abort key restart/<n>/abort/runner-<id>:
// which runner aborted the attempt, the failing rank (-1 for none), why, and
// the exit code the job should end with. Final aborts (a runner was
// interrupted) are never restarted.
type Abort struct {
	Runner   string `json:"runner"`
	Rank     int    `json:"rank"`
	Reason   string `json:"reason"`
	ExitCode int    `json:"exit_code"`
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
	Remote   bool   // the failure was reported by another runner
	Final    bool   // never restart (interrupted here or on another runner)
}

// Inputs of Policy.Step.
type (
	// RankExited: local rank index Local exited with Code (128+signal for
	// a signal death).
	RankExited struct {
		Local int
		Code  int
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
	// Finish: the attempt is over.
	Finish struct{ Outcome Outcome }
)

type phase uint8

const (
	phaseRunning  phase = iota // ranks run
	phaseStopping              // SIGTERM (or the forwarded signal) sent; SIGKILL at deadline
	phaseKilling               // SIGKILL sent; waiting for exits
	phaseBarrier               // local ranks all exited 0; waiting for the other runners
	phaseDone
)

// Policy is the supervision state of one attempt on one runner.
type Policy struct {
	self     string // this runner's id
	ranks    []int  // global rank of each local index
	running  []bool
	nRunning int
	grace    time.Duration
	phase    phase
	deadline time.Time
	outcome  Outcome
}

// NewPolicy returns the state of an attempt whose local ranks (global rank
// of each local index) have all been started. grace is the time between
// SIGTERM and SIGKILL.
func NewPolicy(self string, ranks []int, grace time.Duration) *Policy {
	p := &Policy{self: self, ranks: ranks, running: make([]bool, len(ranks)), nRunning: len(ranks), grace: grace}
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
		if in.Abort.Runner == p.self {
			return nil
		}
		o := Outcome{Kind: Failed, Rank: in.Abort.Rank, ExitCode: in.Abort.ExitCode, Remote: true, Final: in.Abort.Final,
			Reason: fmt.Sprintf("runner %s aborted the attempt: %s", in.Abort.Runner, in.Abort.Reason)}
		if o.ExitCode == 0 {
			o.ExitCode = 1
		}
		switch p.phase {
		case phaseRunning:
			p.outcome = o
			return p.stop(syscall.SIGTERM, now)
		case phaseBarrier:
			p.outcome = o
			return p.finish()
		}
	case RunnersDone:
		if p.phase == phaseBarrier {
			p.outcome = Outcome{Kind: Succeeded, Rank: -1}
			return p.finish()
		}
	case SignalReceived:
		o := Outcome{Kind: Interrupted, Rank: -1, ExitCode: 128 + int(in.Sig), Final: true,
			Reason: fmt.Sprintf("runner %s received %v", p.self, in.Sig)}
		switch p.phase {
		case phaseRunning:
			p.outcome = o
			acts := []Action{PublishAbort{Abort{Runner: p.self, Rank: -1, Reason: o.Reason, ExitCode: o.ExitCode, Final: true}}}
			return append(acts, p.stop(in.Sig, now)...)
		case phaseStopping:
			// A second signal: stop waiting for the grace period.
			p.phase = phaseKilling
			return []Action{SignalRanks{syscall.SIGKILL}}
		case phaseBarrier:
			p.outcome = o
			return p.finish()
		}
	case RunnerLost:
		o := Outcome{Kind: Failed, Rank: -1, ExitCode: 1,
			Reason: fmt.Sprintf("runner %s sent no heartbeat for %v (its host or network is gone, or it hangs)", in.Runner, in.Silent.Round(time.Millisecond))}
		abort := PublishAbort{Abort{Runner: p.self, Rank: -1, Reason: o.Reason, ExitCode: 1}}
		switch p.phase {
		case phaseRunning:
			p.outcome = o
			return append([]Action{abort}, p.stop(syscall.SIGTERM, now)...)
		case phaseBarrier:
			p.outcome = o
			return append([]Action{abort}, p.finish()...)
		}
	case Tick:
		if p.phase == phaseStopping && !now.Before(p.deadline) {
			p.phase = phaseKilling
			return []Action{SignalRanks{syscall.SIGKILL}}
		}
	}
	return nil
}

func (p *Policy) exited(in RankExited, now time.Time) []Action {
	if in.Local < 0 || in.Local >= len(p.running) || !p.running[in.Local] {
		return nil
	}
	p.running[in.Local] = false
	p.nRunning--
	switch p.phase {
	case phaseRunning:
		if in.Code != 0 {
			rank := p.ranks[in.Local]
			p.outcome = Outcome{Kind: Failed, Rank: rank, ExitCode: in.Code,
				Reason: fmt.Sprintf("rank %d exited with code %d", rank, in.Code)}
			acts := []Action{PublishAbort{Abort{Runner: p.self, Rank: rank, Reason: p.outcome.Reason, ExitCode: in.Code}}}
			return append(acts, p.stop(syscall.SIGTERM, now)...)
		}
		if p.nRunning == 0 {
			p.phase = phaseBarrier
			return []Action{PublishDone{}}
		}
	case phaseStopping, phaseKilling:
		if p.nRunning == 0 {
			return p.finish()
		}
	}
	return nil
}

// stop signals the running ranks and arms the SIGKILL deadline.
func (p *Policy) stop(sig syscall.Signal, now time.Time) []Action {
	if p.nRunning == 0 {
		return p.finish()
	}
	p.phase = phaseStopping
	p.deadline = now.Add(p.grace)
	return []Action{SignalRanks{sig}}
}

func (p *Policy) finish() []Action {
	p.phase = phaseDone
	return []Action{Finish{p.outcome}}
}

// Deadline returns when SIGKILL is due, while ranks are being stopped.
func (p *Policy) Deadline() (time.Time, bool) {
	return p.deadline, p.phase == phaseStopping
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

// Action is one of PublishAbort, SignalRanks, PublishDone, Finish.
type Action interface{ action() }

func (PublishAbort) action() {}
func (SignalRanks) action()  {}
func (PublishDone) action()  {}
func (Finish) action()       {}
