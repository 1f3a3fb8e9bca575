package supervisor

import (
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
	// Policy for actor panics (nil: Escalate); see RootConfig.
	Policy    func(child *actor.PID, reason any) Decision
	OnStopped func(child *actor.PID, reason any)
	// Exit ends the process (nil: os.Exit). Before calling it, the rank
	// flushes its events (bounded).
	Exit func(code int)
	Log  zerolog.Logger
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

	mu       sync.Mutex
	timeouts map[string]time.Duration
	closed   bool
}

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
	var sink EventSink
	if cfg.NATS != nil && c.Events != actors.EventsOff {
		r.Events, err = actors.NewEventPublisher(cfg.NATS, actors.PublisherConfig{Job: cfg.Job, Rank: cfg.Rank, Level: c.Events, Log: cfg.Log})
		if err != nil {
			return nil, err
		}
	}
	if r.Events != nil {
		sink = r.Events
	}
	r.Root = StartRoot(system, RootConfig{Rank: cfg.Rank, Policy: cfg.Policy, OnStopped: cfg.OnStopped,
		Dumper: dumper, Events: sink, Exit: r.exit, Log: cfg.Log})
	if r.Events != nil {
		r.Events.Start(system, r.Root)
	}
	r.Watchdog, err = NewWatchdog(WatchdogConfig{Rank: cfg.Rank, Cfg: c, Store: cfg.Store, Dumper: dumper,
		Events: sink, Exit: r.exit, Log: cfg.Log})
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

// exit flushes events (at most 2 s) and ends the process.
func (r *Rank) exit(code int) {
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
		r.Events.Emit(actors.Event{Kind: actors.KindCommInit, Group: spec.Name, Epoch: spec.Epoch,
			Detail: map[string]string{"engine": spec.Engine, "members": fmt.Sprint(spec.Members)}})
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
// watchdog, with the flight recorder's record.
func (r *Rank) Track(group string, op *comm.Op, w *comm.Work) {
	r.Recorder.Record(group, op, w, op.Timeout)
	r.Watchdog.Track(group, op.FP, op.Timeout, w)
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
