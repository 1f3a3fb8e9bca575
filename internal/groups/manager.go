package groups

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"

	"github.com/ranktree/ranktree/actors"
	"github.com/ranktree/ranktree/comm"
	"github.com/ranktree/ranktree/store"
	"github.com/ranktree/ranktree/supervisor"
)

// WorldGroupName is the name of the default process group (c10d's
// default_pg).
const WorldGroupName = "default_pg"

// Bounds of the restart policy: a group restarted automatically more than
// MaxAutoRestarts times within AutoRestartWindow escalates instead (as the
// supervision root's MaxRestarts does for one actor), so that a fault that
// recurs in every epoch ends in a job restart rather than a restart loop.
const (
	MaxAutoRestarts   = 3
	AutoRestartWindow = time.Minute
)

// Teardown bounds (see "Teardown bounds" in doc.go).
const (
	// CloseGrace is how long Close and Destroy let in-flight ops finish
	// before closing the engine under them.
	CloseGrace = 2 * time.Second
	// closeCommBound bounds closing one communicator (actor drain and
	// engine close), after the grace period.
	closeCommBound = time.Second
	// closeSupervisionBound bounds stopping the rank's supervision tree
	// (watchdog, heartbeat monitor, event flush, root) and the actor system.
	closeSupervisionBound = 800 * time.Millisecond
)

// Config configures Start. Every field is read once, at Start.
type Config struct {
	Job             string
	Rank, WorldSize int
	// Store is the attempt's store ("restart/<n>/"): engine rendezvous,
	// abort keys, restart barriers.
	Store store.Store
	// NATS is the control-plane connection for events; nil without one.
	NATS *nats.Conn
	// Timeout is the store timeout: engine connection, restart barrier.
	Timeout time.Duration
	// Incarnation is NextIncarnation's answer for this Init; groups start
	// at BaseEpoch(Incarnation).
	Incarnation uint32
	// Factory connects every group's engine; Device is its CUDA ordinal
	// (-1: host). Faults are injected into the first epoch of each group.
	Factory comm.BackendFactory
	Device  int
	Faults  []comm.Fault
	// Supervision is the rank's supervision config (validated); with
	// ActorPanic PanicRestart the restart policy's abort watch runs.
	Supervision supervisor.Config
	// Exit replaces os.Exit for teardowns (nil: os.Exit); EventTap sees
	// every event and WorkMetrics counts every Work (metrics). As
	// supervisor.RankConfig.
	Exit        func(code int)
	EventTap    func(*actors.Event)
	WorkMetrics supervisor.WorkMetrics
	// Log carries the rank's fields.
	Log zerolog.Logger
}

// Manager owns one rank's process groups (see doc.go). Its state lives
// on the owner loop (loop.go); its methods are safe for concurrent use.
type Manager struct {
	cfg    Config
	system *actor.ActorSystem
	sv     *supervisor.Rank

	reqs chan func(*state) // requests to the owner loop
	done chan struct{}     // closed when the owner loop has ended (after Close)

	// world is the current default group. Only the owner loop writes it;
	// World reads it without a round trip.
	world atomic.Pointer[comm.ProcessGroup]

	// watchCtx ends the restart policy's abort watch and the automatic
	// restarts under way (stopWatch, at Close). Written once at Start.
	watchCtx  context.Context
	stopWatch context.CancelFunc

	closeOnce sync.Once
	closeErr  error
}

// Start creates the rank's actor system and supervision tree, starts the
// owner loop (and, under the restart policy, the abort watch) and creates
// the default process group over every rank of the job. On error nothing
// is left running.
func Start(ctx context.Context, cfg Config) (*Manager, error) {
	m := &Manager{cfg: cfg, reqs: make(chan func(*state)), done: make(chan struct{})}
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	m.system = actor.NewActorSystemWithConfig(actor.Configure(
		actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger { return quiet })))
	var err error
	m.sv, err = supervisor.StartRank(m.system, supervisor.RankConfig{
		Job: cfg.Job, Rank: cfg.Rank, WorldSize: cfg.WorldSize, Cfg: cfg.Supervision, Store: cfg.Store,
		NATS: cfg.NATS, Log: cfg.Log, Exit: cfg.Exit, EventTap: cfg.EventTap, WorkMetrics: cfg.WorkMetrics,
	})
	if err != nil {
		m.system.Shutdown()
		return nil, err
	}
	m.watchCtx, m.stopWatch = context.WithCancel(context.Background())
	policy := cfg.Supervision.ActorPanic == supervisor.PanicRestart
	go m.run(newState(policy))
	if policy {
		err = m.startAbortWatch()
	}
	if err == nil { // registering the group makes it the world (create.go)
		_, err = m.CreateGroup(ctx, comm.GroupSpec{
			Name: WorldGroupName, GlobalRanks: allRanks(cfg.WorldSize), Rank: cfg.Rank, Timeout: cfg.Supervision.Timeout,
		})
	}
	if err != nil {
		m.stopWatch()
		m.stopLoop()
		m.stopSupervision()
		return nil, err
	}
	return m, nil
}

func allRanks(n int) []int {
	ranks := make([]int, n)
	for i := range ranks {
		ranks[i] = i
	}
	return ranks
}

// stopSupervision stops the supervision tree and the actor system
// (Start's error path).
func (m *Manager) stopSupervision() {
	m.sv.Close(time.Second)
	m.system.Shutdown()
}

// World is the current default process group (every rank of the job):
// after a restart of it, the restarted group.
func (m *Manager) World() *comm.ProcessGroup { return m.world.Load() }

// Group returns this rank's live handle of the group called name, or nil
// if there is none (not a member, destroyed, being restarted, or closed).
func (m *Manager) Group(name string) *comm.ProcessGroup {
	var pg *comm.ProcessGroup
	m.do(func(s *state) {
		if l := s.current[name]; l != nil {
			pg = l.pg
		}
	})
	return pg
}

// incarnations counts Inits per (store, job, rank) in this process: it is
// process-wide by nature (a Close then Init in the same process must not
// reuse the earlier Init's store keys).
var incarnations struct {
	mu   sync.Mutex
	n    map[string]uint32
	pins map[string]any
}

// NextIncarnation returns how many times this process already initialized
// the runtime identified by key (the store, job and rank), and counts this
// one. The store's identity matters for tests that run several in-process
// ranks on a fresh MemStore each. key may name the store by its address
// (%p): pass the store as pin, which is kept referenced for as long as the
// count is, so that no later store can be allocated at that address and
// inherit the count (its Init would then wait on "init.<k>" barrier keys
// its peers never write).
func NextIncarnation(key string, pin any) uint32 {
	incarnations.mu.Lock()
	defer incarnations.mu.Unlock()
	if incarnations.n == nil {
		incarnations.n, incarnations.pins = map[string]uint32{}, map[string]any{}
	}
	k := incarnations.n[key]
	incarnations.n[key] = k + 1
	if pin != nil {
		incarnations.pins[key] = pin
	}
	return k
}

// BaseEpoch is the first epoch of groups created by incarnation k.
func BaseEpoch(k uint32) uint32 { return k << 16 }

// closedErr is the error of a request refused because Close began.
func (m *Manager) closedErr(what, group string) error {
	return fmt.Errorf("ranktree: rank %d: %s group %q: %w: the runtime is closed", m.cfg.Rank, what, group, comm.ErrClosed)
}
