package supervisor

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"

	"github.com/ranktree/ranktree/actors"
	"github.com/ranktree/ranktree/comm"
	"github.com/ranktree/ranktree/store"
)

// RankConfig configures StartRank.
type RankConfig struct {
	Job       string
	Rank      int // global rank
	WorldSize int
	Cfg       Config      // from ConfigFromEnv
	Store     store.Store // the job's store (abort and progress keys, dumps); nil: none
	// NATS, if not nil, carries events (ranktree.<job>.events.<rank>.<kind>)
	// and dump requests (DumpSubject). The caller keeps owning it.
	NATS *nats.Conn
	// Policy for actor panics (nil: Cfg.ActorPanic.Decide); see RootConfig.
	Policy      func(child *actor.PID, reason any) Decision
	OnStopped   func(child *actor.PID, reason any)
	OnRestarted func(child *actor.PID, reason any)
	// Exit ends the process (nil: os.Exit). Before calling it, the rank
	// flushes its events (bounded). The rank calls it at most once: the
	// first of the root (ExitEscalate), the watchdog (ExitTearDown) and the
	// heartbeat monitor (ExitHeartbeat) to tear the process down wins, and
	// later requests are ignored (with os.Exit there are none).
	Exit func(code int)
	Log  zerolog.Logger
	// EventTap, if set, sees every event the rank emits, whatever
	// RANKTREE_EVENTS says (actors.PublisherConfig.Tap; the rank's
	// Prometheus metrics). With it, the publisher exists even with events off.
	EventTap func(*actors.Event)
	// WorkMetrics, if set, counts every Work's outcome exactly (the rank's
	// Prometheus metrics; see WorkMetrics), fed by the watchdog.
	WorkMetrics WorkMetrics
}

// Engine is what the watchdog needs of a communicator's engine (comm.Backend
// satisfies it).
type Engine interface {
	Abortable
	AsyncErrorSource
}

// Rank bundles one rank's supervision: the root, the flight recorder, the
// watchdog, the heartbeat monitor, the event publisher and the dump
// service, wired as doc.go describes. Its methods are safe for concurrent use.
type Rank struct {
	cfg      RankConfig
	Root     *Root
	Recorder *FlightRecorder
	Watchdog *Watchdog
	Monitor  *HeartbeatMonitor
	Events   *actors.EventPublisher // nil without NATS or with RANKTREE_EVENTS=off
	dumps    *DumpService
	dumper   Dumper

	mu       sync.Mutex
	timeouts map[string]time.Duration
	closed   bool
	exitCode int // first teardown's exit code (0: none yet)
	// escalation is non-nil once an escalation is reserved (ActorPanicked)
	// or claimed; it is closed after the escalation called Exit.
	escalation chan struct{}
}

// escalationWait bounds how long a watchdog or heartbeat exit waits for a
// reserved escalation before exiting with its own code.
const escalationWait = 15 * time.Second

// StartRank starts a rank's supervision in system. Errors: invalid Cfg
// (*ConfigError), a bad Job for events, or a NATS subscription failure.
func StartRank(system *actor.ActorSystem, cfg RankConfig) (*Rank, error) {
	c, err := cfg.Cfg.Validate()
	if err != nil {
		return nil, err
	}
	cfg.Cfg = c
	if cfg.Exit == nil {
		cfg.Exit = os.Exit
	}
	r := &Rank{cfg: cfg, timeouts: map[string]time.Duration{}}
	r.Recorder = NewFlightRecorder(RecorderConfig{Job: cfg.Job, Rank: cfg.Rank, WorldSize: cfg.WorldSize, Capacity: c.TraceBufferSize})
	dumper := Dumper{Rec: r.Recorder, Dir: c.TraceDir, Store: cfg.Store}
	r.dumper = dumper
	var sink EventSink
	if cfg.NATS != nil && (c.Events != actors.EventsOff || cfg.EventTap != nil) {
		r.Events, err = actors.NewEventPublisher(cfg.NATS, actors.PublisherConfig{Job: cfg.Job, Rank: cfg.Rank, Level: c.Events, Log: cfg.Log, Tap: cfg.EventTap})
		if err != nil {
			return nil, err
		}
	}
	if r.Events != nil {
		sink = r.Events
	}
	policy := cfg.Policy
	if policy == nil {
		policy = c.ActorPanic.Decide
	}
	r.Root = StartRoot(system, RootConfig{Rank: cfg.Rank, Policy: policy, OnStopped: cfg.OnStopped,
		OnRestarted: cfg.OnRestarted, Escalating: r.claimEscalation,
		Dumper: dumper, Events: sink, Exit: r.exitEscalated, Log: cfg.Log})
	if r.Events != nil {
		r.Events.Start(system, r.Root)
	}
	r.Watchdog, err = NewWatchdog(WatchdogConfig{Rank: cfg.Rank, Cfg: c, Store: cfg.Store, Dumper: dumper,
		Events: sink, Metrics: cfg.WorkMetrics, Exit: r.exit, Log: cfg.Log})
	if err != nil {
		r.Close(time.Second)
		return nil, err
	}
	r.Watchdog.Start(system, r.Root)
	r.Monitor, err = NewHeartbeatMonitor(HeartbeatConfig{Rank: cfg.Rank, Timeout: c.HeartbeatTimeout,
		Beat: r.Watchdog.Heartbeat(), Dumper: dumper, Exit: r.exit, Log: cfg.Log})
	if err != nil {
		r.Close(time.Second)
		return nil, err
	}
	r.Monitor.Start(system, r.Root)
	if cfg.NATS != nil {
		if r.dumps, err = ServeDumps(cfg.NATS, cfg.Job, cfg.Rank, r.Recorder, dumper, cfg.Log); err != nil {
			r.Close(time.Second)
			return nil, err
		}
	}
	return r, nil
}

// ActorPanicked tells the rank that one of its actors panicked and the
// panic is on its way to the root. Call it on the panicking goroutine
// before the failed op becomes visible (actors.CommunicatorConfig.OnPanic).
// Under the escalate policy (RankConfig.Policy nil, Cfg.ActorPanic not
// PanicRestart) it reserves the process's exit for the coming escalation,
// so that the watchdog, reacting to the failed op in TearDown mode, does
// not exit first with ExitTearDown: a watchdog or heartbeat exit then
// waits for the escalation (at most 15 s) and is dropped once it has
// happened. The process thus exits once, with ExitEscalate.
func (r *Rank) ActorPanicked(reason any) {
	if r.cfg.Policy != nil || r.cfg.Cfg.ActorPanic == PanicRestart {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.exitCode == 0 && r.escalation == nil {
		r.escalation = make(chan struct{})
		r.cfg.Log.Debug().Int("rank", r.cfg.Rank).Interface("panic", reason).Msg("actor panicked; exit reserved for the escalation")
	}
}

// claimEscalation claims the process's exit for an escalation (the root's
// RootConfig.Escalating, or Escalate); false if another teardown has it.
func (r *Rank) claimEscalation() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.exitCode != 0 {
		return false
	}
	r.exitCode = ExitEscalate
	if r.escalation == nil {
		r.escalation = make(chan struct{})
	}
	return true
}

// exitEscalated ends the process after a claimed escalation and releases
// the exits waiting for it.
func (r *Rank) exitEscalated(code int) {
	r.mu.Lock()
	esc := r.escalation
	r.mu.Unlock()
	r.exitClaimed(code)
	close(esc)
}

// ExitCode is the exit code of the teardown under way (0: none).
func (r *Rank) ExitCode() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.exitCode
}

// exit ends the process with code (the watchdog's and the heartbeat
// monitor's teardown) unless a teardown is already under way; a reserved
// escalation is waited for first (see ActorPanicked).
func (r *Rank) exit(code int) {
	r.mu.Lock()
	esc, claimed := r.escalation, r.exitCode != 0
	r.mu.Unlock()
	if !claimed && esc != nil {
		select {
		case <-esc:
		case <-time.After(escalationWait):
		}
	}
	r.mu.Lock()
	first := r.exitCode
	if first == 0 {
		r.exitCode = code
	}
	r.mu.Unlock()
	if first != 0 {
		r.cfg.Log.Warn().Int("rank", r.cfg.Rank).Int("exit_code", code).Int("first_exit_code", first).
			Msg("teardown already under way; ignoring a second exit")
		return
	}
	r.exitClaimed(code)
}

// Escalate is the escalation path for a failure outside the actors (a
// communicator restart that could not complete): unless a teardown is
// already under way it dumps the flight recorder with reason and exits the
// process with ExitEscalate, so that rankrunner restarts the job.
func (r *Rank) Escalate(reason string) {
	if !r.claimEscalation() {
		return
	}
	r.cfg.Log.Error().Int("rank", r.cfg.Rank).Str("reason", reason).Int("exit_code", ExitEscalate).Msg("escalating: tearing the process down")
	if r.Events != nil {
		r.Events.Emit(actors.Event{Kind: actors.KindRestart, Action: Escalate.String(), Error: reason})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	if err := r.dumper.Dump(ctx, reason); err != nil {
		r.cfg.Log.Error().Err(err).Int("rank", r.cfg.Rank).Msg("escalation dump failed")
	}
	cancel()
	r.exitEscalated(ExitEscalate)
}

// exitClaimed flushes events (at most 2 s) and ends the process; the
// caller has claimed the exit.
func (r *Rank) exitClaimed(code int) {
	if r.Events != nil {
		_ = r.Events.Close(2 * time.Second)
	}
	if r.cfg.NATS != nil {
		_ = r.cfg.NATS.FlushTimeout(time.Second)
	}
	r.cfg.Exit(code)
}

// AttachGroup puts a communicator (group × epoch) under supervision and
// returns the Observer to pass as actors.CommunicatorConfig.Observer.
// groupRank is this rank's rank in the group; spec.Members the group's
// global ranks; spec.Timeout its default deadline (0: Cfg.Timeout). Call it
// before the communicator's first op, and again (new epoch) after a restart.
func (r *Rank) AttachGroup(spec GroupSpec, groupRank int, engine Engine) actors.Observer {
	if spec.Timeout <= 0 {
		spec.Timeout = r.cfg.Cfg.Timeout
	}
	r.mu.Lock()
	r.timeouts[spec.Name] = spec.Timeout
	r.mu.Unlock()
	r.Recorder.AddGroup(spec.Name, spec.Epoch, groupRank, spec.Members)
	r.Watchdog.Register(spec, engine, engine)
	if r.Events != nil {
		detail := map[string]string{"engine": spec.Engine, "members": fmt.Sprint(spec.Members)}
		for k, v := range spec.Detail {
			detail[k] = v
		}
		r.Events.Emit(actors.Event{Kind: actors.KindCommInit, Group: spec.Name, Epoch: spec.Epoch, Detail: detail})
	}
	name := spec.Name
	return actors.Observers{
		r.Recorder.Observer(name, func() time.Duration { return r.groupTimeout(name) }),
		r.Watchdog.Observer(name),
	}
}

func (r *Rank) groupTimeout(group string) time.Duration {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.timeouts[group]
}

// SetTimeout changes group's default deadline for later ops
// (ProcessGroup.SetTimeout).
func (r *Rank) SetTimeout(group string, d time.Duration) {
	if d <= 0 {
		return
	}
	r.mu.Lock()
	r.timeouts[group] = d
	r.mu.Unlock()
	r.Watchdog.SetTimeout(group, d)
}

// DetachGroup stops watching group (ProcessGroup.Destroy, after failing its Works).
func (r *Rank) DetachGroup(group string) { r.Watchdog.Deregister(group) }

// Track puts a Work launched outside a communicator actor under the
// watchdog (which fails it through p at its deadline), with the flight
// recorder's record.
func (r *Rank) Track(group string, op *comm.Op, p *comm.Promise) {
	r.Recorder.recordHeld(group, op, p, op.Timeout)
	r.Watchdog.Track(group, op.FP, op.Timeout, p)
}

// Close stops the dump service, the heartbeat monitor, the watchdog, the
// event publisher (flushing) and the root, each bounded so that the whole
// takes at most about timeout. Idempotent.
func (r *Rank) Close(timeout time.Duration) error {
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return nil
	}
	r.closed = true
	r.mu.Unlock()
	step := max(timeout/4, 10*time.Millisecond)
	var errs []error
	if r.dumps != nil {
		r.dumps.Close()
	}
	if r.Monitor != nil {
		r.Monitor.Stop()
	}
	if r.Watchdog != nil && r.Watchdog.PID() != nil {
		errs = append(errs, r.Watchdog.Stop(step))
	}
	if r.Events != nil {
		errs = append(errs, r.Events.Close(step))
	}
	if r.Root != nil {
		errs = append(errs, r.Root.Stop(step))
	}
	return errors.Join(errs...)
}
