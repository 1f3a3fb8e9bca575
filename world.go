package ranktree

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sync"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/ranktree/ranktree/actors"
	"github.com/ranktree/ranktree/comm"
	"github.com/ranktree/ranktree/comm/cpu"
	"github.com/ranktree/ranktree/supervisor"
)

// EnvTransport selects the CPU engine's transport: "auto" (default: shared
// memory between ranks on one host, TCP otherwise), "shm" or "tcp".
const EnvTransport = "RANKTREE_TRANSPORT"

// EnvFault injects faults into the CPU engine (see comm.ParseFaults and
// docs/faults.md), e.g. "hang@rank=1,seq=5". Unset in normal runs.
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

// groups is the runtime's process-group machinery: the actor system that
// hosts the communicator actors and the rank's supervision tree, the engine
// factory, and the groups made so far (for teardown). Written at Init and by
// createGroup under mu.
type groups struct {
	system  *actor.ActorSystem
	factory comm.BackendFactory
	faults  []comm.Fault
	sup     supervisor.Config
	sv      *supervisor.Rank
	world   *comm.ProcessGroup

	mu    sync.Mutex
	comms []*supervisedLauncher
}

// supervisedLauncher is a group's communicator actor as the ProcessGroup
// sees it: Close also takes the group off the watchdog, and with blocking
// wait (RANKTREE_BLOCKING_WAIT) every Work gets its deadline.
type supervisedLauncher struct {
	*actors.Communicator
	sv       *supervisor.Rank
	group    string
	rank     int
	blocking bool
}

// Submit implements comm.Launcher.
func (l *supervisedLauncher) Submit(op *comm.Op, w *comm.Work) {
	if l.blocking && op.Timeout > 0 {
		fp, timeout := op.FP, op.Timeout // the shape; the actor assigns the seq
		w.SetDeadline(time.Now().Add(timeout), func(elapsed time.Duration) error {
			fp.Seq = w.Seq()
			return &comm.TimeoutError{Rank: l.rank, FP: fp, Group: l.group, Timeout: timeout, Elapsed: elapsed}
		})
	}
	l.Communicator.Submit(op, w)
}

// Close implements comm.Launcher: it closes the communicator, then stops
// watching the group.
func (l *supervisedLauncher) Close(ctx context.Context) error {
	err := l.Communicator.Close(ctx)
	l.sv.DetachGroup(l.group)
	return err
}

// initGroups creates the actor system and the default process group over
// every rank of the job; it runs at the end of Init.
func (r *Runtime) initGroups(ctx context.Context, c *config) error {
	g := &r.grp
	g.factory = c.backend
	if g.factory == nil {
		g.factory = cpu.Factory(cpu.Options{Transport: os.Getenv(EnvTransport)})
	}
	if s := os.Getenv(EnvFault); s != "" {
		faults, err := comm.ParseFaults(s)
		if err != nil {
			return &EnvError{Var: EnvFault, Value: s, Msg: err.Error()}
		}
		g.faults = faults
	}
	sup, err := supervisor.ConfigFromEnv(os.Getenv)
	if err != nil {
		return err
	}
	g.sup = sup
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	g.system = actor.NewActorSystemWithConfig(actor.Configure(
		actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger { return quiet })))
	g.sv, err = supervisor.StartRank(g.system, supervisor.RankConfig{
		Job: r.job, Rank: r.rank, WorldSize: r.worldSize, Cfg: sup, Store: r.st, NATS: r.nc, Log: r.log,
	})
	if err != nil {
		g.system.Shutdown()
		return err
	}
	ranks := make([]int, r.worldSize)
	for i := range ranks {
		ranks[i] = i
	}
	world, err := r.createGroup(ctx, comm.GroupSpec{
		Name: WorldGroupName, GlobalRanks: ranks, Rank: r.rank, Timeout: sup.Timeout,
	})
	if err != nil {
		g.sv.Close(time.Second)
		g.system.Shutdown()
		return err
	}
	g.world = world
	r.onClose(r.closeGroups)
	return nil
}

// World is the default process group: every rank of the job, group rank =
// global rank (torch.distributed's default group / group.WORLD).
func (r *Runtime) World() *comm.ProcessGroup { return r.grp.world }

// NewGroup creates a process group of the given global ranks. Every rank of
// the job must call it, in the same order; non-members get a group whose
// Rank is -1 (torch.distributed.new_group). Errors: an error wrapping
// comm.ErrInvalidArgument for bad ranks; engine connection errors.
func (r *Runtime) NewGroup(ctx context.Context, ranks []int, opts ...comm.GroupOption) (*comm.ProcessGroup, error) {
	return r.grp.world.NewGroup(ctx, ranks, opts...)
}

// groupFactory adapts Runtime to comm.GroupFactory without exporting the method.
type groupFactory struct{ r *Runtime }

func (f groupFactory) CreateGroup(ctx context.Context, spec comm.GroupSpec) (*comm.ProcessGroup, error) {
	return f.r.createGroup(ctx, spec)
}

// createGroup connects an engine for spec, wraps it in a communicator actor
// and returns the process group.
func (r *Runtime) createGroup(ctx context.Context, spec comm.GroupSpec) (*comm.ProcessGroup, error) {
	g := &r.grp
	log := r.log.With().Str("group", spec.Name).Logger()
	const epoch = 0
	be, err := g.factory(ctx, comm.BackendConfig{
		Group: spec.Name, Epoch: epoch, Rank: spec.Rank, Size: len(spec.GlobalRanks),
		GlobalRanks: spec.GlobalRanks, Store: r.st, Device: -1, Timeout: r.timeout,
		Faults: g.faults, Log: log,
	})
	if err != nil {
		return nil, fmt.Errorf("ranktree: rank %d: connecting group %q: %w", r.rank, spec.Name, err)
	}
	if spec.Timeout <= 0 {
		spec.Timeout = g.sup.Timeout
	}
	obs := g.sv.AttachGroup(supervisor.GroupSpec{Name: spec.Name, Epoch: epoch, Engine: be.Name(),
		Members: spec.GlobalRanks, Timeout: spec.Timeout}, spec.Rank, be)
	cm, err := actors.NewCommunicator(g.system, be, actors.CommunicatorConfig{Group: spec.Name, Epoch: epoch, Observer: obs, Log: log})
	if err != nil {
		g.sv.DetachGroup(spec.Name)
		be.Close()
		return nil, err
	}
	l := &supervisedLauncher{Communicator: cm, sv: g.sv, group: spec.Name, rank: r.rank, blocking: g.sup.BlockingWait}
	pg, err := comm.NewProcessGroup(comm.GroupConfig{
		Name: spec.Name, Epoch: epoch, Rank: spec.Rank, Size: len(spec.GlobalRanks), GlobalRanks: spec.GlobalRanks,
		Launcher: l, Engine: be.Name(), Factory: groupFactory{r}, Timeout: spec.Timeout, Log: r.log,
	})
	if err != nil {
		l.Close(ctx)
		return nil, err
	}
	g.mu.Lock()
	g.comms = append(g.comms, l)
	g.mu.Unlock()
	log.Debug().Str("engine", be.Name()).Ints("ranks", spec.GlobalRanks).Msg("process group created")
	return pg, nil
}

// closeGroups closes every communicator (newest first) and the actor system.
func (r *Runtime) closeGroups(ctx context.Context) error {
	g := &r.grp
	g.mu.Lock()
	comms := g.comms
	g.comms = nil
	g.mu.Unlock()
	var errs []error
	for i := len(comms) - 1; i >= 0; i-- {
		if err := comms[i].Close(ctx); err != nil && !errors.Is(err, comm.ErrClosed) {
			errs = append(errs, err)
		}
	}
	if err := g.sv.Close(2 * time.Second); err != nil {
		errs = append(errs, err)
	}
	g.system.Shutdown()
	return errors.Join(errs...)
}
