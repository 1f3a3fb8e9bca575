package ranktree

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/ranktree/ranktree/actors"
	"github.com/ranktree/ranktree/comm"
	"github.com/ranktree/ranktree/comm/cpu"
	"github.com/ranktree/ranktree/comm/cuda/nvmlinfo"
	"github.com/ranktree/ranktree/comm/nccl"
	"github.com/ranktree/ranktree/supervisor"
)

// EnvTransport selects the CPU engine's transport: "auto" (default: shared
// memory between ranks on one host, TCP otherwise), "shm" or "tcp".
const EnvTransport = "RANKTREE_TRANSPORT"

// EnvBackend selects the collective engine of every process group: "cpu"
// (the default: the built-in CPU engine, host buffers) or "nccl" (NCCL and
// the CUDA driver loaded at run time, device buffers; the rank's GPU is
// LOCAL_RANK modulo the node's GPU count). torch.distributed's
// init_process_group(backend=...).
const EnvBackend = "RANKTREE_BACKEND"

// EnvFault injects faults into the CPU engine (see comm.ParseFaults and
// docs/faults.md), e.g. "hang@rank=1,seq=5". Unset in normal runs. A fault
// applies to every epoch of a matching group: a group re-created by
// RestartGroup meets it again when its seq counter reaches S.
const EnvFault = "RANKTREE_FAULT"

// WorldGroupName is the name of the default process group (c10d's default_pg).
const WorldGroupName = "default_pg"

// WithBackend makes Init create every process group's engine with f instead
// of the built-in CPU engine (cpu.Factory). Tests use it to run ranks in one
// process over the in-memory transport.
func WithBackend(f comm.BackendFactory) Option {
	return func(c *config) error {
		if f == nil {
			return &OptionError{Option: "WithBackend", Msg: "nil BackendFactory"}
		}
		c.backend = f
		return nil
	}
}

// WithDevice sets the accelerator every process group of the rank runs on:
// the CUDA ordinal the engine binds (c10d: init_process_group's device_id).
// Without it, RANKTREE_BACKEND=nccl picks LOCAL_RANK modulo the GPU count
// NVML sees, and every other engine runs on the host (device -1). Use it
// with WithBackend(nccl.Factory(opts)) to give the NCCL engine options of
// your own. A negative ordinal is an *OptionError.
func WithDevice(ordinal int) Option {
	return func(c *config) error {
		if ordinal < 0 {
			return &OptionError{Option: fmt.Sprintf("WithDevice(%d)", ordinal), Msg: "a CUDA ordinal is ≥ 0"}
		}
		c.device, c.deviceSet = ordinal, true
		return nil
	}
}

// supervisionOptions are the options that adjust the rank's supervision.
type supervisionOptions struct {
	actorPanic supervisor.PanicPolicy // WithActorPanic; 0: RANKTREE_ACTOR_PANIC
	exit       func(code int)         // WithExit; nil: os.Exit
}

// WithActorPanic sets what a panic in one of the rank's actors leads to
// (overrides RANKTREE_ACTOR_PANIC=escalate|restart):
//
//   - supervisor.PanicEscalate (the default): the flight recorder is
//     dumped and the process exits with supervisor.ExitEscalate (4), so
//     that rankrunner restarts the job;
//   - supervisor.PanicRestart: the actor is restarted, and a communicator
//     actor's panic makes every member re-create its group under the next
//     epoch, without restarting processes (see "Restart policy" in
//     restart.go for what the program must do).
//
// PanicRestart needs RANKTREE_ASYNC_ERROR_HANDLING=CleanupOnly or unset
// (it then selects CleanupOnly); otherwise Init fails with an *OptionError.
func WithActorPanic(p supervisor.PanicPolicy) Option {
	return func(c *config) error {
		if p != supervisor.PanicEscalate && p != supervisor.PanicRestart {
			return &OptionError{Option: fmt.Sprintf("WithActorPanic(%v)", p), Msg: "want supervisor.PanicEscalate or supervisor.PanicRestart"}
		}
		c.supOpts.actorPanic = p
		return nil
	}
}

// WithExit replaces os.Exit for the rank's teardowns: an escalated actor
// panic (code supervisor.ExitEscalate), a watchdog TearDown
// (supervisor.ExitTearDown) and a stalled watchdog
// (supervisor.ExitHeartbeat). The rank calls f at most once, after its
// dump and an event flush. Tests pass a recorder; a program may pass a
// function that saves its own state and then calls os.Exit. If f returns,
// the process goes on with the failed group aborted.
func WithExit(f func(code int)) Option {
	return func(c *config) error {
		if f == nil {
			return &OptionError{Option: "WithExit(nil)", Msg: "nil exit function"}
		}
		c.supOpts.exit = f
		return nil
	}
}

// groups is the runtime's process-group machinery: the actor system that
// hosts the communicator actors and the rank's supervision tree, the engine
// factory, and the groups made so far (for teardown and restart). system,
// factory, faults, sup, sv and incarnation are written once at Init; world
// by Init and RestartGroup; the rest under mu.
type groups struct {
	system  *actor.ActorSystem
	factory comm.BackendFactory
	faults  []comm.Fault
	device  int // CUDA device ordinal for GPU engines, -1 for host
	sup     supervisor.Config
	sv      *supervisor.Rank
	world   atomic.Pointer[comm.ProcessGroup]
	// incarnation counts this process's earlier Inits of the same job and
	// rank (see restart.go): it is folded into the init barrier key and the
	// base epoch of every group, so keys of an earlier Init are never read.
	incarnation uint32

	// stopWatch ends the restart policy's abort watch (restart.go); nil
	// without the restart policy. Written once at Init.
	stopWatch func()
	watchCtx  context.Context

	mu       sync.Mutex
	closing  bool                           // Close began: no new groups
	comms    []*supervisedLauncher          // live communicators, oldest first
	current  map[string]*supervisedLauncher // group name → its live communicator
	epochs   map[string]uint32              // group name → last epoch used
	restarts map[string]*restartCall        // CommID of a restarted epoch → its restart (restart.go)
	restart  *restartCore                   // the restart policy's pure core (restart_core.go); nil without the policy
}

// supervisedLauncher is a group's communicator actor as the ProcessGroup
// sees it: Close also takes the group off the watchdog, and with blocking
// wait (RANKTREE_BLOCKING_WAIT) every Work gets its deadline.
type supervisedLauncher struct {
	*actors.Communicator
	rt       *Runtime
	sv       *supervisor.Rank
	group    string
	epoch    uint32
	rank     int
	blocking bool
	pg       *comm.ProcessGroup // the handle over this communicator; set before it is published

	// retired is set when a restart replaces this communicator: later
	// Submits fail with it (an *AbortedError naming the restart).
	retired atomic.Pointer[comm.AbortedError]

	last      atomic.Pointer[comm.Work] // the last Work submitted (teardown's grace waits for it)
	closeOnce sync.Once
	closeErr  error
}

// Submit implements comm.Launcher. Once a restart has replaced this
// communicator, p fails with an error wrapping comm.ErrAborted that says so.
func (l *supervisedLauncher) Submit(op *comm.Op, p *comm.Promise) {
	if e := l.retired.Load(); e != nil {
		p.Complete(e)
		return
	}
	w := p.Work()
	if l.blocking && op.Timeout > 0 {
		shape, timeout := op.FP, op.Timeout // the identity comes from the communicator (Work.Fingerprint)
		p.SetDeadline(time.Now().Add(timeout), func(elapsed time.Duration) error {
			fp := w.Fingerprint()
			if fp.Seq == 0 { // not scheduled yet: name its shape
				fp = shape
			}
			return &comm.TimeoutError{Rank: l.rank, FP: fp, Group: l.group, Timeout: timeout, Elapsed: elapsed}
		})
	}
	l.last.Store(w)
	l.Communicator.Submit(op, p)
}

// Close implements comm.Launcher (ProcessGroup.Destroy): it gives in-flight
// ops CloseGrace to finish, then closes the communicator within
// closeCommBound and stops watching the group (see teardown.go).
// Idempotent.
func (l *supervisedLauncher) Close(ctx context.Context) error {
	return l.closeBy(ctx, time.Now().Add(CloseGrace))
}

// initGroups creates the actor system and the default process group over
// every rank of the job; it runs at the end of Init.
func (r *Runtime) initGroups(ctx context.Context, c *config) error {
	g := &r.grp
	g.factory, g.device = c.backend, -1
	if g.factory == nil {
		switch b := c.env.Backend; b {
		case "", "cpu":
			o, err := cpuOptions(c)
			if err != nil {
				return err
			}
			g.factory = cpu.Factory(o)
		case "nccl":
			g.factory, g.device = nccl.Factory(nccl.Options{}), r.localRank
			if n, err := nvmlinfo.Count(); err == nil && n > 0 {
				if d, err := nvmlinfo.LocalDevice(r.localRank, n); err == nil {
					g.device = d
				}
			}
		default:
			return &EnvError{Var: EnvBackend, Value: b, Msg: `want "cpu" or "nccl"`}
		}
	}
	if c.deviceSet {
		g.device = c.device
	}
	g.faults = c.env.Faults
	sup := c.sup
	var err error
	if p := c.supOpts.actorPanic; p != 0 {
		// The option replaces RANKTREE_ACTOR_PANIC; the other variables
		// still apply, and restart may change the error-handling default.
		sup, err = c.env.supervisionWith(supervisor.EnvActorPanic, p.String())
		if err != nil {
			return &OptionError{Option: fmt.Sprintf("WithActorPanic(%v)", p), Msg: err.Error()}
		}
	}
	g.sup = sup
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	g.system = actor.NewActorSystemWithConfig(actor.Configure(
		actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger { return quiet })))
	g.sv, err = supervisor.StartRank(g.system, supervisor.RankConfig{
		Job: r.job, Rank: r.rank, WorldSize: r.worldSize, Cfg: sup, Store: r.st, NATS: r.nc, Log: r.log,
		Exit: c.supOpts.exit, EventTap: r.metricsTap(),
	})
	if err != nil {
		g.system.Shutdown()
		return err
	}
	if sup.ActorPanic == supervisor.PanicRestart {
		if err := r.startAbortWatch(); err != nil {
			g.sv.Close(time.Second)
			g.system.Shutdown()
			return err
		}
	}
	ranks := make([]int, r.worldSize)
	for i := range ranks {
		ranks[i] = i
	}
	world, err := r.createGroup(ctx, comm.GroupSpec{
		Name: WorldGroupName, GlobalRanks: ranks, Rank: r.rank, Timeout: sup.Timeout,
	})
	if err != nil {
		if g.stopWatch != nil {
			g.stopWatch()
		}
		g.sv.Close(time.Second)
		g.system.Shutdown()
		return err
	}
	g.world.Store(world)
	r.onClose(r.closeGroups)
	return nil
}

// World is the default process group: every rank of the job, group rank =
// global rank (torch.distributed's default group / group.WORLD). After
// RestartGroup(World()), or an automatic restart under the restart policy,
// it is the restarted group.
func (r *Runtime) World() *comm.ProcessGroup { return r.grp.world.Load() }

// Group returns this rank's live handle of the process group called name
// (the world group is WorldGroupName; subgroups are named by NewGroup,
// Split or comm.WithGroupName): after a restart, the restarted group. It
// returns nil if this rank is not a member of a live group of that name,
// including while a restart is re-creating it (see Runtime.Restarted).
func (r *Runtime) Group(name string) *comm.ProcessGroup {
	g := &r.grp
	g.mu.Lock()
	defer g.mu.Unlock()
	if l := g.current[name]; l != nil {
		return l.pg
	}
	return nil
}

// panicAwareEngine is a group's engine as the watchdog sees it: its async
// error is the engine's, or else the communicator actor's first panic
// (actors.Communicator.PanicErr), so that a panic breaks the group — abort,
// abort/<comm-id> for the peers, dump — even if the panicking op was never
// put under the watchdog. Abort goes to the engine.
type panicAwareEngine struct {
	comm.Backend
	cm atomic.Pointer[actors.Communicator]
}

// AsyncError implements supervisor.AsyncErrorSource.
func (e *panicAwareEngine) AsyncError() error {
	if err := e.Backend.AsyncError(); err != nil {
		return err
	}
	if c := e.cm.Load(); c != nil {
		return c.PanicErr()
	}
	return nil
}

// NewGroup creates a process group of the given global ranks. Every rank of
// the job must call it, in the same order; non-members get a group whose
// Rank is -1 (torch.distributed.new_group). With
// comm.WithLocalSynchronization only the members call it (torch's
// use_local_synchronization=True; see comm.ProcessGroup.NewGroup). Errors: an error wrapping
// comm.ErrInvalidArgument for bad ranks; comm.ErrClosed after Close;
// engine connection errors.
func (r *Runtime) NewGroup(ctx context.Context, ranks []int, opts ...comm.GroupOption) (*comm.ProcessGroup, error) {
	return r.World().NewGroup(ctx, ranks, opts...)
}

// groupFactory adapts Runtime to comm.GroupFactory without exporting the method.
type groupFactory struct{ r *Runtime }

func (f groupFactory) CreateGroup(ctx context.Context, spec comm.GroupSpec) (*comm.ProcessGroup, error) {
	return f.r.createGroup(ctx, spec)
}

// createGroup creates a new group (Init, NewGroup, Split) under the next
// epoch for its name: the incarnation's base epoch the first time, one more
// than the last otherwise, so that a name used again never meets the store
// keys of its earlier communicator.
func (r *Runtime) createGroup(ctx context.Context, spec comm.GroupSpec) (*comm.ProcessGroup, error) {
	g := &r.grp
	g.mu.Lock()
	epoch := baseEpoch(g.incarnation)
	if e, ok := g.epochs[spec.Name]; ok {
		epoch = e + 1
	}
	g.mu.Unlock()
	return r.createGroupAt(ctx, spec, epoch)
}

// createGroupAt connects an engine for spec under epoch, puts it under
// supervision, wraps it in a communicator actor and returns the process
// group. Errors: comm.ErrClosed once Close began; engine connection errors.
func (r *Runtime) createGroupAt(ctx context.Context, spec comm.GroupSpec, epoch uint32) (*comm.ProcessGroup, error) {
	g := &r.grp
	g.mu.Lock()
	if g.closing {
		g.mu.Unlock()
		return nil, fmt.Errorf("ranktree: rank %d: creating group %q: %w: the runtime is closed", r.rank, spec.Name, comm.ErrClosed)
	}
	if g.epochs == nil {
		g.epochs, g.current = map[string]uint32{}, map[string]*supervisedLauncher{}
	}
	g.epochs[spec.Name] = max(g.epochs[spec.Name], epoch)
	g.mu.Unlock()
	log := r.log.With().Str("group", spec.Name).Uint32("epoch", epoch).Logger()
	// Injected faults (RANKTREE_FAULT) strike a group's first communicator
	// only: a restarted one, whose seqs start at 1 again, runs clean.
	faults := g.faults
	if epoch != baseEpoch(g.incarnation) {
		faults = nil
	}
	be, err := g.factory(ctx, comm.BackendConfig{
		Group: spec.Name, Epoch: epoch, Rank: spec.Rank, Size: len(spec.GlobalRanks),
		GlobalRanks: spec.GlobalRanks, Store: r.st, Device: g.device, Timeout: r.timeout,
		Faults: faults, Log: log,
	})
	if err != nil {
		return nil, fmt.Errorf("ranktree: rank %d: connecting group %q (epoch %d): %w", r.rank, spec.Name, epoch, err)
	}
	if spec.Timeout <= 0 {
		spec.Timeout = g.sup.Timeout
	}
	watched := &panicAwareEngine{Backend: be}
	obs := g.sv.AttachGroup(supervisor.GroupSpec{Name: spec.Name, Epoch: epoch, Engine: be.Name(),
		Members: spec.GlobalRanks, Timeout: spec.Timeout, Detail: deviceDetail(be)}, spec.Rank, watched)
	// The rank's supervision root is the actor's parent: its panics follow
	// the policy (RANKTREE_ACTOR_PANIC).
	cm, err := actors.NewCommunicator(g.system, be, actors.CommunicatorConfig{Group: spec.Name, Epoch: epoch, Observer: obs,
		Log: log, Parent: g.sv.Root, OnPanic: func(p *actors.Panic) { g.sv.ActorPanicked(p) }})
	if err != nil {
		g.sv.DetachGroup(spec.Name)
		be.Close()
		return nil, err
	}
	l := &supervisedLauncher{Communicator: cm, rt: r, sv: g.sv, group: spec.Name, epoch: epoch, rank: r.rank, blocking: g.sup.BlockingWait}
	pg, err := comm.NewProcessGroup(comm.GroupConfig{
		Name: spec.Name, Epoch: epoch, Rank: spec.Rank, Size: len(spec.GlobalRanks), GlobalRanks: spec.GlobalRanks,
		Launcher: l, Engine: be.Name(), Factory: groupFactory{r}, Timeout: spec.Timeout, Store: r.st, Log: r.log,
	})
	if err != nil {
		l.Close(ctx)
		return nil, err
	}
	watched.cm.Store(cm)
	l.pg = pg
	g.mu.Lock()
	closing := g.closing
	var acts []restartAction
	if !closing {
		g.comms = append(g.comms, l)
		g.current[spec.Name] = l
		if g.restart != nil { // a peer may have aborted this epoch before it was ours
			acts = g.restart.Step(groupCreated{Group: spec.Name, Epoch: epoch}, time.Now())
		}
	}
	g.mu.Unlock()
	if closing { // Close began while the engine connected
		_ = pg.Destroy(ctx)
		return nil, fmt.Errorf("ranktree: rank %d: creating group %q: %w: the runtime is closed", r.rank, spec.Name, comm.ErrClosed)
	}
	log.Debug().Str("engine", be.Name()).Ints("ranks", spec.GlobalRanks).Msg("process group created")
	r.carryOut(acts)
	return pg, nil
}

// deviceDetail describes a GPU engine's device for the comm_init event
// (NVML UUID, PCI bus id, name, NCCL version); nil for host engines.
func deviceDetail(be comm.Backend) map[string]string {
	if t, ok := be.(interface{ Transport() string }); ok {
		// the CPU engine's links (shm, tcp, shm+tcp), for the byte metrics
		return map[string]string{"transport": t.Transport()}
	}
	e, ok := be.(interface{ DeviceInfo() nccl.DeviceInfo })
	if !ok {
		return nil
	}
	d := e.DeviceInfo()
	return map[string]string{"device": fmt.Sprint(d.Ordinal), "device_name": d.Name, "uuid": d.UUID,
		"pci_bus_id": d.PCIBusID, "nccl_version": d.NCCLVersion}
}
