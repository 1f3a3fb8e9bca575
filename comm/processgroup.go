package comm

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"

	"github.com/ranktree/ranktree/store"
)

// DefaultTimeout is a process group's default op timeout (c10d's default
// for ProcessGroupNCCL and ProcessGroupGloo: 10 minutes).
const DefaultTimeout = 10 * time.Minute

// Launcher takes an op descriptor and the Promise of its Work to the
// group's engine. The communicator actor (actors.Communicator) implements
// it: Submit enters the group's launch queue, which assigns the sequence
// number (collective or P2P), completes the fingerprint (group hash,
// epoch, seq) and calls Backend.Launch in queue order, on the submitting
// goroutine when the queue is idle. Submit never blocks on communication
// and never fails synchronously: errors complete p.
type Launcher interface {
	// Submit schedules op; the launcher completes p (itself or through the
	// engine) exactly once. Submit after Close fails p with ErrClosed.
	// ctx (nil: none) is the ctx given to the op's ProcessGroup method;
	// the launcher owns the op's deadline from it: op.Timeout, or ctx's
	// deadline if that is earlier, and when ctx is cancelled before p
	// completes, a *CanceledError and an abort of the communicator (see
	// actors.Communicator.Submit and CtxWatch).
	Submit(ctx context.Context, op *Op, p *Promise)
	// Abort aborts the communicator: in-flight and later ops fail with
	// ErrAborted wrapping reason (ncclCommAbort). Idempotent.
	Abort(reason error)
	// Close stops the launcher and closes its engine, waiting for the ops
	// already submitted to be launched or ctx to end. Idempotent.
	Close(ctx context.Context) error
}

// GroupSpec describes a new process group that NewGroup or Split is
// creating, as handed to a GroupFactory.
type GroupSpec struct {
	// Name is the new group's name, equal on every member (derived from the
	// parent's name and a per-parent creation counter unless WithGroupName
	// set it).
	Name string
	// Parent is the name of the group NewGroup or Split was called on.
	Parent string
	// GlobalRanks maps the new group's ranks to global ranks.
	GlobalRanks []int
	// Rank is this process's rank in the new group (always a member: the
	// factory is not called on non-members).
	Rank int
	// Timeout is the new group's op timeout.
	Timeout time.Duration
}

// GroupFactory creates the communicator of a new process group; the root
// package implements it. CreateGroup must create and connect a Backend for
// spec.Name with spec.GlobalRanks (comm.BackendFactory with a BackendConfig
// built from spec), wrap it in a communicator actor (the Launcher), and
// return NewProcessGroup(GroupConfig{...}) for it, passing a GroupFactory
// on so that the new group can create subgroups in turn. It blocks until
// every member has connected or ctx ends. c10d: the backend construction
// inside torch.distributed.new_group.
type GroupFactory interface {
	CreateGroup(ctx context.Context, spec GroupSpec) (*ProcessGroup, error)
}

// GroupConfig configures NewProcessGroup. Zero values get defaults from
// validate: Timeout DefaultTimeout, GlobalRanks 0..Size-1.
type GroupConfig struct {
	// Name is the group's name ("default_pg" for the world group).
	Name string
	// Epoch is the communicator epoch (restarts increment it).
	Epoch uint32
	// Rank is this process's group rank, or -1 for a non-member (ops are
	// then no-ops returning a completed Work, logged as warnings).
	Rank int
	// Size is the number of members; -1 (or 0) for a non-member, whose
	// ProcessGroup.Size is then -1.
	Size int
	// GlobalRanks maps group rank to global rank (len Size).
	GlobalRanks []int
	// Launcher is the group's communicator actor; required for members.
	Launcher Launcher
	// Engine is the engine's name ("cpu", "nccl"); "nccl" requires device
	// buffers, every other engine host buffers.
	Engine string
	// Device is the CUDA ordinal of an "nccl" group's communicator
	// (BackendConfig.Device): its buffers must live there. Ignored for
	// host engines.
	Device int
	// Factory creates subgroups for NewGroup and Split; nil makes them fail
	// with ErrUnsupported.
	Factory GroupFactory
	// Timeout is the default per-op timeout.
	Timeout time.Duration
	// Store is the job's store (as BackendConfig.Store), used by
	// MonitoredBarrier and by NewGroup with WithLocalSynchronization; nil
	// makes those return ErrUnsupported.
	Store store.Store
	// Log is the logger (rank fields are added).
	Log zerolog.Logger
}

func (c *GroupConfig) validate() error {
	if c.Name == "" {
		return fmt.Errorf("%w: GroupConfig.Name is empty", ErrInvalidArgument)
	}
	// A non-member's view (Rank -1) has Size -1, as torch's
	// get_world_size on a non-member; its GlobalRanks, if given, are the
	// members' (0 is accepted as a Size too).
	nonMember := c.Rank == -1 && c.Size <= 0
	if c.Size < 1 && !nonMember {
		return fmt.Errorf("%w: group %q: GroupConfig.Size %d, expected at least 1 (-1 or 0 only for a non-member)", ErrInvalidArgument, c.Name, c.Size)
	}
	if c.Rank < -1 || (!nonMember && c.Rank >= c.Size) {
		return fmt.Errorf("%w: group %q: GroupConfig.Rank %d out of range [-1, %d)", ErrInvalidArgument, c.Name, c.Rank, c.Size)
	}
	if c.GlobalRanks == nil && c.Size > 0 {
		c.GlobalRanks = make([]int, c.Size)
		for i := range c.GlobalRanks {
			c.GlobalRanks[i] = i
		}
	}
	if nonMember {
		c.Size = -1
	} else if len(c.GlobalRanks) != c.Size {
		return fmt.Errorf("%w: group %q: %d GlobalRanks for Size %d", ErrInvalidArgument, c.Name, len(c.GlobalRanks), c.Size)
	}
	seen := make(map[int]bool, c.Size)
	for _, g := range c.GlobalRanks {
		if g < 0 || seen[g] {
			return fmt.Errorf("%w: group %q: GlobalRanks %v has a negative or repeated rank", ErrInvalidArgument, c.Name, c.GlobalRanks)
		}
		seen[g] = true
	}
	if c.Rank >= 0 && c.Launcher == nil {
		return fmt.Errorf("%w: group %q: GroupConfig.Launcher is nil for member rank %d", ErrInvalidArgument, c.Name, c.Rank)
	}
	if c.Timeout <= 0 {
		c.Timeout = DefaultTimeout
	}
	return nil
}

// ProcessGroup is a set of ranks that run collectives together: c10d's
// ProcessGroup. Every method is safe for concurrent use, but collectives of
// one group must be issued in the same order on every member (their
// launch order defines their sequence numbers).
// Ranks passed as roots and peers are group ranks; GlobalRank and GroupRank
// convert.
type ProcessGroup struct {
	name     string
	epoch    uint32
	rank     int
	size     int
	global   []int
	toGroup  map[int]int
	launcher Launcher
	engine   string
	device   bool // engine wants device buffers
	ordinal  int  // the device they must be on (device engines)
	factory  GroupFactory
	store    store.Store
	log      zerolog.Logger

	timeout   atomic.Int64 // nanoseconds
	closed    atomic.Bool
	mbarriers atomic.Uint64 // MonitoredBarrier calls so far (their store keys count them)

	mu       sync.Mutex     // guards children and locals
	children int            // subgroups created (names are derived from it)
	locals   map[string]int // local-synchronization NewGroups per rank list or name
	destroy  sync.Once
	destErr  error
}

// NewProcessGroup builds a ProcessGroup over a connected Launcher. The root
// package calls it for the world group and GroupFactory implementations for
// subgroups. Bad config returns an error wrapping ErrInvalidArgument.
func NewProcessGroup(cfg GroupConfig) (*ProcessGroup, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	pg := &ProcessGroup{
		name:     cfg.Name,
		epoch:    cfg.Epoch,
		rank:     cfg.Rank,
		size:     cfg.Size,
		global:   append([]int(nil), cfg.GlobalRanks...),
		toGroup:  make(map[int]int, len(cfg.GlobalRanks)),
		launcher: cfg.Launcher,
		engine:   cfg.Engine,
		device:   cfg.Engine == "nccl",
		ordinal:  cfg.Device,
		factory:  cfg.Factory,
		store:    cfg.Store,
		log:      cfg.Log.With().Str("group", cfg.Name).Int("group_rank", cfg.Rank).Logger(),
	}
	for i, g := range pg.global {
		pg.toGroup[g] = i
	}
	pg.timeout.Store(int64(cfg.Timeout))
	return pg, nil
}

// Name is the group's name.
func (pg *ProcessGroup) Name() string { return pg.name }

// Epoch is the communicator epoch the group was created under.
func (pg *ProcessGroup) Epoch() uint32 { return pg.epoch }

// Rank is this process's rank in the group, or -1 if it is not a member
// (torch.distributed.get_rank(group) returns -1 likewise).
func (pg *ProcessGroup) Rank() int { return pg.rank }

// Size is the number of members (torch get_world_size(group)), or -1 if
// this process is not a member, from NewGroup and Split alike (torch
// returns -1 for a non-member too).
func (pg *ProcessGroup) Size() int { return pg.size }

// Ranks returns the members' global ranks in group-rank order (a copy).
func (pg *ProcessGroup) Ranks() []int { return append([]int(nil), pg.global...) }

// Backend is the engine's name ("cpu", "nccl"); "" for a non-member group.
func (pg *ProcessGroup) Backend() string { return pg.engine }

// GlobalRank maps a group rank to its global rank (torch
// get_global_rank). An out-of-range rank gives an error wrapping
// ErrInvalidArgument.
func (pg *ProcessGroup) GlobalRank(groupRank int) (int, error) {
	if groupRank < 0 || groupRank >= pg.size {
		return -1, fmt.Errorf("%w: group %q: group rank %d out of range [0, %d)", ErrInvalidArgument, pg.name, groupRank, pg.size)
	}
	return pg.global[groupRank], nil
}

// GroupRank maps a global rank to its rank in this group (torch
// get_group_rank). A global rank that is not a member gives an error
// wrapping ErrInvalidArgument.
func (pg *ProcessGroup) GroupRank(globalRank int) (int, error) {
	r, ok := pg.toGroup[globalRank]
	if !ok {
		return -1, fmt.Errorf("%w: global rank %d is not a member of group %q (members %v)", ErrInvalidArgument, globalRank, pg.name, pg.global)
	}
	return r, nil
}

// SetTimeout sets the default timeout of later ops (d <= 0 restores
// DefaultTimeout). Ops already submitted keep theirs.
func (pg *ProcessGroup) SetTimeout(d time.Duration) {
	if d <= 0 {
		d = DefaultTimeout
	}
	pg.timeout.Store(int64(d))
}

// Timeout is the default per-op timeout (10 minutes unless set).
func (pg *ProcessGroup) Timeout() time.Duration { return time.Duration(pg.timeout.Load()) }

// Abort aborts the group's communicator: in-flight and later ops fail with
// ErrAborted wrapping reason (ncclCommAbort). The group stays unusable;
// re-create it. No-op on a non-member group.
func (pg *ProcessGroup) Abort(reason error) {
	if pg.launcher != nil {
		pg.launcher.Abort(reason)
	}
}

// Destroy closes the group's communicator (c10d destroy_process_group for
// one group). Later ops fail with ErrClosed. Idempotent: later calls return
// the first call's result.
func (pg *ProcessGroup) Destroy(ctx context.Context) error {
	pg.destroy.Do(func() {
		pg.closed.Store(true)
		if pg.launcher != nil {
			pg.destErr = pg.launcher.Close(ctx)
		}
		pg.log.Debug().Msg("process group destroyed")
	})
	return pg.destErr
}

// IsMember reports whether this process belongs to the group.
func (pg *ProcessGroup) IsMember() bool { return pg.rank >= 0 }

// String describes the group, e.g. `group "pg1" rank 0/2 (cpu)`.
func (pg *ProcessGroup) String() string {
	return fmt.Sprintf("group %q rank %d/%d (%s)", pg.name, pg.rank, pg.size, pg.engine)
}

// argErr builds the *ArgError for op.
func (pg *ProcessGroup) argErr(op OpType, format string, args ...any) *ArgError {
	return &ArgError{Op: op, Group: pg.name, Rank: pg.rank, Msg: fmt.Sprintf(format, args...)}
}

// precheck handles the cases every op method shares before validation:
// a destroyed group, a non-member, and an ended ctx. It returns a completed
// Work to hand back, or nil to go on.
func (pg *ProcessGroup) precheck(ctx context.Context, op OpType) *Work {
	if pg.closed.Load() {
		return FailedWork(op, fmt.Errorf("%w: %v on group %q after Destroy", ErrClosed, op, pg.name))
	}
	if pg.rank < 0 {
		pg.log.Warn().Str("op", op.String()).Msg("op called on a process group this rank is not a member of; doing nothing")
		return FailedWork(op, nil)
	}
	if ctx != nil {
		if err := ctx.Err(); err != nil {
			return FailedWork(op, err)
		}
	}
	return nil
}

// submit hands op with ctx to the launcher, with cfg from the call's
// options: the op's timeout (WithOpTimeout, else the group's), and
// whether the call blocks until the op completes (Blocking). op's
// fingerprint already holds the op's shape (type, dtype, count, root,
// reduce op); the communicator actor fills in its identity (group hash,
// epoch, seq).
//
// ctx bounds the op after launch too; the
// communicator owns that (Launcher.Submit):
//   - a ctx deadline earlier than the op's timeout becomes its timeout, so
//     the watchdog fails the Work with a *TimeoutError and aborts the
//     communicator exactly as for the op timeout;
//   - cancelling ctx before the Work completes fails it with a
//     *CanceledError (wrapping ctx.Err()) and aborts the communicator,
//     since a collective cannot be left half-done.
func (pg *ProcessGroup) submit(ctx context.Context, op *Op, cfg OpConfig) *Work {
	return pg.submitThen(ctx, op, cfg, nil)
}

// submitThen is submit with then, if not nil, run once when the Work
// completes, before it is seen complete (BatchP2P completes its per-op
// Works from it). A blocking call whose op lives in a pooled block
// (opSetup) counts the Promise's holders (Promise.Retain), starting with
// two: the caller, until its wait ends, and the op's completion, until
// Complete returns (opblock.go).
func (pg *ProcessGroup) submitThen(ctx context.Context, op *Op, cfg OpConfig, then func(*Work)) *Work {
	op.Timeout = cfg.Timeout
	if op.Timeout <= 0 {
		op.Timeout = pg.Timeout()
	}
	p := op.promise
	if p == nil {
		p = NewPromise(op.Type)
	} else {
		op.promise = nil // taken: the Op now travels with it
		p.init(op.Type)
	}
	if p.blk != nil { // a pooled block (opSetup)
		if cfg.Blocking {
			p.w.ref.Store(refStart)
		} else {
			p.w.ref.Store(refUncounted)
		}
	}
	w := p.Work()
	if then != nil {
		w.after = func() { then(w) }
	}
	pg.launcher.Submit(ctx, op, p)
	if !cfg.Blocking {
		return w
	}
	return await(ctx, p)
}
